"""The agent's writes to the cluster for one pod at a time: its create, its deletes, its Secret refresh.

Why one queue keyed by pod name (ce_k8s.workqueue): the paths that decide a pod must be made
(an update) or must go (a hold, the creator undoing a create that a cleanup overtook) run on the
hook threads, at any moment; the calls they decide on run here, on `CE_K8S_CREATE_CONCURRENCY`
workers. A key is held by one worker at a time, so a pod's create and its delete never run side
by side whatever the number of workers, and a create that failed for a reason that passes (quota,
throttling, an outage) comes back after that pod's own back-off, without waiting for the next
update poll.

Level-triggered: a turn of a key runs the delete asked for it, if any (a refresh asked for the
same pod is then dropped: its Secret goes with it), else the credential refresh asked for it
(credentials.py), then asks the creator whether the pod's record still wants a create (the record
says; a cleanup may have come since).
The cleanup hook's own delete is not queued: the hook waits for its answer (`1 pod(s) deleted`),
and deletions.py makes it share a queued delete of the same pod instead of sending a second one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ce_k8s.agent.logfmt import fields
from ce_k8s.workqueue import WorkQueue

log = logging.getLogger(__name__)

THREAD_PREFIX = "ce-k8s-effect"


class Effects:
    """Workers over one WorkQueue of pod names; see the module docstring."""

    def __init__(self, workers: int, create: Callable[[str], None], stop: threading.Event) -> None:
        # Creates back off from 0.5-1 s up to 5 minutes, per pod (ce_k8s.ratelimit.backoff).
        self.queue: WorkQueue[str] = WorkQueue(base=1.0, cap=300.0)
        self._workers = max(1, workers)
        self._create = create
        self._stop = stop
        self._deletes: dict[str, Callable[[], None]] = {}
        # A refresh is (run, dropped): `dropped` is called instead of `run` when the refresh will
        # not run (a delete took the pod's turn, or the agent stopped), so its asker can ask again.
        self._refreshes: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        if self.queue.closed:              # started again after a stop: a queue of its own
            self.queue = WorkQueue(base=self.queue.base, cap=self.queue.cap)
        for i in range(self._workers):
            t = threading.Thread(target=self._worker, name=f"{THREAD_PREFIX}-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        """Stop the workers after their current turn; keys still waiting are dropped (a restarted
        agent rebuilds what it must do from the cluster and the next update polls)."""
        self.queue.shut_down()
        for t in self.threads:
            t.join(10)
        self.threads = []
        with self._lock:
            dropped, self._refreshes = list(self._refreshes.values()), {}
        for _run, drop in dropped:
            drop()

    # -- asking ------------------------------------------------------------------------------------

    def create(self, name: str) -> None:
        """Look at pod `name`'s create now (its record says what is wanted)."""
        self.queue.add(name)

    def delete(self, name: str, call: Callable[[], None]) -> None:
        """Run `call` (one delete of pod `name`, claimed by the caller) at the key's next turn."""
        with self._lock:
            self._deletes[name] = call
        self.queue.add(name)

    def refresh(self, name: str, call: Callable[[], None], dropped: Callable[[], None]) -> None:
        """Run `call` (copy pod `name`'s renewed credentials into its Secret) at the key's next turn,
        or `dropped` if it never will: a queued delete of the pod takes that turn (no write to a
        pod being deleted), or the agent stops first. A newer refresh replaces one still waiting."""
        with self._lock:
            old = self._refreshes.get(name)
            self._refreshes[name] = (call, dropped)
        if old is not None:
            old[1]()
        self.queue.add(name)

    def refreshes_waiting(self) -> int:
        """Refreshes asked for and not yet run (the `ce_k8s_credential_refreshes_queued` gauge)."""
        with self._lock:
            return len(self._refreshes)

    def waiting(self) -> int:
        """Keys waiting for a turn (the `ce_k8s_creates_queued` gauge)."""
        return len(self.queue)

    def idle(self) -> bool:
        """No key waits and none is held: every effect asked for has run (a test's drain before a
        count polls this; the workers signal nobody, so the hot path pays nothing for it)."""
        with self._lock:
            pending = bool(self._deletes or self._refreshes)
        return not pending and len(self.queue) == 0 and self.queue.processing() == 0

    # -- working -----------------------------------------------------------------------------------

    def _worker(self) -> None:
        while not self._stop.is_set():
            name = self.queue.get(self._stop)
            if name is None:
                return
            try:
                self._turn(name)
            except Exception as exc:       # a bug must not kill the worker; the log says which pod
                log.exception("%s", fields(event="effect-crashed", pod=name, error=type(exc).__name__))
            finally:
                self.queue.done(name)

    def _turn(self, name: str) -> None:
        with self._lock:
            delete = self._deletes.pop(name, None)
            refresh = self._refreshes.pop(name, None)
        if delete is not None:
            if refresh is not None:
                refresh[1]()
            delete()
        elif refresh is not None:
            refresh[0]()
        self._create(name)
