"""The condor_job_router emulator's records: a managed job (``RoutedJob``), its states, a route's counters.

Kept apart from the daemon's logic (``router.py`` and its parts) because every part reads and
writes them: the candidate search creates a :class:`RouterJob`, the state machine moves it through
:class:`State`, the hook manager hands it to the exit clients, and :class:`RouteStats` is the
JobRoute bookkeeping (capacity and the failure throttle of JobRouter.cpp) the candidate search
and the cleanup step share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import classad2

THROTTLE_UPDATE_INTERVAL = 600  # JobRouter.cpp


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


def route_attr(route: Any, name: str, default: Any) -> Any:
    value = getattr(route, name, default)
    return default if value is None else value


def route_test(route: Any, method: str, job: classad2.ClassAd) -> bool:
    """A route's boolean macro (JobFailureTest, EditJobInPlace…) against the source ad.

    ``ce_k8s.condor.routing.Route`` evaluates these (UNDEFINED counts as false, JobRouter.cpp);
    a route object without the method simply does not use the feature.
    """
    fn = getattr(route, method, None)
    return bool(fn(job)) if callable(fn) else False
