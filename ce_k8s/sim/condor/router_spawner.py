"""Hook processes started and watched by a separate spawner process (router emulator, harness only).

Why: the real condor_job_router is a C++ daemon whose fork and pipe handling cost microseconds.
In the Python emulator, `Popen`, the pipe multiplexing of every live hook and the router's own
ClassAd work all take turns on one GIL, and the pipeline benchmark found the router's main thread
always busy or waiting for that lock (docs/performance.md). Here a child interpreter starts and
watches the hooks in one epoll loop with `posix_spawn` (`_Spawner`), following the rules of
:class:`~ce_k8s.sim.condor.router_hooks.HookRunner` (hook-protocol.md §2.1), and the router process only sends
requests and reads results. :class:`RemoteHookRunner` has the HookRunner interface the router uses, so
`Router(spawn_process=True)` changes nothing the hooks can see: the same argv, environment, stdin
bytes, process groups, exit-status rules and captured output. (`spawn_threads` is kept for the
router's `restart()`; the spawner needs no threads.)

Messages are `marshal`led tuples of plain values, each behind a 4-byte length, over the child's
stdin and stdout (the child is our own interpreter; nothing here comes from a job).
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

from ce_k8s.sim.condor.router_hooks import FinishedCalls, HookCall, append_capped

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


class RemoteHookRunner(FinishedCalls):
    """HookRunner's interface (spawn, take_finished, wait, inflight, kill_all, close), run by a child."""

    def __init__(self, timeout: float | None = None, max_running: int = 0, spawn_threads: int = 0) -> None:
        self.timeout = timeout
        self.max_running = max_running
        self.spawn_threads = spawn_threads
        cmd = [sys.executable, "-m", "ce_k8s.sim.condor.router_spawner", repr(timeout), str(max_running),
               str(spawn_threads)]
        self._child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        self._calls: dict[int, HookCall] = {}
        self._next_id = 0
        self._env_sent: dict[str, str] | None = None
        self._send_lock = threading.Lock()
        self._finished: queue.SimpleQueue[HookCall] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._inflight = 0
        # Requests go through a writer thread: the spawner reads them between posix_spawn calls, and
        # a poll's burst of thousands of update requests must not stall the router on a full pipe.
        self._outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_requests, name="hook-spawner-requests", daemon=True)
        self._writer.start()
        self._reader = threading.Thread(target=self._read_results, name="hook-spawner-results", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------ router side
    @property
    def pid(self) -> int:
        """The spawner process (benchmarks read its CPU and its hooks' CPU from /proc)."""
        return self._child.pid

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
            self._outbox.put(("spawn", ident, list(call.argv), call.stdin, call.hook, call.key, send_env))

    def kill_all(self) -> None:
        """SIGKILL every live hook (router abort or shutdown); calls not reported yet are dropped.

        Spawn requests still waiting for the writer thread are dropped first: after a poll of
        thousands of routed jobs, a kill queued behind them would wait until the spawner had
        started most of them (20 s after a 20,000-job poll), and the router's close with it.
        """
        with self._send_lock:
            kept = []
            while True:
                try:
                    msg = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if msg is not None and msg[0] == "spawn":
                    if msg[6] is not None:
                        self._env_sent = None       # that request carried the environment: send it again
                    continue
                kept.append(msg)
            self._outbox.put(("kill_all",))
            for msg in kept:
                self._outbox.put(msg)
        with self._cond:
            self._inflight -= len(self._calls)
            self._calls.clear()

    def close(self) -> None:
        self.kill_all()
        self._outbox.put(("close",))
        self._outbox.put(None)
        self._writer.join(timeout=10)
        try:
            self._child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        self._reader.join(timeout=5)

    # ------------------------------------------------------------ internals
    def _write_requests(self) -> None:
        stdin = self._child.stdin
        broken = False
        while True:
            msg = self._outbox.get()
            if msg is None:
                with contextlib.suppress(OSError, ValueError):
                    stdin.close()
                return
            if not broken:
                try:
                    _send(stdin, msg)
                    continue
                except (OSError, ValueError):
                    broken = True
                    log.error("the hook spawner process is gone (exit status %s)", self._child.poll())
            if msg[0] == "spawn":          # never started: a failed spawn, retried next poll (hook-protocol.md §2.1)
                with self._cond:
                    call = self._calls.pop(msg[1], None)
                if call is not None:
                    call.spawn_error = "the hook spawner process is gone"
                    self._finished.put(call)
                    with self._cond:
                        self._cond.notify_all()

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


_CHUNK = 65536
_DRAIN_GRACE = 1.0                 # seconds to collect output after the group was killed


class _Hook:
    """One live hook process in the spawner."""

    __slots__ = ("deadline", "drain_until", "duration", "err", "err_fd", "exit_code", "exited", "ident", "in_fd",
                 "out", "out_fd", "pending", "pid", "pidfd", "signal", "started", "timed_out", "truncated")

    def __init__(self, ident: int, pid: int, started: float, deadline: float) -> None:
        self.ident, self.pid, self.started, self.deadline = ident, pid, started, deadline
        self.pidfd = self.in_fd = self.out_fd = self.err_fd = -1
        self.pending: memoryview | None = None
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.timed_out = self.truncated = self.exited = False
        self.duration = self.drain_until = 0.0


class _Spawner:
    """The spawner's single-threaded loop: requests on fd 0, results on fd 1, one epoll for all.

    Why one thread and `posix_spawn`: every thread hand-off and every `Popen` object is CPU the
    pipeline benchmark counts; here a hook costs one `posix_spawn` (vfork + exec in the C library)
    and a few epoll events. The rules are router_hooks.HookRunner's (hook-protocol.md §2.1): argv [path], the
    router's environment, stdin written fully then closed (or /dev/null when empty), stdout and
    stderr captured, SIGPIPE and SIGXFSZ back to their defaults in the child (as `Popen` does), its
    own process group, killed as a whole once the hook exits, an exit status read with waitpid.
    """

    def __init__(self, timeout: float | None, max_running: int) -> None:
        self.timeout = timeout
        self.max_running = max_running
        self.ep = select.epoll()
        self.fds: dict[int, tuple[str, _Hook]] = {}
        self.live: dict[int, _Hook] = {}
        self.waiting: deque[tuple[Any, ...]] = deque()
        self.env: dict[str, str] = {}
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.results = os.fdopen(1, "wb", buffering=1 << 16)
        self.inbuf = bytearray()
        self.closing = False

    def run(self) -> None:
        os.set_blocking(0, False)
        self.ep.register(0, select.EPOLLIN)
        while not (self.closing and not self.live):
            for fd, _events in self.ep.poll(self._next_timeout()):
                if fd == 0:
                    self._read_requests()
                    continue
                entry = self.fds.get(fd)
                if entry is None:
                    continue
                kind, hook = entry
                if kind == "in":
                    self._write_stdin(hook)
                elif kind == "exit":
                    self._on_exit(hook)
                else:
                    self._read(hook, fd, hook.out if kind == "out" else hook.err)
            self._check_deadlines()
            while self.waiting and not self.closing and len(self.live) < self.max_running:
                self._start(*self.waiting.popleft())

    # -- requests ---------------------------------------------------------------------------------

    def _read_requests(self) -> None:
        try:
            data = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not data:                     # the router is gone
            self.ep.unregister(0)
            self._kill_all()
            self.closing = True
            return
        buf = self.inbuf
        buf += data
        while len(buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(buf)
            if len(buf) < _LEN.size + n:
                break
            msg = marshal.loads(bytes(buf[_LEN.size:_LEN.size + n]))  # noqa: S302 - the router's own pipe
            del buf[:_LEN.size + n]
            if msg[0] == "spawn":
                _, ident, argv, stdin, _hook, _key, new_env = msg
                if new_env is not None:
                    self.env = new_env
                if self.max_running and len(self.live) >= self.max_running:
                    self.waiting.append((ident, argv, stdin))
                else:
                    self._start(ident, argv, stdin)
            elif msg[0] == "kill_all":
                self._kill_all()
            elif msg[0] == "close":
                self._kill_all()
                self.closing = True

    def _kill_all(self) -> None:
        self.waiting.clear()
        for hook in self.live.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(hook.pid, signal.SIGKILL)

    def _report(self, ident: int, h: _Hook | None, spawn_error: str = "") -> None:
        if h is None:
            msg = (ident, b"", b"", None, None, False, 0, 0.0, 0.0, False, spawn_error)
        else:
            msg = (ident, b"".join(h.out), b"".join(h.err), h.exit_code, h.signal, h.timed_out, h.pid, h.started,
                   h.duration, h.truncated, "")
        _send(self.results, msg)

    # -- one hook ---------------------------------------------------------------------------------

    def _start(self, ident: int, argv: list[str], stdin: bytes) -> None:
        fds = []
        try:
            r_out, w_out = os.pipe2(os.O_CLOEXEC)
            fds += [r_out, w_out]
            r_err, w_err = os.pipe2(os.O_CLOEXEC)
            fds += [r_err, w_err]
            if stdin:
                r_in, w_in = os.pipe2(os.O_CLOEXEC)
                fds += [r_in, w_in]
            else:
                r_in, w_in = self.devnull, -1
            started = time.monotonic()
            pid = os.posix_spawn(argv[0], argv, self.env,
                                 file_actions=[(os.POSIX_SPAWN_DUP2, r_in, 0), (os.POSIX_SPAWN_DUP2, w_out, 1),
                                               (os.POSIX_SPAWN_DUP2, w_err, 2)],
                                 setpgroup=0, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        except OSError as exc:           # spawn() == 0 in the real router (hook-protocol.md §2.1): retried next poll
            for fd in fds:
                os.close(fd)
            log.error("spawning %s failed: %s", argv[0], exc)
            self._report(ident, None, f"{type(exc).__name__}: {exc}")
            return
        for fd in (w_out, w_err) + ((r_in,) if stdin else ()):
            os.close(fd)
        h = _Hook(ident, pid, started, started + self.timeout if self.timeout else float("inf"))
        self.live[pid] = h
        h.pidfd = os.pidfd_open(pid)
        self._watch(h.pidfd, select.EPOLLIN, "exit", h)
        h.out_fd, h.err_fd = r_out, r_err
        for fd, kind in ((r_out, "out"), (r_err, "err")):
            os.set_blocking(fd, False)
            self._watch(fd, select.EPOLLIN, kind, h)
        if stdin:
            h.in_fd, h.pending = w_in, memoryview(stdin)
            os.set_blocking(w_in, False)
            self._watch(w_in, select.EPOLLOUT, "in", h)

    def _watch(self, fd: int, events: int, kind: str, h: _Hook) -> None:
        self.fds[fd] = (kind, h)
        self.ep.register(fd, events)

    def _forget(self, fd: int) -> None:
        if fd >= 0 and self.fds.pop(fd, None) is not None:
            self.ep.unregister(fd)
            os.close(fd)

    def _write_stdin(self, h: _Hook) -> None:
        try:
            written = os.write(h.in_fd, h.pending[:_CHUNK])
        except BlockingIOError:
            return
        except OSError:                  # the hook closed stdin or exited: DaemonCore just stops
            written = len(h.pending)
        h.pending = h.pending[written:]
        if not h.pending:
            self._forget(h.in_fd)
            h.in_fd = -1

    def _read(self, h: _Hook, fd: int, sink: list[bytes]) -> None:
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            if not append_capped(sink, data):
                h.truncated = True
            return
        self._forget(fd)
        if fd == h.out_fd:
            h.out_fd = -1
        else:
            h.err_fd = -1
        self._maybe_finish(h)

    def _on_exit(self, h: _Hook) -> None:
        # The family first: the zombie leader still holds the group id (hook-protocol.md §2.1 "Kill_Family").
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(h.pid, signal.SIGKILL)
        _, status = os.waitpid(h.pid, 0)
        h.duration = time.monotonic() - h.started
        if os.WIFSIGNALED(status):
            h.signal, h.exit_code = os.WTERMSIG(status), 0     # WEXITSTATUS of a signalled child
        else:
            h.exit_code = os.WEXITSTATUS(status)
        h.exited = True
        h.drain_until = time.monotonic() + _DRAIN_GRACE
        self._forget(h.pidfd)
        self._forget(h.in_fd)
        h.pidfd = h.in_fd = -1
        self._maybe_finish(h)

    def _maybe_finish(self, h: _Hook, force: bool = False) -> None:
        if not h.exited or (not force and (h.out_fd >= 0 or h.err_fd >= 0)):
            return
        self._forget(h.out_fd)
        self._forget(h.err_fd)
        h.out_fd = h.err_fd = -1
        self.live.pop(h.pid, None)
        self._report(h.ident, h)

    def _next_timeout(self) -> float:
        now = time.monotonic()
        soonest = 0.5
        for h in self.live.values():
            soonest = min(soonest, max(0.0, (h.drain_until if h.exited else h.deadline) - now))
        return soonest

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for h in list(self.live.values()):
            if h.exited:
                if now >= h.drain_until:         # a grandchild escaped the group and holds a pipe
                    self._maybe_finish(h, force=True)
            elif now >= h.deadline and not h.timed_out:
                h.timed_out = True
                log.error("hook pid %d exceeded the harness timeout of %.1fs; killing it", h.pid, self.timeout or 0)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(h.pid, signal.SIGKILL)


def _child_main(argv: list[str]) -> int:
    """The spawner process: `python -m ce_k8s.sim.condor.router_spawner TIMEOUT MAX_RUNNING SPAWN_THREADS`."""
    timeout = None if argv[0] == "None" else float(argv[0])
    _Spawner(timeout, int(argv[1])).run()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(_child_main(sys.argv[1:]))
