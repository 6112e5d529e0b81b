"""Released pods: a live pod kept at a cleanup, for the re-routed job to adopt (docs/agent.md "Released pods").

Why: the router also cleans a routed job up when it could not push a status update to the schedd
(JobRouter.cpp UpdateRoutedJobStatus), and then routes the source job again. Deleting the pod
then would kill a running pilot for nothing, so the cleanup (cleanup.py) keeps a live pod whose
source job is not gone: it is *released* (journalled, `journal.PostJournal`), the re-routed job's
first update adopts it instead of creating its own never-created pod name (update.py), and the GC
deletes it if nobody does within `CE_K8S_RELEASE_GRACE` (garbage.py).

These decisions (release at cleanup, adoption at update, the GC's delete at the end of the grace)
must not cross: each takes `lock`.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.status import CREATE_DONE, HELD, CreateInfo, JobView, decide
from ce_k8s.pods.names import label_value, pod_name

if TYPE_CHECKING:
    from ce_k8s.agent.cache import PodCache
    from ce_k8s.agent.deletions import Deletions
    from ce_k8s.agent.jobs import JobRecord, JobTable
    from ce_k8s.agent.journal import PostJournal
    from ce_k8s.agent.options import AgentOptions
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.agent.routedjob import RoutedJob
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)


class Releases:
    """Which live pods a cleanup keeps, and which released pod a re-routed job may take over."""

    def __init__(self, settings: Settings, options: AgentOptions, cache: PodCache, jobs: JobTable,
                 journal: PostJournal, deletions: Deletions, metrics: dict[str, int], config_error_grace: int) -> None:
        self.settings = settings
        self.options = options
        self.cache = cache
        self.jobs = jobs
        self.journal = journal
        self.deletions = deletions
        self.metrics = metrics
        self.config_error_grace = config_error_grace
        # Serialises the decisions about released pods: release (cleanup), adoption (update) and
        # the GC's delete at the end of the grace must not cross.
        self.lock = threading.Lock()

    def live(self, pod: PodInfo | None) -> bool:
        """A pod that still does (or will do) the pilot's work: not finished, not being deleted, not
        disrupted (an evicted pod's job moves to the next attempt instead)."""
        return (pod is not None and not pod.finished and not pod.deleting and not pod.disruption
                and not self.deletions.covers(pod.name, pod.uid or None))

    @staticmethod
    def of_source(pod: PodInfo, owner: str, gjid: str) -> bool:
        """Stricter than `access.same_job`: the pod's annotations must name this source job and owner, and
        its name must be the one its attempt label gives (only then may another routed job use it)."""
        return (bool(gjid) and pod.global_job_id == gjid and bool(pod.owner)
                and pod.owner in (owner, label_value(owner)) and pod_name(gjid, pod.attempt) == pod.name)

    def held_by_agent(self, pod: PodInfo, job: RoutedJob, now: float) -> bool:
        """Whether the agent holds (or is about to hold) the job of `pod`: then its pod goes."""
        rec = self.jobs.get(pod.name)
        if (rec is not None and rec.reporting.job_status == HELD) or job.job_status == HELD:
            return True
        s = self.settings
        # the pod's own attempt and the route's limits only, not the ad's state (`RoutedJob.job_view` is the update's)
        view = JobView(pod_name=pod.name, attempt=pod.attempt, max_attempts=job.max_attempts or s.max_attempts,
                       pending_timeout=job.pending_timeout or s.pending_timeout)
        d = decide(view, pod, None, CreateInfo(CREATE_DONE), int(now), s.image_pull_timeout, self.config_error_grace,
                   None)
        return d.attrs.get("JobStatus") == HELD

    def keepable(self, name: str, names: list[str], owner: str, gjid: str | None, job: RoutedJob,
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
            if self.live(pod) and self.of_source(pod, owner, gjid) and not self.held_by_agent(pod, job, now):
                return pod
        return None

    def release(self, pod: PodInfo, gjid: str, job: str, source: str, verdict: str) -> bool:
        """Keep `pod` for a re-route if it is still live: journal it (renewing the grace) and make sure
        nothing deletes it for the routed job that was just cleaned up. False: deleted meanwhile,
        nothing left to keep."""
        with self.lock:
            if not self.live(self.cache.get(pod.name)):
                return False
            self.journal.record_release(pod.name, gjid)
            rec = self.jobs.get(pod.name)
            if rec is not None:
                with self.jobs.lock:
                    rec.cleanup = rec.cleanup.cleared()
                    rec.reporting.reason = (f"released at cleanup of {job}: kept {self.options.release_grace} s "
                                            "for a re-route")
            self.metrics["released"] += 1
            why = ("the source job will be routed again" if verdict != "unknown"
                   else "the source job's state is unknown (schedd unreachable or probe off)")
            log.info("%s", fields(event="pod-released", job=job, pod=pod.name, namespace=pod.namespace,
                                  source_job=source or None, source=verdict, why=why,
                                  grace_s=self.options.release_grace))
            return True

    def claim(self, rec: JobRecord, pod: PodInfo) -> None:
        """An update names a released pod directly: a routed job uses it again, so it is no longer
        released (the router re-adopted the routed job, or the re-routed job got the same name)."""
        with self.lock:
            self.journal.record_unreleased(pod.name)
        with self.jobs.lock:
            rec.cleanup = rec.cleanup.cleared()
        job = rec.reporting.routed_job or self.jobs.job_for(pod.name)
        log.info("%s", fields(event="pod-adopted", job=job, pod=pod.name,
                              namespace=pod.namespace, source="released", alias=None))

    def adoptable(self, name: str, owner: str, gjid: str) -> PodInfo | None:
        """A live pod of this source job and owner that this never-created `name` may take over: the
        pod `name` was already given to (the reply may have been lost), or a released one."""
        candidates = self.journal.released_for(gjid)
        alias = self.journal.alias_of(name)
        if alias is not None:
            candidates.append(alias)
        best = None
        for n in candidates:
            pod = self.cache.get(n)
            if n == name or not self.live(pod) or not self.of_source(pod, owner, gjid):
                continue
            if best is None or pod.attempt > best.attempt:
                best = pod
        return best

    def take(self, target: PodInfo, name: str) -> bool:
        """Give the released pod `target` to the never-created `name` (journalled as its alias), if it
        is still live; False when the GC took it meanwhile (the update then creates as usual)."""
        with self.lock:
            if not self.live(self.cache.get(target.name)):
                return False
            self.journal.record_adopt(target.name, name)
            return True
