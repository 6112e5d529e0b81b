"""The agent: the one process that talks to Kubernetes for the hooks (docs/design.md Decisions 2-5).

`Agent` is the lifecycle only: it constructs the parts, starts and stops their threads, and hands
each hook request to its verb. Each part gets the collaborators it uses, not the agent.

Pieces, each in its own module:
* `cache.PodCache` — LIST+WATCH of our pods; every update is answered from it;
* `jobs.JobTable` — what this process knows about each pod name (`JobRecord`, in parts: creation,
  cleanup, reporting, warnings, credentials);
* `access.Access` — the SO_PEERCRED rule and which routed ads are ours, for every verb;
* `update.Updates` — the `update` verb, the hot path: the reply, and the create, delete or
  credential refresh it starts;
* `cleanup.Cleanups` — the `cleanup` verb: delete the job's pods, or release a live one;
* `logs.Logs` — the `logs` verb and the reading of a pod's log (split streams where the server can);
* `listing.Listing` — the `list` verb (`ce-k8s status`);
* `status.decide` — pod state → routed-job attributes (the table in docs/holds.md);
* `adtext` — the few ad lines the hot path reads and the lines it prints;
* `effects.Effects` — the one keyed work queue of the pod writes (create, queued deletes, refreshes);
* `creator.Creator` — creates pod then Secret with bounded concurrency under the QPS budget;
* `apiwarnings` — the API server's `Warning` headers on those writes: logged, counted, and named
  in `K8sPodReason` where the pod will not do what the route meant (never a hold);
* `credentials.CredentialRefresher` — a proxy/token renewed in the spool patched into the live
  pod's Secret (a `stat` per update, the copy on its pod's turn of the work queue);
* `deleter.Deleter` — the delete of a pod, once, whichever path asks (with `deletions.Deletions`,
  which pods a delete path has claimed);
* `release.Releases` — live pods kept at a cleanup for the re-routed job to adopt;
* `garbage.GarbageCollector` — the periodic pass: pods whose job is gone, expired releases, old memory;
* `outputsave.OutputSaver` — each finished pod's log, saved before completion is reported
  (`output.OutputStore` on disk; `outputfetch.OutputFetches`: one log fetch per pod, and none
  written after the pod's cleanup);
* `jobaccounting.JobAccounting` — each attempt's usage in its reply and its per-job history file
  (`accounting.UsageCollector` measures);
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
`.stop()`. `handle(verb, payload, uid)` is the whole request path without the socket. The API
calls, the pod cache, the I/O pool and the clock may be passed in instead of made from
`api_client`: tests/agent/fakes.py builds an agent on in-memory ones, with no server (docs/agent.md
"Testing the agent's decisions").
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor

from kubernetes import client as k8s

from ce_k8s import protocol
from ce_k8s.agent import adtext
from ce_k8s.agent.access import Access
from ce_k8s.agent.cache import PodCache
from ce_k8s.agent.cleanup import Cleanups
from ce_k8s.agent.corecalls import CoreCalls
from ce_k8s.agent.creator import Creator
from ce_k8s.agent.credentials import CredentialRefresher
from ce_k8s.agent.deleter import Deleter
from ce_k8s.agent.deletions import Deletions
from ce_k8s.agent.effects import Effects
from ce_k8s.agent.garbage import GarbageCollector
from ce_k8s.agent.jobaccounting import JobAccounting
from ce_k8s.agent.jobs import JobRecord, JobTable
from ce_k8s.agent.journal import PostJournal
from ce_k8s.agent.listing import Listing
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.logs import Logs
from ce_k8s.agent.metrics import AgentMetrics
from ce_k8s.agent.options import AgentOptions, default_output_dir
from ce_k8s.agent.output import OutputStore
from ce_k8s.agent.outputfetch import OutputFetches
from ce_k8s.agent.outputsave import OutputSaver
from ce_k8s.agent.podinfo import LABEL_CE, LABEL_MANAGED_BY, MANAGER
from ce_k8s.agent.release import Releases
from ce_k8s.agent.sourceprobe import SourceProbe, make_source_probe
from ce_k8s.agent.status import CREATE_DONE, CREATE_HOLD, CREATE_RETRY
from ce_k8s.agent.update import Updates
from ce_k8s.pods.names import label_value
from ce_k8s.ratelimit import TokenBucket

log = logging.getLogger(__name__)

# How long a pod may show CreateContainerConfigError before it is held: the Secret is created right
# after the pod (creator.py), so a few seconds of it are normal.
CONFIG_ERROR_GRACE = 120


def label_selector(ce_name: str) -> str:
    """Our pods: managed by ce-k8s and created by this CE (docs/internals.md "Identity")."""
    return f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_CE}={label_value(ce_name)}"


class Agent:
    """Watch cache + work queue + verbs + GC + socket server; see the module docstring."""

    def __init__(self, settings, api_client, *, socket_path: str | None = None, spool: str | None = None,
                 request_timeout: float = 30.0, watch_timeout: int = 300,
                 config_error_grace: int = CONFIG_ERROR_GRACE, gc_interval: float | None = None,
                 options: AgentOptions | None = None, source_probe: SourceProbe | None = None,
                 core: k8s.CoreV1Api | None = None, calls: CoreCalls | None = None, cache: PodCache | None = None,
                 pool: Executor | None = None, clock: Callable[[], float] = time.time) -> None:
        """`api_client` makes the API collaborators; `core`, `calls` and `cache` replace them (tests
        give in-memory ones, tests/agent/fakes.py, and then `api_client` may be None), `pool` the
        I/O threads (log saves, socket requests), and `clock` is the `time.time()` of the verbs,
        the GC, the journal, the delete book and the credential refreshes' back-off."""
        overrides = {k: v for k, v in (("socket", socket_path), ("spool", spool)) if v}
        if overrides:
            settings = dataclasses.replace(settings, **overrides)
        self.settings = settings
        self.options = options = options or AgentOptions()
        self.core = core if core is not None else k8s.CoreV1Api(api_client)
        # the per-pilot calls, without the typed round trip
        self.calls = calls if calls is not None else CoreCalls(api_client)
        self.request_timeout = request_timeout
        self.bucket = TokenBucket(settings.qps, settings.burst)
        self.cache = cache if cache is not None else PodCache(self.core, label_selector(settings.ce_name),
                                                              watch_timeout=watch_timeout,
                                                              request_timeout=request_timeout)
        self.jobs = JobTable(self.cache)
        self.stop_event = threading.Event()
        # Every delete path (cleanup, hold, the creator's undo, GC, release expiry) claims the pod
        # here first: one delete call per pod (deletions.py; docs/agent.md "Deleting a pod once").
        self.deletions = Deletions(clock)
        self.pool = pool if pool is not None else ThreadPoolExecutor(max_workers=max(4, settings.create_concurrency),
                                                                     thread_name_prefix="ce-k8s-io")
        # The pod writes (create, and every delete but the cleanup hook's own) on one keyed work
        # queue: one effect per pod at a time, per-pod back-off (effects.py).
        self.effects = Effects(settings.create_concurrency, lambda name: self.creator.turn(name), self.stop_event)
        self.server = None
        self.metrics = {"updates": 0, "creates": 0, "adopted": 0, "deletes": 0, "denied": 0, "released": 0,
                        "readopted": 0, "credentials_refreshed": 0}
        self.output = OutputStore(options.output_dir or default_output_dir(settings.spool), options.max_output_bytes)
        self.journal = PostJournal(self.output.directory, clock=clock)
        self.fetches = OutputFetches()                 # log fetches in flight; pods whose cleanup ran
        self.prom = AgentMetrics(pods=lambda: self.cache.pods.values(), last_event=lambda: self.cache.last_event,
                                 extra=self._gauges)
        self.cache.on_error = lambda verb, exc: self.prom.api_error(verb, "pods", exc)
        # The parts: each gets the collaborators it uses.
        self.access = Access(settings, self.metrics)
        self.deleter = Deleter(settings, self.calls, self.core, self.bucket, self.stop_event, request_timeout,
                               self.prom, self.metrics, self.deletions, self.effects, self.jobs)
        self.creator = Creator(settings, self.jobs, self.cache, self.journal, self.core, self.calls, self.bucket,
                               self.stop_event, request_timeout, self.prom, self.metrics, self.deleter, self.effects,
                               seed=lambda rec, built, read_at: self.credentials.seed(rec, built, read_at))
        # Refreshed proxies/tokens into running pods' Secrets.
        self.credentials = CredentialRefresher(settings, self.core, self.effects, self.stop_event, self.prom,
                                               self.metrics, self.creator, clock=clock)
        self.accounting = JobAccounting(settings, api_client, self.core, self.cache, self.jobs,
                                        request_timeout=request_timeout,
                                        acquire=lambda: self.bucket.acquire(self.stop_event),
                                        on_error=lambda verb, res, exc: self.prom.api_error(verb, res, exc))
        self.usage = self.accounting.usage
        self.logs = Logs(settings, self.access, self.cache, self.output, self.calls, self.bucket, self.stop_event,
                         request_timeout, self.prom)
        self.saver = OutputSaver(self.cache, self.output, self.fetches, self.pool, self.usage, self.logs, self.jobs,
                                 self.prom)
        self.cache.listeners.append(self.saver.pod_changed)
        self.cache.listeners.append(self.accounting.usage_changed)
        self.releases = Releases(settings, options, self.cache, self.jobs, self.journal, self.deletions, self.metrics,
                                 config_error_grace)
        self.updates = Updates(settings, self.access, self.cache, self.jobs, self.journal, self.releases, self.deleter,
                               self.effects, self.credentials, self.accounting, self.saver, self.metrics,
                               config_error_grace, clock=clock)
        # Cleanup of a live pod asks the probe about the source job (docs/agent.md "Released pods").
        probe = source_probe if source_probe is not None else make_source_probe(options.source_probe)
        self.cleanups = Cleanups(options, self.access, self.cache, self.jobs, self.journal, self.releases,
                                 self.deleter, self.saver, probe, clock=clock)
        self.listing = Listing(settings, self.access, self.cache, self.jobs, config_error_grace, clock=clock)
        interval = gc_interval if gc_interval is not None else min(60.0, max(settings.gc_grace / 4, 1.0))
        self.garbage = GarbageCollector(settings, options, self.cache, self.jobs, self.journal, self.deletions,
                                        self.deleter, self.releases, self.output, self.fetches, self.saver,
                                        self.accounting, self.stop_event, interval, clock=clock)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, serve: bool = True, wait_ready: float | None = 30.0) -> Agent:
        """Start the watch, the create workers, the GC and (with `serve`) the socket server."""
        from ce_k8s.agent.server import HookServer

        self.stop_event.clear()
        started_at = time.time()
        self.cache.start()
        self.effects.start()
        self.usage.start()
        self.garbage.start(started_at)
        if serve:
            if self.options.metrics_address:
                self.prom.serve(self.options.metrics_address)
            self.server = HookServer(self.settings.socket, self.handle, self.pool)
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
        self.garbage.stop()
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
                return self.updates.handle(text, uid)
            if verb == protocol.VERB_CLEANUP:
                return self.cleanups.handle(text, uid)
            if verb == protocol.VERB_LOGS:
                return self.logs.handle(text, uid)
            if verb == protocol.VERB_LIST:
                return self.listing.handle(uid)
            if verb == protocol.VERB_PING:
                return protocol.STATUS_OK, [b"ce-k8s agent"]
            return protocol.STATUS_BAD, [f"unknown verb {verb}".encode()]
        except Exception as exc:
            job = _job_of(payload)
            log.exception("%s", fields(event="request-failed", verb=verb, job=job, error=type(exc).__name__))
            return protocol.STATUS_ERROR, [f"{type(exc).__name__}: {exc}".encode()[:2000]]

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


def _job_of(payload: bytes) -> str:
    """`ClusterId.ProcId` of a request payload, for a log line about a failed request."""
    attrs = adtext.scan(payload[:MAX_SCAN].decode("utf-8", "replace"), frozenset({"clusterid", "procid"}))
    return f"{attrs.get('clusterid', '?')}.{attrs.get('procid', '?')}"


MAX_SCAN = 1 << 20


__all__ = ["CREATE_DONE", "CREATE_HOLD", "CREATE_RETRY", "Agent", "JobRecord", "label_selector"]
