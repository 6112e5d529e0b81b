"""Spawning hook processes the way condor_job_router's DaemonCore does (docs/hook-protocol.md §2.1).

One process per call, argv ``[path]`` only, the caller's environment plus ``CONDOR_INHERIT``,
stdin a pipe only when there is something to write (written fully, then closed), stdout and
stderr always captured, no timeout in the real router. When the hook exits its whole process
group is killed (the procd kills the process family), then the remaining output is collected.

Many calls run at once: a single I/O thread multiplexes every pipe and a pidfd per child with
``selectors``, so thousands of hooks per poll cost no thread each. Finished calls are handed to
the router through a queue; the router applies them in its own thread, the way DaemonCore runs
the reaper callbacks between timer events.

Harness-only additions (not in the real router, documented in docs/demo.md): an optional
``timeout`` after which a hung hook is SIGKILLed (so a bug fails a test instead of hanging it)
and an optional ``max_running`` that queues spawns beyond a number of live processes (to keep a
2-CPU test machine usable; 0 = no limit, which is what the router does).

``spawn_threads`` (default 0: the caller's thread forks, as before) moves the fork/exec into that
many spawner threads. Why: ``Popen`` waits until the child has exec'd, 4-11 ms on a busy 2-core
box, and the router emulator's polling thread spent 70 % of its time there, so polling and
spawning could not overlap (docs/performance.md). The real router is a C++ daemon whose spawn
cost is not what the benchmarks measure. The protocol is unchanged: the call is registered (and
deduplicated) by the router when it asks for the spawn; a spawn that then fails is reported back
as a call with ``spawn_error`` set, which the router treats like ``spawn() == 0``: the hook did
not run and the step is retried at the next poll (hook-protocol.md §2.1).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

HOOK_TRANSLATE = "TRANSLATE_JOB"
HOOK_UPDATE = "UPDATE_JOB_INFO"
HOOK_FINALIZE = "JOB_FINALIZE"
HOOK_CLEANUP = "JOB_CLEANUP"
HOOK_TYPES = (HOOK_TRANSLATE, HOOK_UPDATE, HOOK_FINALIZE, HOOK_CLEANUP)

_READ_CHUNK = 65536
_MAX_OUTPUT = 64 * 1024 * 1024  # per stream; far beyond any sane hook, protects the harness
_DRAIN_GRACE = 1.0  # seconds to collect output after the group was killed


@dataclass(eq=False)
class HookCall:
    """One hook invocation, recorded for assertions (issue 4 item 3)."""

    hook: str
    key: str
    argv: list[str]
    stdin: bytes
    poll: int = 0
    src_key: str = ""
    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int | None = None  # WEXITSTATUS; 0 when killed by a signal, as the router reads it
    signal: int | None = None  # WTERMSIG when killed by a signal
    timed_out: bool = False  # harness timeout fired (never happens in the real router)
    pid: int = 0
    started: float = 0.0  # time.monotonic()
    duration: float = 0.0  # seconds from spawn to exit
    truncated: bool = False
    spawn_error: str = ""  # the process could not be created (reported by a spawner thread)
    job: Any = field(default=None, repr=False)  # the router's job record (internal)

    @property
    def signaled(self) -> bool:
        return self.signal is not None

    @property
    def exited_ok(self) -> bool:
        """WEXITSTATUS == 0: what translate/update/finalize test (a signal counts as 0, hook-protocol.md §2.1)."""
        return self.exit_code == 0


class _Running:
    """Book-keeping of one live child in the I/O thread."""

    __slots__ = ("call", "deadline", "drain_until", "err", "exited", "out", "pending", "pidfd", "proc")

    def __init__(self, call: HookCall, proc: subprocess.Popen[bytes], pidfd: int, deadline: float) -> None:
        self.call = call
        self.proc = proc
        self.pidfd = pidfd
        self.deadline = deadline
        self.pending = memoryview(call.stdin) if proc.stdin is not None else None
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.exited = False
        self.drain_until = 0.0


def append_capped(sink: list[bytes], data: bytes) -> bool:
    """Keep `data` while the stream holds less than the harness cap; False once it is dropped."""
    if sum(len(c) for c in sink) >= _MAX_OUTPUT:
        return False
    sink.append(data)
    return True


class FinishedCalls:
    """What the router reads of a runner: finished calls in exit order and a wait for them.

    Shared by :class:`HookRunner` and the spawner-process runner (router_spawner.py); a subclass
    sets ``_finished`` (a queue of HookCall), ``_cond`` and ``_inflight`` (calls spawned, or queued,
    whose result has not been taken).
    """

    _finished: queue.SimpleQueue[HookCall]
    _cond: threading.Condition
    _inflight: int

    @property
    def inflight(self) -> int:
        """Calls spawned (or queued) whose result has not been taken yet."""
        with self._cond:
            return self._inflight

    def take_finished(self) -> list[HookCall]:
        """Every call that exited since the last take, in exit order."""
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
        """Block until every call finished (or one, with ``any_done``); False on timeout."""
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


class HookRunner(FinishedCalls):
    """Runs hook processes concurrently and reports finished :class:`HookCall` objects."""

    def __init__(self, timeout: float | None = None, max_running: int = 0, spawn_threads: int = 0) -> None:
        self.timeout = timeout
        self.max_running = max_running
        self.spawn_threads = max(0, spawn_threads)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._incoming: queue.SimpleQueue[tuple[HookCall, subprocess.Popen[bytes]]] = queue.SimpleQueue()
        self._waiting: deque[tuple[HookCall, dict[str, str]]] = deque()
        self._running: dict[int, _Running] = {}
        self._finished: queue.SimpleQueue[HookCall] = queue.SimpleQueue()
        self._inflight = 0
        self._spawning = 0  # handed to a spawner thread, not yet in _incoming
        self._spawn_q: queue.SimpleQueue[tuple[HookCall, dict[str, str]] | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="hook-runner", daemon=True)
        self._thread.start()
        self._spawners = [threading.Thread(target=self._spawner_loop, name=f"hook-spawner-{i}", daemon=True)
                          for i in range(self.spawn_threads)]
        for t in self._spawners:
            t.start()

    # ------------------------------------------------------------ router side
    def spawn(self, call: HookCall, env: dict[str, str]) -> None:
        """Start ``call``.

        Without spawner threads this forks here and raises OSError when the process cannot be
        created (like spawn() == 0); with them it returns at once and a failure comes back later
        as a finished call with ``spawn_error`` set.
        """
        with self._cond:
            if self.max_running and self._live() >= self.max_running:
                self._waiting.append((call, env))
                self._inflight += 1
                return
            if self.spawn_threads:
                self._inflight += 1
                self._spawning += 1
                self._spawn_q.put((call, env))
                return
        self._start(call, env)
        with self._cond:
            self._inflight += 1

    def kill_all(self) -> None:
        """SIGKILL every live hook's process group (router abort or shutdown)."""
        with self._cond:
            self._inflight -= len(self._waiting)
            self._waiting.clear()
            while True:  # calls not handed to a spawner thread yet are dropped
                try:
                    item = self._spawn_q.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._inflight -= 1
                    self._spawning -= 1
            running = list(self._running.values())
        for run in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill_all()
        self._stop = True
        for _ in self._spawners:
            self._spawn_q.put(None)
        for t in self._spawners:
            t.join(timeout=5)
        self._wake()
        self._thread.join(timeout=5)
        self.kill_all()
        while True:  # started by a spawner thread while we were stopping, never adopted
            try:
                _, proc = self._incoming.get_nowait()
            except queue.Empty:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                proc.wait()

    # ------------------------------------------------------------ internals
    def _live(self) -> int:
        return len(self._running) + self._incoming.qsize() + self._spawning

    def _spawner_loop(self) -> None:
        """One spawner thread: fork/exec queued calls so the router's thread never waits for exec."""
        while True:
            item = self._spawn_q.get()
            if item is None or self._stop:
                return
            call, env = item
            try:
                self._start(call, env)
            except OSError as exc:
                self._spawn_failed(call, exc)
            finally:
                with self._cond:
                    self._spawning -= 1

    def _spawn_failed(self, call: HookCall, exc: OSError) -> None:
        """Report a call whose process could not be created (the router retries next poll)."""
        log.error("hook %s for %s: spawning %s failed: %s", call.hook, call.key, call.argv[0], exc)
        call.spawn_error = f"{type(exc).__name__}: {exc}"
        self._finished.put(call)
        with self._cond:
            self._cond.notify_all()

    def _start(self, call: HookCall, env: dict[str, str]) -> None:
        proc = subprocess.Popen(  # argv is [configured hook path]: no shell, no job text
            call.argv,
            stdin=subprocess.PIPE if call.stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            close_fds=True,
            process_group=0,  # its own process group = the procd "family"
        )
        call.pid = proc.pid
        call.started = time.monotonic()
        self._incoming.put((call, proc))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        while not self._stop:
            self._adopt_incoming()
            timeout = self._next_timeout()
            for key, events in self._sel.select(timeout):
                kind, run = key.data
                if kind == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                elif kind == "stdin":
                    self._write_stdin(run)
                elif kind == "stdout":
                    self._read(run, run.proc.stdout, run.out)
                elif kind == "stderr":
                    self._read(run, run.proc.stderr, run.err)
                elif kind == "exit" and events & selectors.EVENT_READ:
                    self._on_exit(run)
            self._check_deadlines()
            self._start_waiting()

    def _adopt_incoming(self) -> None:
        while True:
            try:
                call, proc = self._incoming.get_nowait()
            except queue.Empty:
                return
            pidfd = os.pidfd_open(proc.pid)
            deadline = call.started + self.timeout if self.timeout else float("inf")
            run = _Running(call, proc, pidfd, deadline)
            self._running[proc.pid] = run
            self._sel.register(pidfd, selectors.EVENT_READ, ("exit", run))
            assert proc.stdout is not None and proc.stderr is not None
            for stream, kind in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
                os.set_blocking(stream.fileno(), False)
                self._sel.register(stream.fileno(), selectors.EVENT_READ, (kind, run))
            if proc.stdin is not None:
                os.set_blocking(proc.stdin.fileno(), False)
                self._sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, ("stdin", run))

    def _next_timeout(self) -> float:
        now = time.monotonic()
        soonest = 0.5
        for run in self._running.values():
            limit = run.drain_until if run.exited else run.deadline
            soonest = min(soonest, max(0.0, limit - now))
        return soonest

    def _write_stdin(self, run: _Running) -> None:
        stdin = run.proc.stdin
        assert stdin is not None and run.pending is not None
        try:
            written = os.write(stdin.fileno(), run.pending[:_READ_CHUNK])
        except BlockingIOError:
            return
        except (BrokenPipeError, OSError):
            # The hook exited or closed stdin without reading it all; DaemonCore just stops.
            written = len(run.pending)
        run.pending = run.pending[written:]
        if not run.pending:
            self._close_stdin(run)

    def _close_stdin(self, run: _Running) -> None:
        stdin = run.proc.stdin
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(stdin.fileno())
        with contextlib.suppress(OSError):
            stdin.close()

    def _read(self, run: _Running, stream: Any, sink: list[bytes]) -> None:
        try:
            data = os.read(stream.fileno(), _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            if not append_capped(sink, data):
                run.call.truncated = True
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(stream.fileno())
        stream.close()
        self._maybe_finish(run)

    def _on_exit(self, run: _Running) -> None:
        if run.exited:
            return
        # Kill the family first: the zombie leader still holds the group id, so it cannot be
        # reused by an unrelated process (hook-protocol.md §2.1 "Kill_Family").
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.proc.pid, signal.SIGKILL)
        _, status = os.waitpid(run.proc.pid, 0)
        run.proc.returncode = os.waitstatus_to_exitcode(status)
        call = run.call
        call.duration = time.monotonic() - call.started
        if os.WIFSIGNALED(status):
            call.signal = os.WTERMSIG(status)
            call.exit_code = 0  # WEXITSTATUS of a signalled child
        else:
            call.exit_code = os.WEXITSTATUS(status)
        run.exited = True
        run.drain_until = time.monotonic() + _DRAIN_GRACE
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(run.pidfd)
        os.close(run.pidfd)
        self._close_stdin(run)
        self._maybe_finish(run)

    def _maybe_finish(self, run: _Running, force: bool = False) -> None:
        proc = run.proc
        assert proc.stdout is not None and proc.stderr is not None
        if not run.exited:
            return
        if not force and not (proc.stdout.closed and proc.stderr.closed):
            return
        for stream in (proc.stdout, proc.stderr):
            if not stream.closed:
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(stream.fileno())
                stream.close()
        run.call.stdout = b"".join(run.out)
        run.call.stderr = b"".join(run.err)
        self._running.pop(proc.pid, None)
        self._finished.put(run.call)
        with self._cond:
            self._cond.notify_all()

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for run in list(self._running.values()):
            if run.exited:
                if now >= run.drain_until:
                    # A grandchild escaped the group and holds a pipe open: stop waiting.
                    self._maybe_finish(run, force=True)
            elif now >= run.deadline and not run.call.timed_out:
                run.call.timed_out = True
                log.error("hook %s for job %s (pid %d) exceeded the harness timeout of %.1fs; killing it",
                          run.call.hook, run.call.key, run.proc.pid, self.timeout or 0)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(run.proc.pid, signal.SIGKILL)

    def _start_waiting(self) -> None:
        while self._waiting and (not self.max_running or self._live() < self.max_running):
            with self._cond:
                if not self._waiting:
                    return
                call, env = self._waiting.popleft()
            if self.spawn_threads:
                with self._cond:
                    self._spawning += 1
                self._spawn_q.put((call, env))
                continue
            try:
                self._start(call, env)
            except OSError as exc:
                # Spawn failed after the router counted the call as running: reported like a
                # failure of spawn() itself, so the router retries at its next poll (hook-protocol.md §2.1).
                self._spawn_failed(call, exc)
            self._adopt_incoming()
