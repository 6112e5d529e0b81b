"""Each finished pod's log, saved when the pod finishes; its completion reported only once it is saved.

Why: the finalize hook that follows a completion must not depend on the pod or the API server
(the pod may be deleted, the server down), so the agent reads the log of every pod that will
complete its job as soon as it finishes (a watch listener, `pod_changed`) and stores it
(output.py); the update reply keeps the job running with `K8sPodReason = "saving the pod's output"`
until it is on disk (`saved`). A save that fails is retried with a back-off, `OUTPUT_TRIES` times,
before the completion is reported anyway, without output: a pilot must never hang on its log.
The book of fetches in flight and of pods whose cleanup ran is outputfetch.py's.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from kubernetes.client.exceptions import ApiException

from ce_k8s.agent.logfmt import fields, short_error
from ce_k8s.agent.status import completes
from ce_k8s.pods.names import label_value
from ce_k8s.ratelimit import backoff

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from ce_k8s.agent.accounting import UsageCollector
    from ce_k8s.agent.cache import PodCache
    from ce_k8s.agent.jobs import JobTable
    from ce_k8s.agent.logs import Logs
    from ce_k8s.agent.metrics import AgentMetrics
    from ce_k8s.agent.output import OutputStore, SavedOutput
    from ce_k8s.agent.outputfetch import OutputFetches
    from ce_k8s.agent.podinfo import PodInfo

log = logging.getLogger(__name__)

# Saving a finished pod's log is retried this often (API errors, a full disk) before the agent
# reports the completion anyway, without output: a pilot must never hang on its log.
OUTPUT_TRIES = 5
SAVING_OUTPUT = "saving the pod's output"


class OutputSaver:
    """Starts, runs and ends the log saves (on the agent's I/O pool); `tries` counts their failures."""

    def __init__(self, cache: PodCache, output: OutputStore, fetches: OutputFetches, pool: ThreadPoolExecutor,
                 usage: UsageCollector, logs: Logs, jobs: JobTable, prom: AgentMetrics) -> None:
        self.cache = cache
        self.output = output
        self.fetches = fetches
        self.pool = pool
        self.usage = usage
        self.logs = logs
        self.jobs = jobs
        self.prom = prom
        self.tries: dict[str, tuple[int, float]] = {}   # name -> (failures, next try time)

    def pod_changed(self, name: str | None) -> None:
        """Watch listener: start saving the log of every pod that just finished (or, after a LIST, of
        every finished pod whose log is not saved yet). Runs on the watch thread: only cheap checks."""
        if name is None:
            for pod in list(self.cache.pods.values()):
                if pod.finished:
                    self.want(pod)
            return
        pod = self.cache.pods.get(name)
        if pod is not None and pod.finished:
            self.want(pod)

    def want(self, pod: PodInfo, now: float | None = None) -> None:
        """Queue a log fetch for a finished pod that will complete its job, unless saved, queued or
        closed by its cleanup. The watch thread and update hooks call this for the same pod at once:
        `fetches.begin` decides, checking "saved" again under the lock the save is written under."""
        if pod.name in self.fetches or self.output.has(pod.name, pod.uid) or not completes(pod):
            return
        tries = self.tries.get(pod.name)
        if tries is not None and (tries[0] >= OUTPUT_TRIES or (now or time.time()) < tries[1]):
            return
        generation = self.fetches.begin(pod.name, pod.uid, saved=lambda: self.output.has(pod.name, pod.uid))
        if generation is None:
            return
        try:
            self.pool.submit(self._save, pod, generation)
        except RuntimeError:       # shutting down
            self.fetches.end(pod.name, generation)

    def saved(self, pod: PodInfo | None, now: float) -> bool:
        """Whether completion may be reported: output saved, or saving it is hopeless."""
        if pod is None or self.output.has(pod.name, pod.uid):
            return True
        if self.fetches.closed(pod.name, pod.uid):
            self.fetches.reopen(pod.name)     # a new routing of the job names it again (outputfetch.py)
        tries = self.tries.get(pod.name)
        if tries is not None and tries[0] >= OUTPUT_TRIES:
            return True            # given up (logged): report the completion without output
        if self.cache.get(pod.name) is None:
            # The pod is gone: its log is gone with it. Save a "lost" entry (in the pool, never on
            # this thread) so finalize can say why, then report.
            self.want(pod, now)
            return pod.name not in self.fetches and self.output.has(pod.name)
        self.want(pod, now)
        return False

    def forget(self, name: str, uid: str | None, owner: str, gjid: str | None) -> None:
        """Drop the saved output of `name` if it is this job's (finalize ran: hook-protocol.md §2.5 follows §2.4),
        and close the pod's output for good: a fetch in flight discards its result, and the
        deletion's own watch events start no new one (outputfetch.py)."""
        def remove() -> None:
            meta = self.output.meta(name)
            if meta is not None and meta.owner in (owner, label_value(owner)) \
                    and not (gjid and meta.global_job_id and meta.global_job_id != gjid):
                self.output.remove(name)
        self.fetches.close(name, uid, remove)
        self.tries.pop(name, None)

    def _save(self, pod: PodInfo, generation: int) -> None:
        """Read the finished pod's log (bounded) and store it; a vanished pod leaves a 'lost' entry.
        Nothing is stored when the pod's cleanup ran while the log was read (outputfetch.py)."""
        job = self.jobs.job_for(pod.name)
        self.usage.settle_pod(pod)       # its final usage first: the completion carries it (accounting.py)
        try:
            meta = self._commit(pod, generation, self._fetch(pod))
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
            self._failed(pod, generation, job, exc)
        finally:
            self.fetches.end(pod.name, generation)

    def _fetch(self, pod: PodInfo) -> tuple[bytes, bytes, bool, str]:
        """(stdout, stderr, split, lost) of a finished pod: its log through the API (one read per
        stream the server splits, else one), or why there is none. Raises on errors worth a retry."""
        if self.output.max_bytes <= 0:
            return b"", b"", False, "output return is off (CE_K8S_MAX_OUTPUT_BYTES = 0)"
        try:
            out, err, split = self.logs.read(pod, self.output.max_bytes + 1)
        except ApiException as exc:
            if exc.status not in (400, 404):
                raise
            return b"", b"", False, (f"the pod's log could not be read (HTTP {exc.status}: pod deleted "
                                     "before ce-k8s saved it)")
        return out, err, split, ""

    def _commit(self, pod: PodInfo, generation: int, fetched: tuple[bytes, bytes, bool, str]) -> SavedOutput | None:
        """Store a fetched log unless the pod's cleanup closed this fetch since it began: None then.
        Written under the book's lock, which the cleanup's removal also takes, so a result can never
        land after the cleanup removed the entry."""
        out, err, split, lost = fetched
        with self.fetches.committing(pod.name, generation) as current:
            if not current:
                return None
            meta = self.output.save(pod.name, uid=pod.uid, namespace=pod.namespace, owner=pod.owner,
                                    global_job_id=pod.global_job_id, out=out, err=err, split=split, lost=lost)
            self.tries.pop(pod.name, None)
            return meta

    def _failed(self, pod: PodInfo, generation: int, job: str, exc: Exception) -> None:
        """Count a failed fetch toward OUTPUT_TRIES with a back-off, unless the pod was closed meanwhile."""
        with self.fetches.committing(pod.name, generation) as current:
            if not current:
                return
            failures = self.tries.get(pod.name, (0, 0.0))[0] + 1
            self.tries[pod.name] = (failures, time.time() + backoff(failures, base=1.0, cap=30.0))
        final = failures >= OUTPUT_TRIES
        if final:
            self.prom.outputs.labels("failed").inc()
        log.warning("%s", fields(event="output-failed", job=job, pod=pod.name, attempt=failures,
                                 error=short_error(exc), action="report completion without output" if final
                                 else "retry"))
