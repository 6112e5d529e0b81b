"""Fault injection for the API emulator: throttling, server errors, lost answers, cut watches, latency.

A real API server under load answers 429 with ``Retry-After``, fails with 500, applies a write and
then loses the connection before answering (the client sees a timeout but the pod exists), and
ends watch streams early. The agent must survive all of these, so the emulator produces them on
demand: as seeded random rates (reproducible runs) and as scripted one-shot faults for tests
("the next pod create gets a 500"). Everything is changeable at runtime from any thread.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

# Fault kinds.
THROTTLE = "429"
ERROR = "500"
TIMEOUT = "timeout"  # apply the write, then never answer
CUT = "cut"          # cut a watch stream
KINDS = (THROTTLE, ERROR, TIMEOUT, CUT)
MUTATING_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass
class ScriptedFault:
    """A fault for the next ``count`` requests matching ``verb``/``resource`` (None matches all)."""

    kind: str
    verb: str | None = None
    resource: str | None = None
    count: int = 1

    def matches(self, verb: str, resource: str) -> bool:
        """Whether a request with this verb and resource (``pods``, ``pods/status``…) is targeted."""
        return (self.verb is None or self.verb == verb) and (self.resource is None or self.resource == resource)


@dataclass
class Faults:
    """Fault configuration and the seeded RNG that draws from it.

    Rates are probabilities per request (``cut_rate``: per watch event sent). ``verbs`` and
    ``resources`` restrict random faults (not scripted ones) to some requests; discovery is never
    faulted. ``timeout_mode`` "close" drops the connection after applying the write, "hang" keeps
    it open without answering for ``hang_seconds`` (the client's own timeout fires).
    """

    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_timeout: float = 0.0
    cut_rate: float = 0.0
    cut_after: float | None = None    # also cut every watch after this many seconds
    latency: float = 0.0              # seconds added to every request
    jitter: float = 0.0               # plus uniform(0, jitter)
    retry_after: int = 1
    timeout_mode: str = "close"
    hang_seconds: float = 30.0
    verbs: frozenset[str] | None = None
    resources: frozenset[str] | None = None
    seed: int = 0
    scripted: list[ScriptedFault] = field(default_factory=list)
    injected: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(self.seed)  # noqa: S311 - reproducible simulation, not security

    @classmethod
    def from_rate(cls, rate: float, seed: int = 0) -> Faults:
        """A single ``--fault-rate``: split evenly between 429, 500 and applied-then-timeout."""
        return cls(rate_429=rate / 3, rate_500=rate / 3, rate_timeout=rate / 3, seed=seed)

    def configure(self, **changes: object) -> None:
        """Change any field at runtime (thread-safe); ``seed=`` also reseeds the RNG."""
        with self._lock:
            for k, val in changes.items():
                if not hasattr(self, k) or k.startswith("_"):
                    raise AttributeError(f"unknown fault setting {k!r}")
                setattr(self, k, val)
            if "seed" in changes:
                self._rng = random.Random(self.seed)  # noqa: S311

    def inject(self, kind: str, verb: str | None = None, resource: str | None = None, count: int = 1) -> None:
        """Script ``count`` faults of ``kind`` for the next matching requests."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {KINDS}")
        with self._lock:
            self.scripted.append(ScriptedFault(kind, verb, resource, count))

    def clear(self) -> None:
        """Remove every random rate and scripted fault."""
        with self._lock:
            self.scripted.clear()
            self.rate_429 = self.rate_500 = self.rate_timeout = self.cut_rate = 0.0
            self.latency = self.jitter = 0.0
            self.cut_after = None

    def _take_scripted(self, verb: str, resource: str, kinds: tuple[str, ...]) -> str | None:
        for sf in self.scripted:
            if sf.kind in kinds and sf.matches(verb, resource):
                sf.count -= 1
                if sf.count <= 0:
                    self.scripted.remove(sf)
                return sf.kind
        return None

    def _selected(self, verb: str, resource: str) -> bool:
        return (self.verbs is None or verb in self.verbs) and \
            (self.resources is None or resource in self.resources)

    def _count(self, kind: str) -> str:
        self.injected[kind] = self.injected.get(kind, 0) + 1
        return kind

    def decide(self, verb: str, resource: str) -> str | None:
        """The fault for one request (THROTTLE, ERROR, TIMEOUT or None). TIMEOUT only for writes."""
        kinds = (THROTTLE, ERROR, TIMEOUT) if verb in MUTATING_VERBS else (THROTTLE, ERROR)
        with self._lock:
            kind = self._take_scripted(verb, resource, kinds)
            if kind is not None:
                return self._count(kind)
            if not self._selected(verb, resource):
                return None
            if not (self.rate_429 or self.rate_500 or self.rate_timeout):
                return None
            r = self._rng.random()
            if r < self.rate_429:
                return self._count(THROTTLE)
            r -= self.rate_429
            if r < self.rate_500:
                return self._count(ERROR)
            r -= self.rate_500
            if TIMEOUT in kinds and r < self.rate_timeout:
                return self._count(TIMEOUT)
        return None

    def delay(self) -> float:
        """Seconds to wait before handling a request."""
        with self._lock:
            if not self.latency and not self.jitter:
                return 0.0
            return self.latency + (self._rng.uniform(0, self.jitter) if self.jitter else 0.0)

    def cut_watch_now(self, resource: str) -> bool:
        """Whether to cut a watch stream right after the event just sent."""
        with self._lock:
            if self._take_scripted("watch", resource, (CUT,)):
                self._count(CUT)
                return True
            if self.cut_rate and self._rng.random() < self.cut_rate:
                self._count(CUT)
                return True
        return False
