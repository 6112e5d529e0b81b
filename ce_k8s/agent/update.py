"""The `update` verb: the hot path. Status lines for one routed job, answered from memory.

Why from memory: the router forks an update hook for every routed job on every poll, so the
agent answers from the watch cache and its job records, with no API call (docs/agent.md "What the
agent does", Updates). The few ad lines it needs are read once into a `RoutedJob` (routedjob.py,
one scan of the text), the pod's state is mapped (status.py) and only the attributes whose
rendering differs from the ad's are printed.
The same reply starts what the job needs next: the pod's create on first sight (on the work
queue, effects.py), its delete when the job is held, a credential refresh, the adoption of a pod
an earlier routing of the same source job released (release.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ce_k8s import protocol
from ce_k8s.agent import adtext, apiwarnings
from ce_k8s.agent.access import same_job
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.outputsave import SAVING_OUTPUT
from ce_k8s.agent.routedjob import RoutedJob
from ce_k8s.agent.status import (
    COMPLETED,
    CREATE_DONE,
    CREATE_NONE,
    CREATE_PENDING,
    CREATE_RETRY,
    IDLE,
    RUNNING,
    decide,
)
from ce_k8s.pods.names import pod_name

if TYPE_CHECKING:
    from ce_k8s.agent.access import Access
    from ce_k8s.agent.cache import PodCache
    from ce_k8s.agent.credentials import CredentialRefresher
    from ce_k8s.agent.deleter import Deleter
    from ce_k8s.agent.effects import Effects
    from ce_k8s.agent.jobaccounting import JobAccounting
    from ce_k8s.agent.jobs import JobRecord, JobTable, WarningNotes
    from ce_k8s.agent.journal import PostJournal
    from ce_k8s.agent.outputsave import OutputSaver
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.agent.release import Releases
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)

# A pending pod seen for the first time after a restart gets its Secret re-ensured once it has
# waited this long in ContainerCreating (the agent may have died between pod and Secret).
ENSURE_SECRET_AFTER = 20
NEEDS_SECRET_REASONS = frozenset({"ContainerCreating", "CreateContainerConfigError", "PodInitializing"})


class Updates:
    """The update reply of one routed job, and the create, delete or refresh it starts."""

    def __init__(self, settings: Settings, access: Access, cache: PodCache, jobs: JobTable, journal: PostJournal,
                 releases: Releases, deleter: Deleter, effects: Effects, credentials: CredentialRefresher,
                 accounting: JobAccounting, saver: OutputSaver, metrics: dict[str, int],
                 config_error_grace: int, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock              # time.time(); a test passes its own (tests/agent/fakes.py)
        self.settings = settings
        self.access = access
        self.cache = cache
        self.jobs = jobs
        self.journal = journal
        self.releases = releases
        self.deleter = deleter
        self.effects = effects
        self.credentials = credentials
        self.accounting = accounting
        self.saver = saver
        self.metrics = metrics
        self.config_error_grace = config_error_grace

    def handle(self, text: str, uid: int) -> tuple[str, list[bytes]]:
        """Status lines for one routed job, from the cache; starts creation on first sight."""
        job = self.access.admit(text, uid, "update", (protocol.STATUS_OK, [b""]))
        if not isinstance(job, RoutedJob):
            return job                             # refused, or another backend's job
        self.metrics["updates"] += 1
        if not job.pod_name:
            return protocol.STATUS_OK, [b""]          # not routed through our translate hook
        if not self.cache.ready.is_set():
            return protocol.STATUS_BUSY, [b"agent is still listing pods"]
        return self._update(text, uid, job, job.pod_name, self.clock())

    def _never_created(self, rec: JobRecord, name: str) -> bool:
        """No pod of this name was ever made, as far as anything can tell (memory, cache, journal)."""
        return (rec.creation.info.state == CREATE_NONE and not rec.creation.seen_uid and not rec.creation.namespace
                and not self.journal.posted(name) and self.cache.get(name) is None
                and self.cache.get_gone(name) is None)

    def _renamed_after_cleanup(self, rec: JobRecord, name: str, job: RoutedJob) -> bool:
        """Whether a cleaned-up record must be forgotten: a routed job other than the cleaned one
        names a pod that never existed. A re-routed job can name a pod the cleanup of an earlier
        routing of the same source job already saw (when that cleanup released a live pod instead,
        or the source job never got `K8sAttempt` copied); without this its create would be refused
        for ever. A pod that existed is never made again this way (docs/design.md Decision 5)."""
        return bool(rec.cleanup.job) and job.job_id != rec.cleanup.job and self._never_created(rec, name)

    def _update(self, text: str, uid: int, job: RoutedJob, name: str, now: float,
                adopted: PodInfo | None = None, may_adopt: bool = True) -> tuple[str, list[bytes]]:
        """The update reply for pod `name` of the routed job `job` (read from `text`). `adopted`: the
        released pod a re-routed job is given instead of the never-created `K8sPodName` of its ad
        (`_adopt`); the reply then also names it."""
        owner = job.owner
        rec = self.jobs.record(name, owner)
        if rec.cleanup.asked_at and self._renamed_after_cleanup(rec, name, job):
            rec = self.jobs.fresh(name, owner)
        rec.last_touch = now
        if adopted is not None:
            rec.reporting.routed_job = ""           # another routed job owns the pod from now on
            rec.cleanup = rec.cleanup.cleared()
        if not rec.reporting.routed_job:
            rec.reporting.routed_job = job.job_id
            rec.reporting.source_job = job.routed_from
            rec.reporting.route = job.route_name
            # Another agent process answered an update for this pod name before (its reason line
            # is in the ad): before creating it, the creator looks for traces of an earlier pod (F1).
            rec.creation.check_history = job.replied and not job.pod_uid
            self.accounting.identities[name] = job.identity()   # for the attempt's history file
        pod = self.cache.get(name)
        s = self.settings
        gjid = job.source_global_job_id
        if pod is not None and not same_job(pod, owner, gjid):
            conflict = conflict_hold(pod)
            remember(rec, conflict, job)
            return protocol.STATUS_OK, [adtext.changed_lines(conflict, job.attrs).encode()]
        if pod is not None:
            rec.creation.seen_uid = pod.uid
            if adopted is None and self.journal.released_at(name) is not None:
                self.releases.claim(rec, pod)
        if pod is not None and rec.creation.info.state in (CREATE_NONE, CREATE_RETRY):
            # The pod exists but this process did not finish creating it (restart, or a timeout
            # after the server accepted the create): the Secret may be missing. Re-run the create,
            # which adopts the pod and ensures the Secret, when that can matter.
            needs_secret = pod.phase == "Pending" and pod.waiting_reason in NEEDS_SECRET_REASONS
            waited = now - (pod.created or now)
            if rec.creation.info.state == CREATE_RETRY or (needs_secret and waited >= ENSURE_SECRET_AFTER):
                if now >= rec.creation.next_try:
                    self.queue_create(rec, text, uid)
            elif not needs_secret:
                rec.creation.info.state = CREATE_DONE     # found by the relist after a restart, past the Secret
            # else (F2): a young pod still waiting, maybe for a Secret the dead agent never made:
            # stay undecided and look again at the next update, until ENSURE_SECRET_AFTER has passed.
        view = job.job_view(name, adopted.attempt if adopted is not None else job.attempt, s)
        next_name = pod_name(gjid, view.attempt + 1) if gjid and view.attempt < 999_999 else None
        rec.reporting.attempt = view.attempt
        gone = self.cache.get_gone(name) if pod is None else None
        decision = decide(view, pod, gone, rec.creation.info, int(now), s.image_pull_timeout, self.config_error_grace,
                          next_name)
        if (decision.create and may_adopt and adopted is None and gjid and rec.creation.info.state == CREATE_NONE
                and not rec.creation.seen_uid and not self.journal.posted(name)):
            # This name was never created (no pod, no tombstone, no post, no uid in the ad): a
            # re-routed job may find its live pod released by the cleanup of its last routing.
            target = self.releases.adoptable(name, owner, gjid)
            if target is not None:
                return self._adopt(text, uid, job, name, target, now)
        desired = decision.attrs
        if adopted is not None:
            desired = {"K8sPodName": name, "K8sAttempt": adopted.attempt, **desired}
        desired = self.accounting.with_usage(desired, pod or gone, job, now)
        if (rec.warnings.pending or rec.warnings.always) and pod is not None:
            desired = with_warnings(desired, rec.warnings, pod)
        if desired.get("JobStatus") == COMPLETED and not self.saver.saved(pod or gone, now):
            # Completion is reported only once the pod's log is safe on disk (output.py): the
            # finalize hook that follows must not depend on the pod or the API server.
            finished = pod or gone
            desired = {"K8sPodPhase": finished.phase if finished else "", "K8sPodReason": SAVING_OUTPUT}
        if decision.create and now >= rec.creation.next_try:
            self.queue_create(rec, text, uid)
        if decision.delete and pod is not None:
            self.deleter.delete_async(pod, why="hold", job=rec.reporting.routed_job)
        elif pod is not None and rec.creation.info.state == CREATE_DONE and not pod.finished and not pod.deleting:
            self.credentials.check(rec, job, text, uid, pod, now)     # a renewed proxy/token → its Secret
        new_status = desired.get("JobStatus")
        if new_status is not None and new_status != job.job_status:
            log.info("%s", fields(event="job-status", job=rec.reporting.routed_job, pod=name, status=new_status,
                                  was=job.attrs.get("jobstatus"),
                                  reason=desired.get("HoldReason") or desired.get("K8sPodReason")))
        remember(rec, desired, job)
        return protocol.STATUS_OK, [adtext.changed_lines(desired, job.attrs).encode()]

    def _adopt(self, text: str, uid: int, job: RoutedJob, name: str, target: PodInfo,
               now: float) -> tuple[str, list[bytes]]:
        """Give the re-routed job the released pod `target` instead of creating `name`: the reply sets
        `K8sPodName`/`K8sAttempt` to the pod's, the router applies it to the routed ad and pushes it to
        the schedd (JobRouter.cpp UpdateRoutedJobStatus), and from then on every hook names the pod."""
        if not self.releases.take(target, name):
            # the GC took it meanwhile: create as usual
            return self._update(text, uid, job, name, now, may_adopt=False)
        with self.jobs.lock:
            rec = self.jobs.get(name)
            if rec is not None and rec.creation.info.state == CREATE_NONE:
                del self.jobs[name]            # the never-created name leaves no trace to act on
        self.metrics["readopted"] += 1
        log.info("%s", fields(event="pod-adopted", job=job.job_id, pod=target.name, namespace=target.namespace,
                              source="released", alias=name, attempt=target.attempt))
        return self._update(text, uid, job, target.name, now, adopted=target)

    def queue_create(self, rec: JobRecord, text: str, uid: int | None = None) -> None:
        """Ask for the pod's create at its next turn on the work queue (effects.py), once: not while
        one is pending, never after the job's cleanup."""
        with self.jobs.lock:
            if rec.creation.info.state == CREATE_PENDING or rec.cleanup.asked_at:
                return
            rec.creation.info.state = CREATE_PENDING
            rec.creation.ad_text = text
            rec.creation.caller_uid = uid     # kept with the text: the sandbox is read on this uid's behalf
        self.effects.create(rec.pod_name)


def remember(rec: JobRecord, desired: dict[str, object], job: RoutedJob) -> None:
    """Keep the job state the router will hold after this reply (for `list`)."""
    rec.reporting.remember(desired, job.job_status, job.hold_reason, job.pod_reason or "")


def with_warnings(desired: dict[str, object], notes: WarningNotes, pod: PodInfo) -> dict[str, object]:
    """`desired` with the API server's warnings about this pod after its `K8sPodReason` (docs/agent.md
    "API server warnings"): while the job is idle or running on this very pod, never on a hold, a
    completion, a pod being deleted or a move to the next attempt (which gets its own pod's)."""
    if ("K8sPodReason" not in desired or "K8sPodName" in desired or pod.deleting
            or desired.get("K8sPodPhase") != pod.phase or desired.get("JobStatus") not in (IDLE, RUNNING)):
        return desired
    if pod.phase == "Pending":
        note = apiwarnings.join(notes.pending, notes.always)
    elif pod.phase == "Running":
        note = notes.always
    else:
        return desired
    if not note:
        return desired
    return {**desired, "K8sPodReason": apiwarnings.with_note(str(desired["K8sPodReason"] or ""), note)}


def conflict_hold(pod: PodInfo) -> dict[str, object]:
    """The hold of a job whose pod name is taken by another job's or owner's pod (never touched)."""
    from ce_k8s.holds import hold_attributes

    attrs: dict[str, object] = {"JobStatus": 5, "GridJobStatus": "HELD"}
    attrs.update(hold_attributes("admission-denied", pod=pod.name,
                                 message="a pod of that name exists for another job or owner; not touched"))
    return attrs
