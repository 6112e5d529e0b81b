"""The condor_job_router emulator: the router's poll loop and RoutedJob state machine.

The law is `docs/hook-protocol.md` (§0, §1.1, §2.1-2.7, §3, §4.4, §7), which was
read from JobRouter.cpp, JobRouterHookMgr.cpp, submit_job.cpp and VanillaToGrid.cpp. Every
harsh reaction of the real daemon is reproduced, because a kinder emulator would hide the bugs
that lose pilots on a real CE:

* one ``poll()`` is one ``JOB_ROUTER_POLLING_PERIOD`` tick: finished hooks are applied first
  (DaemonCore runs reaper callbacks between timer events), then AdoptOrphans (polls 1, 6, 11…),
  UpdateRouteStats, GetCandidateJobs, and per managed job TakeOverJob → SubmitJob →
  CheckSubmittedJobStatus → FinalizeJob → CleanupJob → CleanupRetiredJob (hook-protocol.md §2.1);
* hooks are the real executables, spawned asynchronously (a call started in one poll may finish
  in a later one), deduplicated per (key, hook type) with the ``strncmp`` prefix quirk (hook-protocol.md §2.1);
* the stdout/exit-code rules of hook-protocol.md §2.2-2.5 and the daemon abort (:class:`RouterAborted`) when a
  translated ad has no ``JobUniverse`` (VanillaToGrid ``EXCEPT``).

Routes and transforms are applied by ``ce_k8s.condor.routing`` (our transform engine); the
queues are :class:`ce_k8s.sim.condor.schedd.Schedd` objects (one for both sides by default, as on a CE).

The daemon is in parts, each with the collaborators it needs: the records (``router_records.py``),
the candidate search (``router_candidates.py``), the per-job state machine (``router_steps.py``),
the writes to the source job (``router_writes.py``), the hook manager (``router_hookmgr.py``) and
its exit clients (``router_hookexits.py``). :class:`Router` builds them and runs the poll loop.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ce_k8s.sim.condor.router_candidates import Candidates
from ce_k8s.sim.condor.router_hookexits import HookExits
from ce_k8s.sim.condor.router_hookmgr import HookManager
from ce_k8s.sim.condor.router_hooks import HookCall, HookRunner
from ce_k8s.sim.condor.router_records import RouterAborted, RouterJob, RouteStats, State, route_attr
from ce_k8s.sim.condor.router_steps import JobSteps
from ce_k8s.sim.condor.router_writes import QueueWrites
from ce_k8s.sim.condor.schedd import Schedd

__all__ = ["RouteStats", "Router", "RouterAborted", "RouterJob", "State"]

log = logging.getLogger(__name__)


class Router:
    """One emulated condor_job_router.

    ``cfg`` is a ``ce_k8s.condor.config.CondorConfig``; ``routes`` the matching
    ``ce_k8s.condor.routing.RouterConfig`` (built from ``cfg`` when omitted). ``schedd`` is the
    source queue, ``dest_schedd`` the routed-job queue (the same one by default, as on a CE).
    """

    def __init__(
        self,
        cfg: Any,
        schedd: Schedd,
        routes: Any | None = None,
        dest_schedd: Schedd | None = None,
        env: dict[str, str] | None = None,
        hook_timeout: float | None = None,
        max_running_hooks: int = 0,
        record_io: bool = True,
        clock: Callable[[], float] = time.time,
        spawn_threads: int = 0,
        spawn_process: bool = False,
    ) -> None:
        if routes is None:
            from ce_k8s.condor.routing import RouterConfig

            routes = RouterConfig.from_config(cfg)
        self.cfg = cfg
        self.rc = routes
        self.schedd = schedd
        self.schedd2 = dest_schedd or schedd
        self.clock = clock
        self.name: str = routes.router_name
        if not self.name:
            raise RouterAborted("JOB_ROUTER_NAME must not be empty")
        self.max_jobs = cfg.get_int("JOB_ROUTER_MAX_JOBS", -1)
        self.mirror_lag = cfg.get_int("MAX_JOB_MIRROR_UPDATE_LAG", 600)
        self.release_on_hold = cfg.get_bool("JOB_ROUTER_RELEASE_ON_HOLD", True)
        self.round_robin = bool(getattr(routes, "round_robin", False))
        self.enabled = bool(getattr(routes, "enabled", True)) and bool(routes.routes)
        self.routes = {r.name: r for r in routes.routes}
        self.route_order = [r.name for r in routes.routes]
        now = clock()
        self.stats = {
            r.name: RouteStats(
                max_jobs=int(route_attr(r, "max_jobs", 100)),
                max_idle_jobs=int(route_attr(r, "max_idle_jobs", 50)),
                failure_rate_threshold=float(route_attr(r, "failure_rate_threshold", 0.03)),
                recent_begin=now,
            )
            for r in routes.routes
        }
        self.jobs: dict[str, RouterJob] = {}
        self.poll_count = 0
        self.aborted: str | None = None
        self.record_io = record_io  # False: a call's stdin and stdout are dropped once applied
        self.events: Counter[str] = Counter()  # "translate_retry", "update_parse_error", …
        self._env = dict(os.environ)
        self._env["CONDOR_INHERIT"] = f"{os.getpid()} <127.0.0.1:0?sock=ce_k8s_router_emulator> 0 0"
        if env:
            self._env.update(env)
        # spawn_threads > 0: fork/exec off the polling thread (router_hooks module docstring).
        # spawn_process: a child interpreter forks and watches the hooks (router_spawner), so they
        # do not share this process's GIL with the router's own work.
        runner_class = HookRunner
        if spawn_process:
            from ce_k8s.sim.condor.router_spawner import RemoteHookRunner as runner_class
        self.spawn_process = spawn_process
        self.runner = runner_class(timeout=hook_timeout, max_running=max_running_hooks, spawn_threads=spawn_threads)
        # the parts (module docstring); they share the tables above, not copies of them
        self.hooks = HookManager(self.runner, self._env, self.events, self._abort)
        self.calls: list[HookCall] = self.hooks.calls
        self.hook_counts: Counter[str] = self.hooks.hook_counts
        self.hook_seconds: Counter[str] = self.hooks.hook_seconds
        self.writes = QueueWrites(schedd, clock)
        self.steps = JobSteps(rc=routes, routes=self.routes, stats=self.stats, jobs=self.jobs, schedd=schedd,
                              schedd2=self.schedd2, hooks=self.hooks, writes=self.writes, events=self.events,
                              clock=clock, name=self.name, mirror_lag=self.mirror_lag,
                              release_on_hold=self.release_on_hold, abort=self._abort)
        self.exits = HookExits(self.steps, self.writes, schedd, self.events)
        self.candidates = Candidates(rc=routes, routes=self.routes, route_order=self.route_order, stats=self.stats,
                                     jobs=self.jobs, schedd=schedd, schedd2=self.schedd2, name=self.name,
                                     clock=clock, events=self.events, max_jobs=self.max_jobs, enabled=self.enabled,
                                     round_robin=self.round_robin, release_on_hold=self.release_on_hold)

    # ================================================================ driving
    def poll(self) -> None:
        """One JOB_ROUTER_POLLING_PERIOD tick (JobRouter::Poll, hook-protocol.md §2.1)."""
        self._check_alive()
        self._reap()
        self.poll_count += 1
        self.hooks.poll = self.poll_count
        if self.poll_count % 5 == 1:
            self.candidates.adopt_orphans()
        self.candidates.update_route_stats()
        self.candidates.get_candidate_jobs()
        steps = self.steps
        for job in list(self.jobs.values()):
            steps.take_over_job(job)
            steps.submit_job(job)
            steps.check_submitted_job_status(job)
            steps.finalize_job(job)
            steps.cleanup_job(job)
            steps.cleanup_retired_job(job)

    def settle(self, timeout: float = 30.0) -> bool:
        """Wait for every running hook and apply its result (reaper callbacks); False on timeout."""
        ok = self.runner.wait(timeout)
        self._reap()
        return ok

    def process_events(self, seconds: float) -> None:
        """Apply hook exits as they arrive for ``seconds`` (the daemon's event loop between polls)."""
        end = time.monotonic() + seconds
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            if self.runner.inflight:
                self.runner.wait(remaining, any_done=True)
                self._reap()
            else:
                time.sleep(min(remaining, 0.02))
        self._reap()

    def run(
        self,
        until: Callable[[], bool] | None = None,
        max_polls: int = 1000,
        interval: float = 0.0,
        settle_each: bool = True,
        timeout: float = 120.0,
    ) -> int:
        """Poll until ``until()`` is true; returns the number of polls made.

        ``settle_each`` waits for all hooks between polls (deterministic tests); otherwise hook
        results are applied as they arrive during ``interval`` seconds (like the real daemon).
        """
        start = time.monotonic()
        for n in range(1, max_polls + 1):
            self.poll()
            if settle_each:
                self.settle(timeout=max(1.0, timeout - (time.monotonic() - start)))
            if interval:
                self.process_events(interval)
            if until is not None and until():
                return n
            if time.monotonic() - start > timeout:
                break
        return max_polls

    def condor_rm(self, src_key: str, reason: str = "via condor_rm (factory)") -> bool:
        """A factory's ``condor_rm`` of the source job (noticed at the next status check, hook-protocol.md §3.1)."""
        return self.schedd.remove(src_key, reason)

    def restart(self, **kwargs: Any) -> Router:
        """Kill this router and start a new one on the same queues (AdoptOrphans on poll 1)."""
        self.close()
        params = dict(
            env={k: v for k, v in self._env.items() if os.environ.get(k) != v and k != "CONDOR_INHERIT"},
            hook_timeout=self.runner.timeout,
            max_running_hooks=self.runner.max_running,
            spawn_threads=self.runner.spawn_threads,
            spawn_process=self.spawn_process,
            record_io=self.record_io,
            clock=self.clock,
        )
        params.update(kwargs)
        return Router(self.cfg, self.schedd, routes=self.rc, dest_schedd=self.schedd2, **params)

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def counts_by_state(self) -> Counter[str]:
        return Counter(job.state.value for job in self.jobs.values())

    # ================================================================ the daemon
    def _check_alive(self) -> None:
        if self.aborted:
            raise RouterAborted(self.aborted)

    def _abort(self, message: str) -> None:
        self.aborted = message
        log.error("condor_job_router EXCEPT: %s", message)
        self.runner.kill_all()
        raise RouterAborted(message)

    def _reap(self) -> None:
        """Apply the finished hooks (DaemonCore's reaper callbacks), each through its exit client."""
        self.hooks.reap(self.exits.by_hook, keep_io=self.record_io)
