"""The condor_job_router emulator's per-job state machine: one managed job from claim to retirement.

JobRouter.cpp TakeOverJob → SubmitJob (the translate hook, then FinishSubmitJob: VanillaToGrid,
the route's transforms, the submission of the routed job) → CheckSubmittedJobStatus (the update
hook, UpdateRoutedJobStatus, FinishCheckSubmittedJobStatus) → FinalizeJob → CleanupJob →
CleanupRetiredJob, with RerouteJob and GracefullyRemoveJob (docs/hook-protocol.md §2.1-2.7). A step
that needs a hook asks the hook manager for it and returns; the hook's exit client
(``router_hookexits.py``) calls the step's ``finish_`` half.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import classad2

from ce_k8s.condor import wire
from ce_k8s.sim.condor.router_hookmgr import HookManager
from ce_k8s.sim.condor.router_hooks import HOOK_CLEANUP, HOOK_FINALIZE, HOOK_TRANSLATE, HOOK_UPDATE
from ce_k8s.sim.condor.router_records import RouterJob, RouteStats, State, route_test
from ce_k8s.sim.condor.router_writes import QueueWrites
from ce_k8s.sim.condor.schedd import JobStatus, PushRejected, Schedd, copy_ad, eval_int, eval_str, is_true

log = logging.getLogger("ce_k8s.sim.condor.router")  # one logger for the whole emulated daemon (demos silence it)


class JobSteps:
    """The steps of one router, each a no-op unless the job is in its state.

    ``jobs`` is the router's table (shared: a retired job leaves it here), ``rc``/``routes`` the
    ``RouterConfig`` and its routes by name, ``stats`` the routes' counters, ``abort`` the daemon's
    EXCEPT (it raises).
    """

    def __init__(self, *, rc: Any, routes: dict[str, Any], stats: dict[str, RouteStats], jobs: dict[str, RouterJob],
                 schedd: Schedd, schedd2: Schedd, hooks: HookManager, writes: QueueWrites, events: Counter[str],
                 clock: Callable[[], float], name: str, mirror_lag: int, release_on_hold: bool,
                 abort: Callable[[str], None]) -> None:
        self.rc = rc
        self.routes = routes
        self.stats = stats
        self.jobs = jobs
        self.schedd = schedd
        self.schedd2 = schedd2
        self.hooks = hooks
        self.writes = writes
        self.events = events
        self.clock = clock
        self.name = name
        self.mirror_lag = mirror_lag
        self.release_on_hold = release_on_hold
        self.abort = abort

    def take_over_job(self, job: RouterJob) -> None:
        if job.state != State.UNCLAIMED:
            return
        if job.edit_job_in_place:
            self.set_state(job, State.CLAIMED)
            return
        if self.schedd.claim_job(job.src_key, self.name):
            job.is_claimed = True
            self.set_state(job, State.CLAIMED)
        else:
            log.info("JobRouter failure (%s): candidate job could not be claimed", job.desc())
            self.gracefully_remove(job, "claim failed")

    def submit_job(self, job: RouterJob) -> None:
        if job.state != State.CLAIMED:
            return
        route = self.routes.get(job.route_name)
        if route is None:
            self.gracefully_remove(job, "route vanished before translate")
            return
        path = self.rc.hook_path(job.src_ad, HOOK_TRANSLATE)
        if path:
            line = route.route_info_line()
            self.hooks.spawn(job, HOOK_TRANSLATE, path, job.src_key, lambda: wire.translate_stdin(line, job.src_ad))
            return
        job.dest_ad = copy_ad(job.src_ad)
        self.finish_submit_job(job, translated=False)

    def finish_submit_job(self, job: RouterJob, translated: bool = True) -> None:
        """FinishSubmitJob: VanillaToGrid, transforms, submission (hook-protocol.md §2.2 "afterwards")."""
        if not job.edit_job_in_place:
            universe = eval_int(job.dest_ad, "JobUniverse") if "JobUniverse" in job.dest_ad else None
            if universe is None:
                self.abort(f"VanillaToGrid ({job.desc()}): job ad has no integer JobUniverse; "
                           "condor_job_router daemon aborts (hook-protocol.md §2.2)")
        route = self.routes.get(job.route_name)
        if route is None:
            self.gracefully_remove(job, "route vanished before submission")
            return
        try:
            result = self.rc.route_job(copy_ad(job.src_ad), route, translated=job.dest_ad if translated else None)
        except Exception as exc:  # a transform engine bug must not look like a pilot's fault
            log.exception("JobRouter failure (%s): applying the route raised", job.desc())
            self.events["transform_exception"] += 1
            self.gracefully_remove(job, f"route application raised {exc!r}")
            return
        for err in getattr(result, "errors", []) or []:
            log.warning("JobRouter (%s): transform: %s", job.desc(), err)
        if result.failed:
            self.gracefully_remove(job, "transform failed")
            return
        dest = result.ad
        if job.edit_job_in_place:
            self.writes.edit_in_place(job, dest)
            self.gracefully_remove(job, "edit in place done")
            return
        if "RoutedToJobId" in dest:
            del dest["RoutedToJobId"]
        if eval_str(job.src_ad, "Owner") is None:
            self.gracefully_remove(job, "source job has no Owner")
            return
        job.dest_ad = dest
        job.dest_key = self.schedd2.submit_routed(dest)
        job.dest_cluster = int(job.dest_key.split(".")[0])
        job.set_src("RoutedToJobId", job.dest_key)
        job.submission_time = self.clock()
        self.set_state(job, State.SUBMITTED)
        log.debug("JobRouter (%s): submitted job", job.desc())

    def check_submitted_job_status(self, job: RouterJob) -> None:
        if job.state != State.SUBMITTED:
            return
        if job.saw_dest_job:
            path = self.rc.hook_path(job.src_ad, HOOK_UPDATE)
            if path:
                rval = self.hooks.spawn(job, HOOK_UPDATE, path, job.dest_key,
                                        lambda: wire.sprint_ad(job.dest_ad).encode())
                if rval != 0:
                    return
        self.finish_check_submitted_job_status(job)

    def update_routed_job_status(self, job: RouterJob, update: classad2.ClassAd) -> None:
        """UpdateRoutedJobStatus: reload, merge, push every output attribute to SCHEDD2 (hook-protocol.md §2.3)."""
        current = self.schedd2.get(job.dest_key)
        if current is None:
            log.warning("JobRouter failure (%s): ad disappeared before update finished", job.desc())
            self.gracefully_remove(job, "routed job vanished during update")
            return
        job.saw_dest_job = True
        pairs = [(name, update.lookup(name)) for name in update.keys()]
        status = eval_int(current, "JobStatus")
        if status in (JobStatus.REMOVED, JobStatus.COMPLETED):
            # submit_job.cpp:424-434: a dirty JobStatus on a finished routed job is dropped.
            pairs = [(n, v) for n, v in pairs if n.lower() != "jobstatus"]
        try:
            self.schedd2.set_attributes(job.dest_key, pairs, as_user=True)
        except PushRejected as exc:
            log.warning("JobRouter failure (%s): failed to update routed job status: %s", job.desc(), exc)
            self.events["update_push_rejected"] += 1
            job.dest_ad = copy_ad(current)         # the transaction changed nothing
            self.gracefully_remove(job, f"update push rejected: {exc}")
            return
        # The reloaded ad with the update merged, copied once: the queue's ad after the push
        # (the next step would otherwise copy it a second time), or, if the push made the job
        # leave the queue, the ad as it was plus the update.
        after = self.schedd2.get(job.dest_key)
        if after is not None:
            job.dest_ad = copy_ad(after)
        else:
            job.dest_ad = copy_ad(current)
            for name, value in pairs:
                job.dest_ad[name] = value
        self.finish_check_submitted_job_status(job, dest_fresh=after is not None)

    def finish_check_submitted_job_status(self, job: RouterJob, dest_fresh: bool = False) -> None:
        """FinishCheckSubmittedJobStatus: mirror the routed job into the source job (hook-protocol.md §2.3).

        ``dest_fresh``: ``job.dest_ad`` is a copy of the queue's ad taken a moment ago, after
        UpdateRoutedJobStatus pushed (nothing ran in between), so it is not copied again.
        """
        src = self.schedd.get(job.src_key)
        if src is None:
            job.is_interrupted = True
            self.gracefully_remove(job, "source job gone")
            return
        src_status = eval_int(src, "JobStatus")
        if src_status is None:
            job.is_interrupted = True
            self.gracefully_remove(job, "source JobStatus unreadable")
            return
        if src_status == JobStatus.REMOVED:
            job.is_interrupted = True
            self.gracefully_remove(job, "source job removed")
            return
        if src_status == JobStatus.HELD and not is_true(src, "HoldCopiedFromTargetJob"):
            job.is_interrupted = True
            self.gracefully_remove(job, "source job held")
            return
        dest = self.schedd2.get(job.dest_key)
        if dest is None:
            age = self.clock() - job.submission_time
            if job.saw_dest_job:
                log.warning("JobRouter (%s): dest job was removed!", job.desc())
                self.gracefully_remove(job, "routed job gone")
            elif age > self.mirror_lag:
                self.gracefully_remove(job, "routed job never appeared")
            return
        if not dest_fresh:
            job.dest_ad = copy_ad(dest)
        job.saw_dest_job = True
        custom = list(self.rc.attrs_to_copy(job.src_ad) or [])  # empty without a keyword (hook-protocol.md §1.1)
        self.writes.update_job_status(src, job.dest_ad, job, custom)
        if job.src_dirty and not self.writes.push_src(job):
            log.warning("JobRouter failure (%s): failed to update src job", job.desc())
            self.gracefully_remove(job, "source push failed")
            return
        status = eval_int(dest, "JobStatus")
        if status is None:
            self.gracefully_remove(job, "routed JobStatus unreadable")
            return
        job.is_running = status in (JobStatus.RUNNING, JobStatus.TRANSFERRING_OUTPUT)
        if status == JobStatus.COMPLETED and (eval_int(dest, "JobFinishedHookDone", 0) or 0) != 0:
            self.set_state(job, State.FINISHED)

    def finalize_job(self, job: RouterJob) -> None:
        if job.state != State.FINISHED:
            return
        path = self.rc.hook_path(job.src_ad, HOOK_FINALIZE)
        if path:
            self.hooks.spawn(job, HOOK_FINALIZE, path, job.dest_key,
                             lambda: wire.finalize_stdin(job.src_ad, job.dest_ad))
            return
        self.finish_finalize_job(job)

    def reroute_job(self, job: RouterJob) -> None:
        """RerouteJob = SetJobIdle + GracefullyRemoveJob (hook-protocol.md §2.4): the pilot will run again."""
        self.events["rerouted"] += 1
        self.writes.set_job_idle(job)
        self.gracefully_remove(job, "rerouted")

    def finish_finalize_job(self, job: RouterJob) -> None:
        if eval_str(job.src_ad, "Owner") is None:
            self.writes.set_job_idle(job)
            self.gracefully_remove(job, "no Owner at finalize")
            return
        try:
            self.schedd2.set_attributes(job.dest_key, [("LeaveJobInQueue", False)], as_user=True)
            finalized = True
        except Exception as exc:
            log.warning("JobRouter failure (%s): failed to finalize job: %s", job.desc(), exc)
            finalized = False
        if not finalized:
            self.writes.set_job_idle(job)
        else:
            job.is_done = True
            route = self.routes.get(job.route_name)
            failed = route is not None and route_test(route, "job_failed", job.src_ad)
            job.is_success = not failed
            log.info("JobRouter (%s): finalized job", job.desc())
        self.gracefully_remove(job, "finalized" if finalized else "finalize failed")

    def cleanup_job(self, job: RouterJob) -> None:
        if job.state != State.CLEANUP:
            return
        path = self.rc.hook_path(job.src_ad, HOOK_CLEANUP)
        if path and len(job.dest_ad.keys()) > 0:
            self.hooks.spawn(job, HOOK_CLEANUP, path, job.dest_key, lambda: wire.sprint_ad(job.dest_ad).encode())
            return
        self.finish_cleanup_job(job)

    def finish_cleanup_job(self, job: RouterJob) -> None:
        if not job.is_done and job.dest_cluster != -1:
            if self.schedd2.remove(job.dest_key, "JobRouter aborted job"):
                job.dest_cluster = -1
            else:
                log.info("JobRouter (%s): failed to remove dest job (not in queue)", job.desc())
        if job.is_claimed:
            if not self.schedd.yield_job(job.src_key, job.is_done, self.name, self.release_on_hold):
                log.info("JobRouter (%s): failed to yield job (gone or not managed by us)", job.desc())
            job.is_claimed = False
        st = self.stats.get(job.route_name)
        if st is not None:
            if job.is_success:
                st.recent_succeeded += 1
            elif not job.is_interrupted:
                st.recent_failed += 1
        self.set_state(job, State.RETIRED)
        job.retirement_time = self.clock()
        job.route_name = ""

    def cleanup_retired_job(self, job: RouterJob) -> None:
        if job.state != State.RETIRED:
            return
        src = self.schedd.get(job.src_key)
        src_sync = src is None or not (
            eval_str(src, "Managed") == "External" and eval_str(src, "ManagedManager") == self.name)
        dest = self.schedd2.get(job.dest_key) if job.dest_key else None
        dest_sync = dest is None or eval_str(dest, "RoutedBy") != self.name
        if (src_sync and dest_sync) or self.clock() - job.retirement_time >= self.mirror_lag:
            if self.jobs.get(job.src_key) is job:
                del self.jobs[job.src_key]

    def gracefully_remove(self, job: RouterJob, why: str) -> None:
        job.history.append(f"CLEANUP:{why}")
        job.state = State.CLEANUP

    def set_state(self, job: RouterJob, state: State) -> None:
        job.history.append(state.value)
        job.state = state
