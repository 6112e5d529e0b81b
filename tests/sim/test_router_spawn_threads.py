"""The router emulator with spawner threads (``spawn_threads``): the fork/exec leaves the polling
thread, the protocol of docs/hook-protocol.md §2.1 does not change.

Each test drives real hook processes (tests/sim/fake_hooks) and asserts what hook-protocol.md §2.1-§2.5 say, in
the mode the pipeline benchmark uses; spawn failures are checked in both modes, since they must
look the same to the router (``spawn() == 0``: the step is retried at the next poll).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fake_hooks"))

from harness import echo_hook, make_router, pilot, set_mode, step

from ce_k8s.sim.condor.router import State
from ce_k8s.sim.condor.router_hooks import (
    HOOK_CLEANUP,
    HOOK_FINALIZE,
    HOOK_TRANSLATE,
    HOOK_UPDATE,
    HookCall,
    HookRunner,
)


def _router(tmp_path: Path, spawn_threads: int):
    return make_router(tmp_path, spawn_threads=spawn_threads)


def test_whole_lifecycle_with_spawner_threads(tmp_path):
    """hook-protocol.md §2.2-§2.5: translate, update (running, then complete), finalize, cleanup; one process each,
    argv [path], stdin written and closed, and the job yielded as done."""
    router, schedd, hooks, clock = _router(tmp_path, spawn_threads=2)
    try:
        job = schedd.submit(pilot())
        step(router, clock, 2)
        rj = router.jobs[job]
        assert rj.state == State.SUBMITTED
        set_mode(hooks, "update", "complete")
        step(router, clock, 4)
        assert job not in router.jobs or router.jobs[job].state == State.RETIRED
        assert schedd.get(job).eval("Managed") == "ScheddDone"
        kinds = [c.hook for c in router.calls]
        assert kinds[0] == HOOK_TRANSLATE and kinds.count(HOOK_TRANSLATE) == 1
        assert kinds.count(HOOK_FINALIZE) == 1 and kinds.count(HOOK_CLEANUP) == 1
        assert HOOK_UPDATE in kinds
        for call in router.calls:
            assert len(call.argv) == 1 and call.pid > 0 and call.exit_code == 0 and not call.spawn_error
    finally:
        router.close()


def test_running_hook_is_not_spawned_again_with_spawner_threads(tmp_path):
    """hook-protocol.md §2.1 "known hooks": the call is registered when the router asks for it, not when a spawner
    thread gets to it, so polls during a slow hook never start a second one for the same job."""
    router, schedd, hooks, clock = _router(tmp_path, spawn_threads=2)
    try:
        job = schedd.submit(pilot())
        step(router, clock, 2)
        set_mode(hooks, "update", "sleep 1.5")
        for _ in range(4):
            router.poll()
        assert len([c for c in router.calls if c.hook == HOOK_UPDATE]) == 1
        assert router.settle(10)
        assert router.jobs[job].state == State.SUBMITTED
    finally:
        router.close()


@pytest.mark.parametrize("spawn_threads", [0, 2])
def test_spawn_failure_is_retried_next_poll(tmp_path, spawn_threads):
    """hook-protocol.md §2.1: a hook that cannot be spawned did not run: no exit status is applied, the job keeps
    its state and the router tries again at its next poll (same outcome with or without threads)."""
    router, schedd, hooks, clock = _router(tmp_path, spawn_threads=spawn_threads)
    translate = hooks / "translate"
    good = translate.read_text()
    try:
        translate.write_text("#!/nonexistent/interpreter\n")  # executable file whose exec fails
        job = schedd.submit(pilot())
        step(router, clock)
        assert router.events["spawn_failed"] == 1
        assert router.hook_counts[HOOK_TRANSLATE] == 0
        assert router.jobs[job].state == State.CLAIMED
        translate.write_text(good)
        step(router, clock)
        assert router.jobs[job].state == State.SUBMITTED
        assert router.hook_counts[HOOK_TRANSLATE] == 1
    finally:
        router.close()


def test_runner_threads_capture_output_and_kill_the_group(tmp_path):
    """hook-protocol.md §2.1 with spawner threads: stdin written fully then closed (the child sees EOF), stdout and
    stderr captured, the exit status read, and the process group killed once the hook exits."""
    script, marker = echo_hook(tmp_path)
    runner = HookRunner(timeout=20, spawn_threads=2)
    try:
        payload = b"x" * 300_000 + b"end"   # bigger than a pipe buffer: written in pieces
        call = HookCall(hook=HOOK_UPDATE, key="1.0", argv=[str(script)], stdin=payload)
        runner.spawn(call, {})
        assert runner.wait(20)
        (done,) = runner.take_finished()
        assert done is call and call.exit_code == 3, call.stderr
        assert call.stdout == payload[::-1] and call.stderr == b"err"
        assert runner.inflight == 0
        time.sleep(1.5)
        assert not marker.exists()
    finally:
        runner.close()


def test_runner_threads_respect_max_running(tmp_path):
    """The harness's max_running cap also counts calls a spawner thread has not started yet."""
    script = tmp_path / "hook"
    script.write_text(f"#!{sys.executable} -S\nimport time\ntime.sleep(0.3)\n")
    script.chmod(0o755)
    runner = HookRunner(timeout=20, max_running=2, spawn_threads=3)
    try:
        calls = [HookCall(hook=HOOK_UPDATE, key=f"1.{i}", argv=[str(script)], stdin=b"") for i in range(6)]
        for call in calls:
            runner.spawn(call, {})
            assert runner._live() <= 2
        assert runner.wait(20)
        assert len(runner.take_finished()) == 6
        starts = sorted(c.started for c in calls)
        ends = sorted(c.started + c.duration for c in calls)
        # never more than two alive at once: the third start is after the first end, and so on
        assert all(starts[i + 2] >= ends[i] - 0.05 for i in range(4))
    finally:
        runner.close()


def test_output_beyond_the_harness_cap_is_dropped_and_marked(tmp_path, monkeypatch):
    """The harness keeps at most _MAX_OUTPUT bytes per stream (a runaway hook must not exhaust the
    test machine) and marks the call truncated; what came before the cap is kept as it was."""
    from ce_k8s.sim.condor import router_hooks
    monkeypatch.setattr(router_hooks, "_MAX_OUTPUT", 4)
    sink: list[bytes] = []
    assert router_hooks.append_capped(sink, b"abc") and router_hooks.append_capped(sink, b"de")
    assert not router_hooks.append_capped(sink, b"f") and sink == [b"abc", b"de"]
    script, _ = echo_hook(tmp_path)
    runner = HookRunner(timeout=20)
    try:
        call = HookCall(hook=HOOK_UPDATE, key="1.0", argv=[str(script)], stdin=b"0123456789" * 30_000)
        runner.spawn(call, {})
        assert runner.wait(20)
        runner.take_finished()
        assert call.truncated and 4 <= len(call.stdout) < 300_000
        assert (b"0123456789" * 30_000)[::-1].startswith(call.stdout)
    finally:
        runner.close()
