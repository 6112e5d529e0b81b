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
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import classad2

from ce_k8s.condor import wire
from ce_k8s.sim.condor.router_hooks import (
    HOOK_CLEANUP,
    HOOK_FINALIZE,
    HOOK_TRANSLATE,
    HOOK_UPDATE,
    HookCall,
    HookRunner,
)
from ce_k8s.sim.condor.schedd import (
    JobStatus,
    PushRejected,
    Schedd,
    copy_ad,
    eval_int,
    eval_str,
    expr_text,
    is_true,
)

log = logging.getLogger(__name__)

THROTTLE_UPDATE_INTERVAL = 600  # JobRouter.cpp

# update_job_status() copies these from the routed job whenever they differ (VanillaToGrid.cpp).
STATUS_ATTRS_TO_COPY: tuple[str, ...] = (
    "BytesSent", "BytesRecvd", "CompletionDate", "JobRunCount", "JobStartDate", "ExitBySignal",
    "ExitSignal", "ExitCode", "ExitReason", "JobCurrentStartDate", "JobCurrentStartExecutingDate",
    "JobLastStartDate", "ShadowBday", "RemoteSysCpu", "RemoteUserCpu", "NumCkpts", "NumJobStarts",
    "NumJobReconnects", "NumShadowExceptions", "NumShadowStarts", "NumJobMatches", "NumRestarts",
    "RemoteWallClockTime", "LastRemoteWallClockTime", "JobCoreDumped", "ImageSize", "MemoryUsage",
    "ResidentSetSize", "ProportionalSetSizeKb", "DiskUsage", "ScratchDirFileCount",
    "SpooledOutputFiles", "CpusUsage", "CpusProvisioned", "DiskProvisioned", "MemoryProvisioned",
)

# Built-in terms of the umbrella constraint (JobRouter.cpp GetCandidateJobs, hook-protocol.md §4.4).
_BUILTIN_TERMS = (
    "(target.ProcId >= 0 && target.JobStatus == 1 && (target.StageInStart is undefined || "
    'target.StageInFinish isnt undefined) && target.Managed isnt "ScheddDone" && '
    'target.Managed isnt "External" && target.Owner isnt Undefined && target.RoutedBy isnt "{name}")'
)

_round_robin_counter = 0  # process-wide, like the static in ChooseRoute


class RouterAborted(RuntimeError):
    """The emulated condor_job_router daemon hit an EXCEPT (e.g. no JobUniverse, hook-protocol.md §2.2)."""


class State(Enum):
    """RoutedJob states (RoutedJob.h, hook-protocol.md §2.7)."""

    UNCLAIMED = "UNCLAIMED"
    CLAIMED = "CLAIMED"
    SUBMITTED = "SUBMITTED"
    FINISHED = "FINISHED"
    CLEANUP = "CLEANUP"
    RETIRED = "RETIRED"


@dataclass(eq=False)
class RouterJob:
    """The router's record of one managed source job (``RoutedJob`` in the C++)."""

    src_key: str
    route_name: str = ""
    target_universe: int = 9
    grid_resource: str = ""
    state: State = State.UNCLAIMED
    src_ad: classad2.ClassAd = field(default_factory=classad2.ClassAd)
    dest_ad: classad2.ClassAd = field(default_factory=classad2.ClassAd)
    dest_key: str = ""
    dest_cluster: int = -1
    is_claimed: bool = False
    is_done: bool = False
    is_running: bool = False
    is_success: bool = False
    is_interrupted: bool = False
    is_sandboxed: bool = False
    edit_job_in_place: bool = False
    saw_dest_job: bool = False
    submission_time: float = 0.0
    retirement_time: float = 0.0
    src_dirty: set[str] = field(default_factory=set)
    history: list[str] = field(default_factory=list)  # state/event trail, for tests and the demo

    def desc(self) -> str:
        parts = [f"src={self.src_key}"]
        if self.dest_key:
            parts.append(f"dest={self.dest_key}")
        if self.route_name:
            parts.append(f"route={self.route_name}")
        return ",".join(parts)

    def set_src(self, name: str, value: object) -> None:
        """Change the router's copy of the source ad and mark it dirty (dirty tracking)."""
        self.src_ad[name] = value
        self.src_dirty.add(name)


@dataclass
class RouteStats:
    """JobRoute counters: capacity (hook-protocol.md §4.4) and the failure throttle (JobRouter.cpp)."""

    max_jobs: int
    max_idle_jobs: int
    failure_rate_threshold: float
    num_jobs: int = 0
    num_running: int = 0
    recent_routed: int = 0
    recent_succeeded: int = 0
    recent_failed: int = 0
    throttle: float = 0.0
    recent_begin: float = 0.0

    @property
    def idle(self) -> int:
        return self.num_jobs - self.num_running

    def accepting(self) -> bool:
        if self.throttle > 0 and self.throttle <= self.recent_routed:
            return False
        if self.max_idle_jobs >= 0 and self.max_idle_jobs <= self.idle:
            return False
        return self.num_jobs < self.max_jobs

    def adjust_throttle(self, now: float) -> None:
        delta = now - self.recent_begin
        if delta < THROTTLE_UPDATE_INTERVAL:
            return
        new = self.throttle
        rate = self.recent_failed / delta
        if rate > self.failure_rate_threshold and self.recent_failed:
            non_failures = self.num_jobs + self.recent_succeeded
            ratio = self.recent_failed / (self.recent_failed + non_failures)
            new = THROTTLE_UPDATE_INTERVAL * self.failure_rate_threshold / ratio
        else:
            accel = 3.0 * self.recent_succeeded - 2.0 * self.recent_failed
            if accel > 0:
                accel /= self.recent_succeeded + self.recent_failed
            accel += 2.0
            if accel > 1.0:
                new *= accel
            if new > THROTTLE_UPDATE_INTERVAL * self.failure_rate_threshold * 10000:
                new = 0
            if 0 < new < 1 and self.recent_failed == 0:
                new = 1
        self.throttle = new
        self.recent_begin = now
        self.recent_routed = self.recent_failed = self.recent_succeeded = 0


def _route_attr(route: Any, name: str, default: Any) -> Any:
    value = getattr(route, name, default)
    return default if value is None else value


def _route_test(route: Any, method: str, job: classad2.ClassAd) -> bool:
    """A route's boolean macro (JobFailureTest, EditJobInPlace…) against the source ad.

    ``ce_k8s.condor.routing.Route`` evaluates these (UNDEFINED counts as false, JobRouter.cpp);
    a route object without the method simply does not use the feature.
    """
    fn = getattr(route, method, None)
    return bool(fn(job)) if callable(fn) else False


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
                max_jobs=int(_route_attr(r, "max_jobs", 100)),
                max_idle_jobs=int(_route_attr(r, "max_idle_jobs", 50)),
                failure_rate_threshold=float(_route_attr(r, "failure_rate_threshold", 0.03)),
                recent_begin=now,
            )
            for r in routes.routes
        }
        self.jobs: dict[str, RouterJob] = {}
        self.poll_count = 0
        self.aborted: str | None = None
        self.calls: list[HookCall] = []
        self.hook_counts: Counter[str] = Counter()
        self.hook_seconds: Counter[str] = Counter()
        self.record_io = record_io
        self.events: Counter[str] = Counter()  # "translate_retry", "update_parse_error", …
        self._known_hooks: dict[str, dict[str, list[int]]] = {}  # type -> key -> insertion seqs
        self._hook_seq = 0
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

    # ================================================================ driving
    def poll(self) -> None:
        """One JOB_ROUTER_POLLING_PERIOD tick (JobRouter::Poll, hook-protocol.md §2.1)."""
        self._check_alive()
        self._reap()
        self.poll_count += 1
        if self.poll_count % 5 == 1:
            self._adopt_orphans()
        self._update_route_stats()
        self._get_candidate_jobs()
        for job in list(self.jobs.values()):
            self._take_over_job(job)
            self._submit_job(job)
            self._check_submitted_job_status(job)
            self._finalize_job(job)
            self._cleanup_job(job)
            self._cleanup_retired_job(job)

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

    # ================================================================ hooks
    def _check_alive(self) -> None:
        if self.aborted:
            raise RouterAborted(self.aborted)

    def _abort(self, message: str) -> None:
        self.aborted = message
        log.error("condor_job_router EXCEPT: %s", message)
        self.runner.kill_all()
        raise RouterAborted(message)

    def _hook_known(self, key: str, hook: str) -> bool:
        """checkHookKnown: any running entry whose key is a *prefix* of ``key`` (strncmp quirk)."""
        known = self._known_hooks.get(hook)
        if not known:
            return False
        return any(key[:i] in known for i in range(len(key) + 1))

    def _add_known_hook(self, key: str, hook: str) -> None:
        self._hook_seq += 1
        self._known_hooks.setdefault(hook, {}).setdefault(key, []).append(self._hook_seq)

    def _remove_known_hook(self, key: str, hook: str) -> bool:
        """removeKnownHook: drop the *first-added* entry whose key is a prefix of ``key``."""
        known = self._known_hooks.get(hook, {})
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

    def _spawn(self, job: RouterJob, hook: str, path: str, key: str, stdin: Callable[[], bytes]) -> int:
        """hookXxx(): 1 = spawned or already running, -1 = spawn failed (retry next poll).

        The hook's stdin is printed only once the hook is known not to be running for this key, as
        the router does (JobRouterHookMgr.cpp hookUpdateJobInfo: checkHookKnown, then sPrintAd):
        in a poll after a restart most routed jobs still have their update hook queued."""
        if self._hook_known(key, hook):
            log.debug("%s retried while still waiting for the hook to return for key %s - ignoring",
                      hook, key)
            return 1
        call = HookCall(hook=hook, key=key, argv=[path], stdin=stdin(), poll=self.poll_count,
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

    def _reap(self) -> None:
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
            handler = {
                HOOK_TRANSLATE: self._translate_exited,
                HOOK_UPDATE: self._update_exited,
                HOOK_FINALIZE: self._finalize_exited,
                HOOK_CLEANUP: self._cleanup_exited,
            }[call.hook]
            handler(job, call)
            call.job = None
            if not self.record_io:
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

    @staticmethod
    def _parse(call: HookCall) -> classad2.ClassAd:
        return wire.parse_hook_output(call.stdout.decode(errors="replace"),
                                      source=f"{call.hook} stdout of {call.argv[0]}")

    # --- TranslateClient::hookExited (JobRouterHookMgr.cpp, hook-protocol.md §2.2)
    def _translate_exited(self, job: RouterJob, call: HookCall) -> None:
        if call.stdout and call.exited_ok:
            try:
                ad = self._parse(call)
            except wire.HookOutputError as exc:
                log.warning("TRANSLATE (%s): failed to insert line into ClassAd, ignoring invalid "
                            "hook output: %s", job.desc(), exc)
                self.events["translate_parse_error"] += 1
                self._gracefully_remove(job, "translate output did not parse")
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
                self._gracefully_remove(job, f"translate exited {call.exit_code}")
            return
        self._finish_submit_job(job)

    # --- StatusClient::hookExited (hook-protocol.md §2.3)
    def _update_exited(self, job: RouterJob, call: HookCall) -> None:
        if call.stdout and call.exited_ok:
            try:
                ad = self._parse(call)
            except wire.HookOutputError as exc:
                log.warning("UPDATE (%s): invalid hook output, job status NOT updated: %s", job.desc(), exc)
                self.events["update_parse_error"] += 1
                self._gracefully_remove(job, "update output did not parse")
                return
            for name in ("MyType", "TargetType"):
                if name in ad:
                    del ad[name]
            self._update_routed_job_status(job, ad)
        elif call.exited_ok:
            self._finish_check_submitted_job_status(job)
        else:
            log.debug("UPDATE (%s): hook exited with status %s; no status sync this cycle",
                      job.desc(), call.exit_code)
            self.events["update_failed"] += 1

    # --- ExitClient::hookExited (hook-protocol.md §2.4)
    def _finalize_exited(self, job: RouterJob, call: HookCall) -> None:
        if call.stdout and call.exited_ok:
            try:
                ad = self._parse(call)
            except wire.HookOutputError as exc:
                log.warning("FINALIZE (%s): invalid hook output: %s", job.desc(), exc)
                self.events["finalize_parse_error"] += 1
                self._reroute_job(job)
                return
            saved = copy_ad(job.src_ad)
            saved_dirty = set(job.src_dirty)
            for name in ad.keys():
                job.set_src(name, ad.lookup(name))
            if not self._push_src(job):
                log.warning("FINALIZE (%s): failed to update src job in job queue", job.desc())
                mirror = self.schedd.snapshot(job.src_key)
                job.src_ad = mirror if mirror is not None else saved
                job.src_dirty = set() if mirror is not None else saved_dirty
                self._reroute_job(job)
                return
        if not call.exited_ok:
            self.events["finalize_failed"] += 1
            self._reroute_job(job)
        else:
            self._finish_finalize_job(job)

    # --- CleanupClient::hookExited (hook-protocol.md §2.5)
    def _cleanup_exited(self, job: RouterJob, call: HookCall) -> None:
        if call.signaled or call.exit_code == 0:
            self._finish_cleanup_job(job)
        else:
            log.error("CLEANUP (%s): HOOK_JOB_CLEANUP (%s) failed (exit %s); retrying next poll",
                      job.desc(), call.argv[0], call.exit_code)
            self.events["cleanup_failed"] += 1

    # ================================================================ poll steps
    def _adopt_orphans(self) -> None:
        """AdoptOrphans (JobRouter.cpp, hook-protocol.md §2.3): re-adopt routed jobs, yield claimed orphans."""
        for dest_key, dest in list(self.schedd2.items()):
            if (eval_int(dest, "ProcId", -1) or 0) < 0 or eval_str(dest, "RoutedBy") != self.name:
                continue
            if "Owner" not in dest or eval_str(dest, "Owner") is None:
                continue
            src_key = eval_str(dest, "RoutedFromJobId")
            route_name = eval_str(dest, "RouteName")
            if src_key is None or route_name is None:
                log.warning("JobRouter failure (dest=%s): no routing information found in routed job", dest_key)
                continue
            existing = self.jobs.get(src_key)
            if existing is not None and existing.dest_key == dest_key:
                continue
            src = self.schedd.get(src_key)
            if src is None:
                log.info("JobRouter (src=%s,dest=%s): removing orphaned destination job with no "
                         "matching source job", src_key, dest_key)
                self.schedd2.remove(dest_key, "JobRouter orphan")
                continue
            if existing is not None:
                log.info("JobRouter (src=%s,dest=%s): failed to add orphaned job; aborting it", src_key, dest_key)
                self.schedd2.remove(dest_key, "JobRouter orphan")
                continue
            job = RouterJob(src_key=src_key, route_name=route_name, state=State.SUBMITTED,
                            dest_key=dest_key, is_claimed=True, submission_time=self.clock())
            job.dest_cluster = int(dest_key.split(".")[0])
            job.src_ad = copy_ad(src)
            job.dest_ad = copy_ad(dest)
            job.saw_dest_job = True
            job.history.append("ADOPTED")
            self.jobs[src_key] = job
            self.events["adopted"] += 1
            log.info("JobRouter (%s): adopted orphaned job (from previous run?)", job.desc())
        for src_key, src in list(self.schedd.items()):
            if eval_str(src, "Managed") != "External" or eval_str(src, "ManagedManager") != self.name:
                continue
            if eval_str(src, "Owner") is None or src_key in self.jobs:
                continue
            log.info("JobRouter (src=%s): found orphan with no routed destination job; yielding it", src_key)
            self.schedd.yield_job(src_key, False, self.name, self.release_on_hold)
            self.events["orphan_yielded"] += 1

    def _num_managed(self) -> int:
        return sum(1 for job in self.jobs.values() if job.state != State.RETIRED)

    def _accepting(self) -> bool:
        return self.max_jobs < 0 or self._num_managed() < self.max_jobs

    def _update_route_stats(self) -> None:
        for st in self.stats.values():
            st.num_jobs = st.num_running = 0
        for job in self.jobs.values():
            st = self.stats.get(job.route_name) if job.route_name else None
            if st is not None:
                st.num_jobs += 1
                if job.is_running:
                    st.num_running += 1
        now = self.clock()
        for st in self.stats.values():
            st.adjust_throttle(now)

    def _umbrella(self, accepting: list[Any]) -> classad2.ExprTree | None:
        requirements: list[str] = []
        for route in accepting:
            text = (getattr(route, "requirements", None) or "").strip() or "True"
            if text not in requirements:
                requirements.append(text)
        if not requirements:
            return None
        parts = []
        constraint = getattr(self.rc, "source_constraint", None)
        if constraint:
            parts.append(f"({constraint}) && ")
        parts.append("( " + " || ".join(f"({r})" for r in requirements) + " )")
        parts.append(" && " + _BUILTIN_TERMS.format(name=self.name))
        return classad2.ExprTree("".join(parts))

    def _get_candidate_jobs(self) -> None:
        if not self.enabled or not self._accepting():
            return
        accepting = [self.routes[n] for n in self.route_order if self.stats[n].accepting()]
        umbrella = self._umbrella(accepting)
        if umbrella is None:
            return
        for key, ad in list(self.schedd.items()):
            if not self._accepting():
                return
            if key in self.jobs:
                continue
            # Cheap necessary conditions of the built-in terms before the full evaluation.
            if eval_int(ad, "JobStatus") != JobStatus.IDLE or eval_str(ad, "Managed") in ("External", "ScheddDone"):
                continue
            # The query is a match with the job as TARGET. classad2 leaves target.X undefined when
            # scope and target are the same object, so the target is a copy.
            if umbrella.eval(scope=ad, target=copy_ad(ad)) is not True:
                continue
            route, all_full = self._choose_route(ad)
            if route is None:
                if all_full:
                    return
                continue
            job = RouterJob(src_key=key, route_name=route.name,
                            target_universe=int(_route_attr(route, "target_universe", 9)),
                            grid_resource=str(_route_attr(route, "grid_resource", "")))
            job.src_ad = copy_ad(ad)
            job.is_sandboxed = _route_test(route, "sandboxed", job.src_ad)
            job.edit_job_in_place = _route_test(route, "edits_in_place", job.src_ad)
            job.history.append("CANDIDATE")
            self.jobs[key] = job

    def _choose_route(self, ad: classad2.ClassAd) -> tuple[Any | None, bool]:
        global _round_robin_counter
        matches = []
        all_full = True
        for name in self.route_order:
            st = self.stats[name]
            if not st.accepting():
                continue
            all_full = False
            route = self.routes[name]
            if route.matches(ad):
                matches.append(route)
            if not self.round_robin and matches:
                break
        if not matches:
            return None, all_full
        choice = _round_robin_counter % len(matches)
        _round_robin_counter += 1
        route = matches[choice]
        st = self.stats[route.name]
        st.num_jobs += 1
        st.recent_routed += 1
        return route, False

    def _take_over_job(self, job: RouterJob) -> None:
        if job.state != State.UNCLAIMED:
            return
        if job.edit_job_in_place:
            self._set_state(job, State.CLAIMED)
            return
        if self.schedd.claim_job(job.src_key, self.name):
            job.is_claimed = True
            self._set_state(job, State.CLAIMED)
        else:
            log.info("JobRouter failure (%s): candidate job could not be claimed", job.desc())
            self._gracefully_remove(job, "claim failed")

    def _submit_job(self, job: RouterJob) -> None:
        if job.state != State.CLAIMED:
            return
        route = self.routes.get(job.route_name)
        if route is None:
            self._gracefully_remove(job, "route vanished before translate")
            return
        path = self.rc.hook_path(job.src_ad, HOOK_TRANSLATE)
        if path:
            line = route.route_info_line()
            self._spawn(job, HOOK_TRANSLATE, path, job.src_key, lambda: wire.translate_stdin(line, job.src_ad))
            return
        job.dest_ad = copy_ad(job.src_ad)
        self._finish_submit_job(job, translated=False)

    def _finish_submit_job(self, job: RouterJob, translated: bool = True) -> None:
        """FinishSubmitJob: VanillaToGrid, transforms, submission (hook-protocol.md §2.2 "afterwards")."""
        if not job.edit_job_in_place:
            universe = eval_int(job.dest_ad, "JobUniverse") if "JobUniverse" in job.dest_ad else None
            if universe is None:
                self._abort(f"VanillaToGrid ({job.desc()}): job ad has no integer JobUniverse; "
                            "condor_job_router daemon aborts (hook-protocol.md §2.2)")
        route = self.routes.get(job.route_name)
        if route is None:
            self._gracefully_remove(job, "route vanished before submission")
            return
        try:
            result = self.rc.route_job(copy_ad(job.src_ad), route, translated=job.dest_ad if translated else None)
        except Exception as exc:  # a transform engine bug must not look like a pilot's fault
            log.exception("JobRouter failure (%s): applying the route raised", job.desc())
            self.events["transform_exception"] += 1
            self._gracefully_remove(job, f"route application raised {exc!r}")
            return
        for err in getattr(result, "errors", []) or []:
            log.warning("JobRouter (%s): transform: %s", job.desc(), err)
        if result.failed:
            self._gracefully_remove(job, "transform failed")
            return
        dest = result.ad
        if job.edit_job_in_place:
            self._edit_in_place(job, dest)
            return
        if "RoutedToJobId" in dest:
            del dest["RoutedToJobId"]
        if eval_str(job.src_ad, "Owner") is None:
            self._gracefully_remove(job, "source job has no Owner")
            return
        job.dest_ad = dest
        job.dest_key = self.schedd2.submit_routed(dest)
        job.dest_cluster = int(job.dest_key.split(".")[0])
        job.set_src("RoutedToJobId", job.dest_key)
        job.submission_time = self.clock()
        self._set_state(job, State.SUBMITTED)
        log.debug("JobRouter (%s): submitted job", job.desc())

    def _edit_in_place(self, job: RouterJob, dest: classad2.ClassAd) -> None:
        updates = []
        for name in dest.keys():
            if expr_text(job.src_ad, name) != expr_text(dest, name):
                updates.append((name, dest.lookup(name)))
        try:
            self.schedd.set_attributes(job.src_key, updates, as_user=True)
            for name in job.src_ad.keys():
                if name not in dest:
                    self.schedd.delete_attribute(job.src_key, name)
            job.is_success = job.is_done = True
        except PushRejected as exc:
            log.warning("JobRouter failure (%s): failed to edit job: %s", job.desc(), exc)
        self._gracefully_remove(job, "edit in place done")

    def _check_submitted_job_status(self, job: RouterJob) -> None:
        if job.state != State.SUBMITTED:
            return
        if job.saw_dest_job:
            path = self.rc.hook_path(job.src_ad, HOOK_UPDATE)
            if path:
                rval = self._spawn(job, HOOK_UPDATE, path, job.dest_key,
                                   lambda: wire.sprint_ad(job.dest_ad).encode())
                if rval != 0:
                    return
        self._finish_check_submitted_job_status(job)

    def _update_routed_job_status(self, job: RouterJob, update: classad2.ClassAd) -> None:
        """UpdateRoutedJobStatus: reload, merge, push every output attribute to SCHEDD2 (hook-protocol.md §2.3)."""
        current = self.schedd2.get(job.dest_key)
        if current is None:
            log.warning("JobRouter failure (%s): ad disappeared before update finished", job.desc())
            self._gracefully_remove(job, "routed job vanished during update")
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
            self._gracefully_remove(job, f"update push rejected: {exc}")
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
        self._finish_check_submitted_job_status(job, dest_fresh=after is not None)

    def _finish_check_submitted_job_status(self, job: RouterJob, dest_fresh: bool = False) -> None:
        """FinishCheckSubmittedJobStatus: mirror the routed job into the source job (hook-protocol.md §2.3).

        ``dest_fresh``: ``job.dest_ad`` is a copy of the queue's ad taken a moment ago, after
        UpdateRoutedJobStatus pushed (nothing ran in between), so it is not copied again.
        """
        src = self.schedd.get(job.src_key)
        if src is None:
            job.is_interrupted = True
            self._gracefully_remove(job, "source job gone")
            return
        src_status = eval_int(src, "JobStatus")
        if src_status is None:
            job.is_interrupted = True
            self._gracefully_remove(job, "source JobStatus unreadable")
            return
        if src_status == JobStatus.REMOVED:
            job.is_interrupted = True
            self._gracefully_remove(job, "source job removed")
            return
        if src_status == JobStatus.HELD and not is_true(src, "HoldCopiedFromTargetJob"):
            job.is_interrupted = True
            self._gracefully_remove(job, "source job held")
            return
        dest = self.schedd2.get(job.dest_key)
        if dest is None:
            age = self.clock() - job.submission_time
            if job.saw_dest_job:
                log.warning("JobRouter (%s): dest job was removed!", job.desc())
                self._gracefully_remove(job, "routed job gone")
            elif age > self.mirror_lag:
                self._gracefully_remove(job, "routed job never appeared")
            return
        if not dest_fresh:
            job.dest_ad = copy_ad(dest)
        job.saw_dest_job = True
        custom = list(self.rc.attrs_to_copy(job.src_ad) or [])  # empty without a keyword (hook-protocol.md §1.1)
        self._update_job_status(src, job.dest_ad, job, custom)
        if job.src_dirty and not self._push_src(job):
            log.warning("JobRouter failure (%s): failed to update src job", job.desc())
            self._gracefully_remove(job, "source push failed")
            return
        status = eval_int(dest, "JobStatus")
        if status is None:
            self._gracefully_remove(job, "routed JobStatus unreadable")
            return
        job.is_running = status in (JobStatus.RUNNING, JobStatus.TRANSFERRING_OUTPUT)
        if status == JobStatus.COMPLETED and (eval_int(dest, "JobFinishedHookDone", 0) or 0) != 0:
            self._set_state(job, State.FINISHED)

    def _update_job_status(self, orig: classad2.ClassAd, newgrid: classad2.ClassAd, job: RouterJob,
                           custom: list[str]) -> None:
        """VanillaToGrid.cpp update_job_status: routed → source, into the router's copy."""
        origstatus = eval_int(orig, "JobStatus")
        newstatus = eval_int(newgrid, "JobStatus")
        if origstatus is None or newstatus is None:
            log.warning("JobRouter (%s): unable to read JobStatus for status sync", job.desc())
            return
        copied = is_true(orig, "HoldCopiedFromTargetJob")
        if origstatus != JobStatus.HELD and copied:
            job.set_src("HoldCopiedFromTargetJob", False)
        if origstatus != newstatus:
            if newstatus in (JobStatus.IDLE, JobStatus.RUNNING, JobStatus.TRANSFERRING_OUTPUT):
                target = JobStatus.IDLE if newstatus == JobStatus.IDLE else JobStatus.RUNNING
                if not (origstatus == JobStatus.HELD and not copied) and origstatus not in (
                        target, JobStatus.REMOVED):
                    job.set_src("JobStatus", int(target))
                    job.set_src("EnteredCurrentStatus", int(self.clock()))
                    if copied:
                        job.set_src("HoldCopiedFromTargetJob", False)
            elif newstatus == JobStatus.HELD:
                if origstatus not in (JobStatus.HELD, JobStatus.REMOVED, JobStatus.COMPLETED):
                    job.set_src("JobStatus", int(JobStatus.HELD))
                    job.set_src("EnteredCurrentStatus", int(self.clock()))
                    job.set_src("HoldReason", eval_str(newgrid, "HoldReason") or "Unknown reason")
                    job.set_src("HoldReasonCode", eval_int(newgrid, "HoldReasonCode", 0) or 0)
                    subcode = eval_int(newgrid, "HoldReasonSubCode", 0) or 0
                    if eval_str(newgrid, "HoldReason") is None:
                        subcode = 0
                    job.set_src("HoldReasonSubCode", subcode)
                    job.set_src("HoldCopiedFromTargetJob", True)
                    if "ReleaseReason" in job.src_ad:
                        job.set_src("LastReleaseReason", job.src_ad.lookup("ReleaseReason"))
                        del job.src_ad["ReleaseReason"]
                    job.set_src("NumSystemHolds", (eval_int(orig, "NumSystemHolds", 0) or 0) + 1)
            elif newstatus != JobStatus.REMOVED:
                job.set_src("JobStatus", newstatus)
        # The names are read once (one library call) instead of asking `name in newgrid`, which
        # evaluates the attribute: this runs for every routed job on every poll of the emulator.
        names = list(newgrid)
        present = {n.lower() for n in names}
        chirp = [n for n in names if n.lower().startswith("chirp")]
        for name in (*STATUS_ATTRS_TO_COPY, *custom, *chirp):
            if not name or name.lower() not in present:
                continue
            new_text = expr_text(newgrid, name)
            if expr_text(orig, name) != new_text:
                job.set_src(name, newgrid.lookup(name))

    def _push_src(self, job: RouterJob) -> bool:
        """PushUpdatedAttributes for the source job (SCHEDD1), as the job's user."""
        if not job.src_dirty:
            return True
        pairs = [(name, job.src_ad.lookup(name)) for name in sorted(job.src_dirty) if name in job.src_ad]
        try:
            self.schedd.set_attributes(job.src_key, pairs, as_user=True)
        except Exception as exc:
            log.warning("JobRouter (%s): push to source failed: %s", job.desc(), exc)
            return False
        job.src_dirty.clear()
        return True

    def _finalize_job(self, job: RouterJob) -> None:
        if job.state != State.FINISHED:
            return
        path = self.rc.hook_path(job.src_ad, HOOK_FINALIZE)
        if path:
            self._spawn(job, HOOK_FINALIZE, path, job.dest_key, lambda: wire.finalize_stdin(job.src_ad, job.dest_ad))
            return
        self._finish_finalize_job(job)

    def _reroute_job(self, job: RouterJob) -> None:
        """RerouteJob = SetJobIdle + GracefullyRemoveJob (hook-protocol.md §2.4): the pilot will run again."""
        self.events["rerouted"] += 1
        self._set_job_idle(job)
        self._gracefully_remove(job, "rerouted")

    def _set_job_idle(self, job: RouterJob) -> None:
        if eval_int(job.src_ad, "JobStatus", JobStatus.IDLE) != JobStatus.IDLE:
            job.set_src("JobStatus", int(JobStatus.IDLE))
            if not self._push_src(job):
                log.warning("JobRouter failure (%s): failed to set src job status back to idle", job.desc())

    def _finish_finalize_job(self, job: RouterJob) -> None:
        if eval_str(job.src_ad, "Owner") is None:
            self._set_job_idle(job)
            self._gracefully_remove(job, "no Owner at finalize")
            return
        try:
            self.schedd2.set_attributes(job.dest_key, [("LeaveJobInQueue", False)], as_user=True)
            finalized = True
        except Exception as exc:
            log.warning("JobRouter failure (%s): failed to finalize job: %s", job.desc(), exc)
            finalized = False
        if not finalized:
            self._set_job_idle(job)
        else:
            job.is_done = True
            route = self.routes.get(job.route_name)
            failed = route is not None and _route_test(route, "job_failed", job.src_ad)
            job.is_success = not failed
            log.info("JobRouter (%s): finalized job", job.desc())
        self._gracefully_remove(job, "finalized" if finalized else "finalize failed")

    def _cleanup_job(self, job: RouterJob) -> None:
        if job.state != State.CLEANUP:
            return
        path = self.rc.hook_path(job.src_ad, HOOK_CLEANUP)
        if path and len(job.dest_ad.keys()) > 0:
            self._spawn(job, HOOK_CLEANUP, path, job.dest_key, lambda: wire.sprint_ad(job.dest_ad).encode())
            return
        self._finish_cleanup_job(job)

    def _finish_cleanup_job(self, job: RouterJob) -> None:
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
        self._set_state(job, State.RETIRED)
        job.retirement_time = self.clock()
        job.route_name = ""

    def _cleanup_retired_job(self, job: RouterJob) -> None:
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

    # ================================================================ helpers
    def _gracefully_remove(self, job: RouterJob, why: str) -> None:
        job.history.append(f"CLEANUP:{why}")
        job.state = State.CLEANUP

    def _set_state(self, job: RouterJob, state: State) -> None:
        job.history.append(state.value)
        job.state = state
