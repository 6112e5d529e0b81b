"""The condor_job_router emulator's hook manager: spawning hooks and collecting their exits.

What JobRouterHookMgr.cpp does between the router and a hook process, as docs/hook-protocol.md §2.1
says: the known-hook table that deduplicates a hook per (key, hook type) with the ``strncmp``
prefix quirk, the spawn (stdin printed only once the hook is known not to be running), and the
reaping of finished calls, each handed to the exit client of its hook type
(``router_hookexits.py``). It knows nothing of routes or job states; the processes themselves are
``router_hooks.py``'s (or ``router_spawner.py``'s) runner.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from ce_k8s.sim.condor.router_hooks import HOOK_TRANSLATE, HookCall
from ce_k8s.sim.condor.router_records import RouterJob

log = logging.getLogger("ce_k8s.sim.condor.router")  # one logger for the whole emulated daemon (demos silence it)


class HookManager:
    """The known-hook table, spawns and reaping for one router.

    ``runner`` runs the processes, ``env`` is their environment, ``events`` the router's event
    counters and ``abort`` the daemon's EXCEPT (it raises). ``poll`` is set by the router at each
    tick: a call records the poll it was spawned in. ``calls``, ``hook_counts`` and
    ``hook_seconds`` are the router's records of the calls (the router exposes the same objects).
    """

    def __init__(self, runner: Any, env: dict[str, str], events: Counter[str],
                 abort: Callable[[str], None]) -> None:
        self.runner = runner
        self._env = env
        self.events = events
        self._abort = abort
        self.poll = 0
        self.calls: list[HookCall] = []
        self.hook_counts: Counter[str] = Counter()
        self.hook_seconds: Counter[str] = Counter()
        self._known: dict[str, dict[str, list[int]]] = {}  # type -> key -> insertion seqs
        self._hook_seq = 0

    def _hook_known(self, key: str, hook: str) -> bool:
        """checkHookKnown: any running entry whose key is a *prefix* of ``key`` (strncmp quirk)."""
        known = self._known.get(hook)
        if not known:
            return False
        return any(key[:i] in known for i in range(len(key) + 1))

    def _add_known_hook(self, key: str, hook: str) -> None:
        self._hook_seq += 1
        self._known.setdefault(hook, {}).setdefault(key, []).append(self._hook_seq)

    def _remove_known_hook(self, key: str, hook: str) -> bool:
        """removeKnownHook: drop the *first-added* entry whose key is a prefix of ``key``."""
        known = self._known.get(hook, {})
        best: tuple[int, str] | None = None
        for i in range(len(key) + 1):
            seqs = known.get(key[:i])
            if seqs and (best is None or seqs[0] < best[0]):
                best = (seqs[0], key[:i])
        if best is None:
            return False
        seqs = known[best[1]]
        seqs.pop(0)
        if not seqs:
            del known[best[1]]
        return True

    def spawn(self, job: RouterJob, hook: str, path: str, key: str, stdin: Callable[[], bytes]) -> int:
        """hookXxx(): 1 = spawned or already running, -1 = spawn failed (retry next poll).

        The hook's stdin is printed only once the hook is known not to be running for this key, as
        the router does (JobRouterHookMgr.cpp hookUpdateJobInfo: checkHookKnown, then sPrintAd):
        in a poll after a restart most routed jobs still have their update hook queued."""
        if self._hook_known(key, hook):
            log.debug("%s retried while still waiting for the hook to return for key %s - ignoring",
                      hook, key)
            return 1
        call = HookCall(hook=hook, key=key, argv=[path], stdin=stdin(), poll=self.poll,
                        src_key=job.src_key, job=job)
        try:
            self.runner.spawn(call, self._env)
        except OSError as exc:
            log.error("ERROR failed to spawn HOOK_%s (%s) for %s: %s", hook, path, job.desc(), exc)
            self.events["spawn_failed"] += 1
            return -1
        self._add_known_hook(key, hook)
        self.calls.append(call)
        return 1

    def reap(self, exited: Mapping[str, Callable[[RouterJob, HookCall], None]], keep_io: bool) -> None:
        """Apply every finished call: its known-hook entry goes, then ``exited[call.hook]`` (the hook's
        exit client) reads its output; ``keep_io`` False drops stdin and stdout once applied."""
        for call in self.runner.take_finished():
            if call.spawn_error:
                self._spawn_failed(call)
                continue
            self.hook_counts[call.hook] += 1
            self.hook_seconds[call.hook] += call.duration
            job: RouterJob = call.job
            key = job.src_key if call.hook == HOOK_TRANSLATE else job.dest_key
            if not self._remove_known_hook(key, call.hook):
                self._abort(f"{call.hook}: received exit notification for job with key {key}, "
                            "which isn't a key for a job known to have that hook running")
            if call.stderr:
                log.warning("%s (%s): hook %s (pid %d) printed to stderr: %s", call.hook, job.desc(),
                            call.argv[0], call.pid, call.stderr.decode(errors="replace").strip())
            exited[call.hook](job, call)
            call.job = None
            if not keep_io:
                call.stdin = call.stdout = b""

    def _spawn_failed(self, call: HookCall) -> None:
        """A spawner thread could not create the process: what ``spawn() == 0`` means in the real
        router (hook-protocol.md §2.1). The hook never ran, so its known-hook entry goes and nothing else changes:
        the job keeps its state and the same step spawns the hook again at the next poll."""
        job: RouterJob = call.job
        key = job.src_key if call.hook == HOOK_TRANSLATE else job.dest_key
        self._remove_known_hook(key, call.hook)
        log.error("ERROR failed to spawn HOOK_%s (%s) for %s: %s", call.hook, call.argv[0], job.desc(),
                  call.spawn_error)
        self.events["spawn_failed"] += 1
        call.job = None

