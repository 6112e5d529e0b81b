"""The condor_job_router emulator's hook exit clients: what a finished hook's output does to its job.

TranslateClient, StatusClient, ExitClient and CleanupClient ``hookExited`` of
JobRouterHookMgr.cpp, with the stdout and exit-status rules of docs/hook-protocol.md §2.2-2.5:
each reads one finished call (handed over by ``router_hookmgr.py``) and moves the job on through
the state machine (``router_steps.py``), or leaves it to retry at the next poll.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import classad2

from ce_k8s.condor import wire
from ce_k8s.sim.condor.router_hooks import HOOK_CLEANUP, HOOK_FINALIZE, HOOK_TRANSLATE, HOOK_UPDATE, HookCall
from ce_k8s.sim.condor.router_records import RouterJob
from ce_k8s.sim.condor.router_steps import JobSteps
from ce_k8s.sim.condor.router_writes import QueueWrites
from ce_k8s.sim.condor.schedd import Schedd, copy_ad

log = logging.getLogger("ce_k8s.sim.condor.router")  # one logger for the whole emulated daemon (demos silence it)


class HookExits:
    """The four exit clients; ``by_hook`` maps a hook type to its client, for the hook manager."""

    def __init__(self, steps: JobSteps, writes: QueueWrites, schedd: Schedd, events: Counter[str]) -> None:
        self.steps = steps
        self.writes = writes
        self.schedd = schedd
        self.events = events
        self.by_hook: dict[str, Callable[[RouterJob, HookCall], None]] = {
            HOOK_TRANSLATE: self.translate_exited,
            HOOK_UPDATE: self.update_exited,
            HOOK_FINALIZE: self.finalize_exited,
            HOOK_CLEANUP: self.cleanup_exited,
        }

    @staticmethod
    def _parse(call: HookCall) -> classad2.ClassAd:
        return wire.parse_hook_output(call.stdout.decode(errors="replace"),
                                      source=f"{call.hook} stdout of {call.argv[0]}")

    # --- TranslateClient::hookExited (JobRouterHookMgr.cpp, hook-protocol.md §2.2)
    def translate_exited(self, job: RouterJob, call: HookCall) -> None:
        if call.stdout and call.exited_ok:
            try:
                ad = self._parse(call)
            except wire.HookOutputError as exc:
                log.warning("TRANSLATE (%s): failed to insert line into ClassAd, ignoring invalid "
                            "hook output: %s", job.desc(), exc)
                self.events["translate_parse_error"] += 1
                self.steps.gracefully_remove(job, "translate output did not parse")
                return
            job.dest_ad = ad
        else:
            if call.exited_ok:
                log.info("TRANSLATE (%s): hook returned no data; translating again next poll", job.desc())
                self.events["translate_retry"] += 1
            else:
                log.warning("TRANSLATE (%s): hook exited with status %s, ignoring output",
                            job.desc(), call.exit_code)
                self.events["translate_failed"] += 1
                self.steps.gracefully_remove(job, f"translate exited {call.exit_code}")
            return
        self.steps.finish_submit_job(job)

    # --- StatusClient::hookExited (hook-protocol.md §2.3)
    def update_exited(self, job: RouterJob, call: HookCall) -> None:
        if call.stdout and call.exited_ok:
            try:
                ad = self._parse(call)
            except wire.HookOutputError as exc:
                log.warning("UPDATE (%s): invalid hook output, job status NOT updated: %s", job.desc(), exc)
                self.events["update_parse_error"] += 1
                self.steps.gracefully_remove(job, "update output did not parse")
                return
            for name in ("MyType", "TargetType"):
                if name in ad:
                    del ad[name]
            self.steps.update_routed_job_status(job, ad)
        elif call.exited_ok:
            self.steps.finish_check_submitted_job_status(job)
        else:
            log.debug("UPDATE (%s): hook exited with status %s; no status sync this cycle",
                      job.desc(), call.exit_code)
            self.events["update_failed"] += 1

    # --- ExitClient::hookExited (hook-protocol.md §2.4)
    def finalize_exited(self, job: RouterJob, call: HookCall) -> None:
        if call.stdout and call.exited_ok:
            try:
                ad = self._parse(call)
            except wire.HookOutputError as exc:
                log.warning("FINALIZE (%s): invalid hook output: %s", job.desc(), exc)
                self.events["finalize_parse_error"] += 1
                self.steps.reroute_job(job)
                return
            saved = copy_ad(job.src_ad)
            saved_dirty = set(job.src_dirty)
            for name in ad.keys():
                job.set_src(name, ad.lookup(name))
            if not self.writes.push_src(job):
                log.warning("FINALIZE (%s): failed to update src job in job queue", job.desc())
                mirror = self.schedd.snapshot(job.src_key)
                job.src_ad = mirror if mirror is not None else saved
                job.src_dirty = set() if mirror is not None else saved_dirty
                self.steps.reroute_job(job)
                return
        if not call.exited_ok:
            self.events["finalize_failed"] += 1
            self.steps.reroute_job(job)
        else:
            self.steps.finish_finalize_job(job)

    # --- CleanupClient::hookExited (hook-protocol.md §2.5)
    def cleanup_exited(self, job: RouterJob, call: HookCall) -> None:
        if call.signaled or call.exit_code == 0:
            self.steps.finish_cleanup_job(job)
        else:
            log.error("CLEANUP (%s): HOOK_JOB_CLEANUP (%s) failed (exit %s); retrying next poll",
                      job.desc(), call.argv[0], call.exit_code)
            self.events["cleanup_failed"] += 1
