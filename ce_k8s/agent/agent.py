"""The agent: the one process that talks to Kubernetes for the hooks (docs/design.md Decisions 2-5).

Pieces, each in its own module:
* `cache.PodCache` — LIST+WATCH of our pods; every update is answered from it;
* `status.decide` — pod state → routed-job attributes (the table in docs/holds.md);
* `adtext` — the few ad lines the hot path reads and the lines it prints;
* `creator.Creator` — creates pod then Secret with bounded concurrency under the QPS budget;
* `apiwarnings` — the API server's `Warning` headers on those writes: logged, counted, and named
  in `K8sPodReason` where the pod will not do what the route meant (never a hold);
* `credentials.CredentialRefresher` — a proxy/token renewed in the spool patched into the live
  pod's Secret (a `stat` per update, the copy on its own thread);
* `output.OutputStore` — each finished pod's log, saved before completion is reported;
* `outputfetch.OutputFetches` — one log fetch per pod, and none written after the pod's cleanup;
* `deletions.Deletions` — which pods a delete path has claimed, so each pod is deleted once;
* `journal.PostJournal` — the pod names whose create was sent, kept across restarts (F1), and
  the pods a cleanup released for a re-route;
* `sourceprobe.SourceProbe` — asks the CE's schedd whether a cleaned-up job's source job is gone;
* `metrics.AgentMetrics` — Prometheus metrics on `CE_K8S_METRICS_ADDRESS`;
* `server.HookServer` — the Unix socket, with the caller's uid from `SO_PEERCRED`.

Log lines are `key=value` fields (`ce_k8s.agent.logfmt`), `event=` first and `job=` on every
line about a job.

State is only what Kubernetes and the routed ads hold (decision 4): `self.jobs` is a memory of
what this process did (creation in flight, last hook contact) and is rebuilt from the next hook
calls after a restart; pods are found again by the relist, and their names come from the ads.

In-process use (tests, `ce-k8s demo`): `Agent(settings, api_client, socket_path=...).start()` and
`.stop()`. `handle(verb, payload, uid)` is the whole request path without the socket.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pwd
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from ce_k8s import protocol
from ce_k8s.agent import adtext, apiwarnings
from ce_k8s.agent.accounting import IDENTITY_WANTED, UsageCollector, attempt_wall, history_ad, routed_attrs
from ce_k8s.agent.cache import PodCache
from ce_k8s.agent.corecalls import CoreCalls, drained
from ce_k8s.agent.credentials import CredentialRefresher, CredentialState
from ce_k8s.agent.deletions import Deletion, Deletions
from ce_k8s.agent.effects import Effects
from ce_k8s.agent.history import HistoryWriter
from ce_k8s.agent.journal import PostJournal, valid_global_job_id
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.metrics import AgentMetrics
from ce_k8s.agent.options import AgentOptions, default_output_dir
from ce_k8s.agent.output import OutputStore, SavedOutput
from ce_k8s.agent.outputfetch import OutputFetches
from ce_k8s.agent.podinfo import LABEL_CE, LABEL_MANAGED_BY, MANAGER, PodInfo
from ce_k8s.agent.sourceprobe import GONE, SourceProbe, make_source_probe
from ce_k8s.agent.status import (
    COMPLETED,
    CREATE_DONE,
    CREATE_HOLD,
    CREATE_NONE,
    CREATE_PENDING,
    CREATE_RETRY,
    HELD,
    IDLE,
    RUNNING,
    CreateInfo,
    JobView,
    completes,
    decide,
)
from ce_k8s.hooks._common import ad_grid_resource, grid_resource_matches
from ce_k8s.pods.names import label_value, pod_name, secret_name
from ce_k8s.ratelimit import TokenBucket, backoff

log = logging.getLogger(__name__)

JOB_STATES = {1: "Idle", 2: "Running", 3: "Removed", 4: "Completed", 5: "Held"}
# Saving a finished pod's log is retried this often (API errors, a full disk) before the agent
# reports the completion anyway, without output: a pilot must never hang on its log.
OUTPUT_TRIES = 5
SAVING_OUTPUT = "saving the pod's output"
# How long a pod may show CreateContainerConfigError before it is held: the Secret is created right
# after the pod (creator.py), so a few seconds of it are normal.
CONFIG_ERROR_GRACE = 120
# A pending pod seen for the first time after a restart gets its Secret re-ensured once it has
# waited this long in ContainerCreating (the agent may have died between pod and Secret).
ENSURE_SECRET_AFTER = 20
NEEDS_SECRET_REASONS = frozenset({"ContainerCreating", "CreateContainerConfigError", "PodInitializing"})


@dataclass(slots=True)
class JobRecord:
    """What this agent process knows about one pod name (one attempt of one routed job)."""

    pod_name: str
    owner: str
    create: CreateInfo = field(default_factory=CreateInfo)
    last_touch: float = 0.0          # time.time() of the last hook call naming this pod
    failures: int = 0                # consecutive temporary create failures
    next_try: float = 0.0            # earliest time.time() for the next create attempt
    ad_text: str | None = None       # the routed ad, kept only while a create is queued
    cleaned: float = 0.0             # time.time() when cleanup was asked (0 = not cleaned)
    cleaned_job: str = ""            # the routed job ("ClusterId.ProcId") that cleanup was for
    namespace: str = ""
    caller_uid: int | None = None    # SO_PEERCRED uid that sent `ad_text` (sandbox ownership check)
    # What the last update said about the job (`list`, log lines): ids from the routed ad, state
    # as the agent last told the router (or as the ad said, for a final state).
    routed_job: str = ""             # the routed job's "ClusterId.ProcId"
    source_job: str = ""             # RoutedFromJobId
    route: str = ""
    attempt: int = 0
    job_status: int | None = None
    hold_reason: str = ""
    reason: str = ""
    # F1/F3 (docs/reliability.md): evidence that this attempt's pod already existed. `seen_uid` is
    # the uid of the pod once the cache, a create or an adoption showed it: a create re-run must
    # then never POST a new pod of this name (the attempt has had its one pod, docs/design.md Decision 5).
    # `check_history`: the first update this process saw already carried a reply of an earlier
    # agent (K8sPodReason), so the pod may have been created and vanished while no agent watched.
    seen_uid: str = ""
    check_history: bool = False
    cred: CredentialState | None = None   # the pod's credential files and what its Secret holds
    # The API server's Warning headers on this pod's writes (ce_k8s.agent.apiwarnings): the texts
    # logged (each once per pod), and the notes K8sPodReason carries while the pod is pending
    # (a deprecated node label) or while it lives (something the server dropped or ignores).
    api_warnings: tuple[str, ...] = ()
    note_pending: str = ""
    note_always: str = ""


def label_selector(ce_name: str) -> str:
    """Our pods: managed by ce-k8s and created by this CE (docs/internals.md "Identity")."""
    return f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_CE}={label_value(ce_name)}"


class Agent:
    """Watch cache + create queue + socket server; see the module docstring."""

    def __init__(self, settings, api_client, *, socket_path: str | None = None, spool: str | None = None,
                 request_timeout: float = 30.0, watch_timeout: int = 300,
                 config_error_grace: int = CONFIG_ERROR_GRACE, gc_interval: float | None = None,
                 options: AgentOptions | None = None, source_probe: SourceProbe | None = None) -> None:
        overrides = {k: v for k, v in (("socket", socket_path), ("spool", spool)) if v}
        if overrides:
            settings = dataclasses.replace(settings, **overrides)
        self.settings = settings
        self.options = options or AgentOptions()
        self.core = k8s.CoreV1Api(api_client)
        self.calls = CoreCalls(api_client)       # the per-pilot calls, without the typed round trip
        self.socket_path = settings.socket
        self.spool = settings.spool
        self.request_timeout = request_timeout
        self.config_error_grace = config_error_grace
        self.gc_interval = gc_interval if gc_interval is not None else min(60.0, max(settings.gc_grace / 4, 1.0))
        self.bucket = TokenBucket(settings.qps, settings.burst)
        self.cache = PodCache(self.core, label_selector(settings.ce_name), watch_timeout=watch_timeout,
                              request_timeout=request_timeout)
        self.jobs: dict[str, JobRecord] = {}
        self.jobs_lock = threading.Lock()
        self.started_at = time.time()
        self.stop_event = threading.Event()
        self._uids: dict[str, int | None] = {}
        self._my_uid = os.getuid()
        # Every delete path (cleanup, hold, the creator's undo, GC, release expiry) claims the pod
        # here first: one delete call per pod (deletions.py; docs/agent.md "Deleting a pod once").
        self.deletions = Deletions()
        self._split_logs: bool | None = None   # does the API server honour `stream=` on pod logs?
        self._stream_probe = threading.Lock()  # one fetch asks that; the others wait for its answer
        self.pool = ThreadPoolExecutor(max_workers=max(4, settings.create_concurrency), thread_name_prefix="ce-k8s-io")
        from ce_k8s.agent.creator import Creator

        # The pod writes (create, and every delete but the cleanup hook's own) on one keyed work
        # queue: one effect per pod at a time, per-pod back-off (effects.py).
        self.effects = Effects(settings.create_concurrency, self._create_turn, self.stop_event)
        self.creator = Creator(self, self.effects.queue)
        self.credentials = CredentialRefresher(self)   # refreshed proxies/tokens into running pods' Secrets
        self.server = None
        self._gc_thread: threading.Thread | None = None
        self.metrics = {"updates": 0, "creates": 0, "adopted": 0, "deletes": 0, "denied": 0, "released": 0,
                        "readopted": 0, "credentials_refreshed": 0}
        # Cleanup of a live pod asks this about the source job (docs/agent.md "Released pods").
        self.source_probe = source_probe if source_probe is not None else make_source_probe(self.options.source_probe)
        # Serialises the decisions about released pods: release (cleanup), adoption (update) and
        # the GC's delete at the end of the grace must not cross.
        self._release_lock = threading.Lock()
        self.output = OutputStore(self.options.output_dir or default_output_dir(settings.spool),
                                  self.options.max_output_bytes)
        self.journal = PostJournal(self.output.directory)
        self.fetches = OutputFetches()                 # log fetches in flight; pods whose cleanup ran
        self._output_tries: dict[str, tuple[int, float]] = {}   # name -> (failures, next try time)
        self.prom = AgentMetrics(pods=lambda: self.cache.pods.values(), last_event=lambda: self.cache.last_event,
                                 extra=self._gauges)
        self.cache.on_error = lambda verb, exc: self.prom.api_error(verb, "pods", exc)
        self.cache.listeners.append(self._pod_changed)
        self._init_accounting(api_client)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, serve: bool = True, wait_ready: float | None = 30.0) -> Agent:
        """Start the watch, the create workers, the GC and (with `serve`) the socket server."""
        from ce_k8s.agent.server import HookServer

        self.stop_event.clear()
        self.started_at = time.time()
        self.cache.start()
        self.effects.start()
        self.creator.queue = self.effects.queue
        self.usage.start()
        self._gc_thread = threading.Thread(target=self._gc_loop, name="ce-k8s-gc", daemon=True)
        self._gc_thread.start()
        if serve:
            if self.options.metrics_address:
                self.prom.serve(self.options.metrics_address)
            self.server = HookServer(self.socket_path, self.handle, self.pool)
            self.server.start()
        if wait_ready:
            self.cache.ready.wait(wait_ready)
        return self

    def stop(self) -> None:
        """Stop serving and every background thread (pods and Secrets are left as they are)."""
        self.stop_event.set()
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.prom.stop()
        self.effects.stop()
        self.usage.stop()
        self.cache.stop()
        if self._gc_thread is not None:
            self._gc_thread.join(10)
        self.pool.shutdown(wait=True, cancel_futures=True)

    # -- request dispatch --------------------------------------------------------------------------

    def handle(self, verb: str, payload: bytes, uid: int) -> tuple[str, list[bytes]]:
        """One hook request → (status, reply parts); never raises. Counted by verb and status."""
        reply = self._dispatch(verb, payload, uid)
        self.prom.hook(verb if verb in protocol.VERBS else "other", reply[0])
        return reply

    def _dispatch(self, verb: str, payload: bytes, uid: int) -> tuple[str, list[bytes]]:
        try:
            text = payload.decode("utf-8", "surrogateescape")
            if verb == protocol.VERB_UPDATE:
                return self.handle_update(text, uid)
            if verb == protocol.VERB_CLEANUP:
                return self.handle_cleanup(text, uid)
            if verb == protocol.VERB_LOGS:
                return self.handle_logs(text, uid)
            if verb == protocol.VERB_LIST:
                return self.handle_list(uid)
            if verb == protocol.VERB_PING:
                return protocol.STATUS_OK, [b"ce-k8s agent"]
            return protocol.STATUS_BAD, [f"unknown verb {verb}".encode()]
        except Exception as exc:
            job = _job_of(payload)
            log.exception("%s", fields(event="request-failed", verb=verb, job=job, error=type(exc).__name__))
            return protocol.STATUS_ERROR, [f"{type(exc).__name__}: {exc}".encode()[:2000]]

    def _uid_of(self, owner: str) -> int | None:
        if owner not in self._uids:
            try:
                self._uids[owner] = pwd.getpwnam(owner).pw_uid
            except KeyError:
                self._uids[owner] = None
        return self._uids[owner]

    def authorized(self, owner: str | None, uid: int) -> bool:
        """SO_PEERCRED rule: root and the agent's own uid act on every job, a user on their own only."""
        if uid in (0, self._my_uid):
            return True
        return bool(owner) and self._uid_of(owner) == uid

    def _identify(self, text: str, uid: int, verb: str):
        """(scanned attributes, pod name, owner) or an error reply tuple."""
        attrs = adtext.scan(text)
        name = adtext.unquote(attrs.get("k8spodname"))
        owner = adtext.unquote(attrs.get("owner")) or ""
        if not self.authorized(owner, uid):
            self.metrics["denied"] += 1
            job = f"{attrs.get('clusterid', '?')}.{attrs.get('procid', '?')}"
            log.warning("%s", fields(event="request-denied", verb=verb, job=job, owner=owner, caller_uid=uid))
            return (protocol.STATUS_DENIED, [f"uid {uid} may not act on jobs of {owner!r}".encode()])
        return attrs, name, owner

    def _record(self, name: str, owner: str) -> JobRecord:
        rec = self.jobs.get(name)
        if rec is None:
            with self.jobs_lock:
                rec = self.jobs.get(name)
                if rec is None:
                    rec = self.jobs[name] = JobRecord(name, owner)
        return rec

    def _fresh_record(self, name: str, owner: str) -> JobRecord:
        """Replace the record of `name` by an empty one (a new routed job names a never-created pod)."""
        with self.jobs_lock:
            rec = self.jobs[name] = JobRecord(name, owner)
        return rec

    def _never_created(self, rec: JobRecord, name: str) -> bool:
        """No pod of this name was ever made, as far as anything can tell (memory, cache, journal)."""
        return (rec.create.state == CREATE_NONE and not rec.seen_uid and not rec.namespace
                and not self.journal.posted(name) and self.cache.get(name) is None
                and self.cache.get_gone(name) is None)

    def _renamed_after_cleanup(self, rec: JobRecord, name: str, attrs: dict[str, str]) -> bool:
        """Whether a cleaned-up record must be forgotten: a routed job other than the cleaned one
        names a pod that never existed. A re-routed job can name a pod the cleanup of an earlier
        routing of the same source job already saw (when that cleanup released a live pod instead,
        or the source job never got `K8sAttempt` copied); without this its create would be refused
        for ever. A pod that existed is never made again this way (docs/design.md Decision 5)."""
        routed = f"{attrs.get('clusterid', '?')}.{attrs.get('procid', '?')}"
        return bool(rec.cleaned_job) and routed != rec.cleaned_job and self._never_created(rec, name)

    def _other_backend(self, text: str, attrs: dict[str, str]) -> bool:
        """A routed job (it has `RouteName`) of another backend: its GridResource does not start with
        CE_K8S_GRID_RESOURCE (docs/routes.md "CEs with other backends", the hooks' own rule and
        parser). The hooks never send one; an old launcher or a forged call might, and the agent then
        answers with no record, no pod and no API call. An ad with no `RouteName` keeps the usual rules."""
        if "routename" not in attrs:
            return False
        found = ad_grid_resource(text.encode("utf-8", "surrogateescape"))
        return not grid_resource_matches(found, self.settings.grid_resource)

    # -- update: the hot path -------------------------------------------------------------------

    def handle_update(self, text: str, uid: int) -> tuple[str, list[bytes]]:
        """Status lines for one routed job, from the cache; starts creation on first sight."""
        got = self._identify(text, uid, "update")
        if isinstance(got[0], str):
            return got
        attrs, name, owner = got
        if self._other_backend(text, attrs):
            return protocol.STATUS_OK, [b""]          # another backend's job: nothing to say, no record
        self.metrics["updates"] += 1
        if not name:
            return protocol.STATUS_OK, [b""]          # not routed through our translate hook
        if not self.cache.ready.is_set():
            return protocol.STATUS_BUSY, [b"agent is still listing pods"]
        return self._update(text, uid, attrs, name, owner, time.time())

    def _update(self, text: str, uid: int, attrs: dict[str, str], name: str, owner: str, now: float,
                adopted: PodInfo | None = None, may_adopt: bool = True) -> tuple[str, list[bytes]]:
        """The update reply for pod `name`. `adopted`: the released pod a re-routed job is given
        instead of the never-created `K8sPodName` of its ad (`_adopt`); the reply then also names it."""
        rec = self._record(name, owner)
        if rec.cleaned and self._renamed_after_cleanup(rec, name, attrs):
            rec = self._fresh_record(name, owner)
        rec.last_touch = now
        if adopted is not None:
            rec.routed_job = ""           # another routed job owns the pod from now on
            rec.cleaned = 0.0
        if not rec.routed_job:
            rec.routed_job = f"{attrs.get('clusterid', '?')}.{attrs.get('procid', '?')}"
            rec.source_job = adtext.unquote(attrs.get("routedfromjobid")) or ""
            rec.route = adtext.unquote(attrs.get("routename")) or ""
            # Another agent process answered an update for this pod name before (its reason line
            # is in the ad): before creating it, the creator looks for traces of an earlier pod (F1).
            rec.check_history = "k8spodreason" in attrs and not adtext.unquote(attrs.get("k8spoduid"))
            self._identities[name] = adtext.scan(text, IDENTITY_WANTED)   # for the attempt's history file
        pod = self.cache.get(name)
        s = self.settings
        gjid = adtext.unquote(attrs.get("k8ssourceglobaljobid"))
        if pod is not None and not self._same_job(pod, owner, gjid):
            conflict = _conflict_hold(pod)
            self._remember(rec, conflict, attrs)
            return protocol.STATUS_OK, [adtext.changed_lines(conflict, attrs).encode()]
        if pod is not None:
            rec.seen_uid = pod.uid
            if adopted is None and self.journal.released_at(name) is not None:
                self._claim(rec, pod)
        if pod is not None and rec.create.state in (CREATE_NONE, CREATE_RETRY):
            # The pod exists but this process did not finish creating it (restart, or a timeout
            # after the server accepted the create): the Secret may be missing. Re-run the create,
            # which adopts the pod and ensures the Secret, when that can matter.
            needs_secret = pod.phase == "Pending" and pod.waiting_reason in NEEDS_SECRET_REASONS
            if rec.create.state == CREATE_RETRY or (needs_secret and now - (pod.created or now) >= ENSURE_SECRET_AFTER):
                if now >= rec.next_try:
                    self._queue_create(rec, text, uid)
            elif not needs_secret:
                rec.create.state = CREATE_DONE     # found by the relist after a restart, past the Secret
            # else (F2): a young pod still waiting, maybe for a Secret the dead agent never made:
            # stay undecided and look again at the next update, until ENSURE_SECRET_AFTER has passed.
        job = JobView(
            pod_name=name,
            attempt=adopted.attempt if adopted is not None else adtext.as_int(attrs.get("k8sattempt")) or 0,
            max_attempts=adtext.as_int(attrs.get("k8smaxattempts")) or s.max_attempts,
            pending_timeout=adtext.as_int(attrs.get("k8spendingtimeout")) or s.pending_timeout,
            job_status=adtext.as_int(attrs.get("jobstatus")),
            pod_uid=adtext.unquote(attrs.get("k8spoduid")),
            job_start_date=adtext.as_int(attrs.get("jobstartdate")),
            global_job_id=gjid,
            ce_removes_restarts=s.ce_removes_restarts,
            retry_wait=s.retry_wait,
            retry_after=adtext.as_int(attrs.get("k8sretryafter")),
            num_job_starts=adtext.as_int(attrs.get("numjobstarts")),
        )
        next_name = pod_name(gjid, job.attempt + 1) if gjid and job.attempt < 999_999 else None
        rec.attempt = job.attempt
        gone = self.cache.get_gone(name) if pod is None else None
        decision = decide(job, pod, gone, rec.create, int(now), s.image_pull_timeout, self.config_error_grace,
                          next_name)
        if (decision.create and may_adopt and adopted is None and gjid and rec.create.state == CREATE_NONE
                and not rec.seen_uid and not self.journal.posted(name)):
            # This name was never created (no pod, no tombstone, no post, no uid in the ad): a
            # re-routed job may find its live pod released by the cleanup of its last routing.
            target = self._adoptable(name, owner, gjid)
            if target is not None:
                return self._adopt(text, uid, attrs, name, owner, target, now)
        desired = decision.attrs
        if adopted is not None:
            desired = {"K8sPodName": name, "K8sAttempt": adopted.attempt, **desired}
        desired = self._with_usage(desired, pod or gone, attrs, now)
        if (rec.note_pending or rec.note_always) and pod is not None:
            desired = _with_warnings(desired, rec, pod)
        if desired.get("JobStatus") == COMPLETED and not self._output_saved(pod or gone, now):
            # Completion is reported only once the pod's log is safe on disk (output.py): the
            # finalize hook that follows must not depend on the pod or the API server.
            finished = pod or gone
            desired = {"K8sPodPhase": finished.phase if finished else "", "K8sPodReason": SAVING_OUTPUT}
        if decision.create and now >= rec.next_try:
            self._queue_create(rec, text, uid)
        if decision.delete and pod is not None:
            self._delete_async(pod, why="hold", job=rec.routed_job)
        elif pod is not None and rec.create.state == CREATE_DONE and not pod.finished and not pod.deleting:
            self.credentials.check(rec, attrs, text, uid, pod, now)     # a renewed proxy/token → its Secret
        new_status = desired.get("JobStatus")
        if new_status is not None and new_status != adtext.as_int(attrs.get("jobstatus")):
            log.info("%s", fields(event="job-status", job=rec.routed_job, pod=name, status=new_status,
                                  was=attrs.get("jobstatus"),
                                  reason=desired.get("HoldReason") or desired.get("K8sPodReason")))
        self._remember(rec, desired, attrs)
        return protocol.STATUS_OK, [adtext.changed_lines(desired, attrs).encode()]

    @staticmethod
    def _remember(rec: JobRecord, desired: dict[str, object], attrs: dict[str, str]) -> None:
        """Keep the job state the router will hold after this reply (for `list`)."""
        status = desired.get("JobStatus")
        rec.job_status = status if isinstance(status, int) else adtext.as_int(attrs.get("jobstatus"))
        if rec.job_status == HELD:
            rec.hold_reason = str(desired.get("HoldReason") or adtext.unquote(attrs.get("holdreason")) or "")
        else:
            rec.hold_reason = ""
        reason = desired.get("K8sPodReason")
        rec.reason = str(reason) if reason is not None else (adtext.unquote(attrs.get("k8spodreason")) or "")

    def _same_job(self, pod: PodInfo, owner: str, gjid: str | None) -> bool:
        """An existing pod is ours to report on only if its labels/annotations name this job and owner."""
        if pod.owner and pod.owner not in (owner, label_value(owner)):
            return False
        return not (gjid and pod.global_job_id and pod.global_job_id != gjid)

    def _queue_create(self, rec: JobRecord, text: str, uid: int | None = None) -> None:
        with self.jobs_lock:
            if rec.create.state == CREATE_PENDING or rec.cleaned:
                return
            rec.create.state = CREATE_PENDING
            rec.ad_text = text
            rec.caller_uid = uid     # kept with the text: the sandbox is read on this uid's behalf
        self.effects.create(rec.pod_name)

    def _create_turn(self, name: str) -> None:
        self.creator.turn(name)

    # -- released pods: kept at cleanup, adopted by the re-routed job ------------------------------

    def _live(self, pod: PodInfo | None) -> bool:
        """A pod that still does (or will do) the pilot's work: not finished, not being deleted, not
        disrupted (an evicted pod's job moves to the next attempt instead)."""
        return (pod is not None and not pod.finished and not pod.deleting and not pod.disruption
                and not self.deletions.covers(pod.name, pod.uid or None))

    def _of_source(self, pod: PodInfo, owner: str, gjid: str) -> bool:
        """Stricter than `_same_job`: the pod's annotations must name this source job and owner, and
        its name must be the one its attempt label gives (only then may another routed job use it)."""
        return (bool(gjid) and pod.global_job_id == gjid and bool(pod.owner)
                and pod.owner in (owner, label_value(owner)) and pod_name(gjid, pod.attempt) == pod.name)

    def _held_by_agent(self, pod: PodInfo, attrs: dict[str, str], now: float) -> bool:
        """Whether the agent holds (or is about to hold) the job of `pod`: then its pod goes."""
        rec = self.jobs.get(pod.name)
        if (rec is not None and rec.job_status == HELD) or adtext.as_int(attrs.get("jobstatus")) == HELD:
            return True
        s = self.settings
        view = JobView(pod_name=pod.name, attempt=pod.attempt,
                       max_attempts=adtext.as_int(attrs.get("k8smaxattempts")) or s.max_attempts,
                       pending_timeout=adtext.as_int(attrs.get("k8spendingtimeout")) or s.pending_timeout)
        d = decide(view, pod, None, CreateInfo(CREATE_DONE), int(now), s.image_pull_timeout, self.config_error_grace,
                   None)
        return d.attrs.get("JobStatus") == HELD

    def _keepable(self, name: str, names: list[str], owner: str, gjid: str | None, attrs: dict[str, str],
                  now: float) -> PodInfo | None:
        """The live pod a cleanup of this routed job would destroy work in, if any: the job's own pod,
        else the pod its never-created name was an alias for, else a pod of an earlier attempt that
        an earlier cleanup released (the re-routed job was cleaned up before it adopted it)."""
        if not gjid:
            return None
        alias = self.journal.alias_of(name)
        for n in (name, alias, *reversed(names[1:])):
            if n is None or (n != name and n != alias and self.journal.released_at(n) is None):
                continue
            pod = self.cache.get(n)
            if self._live(pod) and self._of_source(pod, owner, gjid) and not self._held_by_agent(pod, attrs, now):
                return pod
        return None

    def _release(self, pod: PodInfo, gjid: str, job: str, source: str, verdict: str) -> None:
        """Keep `pod` for a re-route: journal it (renewing the grace) and make sure nothing deletes it
        for the routed job that was just cleaned up."""
        self.journal.record_release(pod.name, gjid)
        rec = self.jobs.get(pod.name)
        if rec is not None:
            with self.jobs_lock:
                rec.cleaned = 0.0
                rec.reason = f"released at cleanup of {job}: kept {self.options.release_grace} s for a re-route"
        self.metrics["released"] += 1
        why = ("the source job will be routed again" if verdict != "unknown"
               else "the source job's state is unknown (schedd unreachable or probe off)")
        log.info("%s", fields(event="pod-released", job=job, pod=pod.name, namespace=pod.namespace,
                              source_job=source or None, source=verdict, why=why,
                              grace_s=self.options.release_grace))

    def _claim(self, rec: JobRecord, pod: PodInfo) -> None:
        """An update names a released pod directly: a routed job uses it again, so it is no longer
        released (the router re-adopted the routed job, or the re-routed job got the same name)."""
        with self._release_lock:
            self.journal.record_unreleased(pod.name)
        with self.jobs_lock:
            rec.cleaned = 0.0
        log.info("%s", fields(event="pod-adopted", job=rec.routed_job or self._job_for(pod.name), pod=pod.name,
                              namespace=pod.namespace, source="released", alias=None))

    def _adoptable(self, name: str, owner: str, gjid: str) -> PodInfo | None:
        """A live pod of this source job and owner that this never-created `name` may take over: the
        pod `name` was already given to (the reply may have been lost), or a released one."""
        candidates = self.journal.released_for(gjid)
        alias = self.journal.alias_of(name)
        if alias is not None:
            candidates.append(alias)
        best = None
        for n in candidates:
            pod = self.cache.get(n)
            if n == name or not self._live(pod) or not self._of_source(pod, owner, gjid):
                continue
            if best is None or pod.attempt > best.attempt:
                best = pod
        return best

    def _adopt(self, text: str, uid: int, attrs: dict[str, str], name: str, owner: str, target: PodInfo,
               now: float) -> tuple[str, list[bytes]]:
        """Give the re-routed job the released pod `target` instead of creating `name`: the reply sets
        `K8sPodName`/`K8sAttempt` to the pod's, the router applies it to the routed ad and pushes it to
        the schedd (JobRouter.cpp UpdateRoutedJobStatus), and from then on every hook names the pod."""
        with self._release_lock:
            if not self._live(self.cache.get(target.name)):
                target = None                  # the GC took it meanwhile: create as usual
            else:
                self.journal.record_adopt(target.name, name)
        if target is None:
            return self._update(text, uid, attrs, name, owner, now, may_adopt=False)
        with self.jobs_lock:
            rec = self.jobs.get(name)
            if rec is not None and rec.create.state == CREATE_NONE:
                del self.jobs[name]            # the never-created name leaves no trace to act on
        self.metrics["readopted"] += 1
        job = f"{attrs.get('clusterid', '?')}.{attrs.get('procid', '?')}"
        log.info("%s", fields(event="pod-adopted", job=job, pod=target.name, namespace=target.namespace,
                              source="released", alias=name, attempt=target.attempt))
        return self._update(text, uid, attrs, target.name, owner, now, adopted=target)

    # -- cleanup ---------------------------------------------------------------------------------

    def handle_cleanup(self, text: str, uid: int) -> tuple[str, list[bytes]]:
        """Delete the job's pods (this and earlier attempts), Secrets and saved output; absent counts as done.

        Unless the cleanup interrupts live work: the router also cleans a routed job up when it
        could not push a status update to the schedd (JobRouter.cpp UpdateRoutedJobStatus), and
        then routes the source job again. So when the job's pod is live and the agent has not held
        the job, the source job decides (`sourceprobe`): gone → delete as always; waiting or
        unknown → the pod is released, not deleted, for the re-routed job to adopt (docs/agent.md
        "Released pods"); the GC deletes it if nobody does within `CE_K8S_RELEASE_GRACE`.
        """
        got = self._identify(text, uid, "cleanup")
        if isinstance(got[0], str):
            return got
        attrs, name, owner = got
        if self._other_backend(text, attrs):
            return protocol.STATUS_NOTFOUND, [b"not a Kubernetes job"]
        if not name:
            return protocol.STATUS_NOTFOUND, [b"no K8sPodName"]
        if not self.cache.ready.is_set():
            # "not found" before the relist could be a lie that leaks a running pod: retry later.
            return protocol.STATUS_BUSY, [b"agent is still listing pods"]
        now = time.time()
        rec = self._record(name, owner)
        job = f"{attrs.get('clusterid', '?')}.{attrs.get('procid', '?')}"
        gjid = adtext.unquote(attrs.get("k8ssourceglobaljobid"))
        attempt = adtext.as_int(attrs.get("k8sattempt")) or 0
        names = [name]
        if gjid:
            names += [pod_name(gjid, a) for a in range(attempt) if pod_name(gjid, a) != name]
            alias = self.journal.alias_of(name)
            if alias is not None and alias not in names:
                names.append(alias)     # the pod this never-created name was given (`_adopt`)
        keep = None
        source = adtext.unquote(attrs.get("routedfromjobid")) or ""
        verdict = ""
        if gjid and valid_global_job_id(gjid):
            keep = self._keepable(name, names, owner, gjid, attrs, now)
            if keep is not None:
                verdict = self.source_probe.status(source)
                if verdict == GONE:
                    keep = None
        if keep is not None:
            with self._release_lock:
                if self._live(self.cache.get(keep.name)):
                    self._release(keep, gjid, job, source, verdict)
                else:
                    keep = None         # deleted meanwhile: nothing left to keep
        if keep is None or keep.name != name:
            with self.jobs_lock:
                rec.cleaned = rec.cleaned or now
                rec.cleaned_job = job
        self.journal.record_done([n for n in names if keep is None or n != keep.name])
        deleted = 0
        for n in names:
            if keep is not None and n == keep.name:
                continue
            pod = self.cache.get(n)
            if pod is not None and not self._same_job(pod, owner, gjid):
                log.warning("%s", fields(event="cleanup-skipped", job=job, pod=n, namespace=pod.namespace,
                                         why="pod belongs to another job or owner"))
                continue
            gone = self.cache.get_gone(n) if pod is None else None
            uid = (pod.uid if pod is not None else gone.uid if gone is not None else "") or None
            self._forget_output(n, uid, owner, gjid)
            if n != name and pod is None:
                continue
            namespace = pod.namespace if pod is not None else rec.namespace
            if not namespace:
                continue        # never created by us and not in the cache: nothing to delete
            deleted += self._cleanup_delete(n, namespace, uid, job, now)
        log.info("%s", fields(event="cleanup", job=job, pod=name, pods_deleted=deleted,
                              released=keep.name if keep is not None else None))
        if keep is not None:
            return protocol.STATUS_OK, [(f"pod {keep.name} released, not deleted: source job {source or '?'} "
                                         f"is {verdict}; kept {self.options.release_grace} s for a re-route "
                                         f"({deleted} other pod(s) deleted)").encode()]
        return (protocol.STATUS_OK if deleted else protocol.STATUS_NOTFOUND), [f"{deleted} pod(s) deleted".encode()]

    def _forget_output(self, name: str, uid: str | None, owner: str, gjid: str | None) -> None:
        """Drop the saved output of `name` if it is this job's (finalize ran: hook-protocol.md §2.5 follows §2.4),
        and close the pod's output for good: a fetch in flight discards its result, and the
        deletion's own watch events start no new one (outputfetch.py)."""
        def remove() -> None:
            meta = self.output.meta(name)
            if meta is not None and meta.owner in (owner, label_value(owner)) \
                    and not (gjid and meta.global_job_id and meta.global_job_id != gjid):
                self.output.remove(name)
        self.fetches.close(name, uid, remove)
        self._output_tries.pop(name, None)

    def _delete_wait(self) -> float:
        """How long a cleanup waits for another path's delete call: its two requests (pod, then
        Secret by name) and a token from the QPS bucket."""
        return 2 * self.request_timeout + 2 / max(self.settings.qps, 0.1)

    def _cleanup_delete(self, name: str, namespace: str, uid: str | None, job: str, started: float) -> int:
        """The cleanup's delete of pod `name`: 1 if the pod existed, 0 if not. Raises on API errors.

        Another path (GC, hold, the creator's undo) may be deleting this very pod: then its call is
        this cleanup's one delete (deletions.py; docs/agent.md "Deleting a pod once"). A call still in
        flight is waited for; one that returned after this cleanup began is counted as the cleanup's;
        one that returned before (a repeated cleanup, a hold's delete) means the pod was already
        deleted: 0, with no call. A call still in flight after the wait raises TimeoutError, so the
        hook exits 1 and the router retries the cleanup.
        """
        for _ in range(3):
            deletion, mine = self.deletions.claim(name, uid)
            if mine:
                return self._run_delete(deletion, namespace, "cleanup", job)
            wait = self._delete_wait()
            if not self.deletions.wait(deletion, wait):
                raise TimeoutError(f"pod {name}: another delete of it is still in flight after {wait:.0f} s")
            if deletion.existed is not None:
                counted = int(deletion.existed and deletion.settled_at >= started)
                log.info("%s", fields(event="delete-shared", job=job, pod=name, namespace=namespace,
                                      existed=deletion.existed, counted=counted))
                return counted
            # the other path's call failed and gave its claim back: claim again
        raise TimeoutError(f"pod {name}: the other delete calls of it kept failing")

    def _run_delete(self, deletion: Deletion, namespace: str, why: str, job: str | None = None) -> int:
        """Make the delete call of a claim this thread holds, and settle the claim either way."""
        existed: bool | None = None
        try:
            result = self.delete_pod(deletion.name, namespace, why=why, job=job)
            existed = bool(result)
            return result
        finally:
            self.deletions.settle(deletion, existed)

    def delete_pod(self, name: str, namespace: str, why: str = "cleanup", job: str | None = None) -> int:
        """Delete a pod; 1 if it existed, 0 if not. Raises on other API errors.

        The bare call: the agent's paths claim the pod first (`self.deletions`), so that no two of
        them delete the same pod.

        Only the pod: its sandbox Secret has an ownerReference to it, so Kubernetes' garbage
        collector removes the Secret (one API call per pilot saved). Never the other Secret
        volumes a pod mounts: a route may mount a shared site Secret through K8sVolumes. When the
        pod is already gone the sandbox Secret is deleted by name, in case its owner never existed.
        """
        existed = 0
        self.bucket.acquire(self.stop_event)
        t0 = time.monotonic()
        try:
            self.calls.delete_namespaced_pod(name, namespace, propagation_policy="Background",
                                             _preload_content=False, _request_timeout=self.request_timeout)
            existed = 1
            self.metrics["deletes"] += 1
        except ApiException as exc:
            if exc.status != 404:
                self.prom.api_error("delete", "pods", exc)
                raise
        except Exception as exc:
            self.prom.api_error("delete", "pods", exc)
            raise
        if not existed:
            self.bucket.acquire(self.stop_event)
            try:
                drained(self.core.delete_namespaced_secret(secret_name(name), namespace, _preload_content=False,
                                                           _request_timeout=self.request_timeout))
            except ApiException as exc:
                if exc.status != 404:
                    self.prom.api_error("delete", "secrets", exc)
                    raise
            except Exception as exc:
                self.prom.api_error("delete", "secrets", exc)
                raise
        if existed:
            self.prom.delete_seconds.observe(time.monotonic() - t0)
            self.prom.pods_deleted.labels(why).inc()
            log.info("%s", fields(event="pod-deleted", job=job or self._job_for(name), pod=name,
                                  namespace=namespace, why=why))
        return existed

    def _delete_async(self, pod: PodInfo, why: str = "hold", job: str | None = None) -> None:
        """Delete `pod` at its next turn on the work queue (effects.py), unless another path is
        deleting or has deleted it. The claim is taken here, on the caller's thread, so that a
        cleanup or GC pass that comes before the turn sees it (deletions.py)."""
        if pod.deleting:
            return
        deletion, mine = self.deletions.claim(pod.name, pod.uid or None)
        if not mine:
            return

        def run() -> None:
            try:
                self._run_delete(deletion, pod.namespace, why, job)
            except Exception as exc:
                log.warning("%s", fields(event="delete-failed", job=job or self._job_for(pod.name), pod=pod.name,
                                         namespace=pod.namespace, error=_short(exc)))

        if self.effects.queue.closed:         # stopping: give the claim back, the next agent decides
            self.deletions.settle(deletion, None)
            return
        self.effects.delete(pod.name, run)

    def _job_for(self, name: str) -> str:
        """The job id for a log line about pod `name`: routed id if an update named it, else the source id."""
        rec = self.jobs.get(name)
        if rec is not None and rec.routed_job:
            return rec.routed_job
        pod = self.cache.get(name) or self.cache.get_gone(name)
        return (pod.source_job if pod is not None else "") or "?"

    # -- accounting: usage of every attempt (docs/accounting.md) -----------------------------------

    def _init_accounting(self, api_client) -> None:
        """The usage collector (kubelet Summary API) and, with CE_K8S_PER_JOB_HISTORY_DIR, the
        per-job history writer for APEL."""
        s = self.settings
        self._identities: dict[str, dict[str, str]] = {}     # pod name -> identity attrs of its routed ad
        self._history_retry: dict[str, object] = {}           # pod name -> record whose file failed
        self.history: HistoryWriter | None = None
        if s.per_job_history_dir:
            try:
                self.history = HistoryWriter(s.per_job_history_dir)
            except OSError as exc:
                log.error("%s", fields(event="history-dir-unusable", path=s.per_job_history_dir,
                                       error=exc.strerror))
        self.usage = UsageCollector(
            api_client, self.core, lambda: list(self.cache.pods.values()), interval=s.usage_interval,
            request_timeout=self.request_timeout, acquire=lambda: self.bucket.acquire(self.stop_event),
            on_final=self._attempt_settled, on_error=lambda verb, res, exc: self.prom.api_error(verb, res, exc),
            source=s.usage_source, kubelet_ca=s.kubelet_ca, kubelet_insecure=s.kubelet_insecure)
        self.cache.listeners.append(self._usage_changed)

    def _usage_changed(self, name: str | None) -> None:
        """Watch listener: tell the collector about starts, terminations and deletions (cheap)."""
        if name is None:
            for pod in list(self.cache.pods.values()):
                self.usage.pod_changed(pod)
            return
        pod = self.cache.pods.get(name)
        if pod is not None:
            self.usage.pod_changed(pod)
        else:
            self.usage.pod_changed(self.cache.get_gone(name), gone=True)

    def _attempt_settled(self, record) -> None:
        """An attempt's usage is final: write its per-job history file (once; retried by the GC)."""
        pod = record.pod
        job = self._job_for(pod.name)
        log.info("%s", fields(event="attempt-accounted", job=job, pod=pod.name, node=pod.node,
                              outcome=record.outcome, wall_s=record.wall, wall_source=record.wall_source,
                              cpu_s=None if record.cpu_seconds is None else round(record.cpu_seconds, 1)))
        if record.cpu_reported is not None:
            # docs/accounting.md "Wall time and the CPU bound": never more CPU than wall × cores.
            log.warning("%s", fields(event="cpu-capped", job=job, pod=pod.name, node=pod.node,
                                     reported_s=round(record.cpu_reported, 3), wall_s=record.wall, cores=record.cores,
                                     capped_s=round(record.cpu_seconds or 0.0, 3)))
        if self.history is None:
            if self.settings.per_job_history_dir:
                self._history_retry[pod.name] = record     # the directory may become usable (GC retries)
            return
        rec = self.jobs.get(pod.name)
        ad = history_ad(record, self.settings.ce_name, self._identities.get(pod.name),
                        rec.routed_job if rec is not None else "")
        try:
            path = self.history.write(pod.uid or pod.name, ad)
            self._history_retry.pop(pod.name, None)
            if path:
                log.info("%s", fields(event="history-written", pod=pod.name, path=path))
        except OSError as exc:
            self._history_retry[pod.name] = record
            log.warning("%s", fields(event="history-write-failed", pod=pod.name, error=exc.strerror, action="retry"))

    def _with_usage(self, desired: dict[str, object], pod: PodInfo | None, attrs: dict[str, str],
                    now: float) -> dict[str, object]:
        """Add the attempt's usage to a reply that ends the attempt (completed, held, next attempt).

        HTCondor's `RemoteWallClockTime` is cumulative over a job's runs and `LastRemoteWallClockTime`
        is the last run's: the ending attempt's wall time is added to the routed ad's current value
        (idempotent: that value is the ad's before this transition, and after it the old pod is never
        looked at again). A completion waits, like for its output, until the attempt's final Summary
        read is done (`_save_output` does it first; at most `accounting.SETTLE_WAIT` seconds); an
        eviction or a hold is reported at once with the pod's wall time.
        """
        status = desired.get("JobStatus")
        if pod is None or status not in (COMPLETED, HELD, IDLE) or (status == IDLE and "K8sAttempt" not in desired):
            return desired
        if pod.started_at is None:
            return desired               # the pilot container never started: nothing was used
        if status == COMPLETED and not self.usage.settled(pod, now, gone=self.cache.get(pod.name) is None):
            return {"K8sPodPhase": pod.phase, "K8sPodReason": SAVING_OUTPUT}
        out = dict(desired)
        record = self.usage.record(pod.name)
        if record is not None:
            out.update(routed_attrs(record))
            wall, end = record.wall, record.end
        else:
            # An eviction or a hold is reported at once: its wall time is the pod's own (at least a
            # second: it ran); its CPU and memory reach the history file when the collector has
            # settled the attempt.
            wall, _source = attempt_wall(pod.started_at, pod.finished_at or int(now))
            end = pod.started_at + int(wall)
            out.update({"JobCurrentStartDate": pod.started_at, "LastRemoteHost": pod.node})
        if "CompletionDate" in out:
            # The end that goes with the wall time (docs/accounting.md "Wall time and the CPU bound"):
            # later than the pod's `finishedAt` only by the second its truncation hid.
            out["CompletionDate"] = end
        try:
            base = float(adtext.unquote(attrs.get("remotewallclocktime")) or 0.0)
        except ValueError:
            base = 0.0
        out["RemoteWallClockTime"] = round(base + wall, 3)
        out["LastRemoteWallClockTime"] = wall
        return out

    def _gc_accounting(self, now: float) -> None:
        """Retry failed history writes; forget usage of pods long gone; prune old markers."""
        if self.history is None and self.settings.per_job_history_dir:
            try:
                self.history = HistoryWriter(self.settings.per_job_history_dir)
            except OSError:
                pass                    # logged at start; the records wait in _history_retry
        for record in list(self._history_retry.values()):
            self._attempt_settled(record)
        keep = set(self.cache.pods) | set(self.cache.gone)
        self.usage.forget(keep)
        for name in [n for n in self._identities if n not in keep and n not in self.jobs]:
            del self._identities[name]
        if self.history is not None:
            self.history.prune(now)

    # -- output: saved when the pod finishes, served to finalize -----------------------------------

    def _pod_changed(self, name: str | None) -> None:
        """Watch listener: start saving the log of every pod that just finished (or, after a LIST, of
        every finished pod whose log is not saved yet). Runs on the watch thread: only cheap checks."""
        if name is None:
            for pod in list(self.cache.pods.values()):
                if pod.finished:
                    self._want_output(pod)
            return
        pod = self.cache.pods.get(name)
        if pod is not None and pod.finished:
            self._want_output(pod)

    def _want_output(self, pod: PodInfo, now: float | None = None) -> None:
        """Queue a log fetch for a finished pod that will complete its job, unless saved, queued or
        closed by its cleanup. The watch thread and update hooks call this for the same pod at once:
        `fetches.begin` decides, checking "saved" again under the lock the save is written under."""
        if pod.name in self.fetches or self.output.has(pod.name, pod.uid) or not completes(pod):
            return
        tries = self._output_tries.get(pod.name)
        if tries is not None and (tries[0] >= OUTPUT_TRIES or (now or time.time()) < tries[1]):
            return
        generation = self.fetches.begin(pod.name, pod.uid, saved=lambda: self.output.has(pod.name, pod.uid))
        if generation is None:
            return
        try:
            self.pool.submit(self._save_output, pod, generation)
        except RuntimeError:       # shutting down
            self.fetches.end(pod.name, generation)

    def _output_saved(self, pod: PodInfo | None, now: float) -> bool:
        """Whether completion may be reported: output saved, or saving it is hopeless."""
        if pod is None or self.output.has(pod.name, pod.uid):
            return True
        if self.fetches.closed(pod.name, pod.uid):
            self.fetches.reopen(pod.name)     # a new routing of the job names it again (outputfetch.py)
        tries = self._output_tries.get(pod.name)
        if tries is not None and tries[0] >= OUTPUT_TRIES:
            return True            # given up (logged): report the completion without output
        if self.cache.get(pod.name) is None:
            # The pod is gone: its log is gone with it. Save a "lost" entry (in the pool, never on
            # this thread) so finalize can say why, then report.
            self._want_output(pod, now)
            return pod.name not in self.fetches and self.output.has(pod.name)
        self._want_output(pod, now)
        return False

    def _save_output(self, pod: PodInfo, generation: int) -> None:
        """Read the finished pod's log (bounded) and store it; a vanished pod leaves a 'lost' entry.
        Nothing is stored when the pod's cleanup ran while the log was read (outputfetch.py)."""
        job = self._job_for(pod.name)
        self.usage.settle_pod(pod)       # its final usage first: the completion carries it (accounting.py)
        try:
            meta = self._commit_output(pod, generation, self._fetch_output(pod))
            if meta is None:
                log.info("%s", fields(event="output-discarded", job=job, pod=pod.name,
                                      why="cleanup ran while the log was read"))
                return
            result = "lost" if meta.lost else "truncated" if meta.truncated else "saved"
            self.prom.outputs.labels(result).inc()
            level = logging.WARNING if meta.lost else logging.INFO
            log.log(level, "%s", fields(event="output-" + result, job=job, pod=pod.name, split=meta.split,
                                        why=meta.lost or None))
        except Exception as exc:
            self._output_failed(pod, generation, job, exc)
        finally:
            self.fetches.end(pod.name, generation)

    def _fetch_output(self, pod: PodInfo) -> tuple[bytes, bytes, bool, str]:
        """(stdout, stderr, split, lost) of a finished pod: its log through the API (one read per
        stream the server splits, else one), or why there is none. Raises on errors worth a retry."""
        if self.output.max_bytes <= 0:
            return b"", b"", False, "output return is off (CE_K8S_MAX_OUTPUT_BYTES = 0)"
        try:
            out, err, split = self.read_logs(pod, self.output.max_bytes + 1)
        except ApiException as exc:
            if exc.status not in (400, 404):
                raise
            return b"", b"", False, (f"the pod's log could not be read (HTTP {exc.status}: pod deleted "
                                     "before ce-k8s saved it)")
        return out, err, split, ""

    def _commit_output(self, pod: PodInfo, generation: int,
                       fetched: tuple[bytes, bytes, bool, str]) -> SavedOutput | None:
        """Store a fetched log unless the pod's cleanup closed this fetch since it began: None then.
        Written under the book's lock, which the cleanup's removal also takes, so a result can never
        land after the cleanup removed the entry."""
        out, err, split, lost = fetched
        with self.fetches.committing(pod.name, generation) as current:
            if not current:
                return None
            meta = self.output.save(pod.name, uid=pod.uid, namespace=pod.namespace, owner=pod.owner,
                                    global_job_id=pod.global_job_id, out=out, err=err, split=split, lost=lost)
            self._output_tries.pop(pod.name, None)
            return meta

    def _output_failed(self, pod: PodInfo, generation: int, job: str, exc: Exception) -> None:
        """Count a failed fetch toward OUTPUT_TRIES with a back-off, unless the pod was closed meanwhile."""
        with self.fetches.committing(pod.name, generation) as current:
            if not current:
                return
            failures = self._output_tries.get(pod.name, (0, 0.0))[0] + 1
            self._output_tries[pod.name] = (failures, time.time() + backoff(failures, base=1.0, cap=30.0))
        final = failures >= OUTPUT_TRIES
        if final:
            self.prom.outputs.labels("failed").inc()
        log.warning("%s", fields(event="output-failed", job=job, pod=pod.name, attempt=failures,
                                 error=_short(exc), action="report completion without output" if final
                                 else "retry"))

    def handle_logs(self, text: str, uid: int) -> tuple[str, list[bytes]]:
        """[spool root, stdout, stderr] of the job's pod for the finalize hook: the saved output, else
        the live pod's log; a note on stderr says why output is missing or cut."""
        got = self._identify(text, uid, "logs")
        if isinstance(got[0], str):
            return got
        attrs, name, owner = got
        if self._other_backend(text, attrs):
            return protocol.STATUS_NOTFOUND, [b"not a Kubernetes job"]
        gjid = adtext.unquote(attrs.get("k8ssourceglobaljobid"))
        job = f"{attrs.get('clusterid', '?')}.{attrs.get('procid', '?')}"
        saved = self.output.load(name) if name else None
        if saved is not None:
            meta, out, err = saved
            if meta.owner not in (owner, label_value(owner)) or (gjid and meta.global_job_id
                                                                  and meta.global_job_id != gjid):
                log.warning("%s", fields(event="request-denied", verb="logs", job=job, pod=name,
                                         why="saved output belongs to another job or owner"))
                return protocol.STATUS_DENIED, [b"output belongs to another job"]
            if meta.lost:
                err += f"ce-k8s: the pilot's output could not be returned: {meta.lost}\n".encode()
            elif meta.truncated:
                err += (f"ce-k8s: output cut at CE_K8S_MAX_OUTPUT_BYTES = {self.output.max_bytes} bytes "
                        "per stream\n").encode()
            log.info("%s", fields(event="output-returned", job=job, pod=name, stdout_bytes=len(out),
                                  stderr_bytes=len(err), source="saved"))
            return protocol.STATUS_OK, [self.spool.encode(), out, err]
        pod = self.cache.get(name) if name else None
        if pod is None:
            log.warning("%s", fields(event="output-missing", job=job, pod=name))
            return protocol.STATUS_NOTFOUND, [f"no pod {name!r} and no saved output".encode()]
        if not self._same_job(pod, owner, gjid):
            return protocol.STATUS_DENIED, [b"pod belongs to another job"]
        out, err, _split = self.read_logs(pod, self.output.max_bytes or 1)
        log.info("%s", fields(event="output-returned", job=job, pod=name, stdout_bytes=len(out),
                              stderr_bytes=len(err), source="pod"))
        return protocol.STATUS_OK, [self.spool.encode(), out, err]

    def _log(self, pod: PodInfo, stream: str | None, limit: int) -> bytes:
        self.bucket.acquire(self.stop_event)
        kwargs = {"container": "pilot", "limit_bytes": limit, "_preload_content": False,
                  "_request_timeout": self.request_timeout}
        if stream:
            kwargs["stream"] = stream
        try:
            resp = self.calls.read_namespaced_pod_log(pod.name, pod.namespace, **kwargs)
        except Exception as exc:
            self.prom.api_error("get", "pods/log", exc)
            raise
        return resp.data

    def read_logs(self, pod: PodInfo, limit: int) -> tuple[bytes, bytes, bool]:
        """(stdout, stderr, split): split when the API server honours `stream=` (Kubernetes ≥ 1.32 with
        PodLogsQuerySplitStreams), else the combined log as stdout and an empty stderr.

        Raises ApiException (404: the pod is gone) and transport errors; the caller decides.
        """
        if self._split_logs is None:
            with self._stream_probe:       # one probe: fetches that start meanwhile wait for its answer
                if self._split_logs is None:
                    return self._read_streams(pod, limit)
        if self._split_logs is False:
            return self._log(pod, None, limit), b"", False
        return self._read_streams(pod, limit)

    def _read_streams(self, pod: PodInfo, limit: int) -> tuple[bytes, bytes, bool]:
        """Ask for `Stdout` and `Stderr` apart, and learn from the answers whether the server splits."""
        try:
            out = self._log(pod, "Stdout", limit)
        except ApiException as exc:
            if not _rejects_stream(exc):     # anything but "this server refuses `stream`" is real
                raise
            self._split_logs = False
            return self._log(pod, None, limit), b"", False
        err = self._log(pod, "Stderr", limit)
        if err == out and out:
            self._split_logs = False   # the server ignores `stream`: both were the combined log
            return out, b"", False
        if err != out:
            self._split_logs = True
        return out, err, bool(self._split_logs)

    # -- list (`ce-k8s status`) --------------------------------------------------------------------

    def handle_list(self, uid: int) -> tuple[str, list[bytes]]:
        """Every pilot pod (and held or waiting job without one) the caller may see, as JSON rows in
        the shape of `ce_k8s.ops.status.PilotRow`. Root and the agent's uid see all; a pilot account
        sees its own jobs. Only ids, states and reasons: never an ad, a Secret or a log."""
        if not self.cache.ready.is_set():
            return protocol.STATUS_BUSY, [b"agent is still listing pods"]
        now = int(time.time())
        rows = []
        for name, pod in list(self.cache.pods.items()):
            rec = self.jobs.get(name)
            owner = pod.owner or (rec.owner if rec else "")
            if self.authorized(owner, uid):
                rows.append(self._pod_row(pod, rec, now))
        for name, rec in list(self.jobs.items()):
            if name in self.cache.pods or rec.cleaned or not rec.routed_job:
                continue
            waiting = rec.create.state in (CREATE_PENDING, CREATE_RETRY, CREATE_HOLD)
            if (rec.job_status == HELD or waiting) and self.authorized(rec.owner, uid):
                rows.append(_row(rec.routed_job, rec.source_job, rec.owner, rec.route, rec.namespace, name, "",
                                 "Gone" if rec.job_status == HELD else "", JOB_STATES.get(rec.job_status or 0, "?"),
                                 rec.attempt, None, rec.hold_reason, rec.reason or rec.create.message))
        return protocol.STATUS_OK, [json.dumps({"pilots": rows}, separators=(",", ":")).encode()]

    def _pod_row(self, pod: PodInfo, rec: JobRecord | None, now: int) -> dict[str, object]:
        phase = "Terminating" if pod.deleting and not pod.finished else pod.phase
        if pod.phase == "Failed" and pod.disrupted:
            phase = "Evicted"
        if rec is not None and rec.job_status is not None:
            status, hold, reason = JOB_STATES.get(rec.job_status, "?"), rec.hold_reason, rec.reason
        else:   # no update since this agent started: what the next update would say
            next_name = pod_name(pod.global_job_id, pod.attempt + 1) if pod.global_job_id else None
            job = JobView(pod_name=pod.name, attempt=pod.attempt, max_attempts=self.settings.max_attempts,
                          pending_timeout=self.settings.pending_timeout, pod_uid=pod.uid,
                          global_job_id=pod.global_job_id or None)
            attrs = decide(job, pod, None, CreateInfo(CREATE_DONE), now, self.settings.image_pull_timeout,
                           self.config_error_grace, next_name).attrs
            code = attrs.get("JobStatus")
            status = JOB_STATES.get(code, "?") if isinstance(code, int) else "?"
            hold, reason = str(attrs.get("HoldReason") or ""), str(attrs.get("K8sPodReason") or "")
        return _row(rec.routed_job if rec else "", (rec.source_job if rec else "") or pod.source_job,
                    pod.owner or (rec.owner if rec else ""), pod.route or (rec.route if rec else ""), pod.namespace,
                    pod.name, pod.node, phase, status, pod.attempt, pod.created, hold, reason)

    # -- metrics -----------------------------------------------------------------------------------

    def _gauges(self) -> dict[str, tuple[str, float]]:
        """Gauges computed at scrape time (see metrics.py)."""
        return {
            "ce_k8s_cache_pods": ("Pods in the agent's watch cache", float(len(self.cache.pods))),
            "ce_k8s_jobs_tracked": ("Routed jobs this agent process has heard of", float(len(self.jobs))),
            "ce_k8s_cache_lists": ("Full LISTs since the agent started (start and 410 Gone)", float(self.cache.lists)),
            "ce_k8s_outputs_stored": ("Pod outputs saved and not yet cleaned up", float(len(self.output))),
            "ce_k8s_creates_queued": ("Pods whose create or delete waits on the work queue",
                                      float(self.effects.waiting())),
            "ce_k8s_credential_refreshes_queued": ("Changed credential files waiting to be copied into Secrets",
                                                   float(self.effects.refreshes_waiting())),
        }

    # -- garbage collection ------------------------------------------------------------------------

    def _gc_loop(self) -> None:
        while not self.stop_event.wait(self.gc_interval):
            try:
                self.collect_garbage()
            except Exception as exc:
                log.exception("%s", fields(event="gc-failed", error=_short(exc)))

    def collect_garbage(self, now: float | None = None) -> list[str]:
        """Delete our pods whose job is gone; never a live pod whose job still calls the hooks.

        A pod is collected when its routed job was cleaned up (a cleanup call that failed to delete
        is retried here), or when it has finished and no hook has named it for `CE_K8S_GC_GRACE`
        (counted from the agent's start for pods it has not heard of since a restart). Saved output
        of pods that are gone is dropped after `max(2 × CE_K8S_GC_GRACE, 1 day)` (a finalize that
        never came, e.g. the job was removed while the agent was down).
        """
        now = time.time() if now is None else now
        grace = self.settings.gc_grace
        victims = []
        for name, pod in list(self.cache.pods.items()):
            if pod.deleting or self.deletions.covers(name, pod.uid or None):
                continue
            rec = self.jobs.get(name)
            last = rec.last_touch if rec and rec.last_touch else self.started_at
            released = self.journal.released_at(name) is not None
            if (rec and rec.cleaned and not released) or (pod.finished and now - last >= grace):
                victims.append(pod)
        collected = []
        for pod in victims:
            # The victim list is a snapshot: a cleanup or hold may have claimed the pod since.
            deletion, mine = self.deletions.claim(pod.name, pod.uid or None)
            if not mine:
                continue
            collected.append(pod)
            try:
                self._run_delete(deletion, pod.namespace, "gc", self._job_for(pod.name))
            except Exception as exc:
                log.warning("%s", fields(event="delete-failed", job=self._job_for(pod.name), pod=pod.name,
                                         namespace=pod.namespace, why="gc", error=_short(exc)))
        victims = collected + self._expire_releases(now)
        self.cache.forget_gone(now - max(grace, 600))
        self.deletions.prune(now - max(grace, 600))
        self._gc_accounting(now)
        self.journal.prune(now)
        self.output.prune(now - max(2 * grace, 86400), keep=set(self.cache.pods))
        self.fetches.prune(now - max(grace, 600), keep=set(self.cache.pods))
        with self.jobs_lock:
            for name in [n for n, r in self.jobs.items()
                         if r.create.state != CREATE_PENDING and n not in self.cache.pods
                         and now - max(r.last_touch, r.cleaned) >= 2 * max(grace, 600)]:
                del self.jobs[name]
                self._output_tries.pop(name, None)
        return [p.name for p in victims]

    def _expire_releases(self, now: float) -> list[PodInfo]:
        """Delete the released pods no re-routed job adopted within `CE_K8S_RELEASE_GRACE` of their
        last release; forget releases whose pod is gone. Returns the pods it deleted."""
        expired: list[tuple[PodInfo, Deletion]] = []
        for name, (_gjid, when) in self.journal.released().items():
            if now - when < self.options.release_grace:
                continue
            with self._release_lock:
                if self.journal.released_at(name) != when:
                    continue                    # renewed or adopted since the copy was taken
                pod = self.cache.get(name)
                if pod is None:
                    self.journal.record_unreleased(name)
                    continue
                if pod.deleting:
                    continue
                deletion, mine = self.deletions.claim(name, pod.uid or None)
                if not mine:
                    continue                    # another path deletes it (or did)
            expired.append((pod, deletion))     # an adoption from now on sees it as not live
        deleted = []
        for pod, deletion in expired:
            job = self._job_for(pod.name)
            try:
                self._run_delete(deletion, pod.namespace, "release", job)
                self.journal.record_unreleased(pod.name)
                deleted.append(pod)
            except Exception as exc:
                log.warning("%s", fields(event="delete-failed", job=job, pod=pod.name, namespace=pod.namespace,
                                         why="release", error=_short(exc)))
        return deleted


def _row(routed_job: str, source_job: str, owner: str, route: str, namespace: str, pod: str, node: str, phase: str,
         status: str, attempt: int, created: int | None, hold_reason: str, reason: str) -> dict[str, object]:
    """One `list` row: exactly the keys of `ce_k8s.ops.status.PilotRow` the agent knows (age is the client's)."""
    return {"routed_job": routed_job, "source_job": source_job, "owner": owner, "route": route,
            "namespace": namespace, "pod": pod, "node": node, "phase": phase, "status": status,
            "attempt": attempt, "created": created, "hold_reason": hold_reason, "reason": reason}


def _job_of(payload: bytes) -> str:
    """`ClusterId.ProcId` of a request payload, for a log line about a failed request."""
    attrs = adtext.scan(payload[:MAX_SCAN].decode("utf-8", "replace"), frozenset({"clusterid", "procid"}))
    return f"{attrs.get('clusterid', '?')}.{attrs.get('procid', '?')}"


MAX_SCAN = 1 << 20


def _rejects_stream(exc: ApiException) -> bool:
    """The API server refused the `stream` log option itself: 400 from a server that reads it as a
    bad parameter, or 422 `stream: Forbidden` from Kubernetes >= 1.32 with PodLogsQuerySplitStreams
    off (the default while the gate is alpha; validation of PodLogOptions, kubernetes#133005)."""
    if exc.status == 400:
        return True
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    return exc.status == 422 and "stream" in body


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) < 300 else text[:297] + "..."


def _with_warnings(desired: dict[str, object], rec: JobRecord, pod: PodInfo) -> dict[str, object]:
    """`desired` with the API server's warnings about this pod after its `K8sPodReason` (docs/agent.md
    "API server warnings"): while the job is idle or running on this very pod, never on a hold, a
    completion, a pod being deleted or a move to the next attempt (which gets its own pod's)."""
    if ("K8sPodReason" not in desired or "K8sPodName" in desired or pod.deleting
            or desired.get("K8sPodPhase") != pod.phase or desired.get("JobStatus") not in (IDLE, RUNNING)):
        return desired
    if pod.phase == "Pending":
        note = apiwarnings.join(rec.note_pending, rec.note_always)
    elif pod.phase == "Running":
        note = rec.note_always
    else:
        return desired
    if not note:
        return desired
    return {**desired, "K8sPodReason": apiwarnings.with_note(str(desired["K8sPodReason"] or ""), note)}


def _conflict_hold(pod: PodInfo) -> dict[str, object]:
    from ce_k8s.holds import hold_attributes

    attrs: dict[str, object] = {"JobStatus": 5, "GridJobStatus": "HELD"}
    attrs.update(hold_attributes("admission-denied", pod=pod.name,
                                 message="a pod of that name exists for another job or owner; not touched"))
    return attrs


__all__ = ["CREATE_DONE", "CREATE_HOLD", "CREATE_RETRY", "Agent", "JobRecord", "label_selector"]
