"""The router emulator with a spawner process (``spawn_process``): hooks are forked and watched by
a child interpreter (ce_k8s/sim/condor/router_spawner.py); what a hook sees and what the router reads back
must not change (docs/hook-protocol.md §2.1-§2.5).
"""

from __future__ import annotations

import os
import queue
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fake_hooks"))

from harness import echo_hook, make_router, pilot, set_mode, step

from ce_k8s.sim.condor.router import State
from ce_k8s.sim.condor.router_hooks import HOOK_CLEANUP, HOOK_FINALIZE, HOOK_TRANSLATE, HOOK_UPDATE, HookCall
from ce_k8s.sim.condor.router_spawner import RemoteHookRunner


def _router(tmp_path: Path, spawn_threads: int = 0):
    return make_router(tmp_path, spawn_threads=spawn_threads, spawn_process=True)


@pytest.mark.parametrize("spawn_threads", [0, 2])
def test_whole_lifecycle_through_the_spawner_process(tmp_path, spawn_threads):
    """hook-protocol.md §2.2-§2.5 end to end with the hooks forked by the spawner: one process per call, argv
    [path], the router's environment (the fake hooks find their directory through it), each
    exit status applied, the job yielded as done."""
    router, schedd, hooks, clock = _router(tmp_path, spawn_threads)
    try:
        spawner = router.runner.pid
        job = schedd.submit(pilot())
        step(router, clock, 2)
        assert router.jobs[job].state == State.SUBMITTED
        set_mode(hooks, "update", "complete")
        step(router, clock, 4)
        assert schedd.get(job).eval("Managed") == "ScheddDone"
        kinds = [c.hook for c in router.calls]
        assert kinds[0] == HOOK_TRANSLATE and kinds.count(HOOK_TRANSLATE) == 1
        assert kinds.count(HOOK_FINALIZE) == 1 and kinds.count(HOOK_CLEANUP) == 1 and HOOK_UPDATE in kinds
        for call in router.calls:
            assert len(call.argv) == 1 and call.pid > 0 and call.exit_code == 0 and not call.spawn_error
            assert call.pid not in (os.getpid(), spawner)
    finally:
        router.close()
    assert router.runner._child.returncode == 0          # the spawner exits cleanly on close


def test_spawn_failure_through_the_spawner_is_retried_next_poll(tmp_path):
    """hook-protocol.md §2.1: a hook that cannot be started did not run; the router tries again at its next poll."""
    router, schedd, hooks, clock = _router(tmp_path)
    translate = hooks / "translate"
    good = translate.read_text()
    try:
        translate.write_text("#!/nonexistent/interpreter\n")
        job = schedd.submit(pilot())
        step(router, clock)
        assert router.events["spawn_failed"] == 1 and router.jobs[job].state == State.CLAIMED
        translate.write_text(good)
        step(router, clock)
        assert router.jobs[job].state == State.SUBMITTED and router.hook_counts[HOOK_TRANSLATE] == 1
    finally:
        router.close()


def test_remote_runner_writes_stdin_captures_output_and_kills_the_group(tmp_path):
    """hook-protocol.md §2.1 through the spawner: stdin bigger than a pipe buffer written whole then closed, stdout,
    stderr and the exit status carried back unchanged, the process group killed at exit."""
    script, marker = echo_hook(tmp_path)
    runner = RemoteHookRunner(timeout=20, spawn_threads=2)
    try:
        payload = b"x" * 300_000 + b"\x00\xffend"
        call = HookCall(hook=HOOK_UPDATE, key="1.0", argv=[str(script)], stdin=payload)
        runner.spawn(call, {"ROUTER_ENV": "yes", "PATH": os.environ.get("PATH", "")})
        assert runner.wait(20)
        (done,) = runner.take_finished()
        assert done is call and call.exit_code == 3 and call.signal is None, call.stderr
        assert call.stdout == payload[::-1] and call.stderr == b"yes"
        assert call.duration > 0 and runner.inflight == 0
        time.sleep(1.5)
        assert not marker.exists()
    finally:
        runner.close()


def test_kill_all_drops_the_spawn_requests_the_spawner_has_not_read(tmp_path):
    """A kill (router abort or close) must not wait behind a poll's queued spawn requests: with the
    spawner not reading (stopped), the requests pile up before the writer thread, and `kill_all`
    leaves none of them queued ahead of itself; the runner still closes cleanly afterwards."""
    import signal

    script, _marker = echo_hook(tmp_path)
    runner = RemoteHookRunner(timeout=20)
    os.kill(runner.pid, signal.SIGSTOP)
    try:
        env = {"PATH": os.environ.get("PATH", "")}
        for i in range(5):      # each far bigger than a pipe buffer: the writer blocks on the first
            runner.spawn(HookCall(hook=HOOK_UPDATE, key=f"{i}.0", argv=[str(script)], stdin=b"x" * 300_000), env)
        runner.kill_all()
        queued = []
        while True:
            try:
                queued.append(runner._outbox.get_nowait())
            except queue.Empty:
                break
        assert [m[0] for m in queued if m is not None] == ["kill_all"]
        assert runner.inflight == 0
        for msg in queued:             # hand them back to the writer, in order
            runner._outbox.put(msg)
    finally:
        os.kill(runner.pid, signal.SIGCONT)
        runner.close()
    assert runner._child.returncode is not None
