"""Which pods' logs are being fetched, and which pods' output a cleanup has closed.

Why (docs/agent.md "What the agent does", Output): the agent reads a finished pod's log exactly
once and keeps it until the cleanup hook deletes it (cleanup, docs/hook-protocol.md §2.5, follows
finalize, docs/hook-protocol.md §2.4). Two things broke that, one seen in `ce-k8s demo`, one in CI:

* A cleanup deletes the pod, and the deletion is itself a watch event (MODIFIED with
  `deletionTimestamp`, then DELETED). The pod still looked finished with no saved output (the
  cleanup had just removed it), so a second fetch started: two `get pods/log` per pilot, and a
  "lost" entry written after the cleanup that nothing would delete for a day.
* A fetch still in flight when the cleanup ran wrote its result after the cleanup had removed the
  entry (`tests/agent/test_output.py::test_cleanup_removes_the_saved_output` failed in CI once).

So each fetch gets a generation number, and a cleanup *closes* the pod: it ends the generation in
flight and leaves a tombstone for the pod's uid. No fetch starts for a closed pod, and a fetch
writes its result only while holding this book's lock and only if its generation is still the
current one; the cleanup removes the saved entry while holding the same lock. So whichever comes
first, nothing of that pod is on disk once the cleanup has returned.

A tombstone names the pod's uid, not only its name: a pod name never created before a cleanup may
later be given to a pod of a re-routed job (`Updates._renamed_after_cleanup`, update.py), whose output is
wanted. A cleanup that knows no uid (no pod of that name was ever seen) still ends a fetch in
flight but leaves no tombstone. And an update that names a closed pod reopens it: the router
cleans a routed job up when a status push fails and routes the source job again
(`JobRouter.cpp` UpdateRoutedJobStatus, docs/real-condor.md finding R3), and the new routing of a
pilot that had finished must still get its completion, with a note when the log is gone.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class OutputFetches:
    """The log fetches in flight (pod name -> generation) and the pods cleanup closed (name -> uid)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generations = itertools.count(1)
        self._inflight: dict[str, int] = {}
        self._closed: dict[str, tuple[str, float]] = {}    # name -> (pod uid, when the cleanup closed it)

    def __contains__(self, name: str) -> bool:
        """A fetch of `name` is in flight."""
        return name in self._inflight

    def __len__(self) -> int:
        return len(self._inflight)

    def closed(self, name: str, uid: str) -> bool:
        """A cleanup closed the pod `name` with this uid: its output must not be saved again."""
        entry = self._closed.get(name)
        return entry is not None and entry[0] == uid

    def begin(self, name: str, uid: str, saved: Callable[[], bool] = lambda: False) -> int | None:
        """Claim the fetch of pod `name`: its generation, or None when one is in flight, the pod is
        closed, or `saved()` (asked under the lock results are written under: a fetch that saved and
        ended just before this call is seen, so it is not repeated)."""
        with self._lock:
            if name in self._inflight or self.closed(name, uid) or saved():
                return None
            generation = self._inflight[name] = next(self._generations)
            return generation

    @contextmanager
    def committing(self, name: str, generation: int) -> Iterator[bool]:
        """Hold the book while a fetch's result is written: yields whether the fetch is still current
        (no cleanup closed the pod since `begin`). The caller writes only when it is."""
        with self._lock:
            yield self._inflight.get(name) == generation

    def end(self, name: str, generation: int) -> None:
        """The fetch of `generation` is over (saved, failed or discarded)."""
        with self._lock:
            if self._inflight.get(name) == generation:
                del self._inflight[name]

    def close(self, name: str, uid: str | None, remove: Callable[[], None], now: float | None = None) -> None:
        """Cleanup: end any fetch of `name` in flight, tombstone the pod's uid, and run `remove` (drop
        the saved entry) under the lock, so no fetch can write between the check and the removal."""
        with self._lock:
            self._inflight.pop(name, None)
            if uid:
                self._closed[name] = (uid, time.time() if now is None else now)
            remove()

    def reopen(self, name: str) -> None:
        """Forget the tombstone of `name`: a routed job names the pod again after its cleanup (the
        source job was routed again), so its output is wanted again, until that job's cleanup."""
        with self._lock:
            self._closed.pop(name, None)

    def prune(self, older_than: float, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Forget tombstones closed before `older_than` whose pod is no longer known (`keep`: the pods
        the cache still holds, which a watch event could offer again)."""
        with self._lock:
            for name in [n for n, (_uid, t) in self._closed.items() if t < older_than and n not in keep]:
                del self._closed[name]
