"""Accounting of each routed job's attempts (docs/accounting.md): usage in the update reply that ends
an attempt, and the attempt's per-job history file for APEL.

Why apart from accounting.py: that module measures (the kubelet's Summary API, the collector's
thread, the arithmetic of wall and CPU time) and knows nothing of routed jobs. This is the glue to
the agent: the watch tells the collector about pods (`usage_changed`), a settled attempt becomes a
history file named for its routed job (`attempt_settled`, retried by the GC, `collect`), and the
reply that ends an attempt carries its usage (`with_usage`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ce_k8s.agent.accounting import UsageCollector, attempt_wall, history_ad, routed_attrs
from ce_k8s.agent.history import HistoryWriter
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.outputsave import SAVING_OUTPUT
from ce_k8s.agent.status import COMPLETED, HELD, IDLE

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api

    from ce_k8s.agent.accounting import AttemptRecord
    from ce_k8s.agent.cache import PodCache
    from ce_k8s.agent.jobs import JobTable
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.agent.routedjob import RoutedJob
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)


class JobAccounting:
    """The usage collector (kubelet Summary API) and, with CE_K8S_PER_JOB_HISTORY_DIR, the
    per-job history writer for APEL."""

    def __init__(self, settings: Settings, api_client: ApiClient, core: CoreV1Api, cache: PodCache, jobs: JobTable,
                 *, request_timeout: float, acquire: Callable[[], object],
                 on_error: Callable[[str, str, BaseException], None]) -> None:
        s = self.settings = settings
        self.cache = cache
        self.jobs = jobs
        self.identities: dict[str, dict[str, str]] = {}      # pod name -> identity attrs of its routed ad
        self._history_retry: dict[str, AttemptRecord] = {}    # pod name -> record whose file failed
        self.history: HistoryWriter | None = None
        if s.per_job_history_dir:
            try:
                self.history = HistoryWriter(s.per_job_history_dir)
            except OSError as exc:
                log.error("%s", fields(event="history-dir-unusable", path=s.per_job_history_dir,
                                       error=exc.strerror))
        self.usage = UsageCollector(
            api_client, core, lambda: list(self.cache.pods.values()), interval=s.usage_interval,
            request_timeout=request_timeout, acquire=acquire, on_final=self.attempt_settled, on_error=on_error,
            source=s.usage_source, kubelet_ca=s.kubelet_ca, kubelet_insecure=s.kubelet_insecure)

    def usage_changed(self, name: str | None) -> None:
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

    def attempt_settled(self, record: AttemptRecord) -> None:
        """An attempt's usage is final: write its per-job history file (once; retried by the GC)."""
        pod = record.pod
        job = self.jobs.job_for(pod.name)
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
        ad = history_ad(record, self.settings.ce_name, self.identities.get(pod.name),
                        rec.reporting.routed_job if rec is not None else "")
        try:
            path = self.history.write(pod.uid or pod.name, ad)
            self._history_retry.pop(pod.name, None)
            if path:
                log.info("%s", fields(event="history-written", pod=pod.name, path=path))
        except OSError as exc:
            self._history_retry[pod.name] = record
            log.warning("%s", fields(event="history-write-failed", pod=pod.name, error=exc.strerror, action="retry"))

    def with_usage(self, desired: dict[str, object], pod: PodInfo | None, job: RoutedJob,
                   now: float) -> dict[str, object]:
        """Add the attempt's usage to a reply that ends the attempt (completed, held, next attempt).

        HTCondor's `RemoteWallClockTime` is cumulative over a job's runs and `LastRemoteWallClockTime`
        is the last run's: the ending attempt's wall time is added to the routed ad's current value
        (idempotent: that value is the ad's before this transition, and after it the old pod is never
        looked at again). A completion waits, like for its output, until the attempt's final Summary
        read is done (`OutputSaver._save` does it first; at most `accounting.SETTLE_WAIT` seconds); an
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
        out["RemoteWallClockTime"] = round(job.remote_wall_clock_time + wall, 3)
        out["LastRemoteWallClockTime"] = wall
        return out

    def collect(self, now: float) -> None:
        """The GC's part: retry failed history writes; forget usage of pods long gone; prune old markers."""
        if self.history is None and self.settings.per_job_history_dir:
            try:
                self.history = HistoryWriter(self.settings.per_job_history_dir)
            except OSError:
                pass                    # logged at start; the records wait in _history_retry
        for record in list(self._history_retry.values()):
            self.attempt_settled(record)
        keep = set(self.cache.pods) | set(self.cache.gone)
        self.usage.forget(keep)
        for name in [n for n in self.identities if n not in keep and n not in self.jobs]:
            del self.identities[name]
        if self.history is not None:
            self.history.prune(now)
