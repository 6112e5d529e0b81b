"""The JobRouter emulator against docs/hook-protocol.md: stdin bytes, hook outcomes, state machine.

Each test drives the emulator with real hook processes (tests/sim/fake_hooks) whose behaviour is
chosen per call, and asserts the consequence the reference documents for that behaviour.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fake_hooks"))

from harness import T0, FakeClock, config_text, install_hooks, pilot, set_mode

from ce_k8s.condor.config import CondorConfig
from ce_k8s.sim.condor.router import Router, RouterAborted, State
from ce_k8s.sim.condor.router_hooks import HOOK_CLEANUP, HOOK_FINALIZE, HOOK_TRANSLATE, HOOK_UPDATE
from ce_k8s.sim.condor.schedd import Schedd


@dataclass
class Bed:
    hooks: Path
    schedd: Schedd
    router: Router
    clock: FakeClock

    def mode(self, hook: str, mode: str, proc: int | None = None) -> None:
        set_mode(self.hooks, hook, mode, proc)

    def step(self, n: int = 1) -> None:
        """n polls, each followed by the reaper callbacks of every hook it started."""
        for _ in range(n):
            self.router.poll()
            assert self.router.settle(timeout=30)
            self.clock.advance(10)  # JOB_ROUTER_POLLING_PERIOD

    def calls(self, hook: str) -> list:
        return [c for c in self.router.calls if c.hook == hook]

    def src(self, job: str):
        return self.schedd.get(job)


@pytest.fixture
def make_bed(tmp_path):
    made: list[Router] = []

    def make(**cfg) -> Bed:
        clock = FakeClock(T0)
        hooks = install_hooks(tmp_path)
        config = CondorConfig.from_text(config_text(hooks, **cfg), name=str(tmp_path / "condor_config"))
        schedd = Schedd(name="ce.example.org", clock=clock)
        router = Router(config, schedd, env={"FAKE_HOOK_DIR": str(hooks)}, hook_timeout=20, clock=clock)
        made.append(router)
        return Bed(hooks, schedd, router, clock)

    yield make
    for router in made:
        router.close()


# ----------------------------------------------------------------------------- stdin bytes
def test_translate_stdin_is_route_line_dashes_and_sorted_source_ad(make_bed):
    """hook-protocol.md §2.2: route line (new-style, no newline), "\\n------\\n", sPrintAd(src) sorted by bytes."""
    bed = make_bed()
    job = bed.schedd.submit(pilot(ClusterId=4711), owner="cmspilot")
    bed.step()
    (call,) = bed.calls(HOOK_TRANSLATE)
    assert call.argv == [str(bed.hooks / "translate")]
    expected = (
        '[ Name = "K8s"; GridResource = "batch k8s"; TargetUniverse = 9 ]\n'
        "------\n"
        "ClusterId = 1\n"
        'Cmd = "glidein_startup.sh"\n'
        f"EnteredCurrentStatus = {T0}\n"
        f'GlobalJobId = "ce.example.org#{job}#{T0}"\n'
        "JobStatus = 1\n"
        "JobUniverse = 5\n"
        "LeaveJobInQueue = JobStatus == 4\n"
        'Owner = "cmspilot"\n'
        "ProcId = 0\n"
        f"QDate = {T0}\n"
        "RequestCpus = 8\n"
        'x509userproxy = "/var/lib/condor-ce/spool/4711/0/cluster4711.proc0.subproc0/x509up"\n'
    ).encode()
    assert call.stdin == expected
    assert call.key == job


def test_private_attributes_never_reach_a_hook(make_bed):
    """hook-protocol.md §2.2: sPrintAd drops ClaimId, Capability, TransferKey, _condor_priv* (case-insensitive)."""
    bed = make_bed()
    bed.schedd.submit(pilot(ClaimId="secret", capability="x", _CONDOR_PRIV_Thing=1, TransferKey="k"))
    bed.step()
    text = bed.calls(HOOK_TRANSLATE)[0].stdin.decode()
    for name in ("ClaimId", "capability", "_CONDOR_PRIV_Thing", "TransferKey"):
        assert f"\n{name} = " not in text


def test_update_and_finalize_stdin_layout(make_bed):
    """hook-protocol.md §2.3: update gets sPrintAd(routed ad); §2.4: finalize has an empty line before the dashes."""
    bed = make_bed()
    job = bed.schedd.submit(pilot())
    bed.step(2)  # translate + submit, then first status check (routed job seen)
    bed.mode("update", "complete 3")
    bed.step(2)  # update says completed -> FINISHED; next poll runs finalize
    update = bed.calls(HOOK_UPDATE)[0]
    assert update.stdin.startswith(b"BytesRecvd = ") or update.stdin.split(b"\n")[0] < update.stdin.split(b"\n")[1]
    names = [line.split(b" = ")[0] for line in update.stdin.splitlines()]
    assert names == sorted(names)
    assert b'RoutedBy = "htcondor-ce"\n' in update.stdin
    assert f'RoutedFromJobId = "{job}"\n'.encode() in update.stdin
    assert b"LeaveJobInQueue = JobStatus == 4\n" in update.stdin
    (final,) = bed.calls(HOOK_FINALIZE)
    src_part, sep, dest_part = final.stdin.partition(b"\n------\n")
    assert sep and src_part.endswith(b"\n"), "sPrintAd(src) ends with \\n, so an empty line precedes ------"
    assert b"\n\n------\n" in final.stdin
    assert f"RoutedToJobId = \"{bed.router.jobs[job].dest_key}\"".encode() in src_part
    assert b"JobFinishedHookDone = " in dest_part


def test_no_arguments_and_inherited_environment(make_bed):
    """hook-protocol.md §2.1: argv is [path]; the environment is the router's plus CONDOR_INHERIT."""
    bed = make_bed()
    bed.schedd.submit(pilot())
    bed.step()
    call = bed.calls(HOOK_TRANSLATE)[0]
    assert call.argv == [str(bed.hooks / "translate")]
    assert "CONDOR_INHERIT" in bed.router._env
    assert bed.router._env["PATH"] == os.environ["PATH"]


# ----------------------------------------------------------------------------- translate outcomes
def test_translate_success_submits_routed_job_with_transforms(make_bed):
    """hook-protocol.md §2.2: output replaces the ad, then VanillaToGrid, transforms, router stamps, submit_job."""
    bed = make_bed()
    job = bed.schedd.submit(pilot(x509UserProxySubject="/DC=org/CN=pilot"))
    bed.step()
    rj = bed.router.jobs[job]
    assert rj.state == State.SUBMITTED
    routed = bed.schedd.get(rj.dest_key)
    assert routed.eval("JobUniverse") == 9 and routed.eval("Remote_JobUniverse") == 5
    assert routed.eval("GridResource") == "batch k8s"
    assert routed.eval("RoutedJob") is True
    assert routed.eval("RouteName") == "K8s" and routed.eval("RoutedFromJobId") == job
    assert routed.eval("Managed") == "ScheddDone" and routed.eval("ManagedManager") == "fake"
    assert "x509UserProxySubject" not in routed, "secure attributes dropped at submit (hook-protocol.md §2.2)"
    assert str(routed.lookup("LeaveJobInQueue")) == "JobStatus == 4"
    src = bed.src(job)
    assert src.eval("Managed") == "External" and src.eval("ManagedManager") == "htcondor-ce"


def test_translate_empty_output_retries_next_poll(make_bed):
    """hook-protocol.md §2.2: exit 0 with no stdout = do nothing; the job stays CLAIMED and translate runs again."""
    bed = make_bed()
    bed.mode("translate", "empty")
    job = bed.schedd.submit(pilot())
    bed.step(3)
    assert len(bed.calls(HOOK_TRANSLATE)) == 3
    assert bed.router.jobs[job].state == State.CLAIMED
    assert bed.src(job).eval("Managed") == "External"
    bed.mode("translate", "default")
    bed.step()
    assert bed.router.jobs[job].state == State.SUBMITTED


@pytest.mark.parametrize("mode", ["exit 1", "badline"])
def test_translate_failure_is_graceful_removal_then_reroute(make_bed, mode):
    """hook-protocol.md §2.2: non-zero exit or a bad line -> CLEANUP without cleanup hook, yield, routed again later."""
    bed = make_bed()
    bed.mode("translate", mode)
    job = bed.schedd.submit(pilot())
    bed.step()
    assert bed.router.jobs[job].state == State.CLEANUP
    bed.step()  # CleanupJob: no dest ad -> no hook; yield; RETIRED; then forgotten
    assert bed.calls(HOOK_CLEANUP) == []
    assert bed.src(job).eval("Managed") == "Schedd"
    assert bed.src(job).eval("JobStatus") == 1
    assert "RoutedToJobId" not in bed.src(job)
    bed.mode("translate", "default")
    bed.step(2)
    assert len(bed.calls(HOOK_TRANSLATE)) == 2
    assert bed.router.jobs[job].state == State.SUBMITTED


@pytest.mark.parametrize("mode", ["nouniverse", "whitespace"])
def test_translate_without_jobuniverse_aborts_the_router(make_bed, mode):
    """hook-protocol.md §2.2: VanillaToGrid EXCEPTs on an ad without JobUniverse (e.g. whitespace-only stdout)."""
    bed = make_bed()
    bed.mode("translate", mode)
    bed.schedd.submit(pilot())
    bed.router.poll()
    bed.router.runner.wait(30)
    with pytest.raises(RouterAborted, match="JobUniverse"):
        bed.router.poll()
    with pytest.raises(RouterAborted):
        bed.router.poll()


def test_translate_killed_by_signal_counts_as_exit_zero(make_bed):
    """hook-protocol.md §2.1: WEXITSTATUS of a signalled hook is 0, so its output is used."""
    bed = make_bed()
    bed.mode("translate", "signal")
    job = bed.schedd.submit(pilot())
    bed.step()
    call = bed.calls(HOOK_TRANSLATE)[0]
    assert call.signal == 9 and call.exit_code == 0
    assert bed.router.jobs[job].state == State.SUBMITTED


def test_world_writable_hook_is_treated_as_unconfigured(make_bed):
    """hook-protocol.md §1.1: a path that fails the checks means no hook: plain routing, nothing logged as error."""
    bed = make_bed()
    os.chmod(bed.hooks / "translate", 0o777)
    job = bed.schedd.submit(pilot())
    bed.step()
    assert bed.calls(HOOK_TRANSLATE) == []
    routed = bed.schedd.get(bed.router.jobs[job].dest_key)
    assert "ManagedManager" not in routed  # the fake translate would have set it


def test_hook_process_group_is_killed_after_exit(make_bed, tmp_path):
    """hook-protocol.md §2.1: Kill_Family after the hook exits: a background child never finishes its work."""
    bed = make_bed()
    marker = tmp_path / "child-ran"
    bed.mode("translate", f"background {marker}")
    bed.schedd.submit(pilot())
    bed.step()
    time.sleep(1.5)
    assert not marker.exists()


# ----------------------------------------------------------------------------- update outcomes
def _submitted(bed: Bed) -> tuple[str, str]:
    job = bed.schedd.submit(pilot())
    bed.step(2)  # translate+submit; first status check sees the routed job
    rj = bed.router.jobs[job]
    assert rj.state == State.SUBMITTED and rj.saw_dest_job
    return job, rj.dest_key


def test_update_runs_only_after_routed_job_seen_and_syncs_source(make_bed):
    """hook-protocol.md §2.3: no update before SawDestJob; running routed job -> source running + copied attrs."""
    bed = make_bed()
    job = bed.schedd.submit(pilot())
    bed.step(2)
    assert bed.calls(HOOK_UPDATE) == []
    bed.mode("update", "running")
    bed.step()
    assert len(bed.calls(HOOK_UPDATE)) == 1
    src = bed.src(job)
    assert src.eval("JobStatus") == 2
    assert "JobCurrentStartDate" in src
    assert src.eval("K8sPodPhase") == "Running", "<KW>_ATTRS_TO_COPY is mirrored"
    assert src.eval("RoutedToJobId") == bed.router.jobs[job].dest_key


def test_update_parse_error_removes_routed_job_and_requeues_source(make_bed):
    """hook-protocol.md §2.3: one bad line -> GracefullyRemoveJob: routed job removed, cleanup, source idle again."""
    bed = make_bed()
    job, dest = _submitted(bed)
    bed.mode("update", "badline")
    bed.step()
    assert bed.router.jobs[job].state == State.CLEANUP
    bed.mode("update", "default")
    bed.step()
    assert len(bed.calls(HOOK_CLEANUP)) == 1
    assert bed.src(job).eval("JobStatus") == 1 and bed.src(job).eval("Managed") == "Schedd"
    # The routed job is Managed = "ScheddDone", the schedd's own (docs/internals.md "Routed jobs"),
    # so condor_rm destroys it at once. With the routed job gone and the source yielded, the
    # RETIRED record is forgotten at the next poll (hook-protocol.md §2.5 step 4) without waiting for
    # MAX_JOB_MIRROR_UPDATE_LAG, and the pilot is routed again.
    assert bed.schedd.get(dest) is None and bed.schedd.history[dest].eval("JobStatus") == 3
    bed.step(2)
    assert bed.router.jobs[job].dest_key not in ("", dest), "the pilot is routed again"


def test_update_nonzero_exit_means_no_sync_this_cycle(make_bed):
    """hook-protocol.md §2.3: exit != 0 -> output ignored and FinishCheckSubmittedJobStatus not run."""
    bed = make_bed()
    job, dest = _submitted(bed)
    bed.schedd.set_attributes(dest, {"JobStatus": 2})  # the routed job runs (as if a hook said so)
    bed.mode("update", "exit 1")
    bed.step(2)
    assert bed.src(job).eval("JobStatus") == 1
    assert bed.router.jobs[job].state == State.SUBMITTED
    bed.mode("update", "default")
    bed.step()
    assert bed.src(job).eval("JobStatus") == 2


def test_update_signalled_output_is_applied(make_bed):
    """hook-protocol.md §2.1: a signal-killed update hook counts as exit 0 and its output is parsed."""
    bed = make_bed()
    job, _ = _submitted(bed)
    bed.mode("update", "signal")
    bed.step()
    assert bed.src(job).eval("JobStatus") == 2


def test_update_of_immutable_attribute_is_a_push_failure(make_bed):
    """hook-protocol.md §2.3: Owner is in SYSTEM_IMMUTABLE_JOB_ATTRS -> push fails -> routed job removed."""
    bed = make_bed()
    job, dest = _submitted(bed)
    bed.mode("update", "immutable")
    bed.step()
    assert bed.router.jobs[job].state == State.CLEANUP
    assert bed.schedd.get(dest).eval("Owner") == "cmspilot"


def test_routed_hold_is_mirrored_and_undone_on_yield(make_bed):
    """hook-protocol.md §2.3 update_job_status: HELD copied with reason/codes and HoldCopiedFromTargetJob."""
    bed = make_bed()
    job, _ = _submitted(bed)
    bed.mode("update", "hold")
    bed.step()
    src = bed.src(job)
    assert src.eval("JobStatus") == 5 and src.eval("HoldReasonCode") == 3
    assert src.eval("HoldReasonSubCode") == 42 and src.eval("HoldCopiedFromTargetJob") is True
    assert src.eval("NumSystemHolds") == 1


# ----------------------------------------------------------------------------- finish / finalize / cleanup
def test_completion_needs_jobfinishedhookdone_then_finalize_and_cleanup(make_bed):
    """hook-protocol.md §2.3-2.5: JobStatus 4 + JobFinishedHookDone -> FINISHED -> finalize -> cleanup -> ScheddDone."""
    bed = make_bed()
    job, dest = _submitted(bed)
    bed.schedd.set_attributes(dest, {"JobStatus": 4})  # completed but no JobFinishedHookDone
    bed.step()
    assert bed.router.jobs[job].state == State.SUBMITTED
    bed.mode("update", "complete 3")
    bed.step(3)
    assert [len(bed.calls(h)) for h in (HOOK_FINALIZE, HOOK_CLEANUP)] == [1, 1]
    src = bed.src(job)
    assert src.eval("JobStatus") == 4 and src.eval("ExitCode") == 3
    assert src.eval("Managed") == "ScheddDone" and src.eval("ManagedManager") == ""
    routed = bed.schedd.get(dest)
    assert routed is None or routed.eval("LeaveJobInQueue") is False


def test_finalize_output_updates_source_job(make_bed):
    """hook-protocol.md §2.4: finalize stdout is merged into the source ad and pushed to SCHEDD1."""
    bed = make_bed()
    job, _ = _submitted(bed)
    bed.mode("finalize", "attrs")
    bed.mode("update", "complete 0")
    bed.step(3)
    assert bed.src(job).eval("FinalizedBy") == "fake"


@pytest.mark.parametrize("mode", ["exit 1", "badline"])
def test_finalize_failure_reroutes_the_pilot(make_bed, mode):
    """hook-protocol.md §2.4: finalize exit != 0 or a bad line -> RerouteJob: source idle, routed removed, new route."""
    bed = make_bed()
    job, dest = _submitted(bed)
    bed.mode("finalize", mode)
    bed.mode("update", "complete 0")
    bed.step(2)  # update -> FINISHED; finalize fails -> CLEANUP
    assert bed.router.jobs[job].state == State.CLEANUP
    assert bed.src(job).eval("JobStatus") == 1
    bed.mode("update", "default")
    bed.step()
    bed.clock.advance(600)  # RETIRED until MAX_JOB_MIRROR_UPDATE_LAG (hook-protocol.md §2.5 step 4)
    bed.step(2)
    assert bed.router.jobs[job].dest_key not in ("", dest)
    assert bed.router.events["rerouted"] == 1


def test_cleanup_nonzero_exit_is_retried_every_poll(make_bed):
    """hook-protocol.md §2.5: cleanup exit != 0 leaves the job in CLEANUP; the hook runs again each poll."""
    bed = make_bed()
    job, _ = _submitted(bed)
    bed.mode("cleanup", "exit 2")
    bed.router.condor_rm(job)
    bed.step(4)
    assert len(bed.calls(HOOK_CLEANUP)) == 3
    assert bed.router.jobs[job].state == State.CLEANUP
    assert bed.src(job).eval("Managed") == "External"
    bed.mode("cleanup", "default")
    bed.step(2)
    assert bed.src(job) is None, "the removed source job is destroyed once yielded"


def test_cleanup_killed_by_signal_counts_as_success(make_bed):
    """hook-protocol.md §2.5: the cleanup handler checks WIFSIGNALED explicitly: signalled = finished."""
    bed = make_bed()
    job, _ = _submitted(bed)
    bed.mode("cleanup", "signal")
    bed.router.condor_rm(job)
    bed.step(2)
    assert len(bed.calls(HOOK_CLEANUP)) == 1
    assert bed.src(job) is None


def test_condor_rm_of_source_removes_routed_job_and_calls_cleanup(make_bed):
    """hook-protocol.md §3.1: source removed by the user -> routed job removed, cleanup hook, source destroyed."""
    bed = make_bed()
    job, dest = _submitted(bed)
    bed.router.condor_rm(job)
    bed.step(2)  # the status check notices the removal; the next poll runs cleanup
    (call,) = bed.calls(HOOK_CLEANUP)
    assert call.key == dest and f'RoutedFromJobId = "{job}"'.encode() in call.stdin
    # Managed = "ScheddDone": the removed routed job leaves the queue at once (schedd.py docstring).
    assert bed.schedd.get(dest) is None and bed.schedd.history[dest].eval("JobStatus") == 3
    assert bed.src(job) is None
    assert bed.router.jobs[job].is_interrupted


# ----------------------------------------------------------------------------- dedup, limits, restart
def test_running_hook_is_not_spawned_again(make_bed):
    """hook-protocol.md §2.1: while a hook runs for a key, calls of that type for that key are skipped."""
    bed = make_bed()
    job, _ = _submitted(bed)
    bed.mode("update", "sleep 1.5")
    for _ in range(3):
        bed.router.poll()
    assert len(bed.calls(HOOK_UPDATE)) == 1
    bed.router.settle(10)
    bed.mode("update", "default")
    bed.step()
    assert len(bed.calls(HOOK_UPDATE)) == 2
    assert bed.router.jobs[job].state == State.SUBMITTED


def test_a_running_hooks_stdin_is_not_printed_again(make_bed, monkeypatch):
    """JobRouterHookMgr hookUpdateJobInfo: checkHookKnown comes before sPrintAd, so a poll that
    skips a job whose update hook still runs does not print its ad (a restarted router with
    20,000 routed jobs would print them all on every poll otherwise)."""
    from ce_k8s.condor import wire  # the router's state machine (router_steps.py) prints the ad with it
    bed = make_bed()
    _submitted(bed)
    printed = []
    real = wire.sprint_ad
    monkeypatch.setattr(wire, "sprint_ad", lambda ad: printed.append(1) or real(ad))
    bed.mode("update", "sleep 1.5")
    for _ in range(3):
        bed.router.poll()
    assert len(bed.calls(HOOK_UPDATE)) == 1 and len(printed) == 1
    bed.router.settle(10)


def test_dedup_prefix_quirk_blocks_longer_keys(make_bed):
    """hook-protocol.md §2.1 quirk: strncmp(known, key, strlen(known)): while 7.1 translates, 7.10 and 7.11 wait."""
    bed = make_bed()
    ids = bed.schedd.submit_cluster([pilot() for _ in range(12)])
    assert ids[1].endswith(".1") and ids[10].endswith(".10")
    bed.mode("translate", "sleep 2", proc=1)
    bed.router.poll()
    spawned = {c.key for c in bed.calls(HOOK_TRANSLATE)}
    assert ids[1] in spawned and ids[10] not in spawned and ids[11] not in spawned
    assert ids[2] in spawned and ids[0] in spawned
    bed.router.settle(20)
    bed.router.poll()
    spawned = {c.key for c in bed.calls(HOOK_TRANSLATE)}
    assert ids[10] in spawned and ids[11] in spawned
    bed.router.settle(20)


def test_max_idle_jobs_throttles_routing_until_jobs_run(make_bed):
    """hook-protocol.md §4.4: a route stops taking jobs when idle routed jobs (status not 2/6) reach MaxIdleJobs."""
    bed = make_bed(max_idle=2)
    jobs = [bed.schedd.submit(pilot()) for _ in range(5)]
    bed.step(3)
    routed = [j for j in jobs if j in bed.router.jobs]
    assert len(routed) == 2
    bed.mode("update", "running")
    bed.step(3)
    assert len([j for j in jobs if j in bed.router.jobs]) >= 4


def test_restart_adopts_routed_jobs_without_translate(make_bed):
    """hook-protocol.md §2.3: after a restart AdoptOrphans re-adopts SUBMITTED routed jobs; no new translate."""
    bed = make_bed()
    job, dest = _submitted(bed)
    router2 = bed.router.restart()
    try:
        bed.router = router2
        bed.mode("update", "running")
        bed.step(2)
        rj = router2.jobs[job]
        assert rj.dest_key == dest and "ADOPTED" in rj.history
        assert bed.calls(HOOK_TRANSLATE) == []
        assert len(bed.calls(HOOK_UPDATE)) >= 1
        assert bed.src(job).eval("JobStatus") == 2
    finally:
        router2.close()


def test_orphaned_claimed_source_is_yielded(make_bed):
    """AdoptOrphans: a source job claimed by this router with no routed job is yielded."""
    bed = make_bed()
    bed.mode("translate", "sleep 30")
    job = bed.schedd.submit(pilot())
    bed.router.poll()  # claimed, translate hung
    assert bed.src(job).eval("Managed") == "External"
    router2 = bed.router.restart()
    try:
        router2.poll()  # poll 1: AdoptOrphans yields it; then it is a candidate again
        assert router2.events["orphan_yielded"] == 1
    finally:
        router2.close()


def test_harness_timeout_kills_a_hung_hook(make_bed):
    """Harness-only: a hook past the timeout is SIGKILLed and recorded (the router has none, hook-protocol.md §0)."""
    bed = make_bed()
    bed.router.runner.timeout = 0.5
    bed.mode("translate", "sleep 30")
    job = bed.schedd.submit(pilot())
    bed.step()
    call = bed.calls(HOOK_TRANSLATE)[0]
    assert call.timed_out and call.signal == 9
    assert bed.router.jobs[job].state == State.CLAIMED  # signalled, no output = "no data" -> retry


def test_stderr_is_recorded_and_has_no_other_effect(make_bed):
    """hook-protocol.md §2.2: stderr non-empty is logged as a warning only."""
    bed = make_bed()
    bed.mode("translate", "stderr")
    job = bed.schedd.submit(pilot())
    bed.step()
    assert bed.calls(HOOK_TRANSLATE)[0].stderr == b"a warning on stderr\n"
    assert bed.router.jobs[job].state == State.SUBMITTED
