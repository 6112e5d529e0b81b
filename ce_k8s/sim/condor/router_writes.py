"""The condor_job_router emulator's writes to the source job: the mirror of its routed job, the pushes.

VanillaToGrid.cpp ``update_job_status`` (the routed job's status and accounting copied into the
router's copy of the source job, marked dirty), PushUpdatedAttributes of the dirty attributes to
the source queue (SCHEDD1) as the job's user, setting a source job idle again, and the edit in
place of a route with ``EditJobInPlace`` (docs/hook-protocol.md §2.3, §2.4). The state machine
(``router_steps.py``) decides when; this says what is written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import classad2

from ce_k8s.sim.condor.router_records import RouterJob
from ce_k8s.sim.condor.schedd import JobStatus, PushRejected, Schedd, eval_int, eval_str, expr_text, is_true

log = logging.getLogger("ce_k8s.sim.condor.router")  # one logger for the whole emulated daemon (demos silence it)

# update_job_status() copies these from the routed job whenever they differ (VanillaToGrid.cpp).
STATUS_ATTRS_TO_COPY: tuple[str, ...] = (
    "BytesSent", "BytesRecvd", "CompletionDate", "JobRunCount", "JobStartDate", "ExitBySignal",
    "ExitSignal", "ExitCode", "ExitReason", "JobCurrentStartDate", "JobCurrentStartExecutingDate",
    "JobLastStartDate", "ShadowBday", "RemoteSysCpu", "RemoteUserCpu", "NumCkpts", "NumJobStarts",
    "NumJobReconnects", "NumShadowExceptions", "NumShadowStarts", "NumJobMatches", "NumRestarts",
    "RemoteWallClockTime", "LastRemoteWallClockTime", "JobCoreDumped", "ImageSize", "MemoryUsage",
    "ResidentSetSize", "ProportionalSetSizeKb", "DiskUsage", "ScratchDirFileCount",
    "SpooledOutputFiles", "CpusUsage", "CpusProvisioned", "DiskProvisioned", "MemoryProvisioned",
)


class QueueWrites:
    """The source-job writes of one router: ``schedd`` is the source queue, ``clock`` the router's."""

    def __init__(self, schedd: Schedd, clock: Callable[[], float]) -> None:
        self.schedd = schedd
        self.clock = clock

    def edit_in_place(self, job: RouterJob, dest: classad2.ClassAd) -> None:
        updates = []
        for name in dest.keys():
            if expr_text(job.src_ad, name) != expr_text(dest, name):
                updates.append((name, dest.lookup(name)))
        try:
            self.schedd.set_attributes(job.src_key, updates, as_user=True)
            for name in job.src_ad.keys():
                if name not in dest:
                    self.schedd.delete_attribute(job.src_key, name)
            job.is_success = job.is_done = True
        except PushRejected as exc:
            log.warning("JobRouter failure (%s): failed to edit job: %s", job.desc(), exc)

    def update_job_status(self, orig: classad2.ClassAd, newgrid: classad2.ClassAd, job: RouterJob,
                          custom: list[str]) -> None:
        """VanillaToGrid.cpp update_job_status: routed → source, into the router's copy."""
        origstatus = eval_int(orig, "JobStatus")
        newstatus = eval_int(newgrid, "JobStatus")
        if origstatus is None or newstatus is None:
            log.warning("JobRouter (%s): unable to read JobStatus for status sync", job.desc())
            return
        copied = is_true(orig, "HoldCopiedFromTargetJob")
        if origstatus != JobStatus.HELD and copied:
            job.set_src("HoldCopiedFromTargetJob", False)
        if origstatus != newstatus:
            if newstatus in (JobStatus.IDLE, JobStatus.RUNNING, JobStatus.TRANSFERRING_OUTPUT):
                target = JobStatus.IDLE if newstatus == JobStatus.IDLE else JobStatus.RUNNING
                if not (origstatus == JobStatus.HELD and not copied) and origstatus not in (
                        target, JobStatus.REMOVED):
                    job.set_src("JobStatus", int(target))
                    job.set_src("EnteredCurrentStatus", int(self.clock()))
                    if copied:
                        job.set_src("HoldCopiedFromTargetJob", False)
            elif newstatus == JobStatus.HELD:
                if origstatus not in (JobStatus.HELD, JobStatus.REMOVED, JobStatus.COMPLETED):
                    job.set_src("JobStatus", int(JobStatus.HELD))
                    job.set_src("EnteredCurrentStatus", int(self.clock()))
                    job.set_src("HoldReason", eval_str(newgrid, "HoldReason") or "Unknown reason")
                    job.set_src("HoldReasonCode", eval_int(newgrid, "HoldReasonCode", 0) or 0)
                    subcode = eval_int(newgrid, "HoldReasonSubCode", 0) or 0
                    if eval_str(newgrid, "HoldReason") is None:
                        subcode = 0
                    job.set_src("HoldReasonSubCode", subcode)
                    job.set_src("HoldCopiedFromTargetJob", True)
                    if "ReleaseReason" in job.src_ad:
                        job.set_src("LastReleaseReason", job.src_ad.lookup("ReleaseReason"))
                        del job.src_ad["ReleaseReason"]
                    job.set_src("NumSystemHolds", (eval_int(orig, "NumSystemHolds", 0) or 0) + 1)
            elif newstatus != JobStatus.REMOVED:
                job.set_src("JobStatus", newstatus)
        # The names are read once (one library call) instead of asking `name in newgrid`, which
        # evaluates the attribute: this runs for every routed job on every poll of the emulator.
        names = list(newgrid)
        present = {n.lower() for n in names}
        chirp = [n for n in names if n.lower().startswith("chirp")]
        for name in (*STATUS_ATTRS_TO_COPY, *custom, *chirp):
            if not name or name.lower() not in present:
                continue
            new_text = expr_text(newgrid, name)
            if expr_text(orig, name) != new_text:
                job.set_src(name, newgrid.lookup(name))

    def push_src(self, job: RouterJob) -> bool:
        """PushUpdatedAttributes for the source job (SCHEDD1), as the job's user."""
        if not job.src_dirty:
            return True
        pairs = [(name, job.src_ad.lookup(name)) for name in sorted(job.src_dirty) if name in job.src_ad]
        try:
            self.schedd.set_attributes(job.src_key, pairs, as_user=True)
        except Exception as exc:
            log.warning("JobRouter (%s): push to source failed: %s", job.desc(), exc)
            return False
        job.src_dirty.clear()
        return True

    def set_job_idle(self, job: RouterJob) -> None:
        if eval_int(job.src_ad, "JobStatus", JobStatus.IDLE) != JobStatus.IDLE:
            job.set_src("JobStatus", int(JobStatus.IDLE))
            if not self.push_src(job):
                log.warning("JobRouter failure (%s): failed to set src job status back to idle", job.desc())
