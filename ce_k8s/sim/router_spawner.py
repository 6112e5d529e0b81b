"""Hook processes started and watched by a separate spawner process (router emulator, harness only).

Why: the real condor_job_router is a C++ daemon whose fork and pipe handling cost microseconds.
In the Python emulator, `Popen`, the pipe multiplexing of every live hook and the router's own
ClassAd work all take turns on one GIL, and the pipeline benchmark found the router's main thread
always busy or waiting for that lock (docs/performance.md). Here a child interpreter runs an
ordinary :class:`~ce_k8s.sim.router_hooks.HookRunner` (the same spawning rules, §2.1) and the router
process only sends requests and reads results. :class:`RemoteHookRunner` has the HookRunner
interface the router uses, so `Router(spawn_process=True)` changes nothing the hooks can see: the
same argv, environment, stdin bytes, process groups, exit-status rules and captured output.

Messages are `marshal`led tuples of plain values, each behind a 4-byte length, over the child's
stdin and stdout (the child is our own interpreter; nothing here comes from a job).
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import queue
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from ce_k8s.sim.router_hooks import HookCall, HookRunner

log = logging.getLogger(__name__)

_LEN = struct.Struct("!I")
# The HookCall fields the child reports back, in this order.
_RESULT_FIELDS = ("stdout", "stderr", "exit_code", "signal", "timed_out", "pid", "started", "duration",
                  "truncated", "spawn_error")


def _send(fh: Any, msg: tuple[Any, ...]) -> None:
    data = marshal.dumps(msg)
    fh.write(_LEN.pack(len(data)) + data)
    fh.flush()


def _recv(fh: Any) -> tuple[Any, ...] | None:
    head = fh.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (n,) = _LEN.unpack(head)
    data = fh.read(n)
    return marshal.loads(data) if len(data) == n else None  # noqa: S302 - our own child's pipe, no job text


class RemoteHookRunner:
    """HookRunner's interface (spawn, take_finished, wait, inflight, kill_all, close), run by a child."""

    def __init__(self, timeout: float | None = None, max_running: int = 0, spawn_threads: int = 0) -> None:
        self.timeout = timeout
        self.max_running = max_running
        self.spawn_threads = spawn_threads
        cmd = [sys.executable, "-m", "ce_k8s.sim.router_spawner", repr(timeout), str(max_running), str(spawn_threads)]
        self._child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        self._calls: dict[int, HookCall] = {}
        self._next_id = 0
        self._env_sent: dict[str, str] | None = None
        self._send_lock = threading.Lock()
        self._finished: queue.SimpleQueue[HookCall] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._inflight = 0
        self._reader = threading.Thread(target=self._read_results, name="hook-spawner-results", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------ router side
    @property
    def pid(self) -> int:
        """The spawner process (benchmarks read its CPU and its hooks' CPU from /proc)."""
        return self._child.pid

    @property
    def inflight(self) -> int:
        with self._cond:
            return self._inflight

    def spawn(self, call: HookCall, env: dict[str, str]) -> None:
        """Hand `call` to the spawner; a process that cannot be made comes back with `spawn_error`."""
        with self._send_lock:
            self._next_id += 1
            ident = self._next_id
            with self._cond:
                self._calls[ident] = call
                self._inflight += 1
            send_env = None
            if env is not self._env_sent:      # the router passes one dict for all its calls
                send_env, self._env_sent = dict(env), env
            _send(self._child.stdin, ("spawn", ident, list(call.argv), call.stdin, call.hook, call.key, send_env))

    def take_finished(self) -> list[HookCall]:
        done: list[HookCall] = []
        while True:
            try:
                done.append(self._finished.get_nowait())
            except queue.Empty:
                break
        if done:
            with self._cond:
                self._inflight -= len(done)
        return done

    def wait(self, timeout: float | None = None, any_done: bool = False) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                pending = self._inflight - self._finished.qsize()
                if pending <= 0 or (any_done and self._finished.qsize() > 0):
                    return True
                remaining = None if end is None else end - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(0.05 if remaining is None else min(0.05, remaining))

    def kill_all(self) -> None:
        """SIGKILL every live hook (router abort or shutdown); calls not reported yet are dropped."""
        with self._send_lock, contextlib.suppress(BrokenPipeError, ValueError):
            _send(self._child.stdin, ("kill_all",))
        with self._cond:
            self._inflight -= len(self._calls)
            self._calls.clear()

    def close(self) -> None:
        self.kill_all()
        with self._send_lock, contextlib.suppress(BrokenPipeError, ValueError, OSError):
            _send(self._child.stdin, ("close",))
            self._child.stdin.close()
        try:
            self._child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        self._reader.join(timeout=5)

    # ------------------------------------------------------------ internals
    def _read_results(self) -> None:
        out = self._child.stdout
        while True:
            msg = _recv(out)
            if msg is None:
                return
            with self._cond:
                call = self._calls.pop(msg[0], None)
            if call is None:
                continue            # dropped by kill_all
            for name, value in zip(_RESULT_FIELDS, msg[1:], strict=True):
                setattr(call, name, value)
            self._finished.put(call)
            with self._cond:
                self._cond.notify_all()


def _child_main(argv: list[str]) -> int:
    """The spawner: read requests on stdin, run them with a HookRunner, write results on stdout."""
    timeout = None if argv[0] == "None" else float(argv[0])
    runner = HookRunner(timeout=timeout, max_running=int(argv[1]), spawn_threads=int(argv[2]))
    requests = os.fdopen(0, "rb", buffering=1 << 16)
    results = os.fdopen(1, "wb", buffering=1 << 16)
    ids: dict[int, int] = {}           # id(HookCall) -> request id
    env: dict[str, str] = {}
    stopping = threading.Event()
    out_lock = threading.Lock()

    def report(ident: int, call: HookCall) -> None:
        with out_lock:
            _send(results, (ident, *(getattr(call, name) for name in _RESULT_FIELDS)))

    def forward() -> None:
        while not (stopping.is_set() and runner.inflight == 0):
            runner.wait(timeout=0.2, any_done=True)
            done = runner.take_finished()
            for call in done:
                ident = ids.pop(id(call), None)
                if ident is not None:
                    report(ident, call)
            if stopping.is_set() and not done:
                return

    forwarder = threading.Thread(target=forward, name="hook-results", daemon=True)
    forwarder.start()
    try:
        while True:
            msg = _recv(requests)
            if msg is None or msg[0] == "close":
                break
            if msg[0] == "kill_all":
                runner.kill_all()
                continue
            _, ident, call_argv, stdin, hook, key, new_env = msg
            if new_env is not None:
                env = new_env
            call = HookCall(hook=hook, key=key, argv=call_argv, stdin=stdin)
            ids[id(call)] = ident
            try:
                runner.spawn(call, env)
            except OSError as exc:          # without spawner threads spawn() raises (§2.1: spawn() == 0)
                ids.pop(id(call), None)
                call.spawn_error = f"{type(exc).__name__}: {exc}"
                report(ident, call)
    finally:
        stopping.set()
        runner.kill_all()
        forwarder.join(timeout=5)
        runner.close()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(_child_main(sys.argv[1:]))
