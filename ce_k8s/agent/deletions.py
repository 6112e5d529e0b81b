"""One delete per pod: every delete path of the agent claims the pod here before calling the API.

Why: several paths can decide at the same moment that a pod must go. A cleanup request, the
creator finishing a create that the cleanup overtook, the GC retrying a cleanup, a hold, and the
expiry of a released pod each used to call the API on its own. The second call then met a pod
already deleted (404), and fell back to deleting the sandbox Secret by name, as for a pod that
never existed: three calls where one is right (docs/agent.md "Deleting a pod once"). The watch
cannot arbitrate, because its DELETED event arrives after the second path has decided. So every
path claims the pod's name and uid here. A claim that another path holds or has settled means the
pod is already dealt with.

A settled delete is remembered until the GC prunes it (as long as the cache keeps tombstones):
the pod name of an attempt is never reused for another pod (docs/design.md Decision 5), and the
uid tells a pod made out of band under the same name apart.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable


@dataclasses.dataclass(eq=False)
class Deletion:
    """One delete call for pod `name`: made by the path that claimed it, waited on by the others."""

    name: str
    uid: str | None                  # the pod's uid when the caller knew it (cache, create reply)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    existed: bool | None = None      # True: the call deleted the pod; False: it was gone (404); None: failed
    settled_at: float = 0.0          # time.time() when the call returned
    waiters: int = 0                 # threads waiting for `done` (for tests and the log)


class Deletions:
    """The deletes in flight and the settled ones, by pod name; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock               # settled_at's time.time(); a test passes its own
        self._lock = threading.Lock()
        self._running: dict[str, Deletion] = {}
        self._settled: dict[str, Deletion] = {}

    def claim(self, name: str, uid: str | None) -> tuple[Deletion, bool]:
        """(deletion, mine). `mine`: the caller makes the call, then `settle`s it. Otherwise the
        deletion is another path's: in flight (wait on `done`) or settled for this pod."""
        with self._lock:
            running = self._running.get(name)
            if running is not None:
                return running, False
            settled = self._settled.get(name)
            if settled is not None and _covers(settled, uid):
                return settled, False
            mine = self._running[name] = Deletion(name, uid)
            return mine, True

    def settle(self, deletion: Deletion, existed: bool | None) -> None:
        """Record the outcome of the call `deletion` (None: it failed, so the next claim may retry)."""
        with self._lock:
            deletion.existed = existed
            deletion.settled_at = self.clock()
            if self._running.get(deletion.name) is deletion:
                del self._running[deletion.name]
            if existed is not None:
                self._settled[deletion.name] = deletion
        deletion.done.set()

    def wait(self, deletion: Deletion, timeout: float) -> bool:
        """Wait for another path's call to return; False if it has not within `timeout`."""
        with self._lock:
            deletion.waiters += 1
        try:
            return deletion.done.wait(timeout)
        finally:
            with self._lock:
                deletion.waiters -= 1

    def waiters(self, name: str) -> int:
        """How many threads wait for the delete of `name` in flight."""
        with self._lock:
            running = self._running.get(name)
            return running.waiters if running is not None else 0

    def covers(self, name: str, uid: str | None) -> bool:
        """Whether the pod `name` (`uid`) is being deleted or was deleted by this agent: then it is
        no longer live work, and no other path may delete it again."""
        with self._lock:
            if name in self._running:
                return True
            settled = self._settled.get(name)
            return settled is not None and _covers(settled, uid)

    def prune(self, older_than: float) -> None:
        """Forget deletes settled before `older_than` (time.time())."""
        with self._lock:
            for name in [n for n, d in self._settled.items() if d.settled_at < older_than]:
                del self._settled[name]


def _covers(settled: Deletion, uid: str | None) -> bool:
    """Whether a settled delete dealt with the pod `uid`. The same uid, always. A delete that found
    a pod whose uid its caller did not know covers any uid of the name (names are not reused), and
    one that found it so covers a caller that does not know the uid. A 404 for a name of unknown uid
    does not cover a pod seen since (its create may have landed after the 404)."""
    if uid is not None and settled.uid == uid:
        return True
    return bool(settled.existed) and (settled.uid is None or uid is None)
