"""The agent: the one process that talks to Kubernetes for the hooks (DESIGN decisions 2-5).

Pieces, each in its own module:
* `cache.PodCache` — LIST+WATCH of our pods; every update is answered from it;
* `status.decide` — pod state → routed-job attributes (the table in docs/holds.md);
* `adtext` — the few ad lines the hot path reads and the lines it prints;
* `creator.Creator` — creates pod then Secret with bounded concurrency under the QPS budget;
* `server.HookServer` — the Unix socket, with the caller's uid from `SO_PEERCRED`.

State is only what Kubernetes and the routed ads hold (decision 4): `self.jobs` is a memory of
what this process did (creation in flight, last hook contact) and is rebuilt from the next hook
calls after a restart; pods are found again by the relist, and their names come from the ads.

In-process use (tests, `ce-k8s demo`): `Agent(settings, api_client, socket_path=...).start()` and
`.stop()`. `handle(verb, payload, uid)` is the whole request path without the socket.
"""

from __future__ import annotations

import dataclasses
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
from ce_k8s.agent import adtext
from ce_k8s.agent.cache import PodCache
from ce_k8s.agent.podinfo import LABEL_CE, LABEL_MANAGED_BY, MANAGER, PodInfo
from ce_k8s.agent.ratelimit import TokenBucket
from ce_k8s.agent.status import (
    CREATE_DONE,
    CREATE_HOLD,
    CREATE_NONE,
    CREATE_PENDING,
    CREATE_RETRY,
    CreateInfo,
    JobView,
    decide,
)
from ce_k8s.pods.names import label_value, pod_name, secret_name

log = logging.getLogger(__name__)

LOG_LIMIT_BYTES = 16 * 1024 * 1024
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
    namespace: str = ""
    caller_uid: int | None = None    # SO_PEERCRED uid that sent `ad_text` (sandbox ownership check)


def label_selector(ce_name: str) -> str:
    """Our pods: managed by ce-k8s and created by this CE (docs/internals.md "Identity")."""
    return f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_CE}={label_value(ce_name)}"


class Agent:
    """Watch cache + create queue + socket server; see the module docstring."""

    def __init__(self, settings, api_client, *, socket_path: str | None = None, spool: str | None = None,
                 request_timeout: float = 30.0, watch_timeout: int = 300,
                 config_error_grace: int = CONFIG_ERROR_GRACE, gc_interval: float | None = None) -> None:
        overrides = {k: v for k, v in (("socket", socket_path), ("spool", spool)) if v}
        if overrides:
            settings = dataclasses.replace(settings, **overrides)
        self.settings = settings
        self.core = k8s.CoreV1Api(api_client)
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
        self._deleting: set[str] = set()
        self._split_logs: bool | None = None   # does the API server honour `stream=` on pod logs?
        self.pool = ThreadPoolExecutor(max_workers=max(4, settings.create_concurrency), thread_name_prefix="ce-k8s-io")
        from ce_k8s.agent.creator import Creator

        self.creator = Creator(self)
        self.server = None
        self._gc_thread: threading.Thread | None = None
        self.metrics = {"updates": 0, "creates": 0, "adopted": 0, "deletes": 0, "denied": 0}

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, serve: bool = True, wait_ready: float | None = 30.0) -> Agent:
        """Start the watch, the create workers, the GC and (with `serve`) the socket server."""
        from ce_k8s.agent.server import HookServer

        self.stop_event.clear()
        self.started_at = time.time()
        self.cache.start()
        self.creator.start()
        self._gc_thread = threading.Thread(target=self._gc_loop, name="ce-k8s-gc", daemon=True)
        self._gc_thread.start()
        if serve:
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
        self.creator.stop()
        self.cache.stop()
        if self._gc_thread is not None:
            self._gc_thread.join(10)
        self.pool.shutdown(wait=True, cancel_futures=True)

    # -- request dispatch --------------------------------------------------------------------------

    def handle(self, verb: str, payload: bytes, uid: int) -> tuple[str, list[bytes]]:
        """One hook request → (status, reply parts); never raises."""
        try:
            text = payload.decode("utf-8", "surrogateescape")
            if verb == protocol.VERB_UPDATE:
                return self.handle_update(text, uid)
            if verb == protocol.VERB_CLEANUP:
                return self.handle_cleanup(text, uid)
            if verb == protocol.VERB_LOGS:
                return self.handle_logs(text, uid)
            if verb == protocol.VERB_PING:
                return protocol.STATUS_OK, [b"ce-k8s agent"]
            return protocol.STATUS_BAD, [f"unknown verb {verb}".encode()]
        except Exception as exc:
            log.exception("%s request failed", verb)
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
            log.warning("%s for job %s (Owner %r) refused: caller uid %d", verb, job, owner, uid)
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

    # -- update: the hot path -------------------------------------------------------------------

    def handle_update(self, text: str, uid: int) -> tuple[str, list[bytes]]:
        """Status lines for one routed job, from the cache; starts creation on first sight."""
        got = self._identify(text, uid, "update")
        if isinstance(got[0], str):
            return got
        attrs, name, owner = got
        self.metrics["updates"] += 1
        if not name:
            return protocol.STATUS_OK, [b""]          # not routed through our translate hook
        if not self.cache.ready.is_set():
            return protocol.STATUS_BUSY, [b"agent is still listing pods"]
        now = time.time()
        rec = self._record(name, owner)
        rec.last_touch = now
        pod = self.cache.get(name)
        s = self.settings
        gjid = adtext.unquote(attrs.get("k8ssourceglobaljobid"))
        if pod is not None and not self._same_job(pod, owner, gjid):
            line = adtext.changed_lines(_conflict_hold(pod), attrs)
            return protocol.STATUS_OK, [line.encode()]
        if pod is not None and rec.create.state in (CREATE_NONE, CREATE_RETRY):
            # The pod exists but this process did not finish creating it (restart, or a timeout
            # after the server accepted the create): the Secret may be missing. Re-run the create,
            # which adopts the pod (409) and ensures the Secret, when that can matter.
            waiting = pod.phase == "Pending" and pod.waiting_reason in NEEDS_SECRET_REASONS \
                and now - (pod.created or now) >= ENSURE_SECRET_AFTER
            if rec.create.state == CREATE_RETRY or waiting:
                if now >= rec.next_try:
                    self._queue_create(rec, text, uid)
            else:
                rec.create.state = CREATE_DONE     # found by the relist after a restart
        job = JobView(
            pod_name=name,
            attempt=adtext.as_int(attrs.get("k8sattempt")) or 0,
            max_attempts=adtext.as_int(attrs.get("k8smaxattempts")) or s.max_attempts,
            pending_timeout=adtext.as_int(attrs.get("k8spendingtimeout")) or s.pending_timeout,
            job_status=adtext.as_int(attrs.get("jobstatus")),
            pod_uid=adtext.unquote(attrs.get("k8spoduid")),
            job_start_date=adtext.as_int(attrs.get("jobstartdate")),
            global_job_id=gjid,
        )
        next_name = pod_name(gjid, job.attempt + 1) if gjid and job.attempt < 999_999 else None
        decision = decide(job, pod, self.cache.get_gone(name) if pod is None else None, rec.create, int(now),
                          s.image_pull_timeout, self.config_error_grace, next_name)
        if decision.create and now >= rec.next_try:
            self._queue_create(rec, text, uid)
        if decision.delete and pod is not None:
            self._delete_async(pod)
        return protocol.STATUS_OK, [adtext.changed_lines(decision.attrs, attrs).encode()]

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
        self.creator.submit(rec)

    # -- cleanup ---------------------------------------------------------------------------------

    def handle_cleanup(self, text: str, uid: int) -> tuple[str, list[bytes]]:
        """Delete the job's pods (this and earlier attempts) and Secrets; absent counts as done."""
        got = self._identify(text, uid, "cleanup")
        if isinstance(got[0], str):
            return got
        attrs, name, owner = got
        if not name:
            return protocol.STATUS_NOTFOUND, [b"no K8sPodName"]
        if not self.cache.ready.is_set():
            # "not found" before the relist could be a lie that leaks a running pod: retry later.
            return protocol.STATUS_BUSY, [b"agent is still listing pods"]
        rec = self._record(name, owner)
        with self.jobs_lock:
            rec.cleaned = rec.cleaned or time.time()
        gjid = adtext.unquote(attrs.get("k8ssourceglobaljobid"))
        attempt = adtext.as_int(attrs.get("k8sattempt")) or 0
        names = [name]
        if gjid:
            names += [pod_name(gjid, a) for a in range(attempt) if pod_name(gjid, a) != name]
        deleted = 0
        for n in names:
            pod = self.cache.get(n)
            if pod is not None and not self._same_job(pod, owner, gjid):
                log.warning("cleanup: pod %s/%s belongs to another job or owner; not touched", pod.namespace, n)
                continue
            if n != name and pod is None:
                continue
            namespace = pod.namespace if pod is not None else rec.namespace
            if not namespace:
                continue        # never created by us and not in the cache: nothing to delete
            deleted += self.delete_pod(n, namespace, pod.secrets if pod else (secret_name(n),))
        return (protocol.STATUS_OK if deleted else protocol.STATUS_NOTFOUND), [f"{deleted} pod(s) deleted".encode()]

    def delete_pod(self, name: str, namespace: str, secrets=()) -> int:
        """Delete a pod and its Secrets; 1 if the pod existed, 0 if not. Raises on other API errors."""
        existed = 0
        self.bucket.acquire(self.stop_event)
        try:
            self.core.delete_namespaced_pod(name, namespace, propagation_policy="Background",
                                            _preload_content=False, _request_timeout=self.request_timeout)
            existed = 1
            self.metrics["deletes"] += 1
            log.info("deleted pod %s/%s", namespace, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        for sname in secrets or (secret_name(name),):
            self.bucket.acquire(self.stop_event)
            try:
                self.core.delete_namespaced_secret(sname, namespace, _preload_content=False,
                                                   _request_timeout=self.request_timeout)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return existed

    def _delete_async(self, pod: PodInfo) -> None:
        if pod.deleting or pod.name in self._deleting:
            return
        self._deleting.add(pod.name)

        def run() -> None:
            try:
                self.delete_pod(pod.name, pod.namespace, pod.secrets)
            except Exception as exc:
                log.warning("delete of pod %s/%s failed: %s", pod.namespace, pod.name, exc)
            finally:
                self._deleting.discard(pod.name)

        try:
            self.pool.submit(run)
        except RuntimeError:          # shutting down
            self._deleting.discard(pod.name)

    # -- logs (finalize) -------------------------------------------------------------------------

    def handle_logs(self, text: str, uid: int) -> tuple[str, list[bytes]]:
        """[spool root, stdout, stderr] of the job's pod, for the finalize hook to write."""
        got = self._identify(text, uid, "logs")
        if isinstance(got[0], str):
            return got
        attrs, name, owner = got
        pod = self.cache.get(name) if name else None
        if pod is None:
            return protocol.STATUS_NOTFOUND, [f"no pod {name!r}".encode()]
        if not self._same_job(pod, owner, adtext.unquote(attrs.get("k8ssourceglobaljobid"))):
            return protocol.STATUS_DENIED, [b"pod belongs to another job"]
        out, err = self.read_logs(pod)
        return protocol.STATUS_OK, [self.spool.encode(), out, err]

    def _log(self, pod: PodInfo, stream: str | None) -> bytes:
        self.bucket.acquire(self.stop_event)
        kwargs = {"container": "pilot", "limit_bytes": LOG_LIMIT_BYTES, "_preload_content": False,
                  "_request_timeout": self.request_timeout}
        if stream:
            kwargs["stream"] = stream
        resp = self.core.read_namespaced_pod_log(pod.name, pod.namespace, **kwargs)
        return resp.data

    def read_logs(self, pod: PodInfo) -> tuple[bytes, bytes]:
        """(stdout, stderr), split when the API server supports `stream=` (Kubernetes ≥ 1.32 with
        PodLogsQuerySplitStreams), else the combined log as stdout and an empty stderr."""
        try:
            out = self._log(pod, "Stdout")
        except ApiException as exc:
            if exc.status == 404:
                return b"", b""
            return self._log(pod, None), b""
        if self._split_logs is False:
            return out, b""
        try:
            err = self._log(pod, "Stderr")
        except ApiException:
            return out, b""
        if err == out and out:
            self._split_logs = False   # the server ignores `stream`: both were the combined log
            return out, b""
        if err != out:
            self._split_logs = True
        return out, err

    # -- garbage collection ------------------------------------------------------------------------

    def _gc_loop(self) -> None:
        while not self.stop_event.wait(self.gc_interval):
            try:
                self.collect_garbage()
            except Exception:
                log.exception("garbage collection failed")

    def collect_garbage(self, now: float | None = None) -> list[str]:
        """Delete our pods whose job is gone; never a live pod whose job still calls the hooks.

        A pod is collected when its routed job was cleaned up (a cleanup call that failed to delete
        is retried here), or when it has finished and no hook has named it for `CE_K8S_GC_GRACE`
        (counted from the agent's start for pods it has not heard of since a restart).
        """
        now = time.time() if now is None else now
        grace = self.settings.gc_grace
        victims = []
        for name, pod in list(self.cache.pods.items()):
            if pod.deleting or name in self._deleting:
                continue
            rec = self.jobs.get(name)
            last = rec.last_touch if rec and rec.last_touch else self.started_at
            if (rec and rec.cleaned) or (pod.finished and now - last >= grace):
                victims.append(pod)
        for pod in victims:
            log.info("gc: deleting pod %s/%s (%s)", pod.namespace, pod.name, pod.phase)
            try:
                self.delete_pod(pod.name, pod.namespace, pod.secrets)
            except Exception as exc:
                log.warning("gc: delete of %s failed: %s", pod.name, exc)
        self.cache.forget_gone(now - max(grace, 600))
        with self.jobs_lock:
            for name in [n for n, r in self.jobs.items()
                         if r.create.state != CREATE_PENDING and n not in self.cache.pods
                         and now - max(r.last_touch, r.cleaned) >= 2 * max(grace, 600)]:
                del self.jobs[name]
        return [p.name for p in victims]


def _conflict_hold(pod: PodInfo) -> dict[str, object]:
    from ce_k8s.holds import hold_attributes

    attrs: dict[str, object] = {"JobStatus": 5, "GridJobStatus": "HELD"}
    attrs.update(hold_attributes("admission-denied", pod=pod.name,
                                 message="a pod of that name exists for another job or owner; not touched"))
    return attrs


__all__ = ["CREATE_DONE", "CREATE_HOLD", "CREATE_RETRY", "Agent", "JobRecord", "label_selector"]
