"""The agent's garbage collection: pods whose job is gone, released pods nobody adopted, old memory.

Why a periodic pass besides the cleanup hook: a cleanup whose delete failed is retried only by the
router's next poll, and a job removed while the agent was down never sends one; a released pod
(release.py) has no hook at all once its grace runs out. The pass also bounds what the agent keeps
in memory and on disk (tombstones, settled deletes, journal entries, saved output, records).
Never a live pod whose job still calls the hooks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ce_k8s.agent.logfmt import fields, short_error
from ce_k8s.agent.status import CREATE_PENDING

if TYPE_CHECKING:
    from ce_k8s.agent.cache import PodCache
    from ce_k8s.agent.deleter import Deleter
    from ce_k8s.agent.deletions import Deletion, Deletions
    from ce_k8s.agent.jobaccounting import JobAccounting
    from ce_k8s.agent.jobs import JobTable
    from ce_k8s.agent.journal import PostJournal
    from ce_k8s.agent.options import AgentOptions
    from ce_k8s.agent.output import OutputStore
    from ce_k8s.agent.outputfetch import OutputFetches
    from ce_k8s.agent.outputsave import OutputSaver
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.agent.release import Releases
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)


class GarbageCollector:
    """One GC pass (`collect`), every `interval` seconds on its own thread between `start` and `stop`."""

    def __init__(self, settings: Settings, options: AgentOptions, cache: PodCache, jobs: JobTable,
                 journal: PostJournal, deletions: Deletions, deleter: Deleter, releases: Releases,
                 output: OutputStore, fetches: OutputFetches, saver: OutputSaver, accounting: JobAccounting,
                 stop_event: threading.Event, interval: float, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.clock = clock              # time.time(); a test passes its own (tests/agent/fakes.py)
        self.settings = settings
        self.options = options
        self.cache = cache
        self.jobs = jobs
        self.journal = journal
        self.deletions = deletions
        self.deleter = deleter
        self.releases = releases
        self.output = output
        self.fetches = fetches
        self.saver = saver
        self.accounting = accounting
        self.stop_event = stop_event
        self.interval = interval
        self.started_at = clock()          # the agent's start: the GC grace of pods it has not heard of
        self._thread: threading.Thread | None = None

    def start(self, started_at: float) -> None:
        self.started_at = started_at
        self._thread = threading.Thread(target=self._loop, name="ce-k8s-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Wait for the thread (the agent's stop event ends its loop)."""
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        while not self.stop_event.wait(self.interval):
            try:
                self.collect()
            except Exception as exc:
                log.exception("%s", fields(event="gc-failed", error=short_error(exc)))

    def collect(self, now: float | None = None) -> list[str]:
        """Delete our pods whose job is gone; never a live pod whose job still calls the hooks.

        A pod is collected when its routed job was cleaned up (a cleanup call that failed to delete
        is retried here), or when it has finished and no hook has named it for `CE_K8S_GC_GRACE`
        (counted from the agent's start for pods it has not heard of since a restart). Saved output
        of pods that are gone is dropped after `max(2 × CE_K8S_GC_GRACE, 1 day)` (a finalize that
        never came, e.g. the job was removed while the agent was down).
        """
        now = self.clock() if now is None else now
        grace = self.settings.gc_grace
        victims = []
        for name, pod in list(self.cache.pods.items()):
            if pod.deleting or self.deletions.covers(name, pod.uid or None):
                continue
            rec = self.jobs.get(name)
            last = rec.last_touch if rec and rec.last_touch else self.started_at
            released = self.journal.released_at(name) is not None
            if (rec and rec.cleanup.asked_at and not released) or (pod.finished and now - last >= grace):
                victims.append(pod)
        collected = []
        for pod in victims:
            # The victim list is a snapshot: a cleanup or hold may have claimed the pod since.
            deletion, mine = self.deletions.claim(pod.name, pod.uid or None)
            if not mine:
                continue
            collected.append(pod)
            try:
                self.deleter.run_delete(deletion, pod.namespace, "gc", self.jobs.job_for(pod.name))
            except Exception as exc:
                log.warning("%s", fields(event="delete-failed", job=self.jobs.job_for(pod.name), pod=pod.name,
                                         namespace=pod.namespace, why="gc", error=short_error(exc)))
        victims = collected + self.expire_releases(now)
        self.cache.forget_gone(now - max(grace, 600))
        self.deletions.prune(now - max(grace, 600))
        self.accounting.collect(now)
        self.journal.prune(now)
        self.output.prune(now - max(2 * grace, 86400), keep=set(self.cache.pods))
        self.fetches.prune(now - max(grace, 600), keep=set(self.cache.pods))
        with self.jobs.lock:
            for name in [n for n, r in self.jobs.items()
                         if r.creation.info.state != CREATE_PENDING and n not in self.cache.pods
                         and now - max(r.last_touch, r.cleanup.asked_at) >= 2 * max(grace, 600)]:
                del self.jobs[name]
                self.saver.tries.pop(name, None)
        return [p.name for p in victims]

    def expire_releases(self, now: float) -> list[PodInfo]:
        """Delete the released pods no re-routed job adopted within `CE_K8S_RELEASE_GRACE` of their
        last release; forget releases whose pod is gone. Returns the pods it deleted."""
        expired: list[tuple[PodInfo, Deletion]] = []
        for name, (_gjid, when) in self.journal.released().items():
            if now - when < self.options.release_grace:
                continue
            with self.releases.lock:
                if self.journal.released_at(name) != when:
                    continue                    # renewed or adopted since the copy was taken
                pod = self.cache.get(name)
                if pod is None:
                    self.journal.record_unreleased(name)
                    continue
                if pod.deleting:
                    continue
                deletion, mine = self.deletions.claim(name, pod.uid or None)
                if not mine:
                    continue                    # another path deletes it (or did)
            expired.append((pod, deletion))     # an adoption from now on sees it as not live
        deleted = []
        for pod, deletion in expired:
            job = self.jobs.job_for(pod.name)
            try:
                self.deleter.run_delete(deletion, pod.namespace, "release", job)
                self.journal.record_unreleased(pod.name)
                deleted.append(pod)
            except Exception as exc:
                log.warning("%s", fields(event="delete-failed", job=job, pod=pod.name, namespace=pod.namespace,
                                         why="release", error=short_error(exc)))
        return deleted
