"""One keyed work queue for the agent's effects and the HTCJob operator's passes.

The shape of client-go's rate-limited delaying work queue (the model docs/internals.md points
to), written for our two users:

* **A key waits at most once**, at its earliest due time: ten update polls asking for the same
  pod's create are one piece of work.
* **A key is worked by one worker at a time.** A key added while a worker holds it waits until
  that worker calls `done`, then runs again: the effects of one pod (its create, its delete)
  never run side by side, by construction, whatever the number of workers.
* **Per-key back-off:** `retry` counts the key's consecutive failures and puts it back after
  `ratelimit.backoff` (exponential, equal jitter); `forget` clears the count after a success.
  The API budget (QPS) is not the queue's: every call takes a token from the one bucket of its
  process, whatever path made it.

Level-triggered, as the models are: the queue says only *which* key to look at; the worker reads
what that key wants now (a record, a resource) and does it. Stdlib only, so any room may use it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from ce_k8s.ratelimit import backoff

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keys with due times; see the module docstring. Thread-safe."""

    def __init__(self, *, base: float = 1.0, cap: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base = base
        self.cap = cap
        self._clock = clock
        self._heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()          # ties in due time keep their order; keys are never compared
        self._due: dict[K, float] = {}          # waiting keys (parked ones included) -> due time
        self._parked: set[K] = set()            # due while a worker holds them: back in at `done`
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._shut = False
        self._cv = threading.Condition()

    # -- adding ------------------------------------------------------------------------------------

    def add(self, key: K, delay: float = 0.0) -> None:
        """Have `key` worked `delay` seconds from now, or earlier if it already waits for earlier."""
        due = self._clock() + max(delay, 0.0)
        with self._cv:
            if self._shut or (key in self._due and self._due[key] <= due):
                return
            self._due[key] = due
            if key not in self._parked:
                heapq.heappush(self._heap, (due, next(self._seq), key))
            self._cv.notify()

    def retry(self, key: K) -> float:
        """Count a failure of `key` and add it back after its back-off; the delay, in seconds."""
        with self._cv:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = backoff(failures, base=self.base, cap=self.cap)
        self.add(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """The key succeeded (or its work ended): its next failure backs off from the start."""
        with self._cv:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """Consecutive failures of `key` since it was last forgotten."""
        with self._cv:
            return self._failures.get(key, 0)

    def discard(self, key: K) -> None:
        """Drop `key` if it waits (a worker that holds it keeps it until `done`)."""
        with self._cv:
            self._due.pop(key, None)
            self._parked.discard(key)
            self._failures.pop(key, None)

    # -- taking ------------------------------------------------------------------------------------

    def _take(self) -> tuple[K | None, float | None]:
        """(a due key now held by the caller, None) or (None, seconds until the next due key)."""
        while self._heap:
            due, _, key = self._heap[0]
            if self._due.get(key) != due or key in self._parked:
                heapq.heappop(self._heap)        # superseded by an earlier due time, or dropped
                continue
            if key in self._processing:
                heapq.heappop(self._heap)
                self._parked.add(key)            # back in when its worker is done
                continue
            now = self._clock()
            if due > now:
                return None, due - now
            heapq.heappop(self._heap)
            del self._due[key]
            self._processing.add(key)
            return key, None
        return None, None

    def get(self, stop: threading.Event | None = None, timeout: float | None = None) -> K | None:
        """Wait for a due key and hold it (call `done` after); None once stopped, shut down or
        after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while not self._shut and not (stop is not None and stop.is_set()):
                key, wait = self._take()
                if key is not None:
                    return key
                wait = 1.0 if wait is None else min(wait, 1.0)   # a stop event is not a notify
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    wait = min(wait, left)
                self._cv.wait(wait)
        return None

    def get_nowait(self) -> K | None:
        """A due key, held by the caller, or None at once."""
        with self._cv:
            return None if self._shut else self._take()[0]

    def done(self, key: K) -> None:
        """The worker holding `key` is finished with it; if it was added meanwhile, it waits again."""
        with self._cv:
            self._processing.discard(key)
            if key in self._parked:
                self._parked.discard(key)
                heapq.heappush(self._heap, (self._due[key], next(self._seq), key))
                self._cv.notify()

    def shut_down(self) -> None:
        """Wake every worker waiting in `get`; they return None. Keys still waiting are dropped."""
        with self._cv:
            self._shut = True
            self._cv.notify_all()

    # -- looking -----------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether `shut_down` was called."""
        return self._shut

    def __len__(self) -> int:
        """Keys waiting (due or not), not counting those a worker holds."""
        with self._cv:
            return len(self._due)

    def __contains__(self, key: object) -> bool:
        with self._cv:
            return key in self._due

    def processing(self) -> int:
        """Keys a worker holds now."""
        with self._cv:
            return len(self._processing)
