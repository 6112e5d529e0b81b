"""Client-side API budget (`CE_K8S_QPS` / `CE_K8S_BURST`) and retry back-off.

Why on our side: throughput of peer systems is bounded by client QPS, and a CE that floods the
API server with creates after a restart hurts every tenant of the cluster (client-go's own
default is 5 QPS, burst 10: `DefaultQPS`/`DefaultBurst` in k8s.io/client-go rest/config.go).
Every mutating or reading call the agent makes (except the one long-lived watch) takes a token first.
"""

from __future__ import annotations

import random
import threading
import time


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up; `acquire` blocks until one is free."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic, sleep=time.sleep) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._last = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def try_acquire(self) -> bool:
        """Take a token if one is available now."""
        with self._lock:
            self._refill()
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Wait for a token; False only if `stop` was set while waiting."""
        while True:
            with self._lock:
                self._refill()
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return True
                wait = (1.0 - self._tokens) / self.rate
            if stop is not None:
                if stop.wait(wait):
                    return False
            else:
                self._sleep(wait)


def backoff(failures: int, base: float = 0.5, cap: float = 60.0) -> float:
    """Exponential back-off with *equal* jitter after `failures` consecutive failures (≥ 1).

    The ceiling is `t = min(cap, base * 2**(failures - 1))`; the wait is `t/2 + uniform(0, t/2)`,
    so never below half the ceiling ("equal jitter" in the AWS architecture blog's "Exponential
    Backoff And Jitter"; "full jitter" would be `uniform(0, t)`). Why a floor rather than full
    jitter's spread down to zero: every caller relies on a minimum spacing of its retries.

    * `outputsave.py` gives up saving a finished pod's log after `OUTPUT_TRIES` (5) failures and reports
      the completion without output: the floor guarantees the five tries span at least 7.5 s
      (0.5 + 1 + 2 + 4) of an API outage, where full jitter could spend them all at once.
    * `creator.py` retries a create refused with 429, quota or 5xx, `cache.py` relists after a
      failed watch, `credentials.py` re-patches a Secret: a retry at ~0 s would come straight back
      into the throttling or failure it follows. Jobs that failed together still spread their
      retries over [t/2, t].
    * docs/reliability.md's figures and docs/performance.md's relist times after an API server
      restart (`real_agent_relist_410_s`, which includes this back-off) were measured with it.
    """
    ceiling = min(cap, base * (2 ** min(max(failures - 1, 0), 16)))
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not crypto
