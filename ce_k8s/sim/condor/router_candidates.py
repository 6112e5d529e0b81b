"""The condor_job_router emulator's candidate search: which source jobs the router takes on, by which route.

JobRouter.cpp AdoptOrphans (routed jobs of a previous run re-adopted, claimed orphans yielded),
UpdateRouteStats, GetCandidateJobs (the umbrella constraint of docs/hook-protocol.md §4.4 over the
source queue) and ChooseRoute (first match, or round robin, within each route's capacity and
failure throttle). It creates the :class:`RouterJob` records the state machine
(``router_steps.py``) then drives.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import classad2

from ce_k8s.sim.condor.router_records import RouterJob, RouteStats, State, route_attr, route_test
from ce_k8s.sim.condor.schedd import JobStatus, Schedd, copy_ad, eval_int, eval_str

log = logging.getLogger("ce_k8s.sim.condor.router")  # one logger for the whole emulated daemon (demos silence it)

# Built-in terms of the umbrella constraint (JobRouter.cpp GetCandidateJobs, hook-protocol.md §4.4).
_BUILTIN_TERMS = (
    "(target.ProcId >= 0 && target.JobStatus == 1 && (target.StageInStart is undefined || "
    'target.StageInFinish isnt undefined) && target.Managed isnt "ScheddDone" && '
    'target.Managed isnt "External" && target.Owner isnt Undefined && target.RoutedBy isnt "{name}")'
)

_round_robin_counter = 0  # process-wide, like the static in ChooseRoute


class Candidates:
    """The router's intake: ``jobs`` (the router's table, shared) gains the jobs this finds.

    ``rc`` is the ``RouterConfig``, ``routes``/``route_order``/``stats`` the router's routes by
    name, their order and their counters; ``schedd`` the source queue, ``schedd2`` the routed one.
    """

    def __init__(self, *, rc: Any, routes: dict[str, Any], route_order: list[str], stats: dict[str, RouteStats],
                 jobs: dict[str, RouterJob], schedd: Schedd, schedd2: Schedd, name: str,
                 clock: Callable[[], float], events: Counter[str], max_jobs: int, enabled: bool,
                 round_robin: bool, release_on_hold: bool) -> None:
        self.rc = rc
        self.routes = routes
        self.route_order = route_order
        self.stats = stats
        self.jobs = jobs
        self.schedd = schedd
        self.schedd2 = schedd2
        self.name = name
        self.clock = clock
        self.events = events
        self.max_jobs = max_jobs
        self.enabled = enabled
        self.round_robin = round_robin
        self.release_on_hold = release_on_hold

    def adopt_orphans(self) -> None:
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

    def update_route_stats(self) -> None:
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

    def get_candidate_jobs(self) -> None:
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
                            target_universe=int(route_attr(route, "target_universe", 9)),
                            grid_resource=str(route_attr(route, "grid_resource", "")))
            job.src_ad = copy_ad(ad)
            job.is_sandboxed = route_test(route, "sandboxed", job.src_ad)
            job.edit_job_in_place = route_test(route, "edits_in_place", job.src_ad)
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
