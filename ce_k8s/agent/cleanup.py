"""The `cleanup` verb: the routed job is over for the router; its pods, Secrets and saved output go.

Why a verb of its own and not the GC's: the router retries the cleanup hook on every poll until it
exits 0 (docs/agent.md "Hooks"), so the cleanup deletes at once and says whether it did; the GC
only retries what a cleanup could not finish (garbage.py). A live pod may be kept instead
(release.py), because the router also cleans up a routed job it is about to route again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ce_k8s import protocol
from ce_k8s.agent.access import same_job
from ce_k8s.agent.jobs import Cleanup
from ce_k8s.agent.journal import valid_global_job_id
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.routedjob import RoutedJob
from ce_k8s.agent.sourceprobe import GONE
from ce_k8s.pods.names import pod_name

if TYPE_CHECKING:
    from ce_k8s.agent.access import Access
    from ce_k8s.agent.cache import PodCache
    from ce_k8s.agent.deleter import Deleter
    from ce_k8s.agent.jobs import JobTable
    from ce_k8s.agent.journal import PostJournal
    from ce_k8s.agent.options import AgentOptions
    from ce_k8s.agent.outputsave import OutputSaver
    from ce_k8s.agent.release import Releases
    from ce_k8s.agent.sourceprobe import SourceProbe

log = logging.getLogger(__name__)


class Cleanups:
    """The cleanup of one routed job; `source_probe` answers whether its source job is gone."""

    def __init__(self, options: AgentOptions, access: Access, cache: PodCache, jobs: JobTable, journal: PostJournal,
                 releases: Releases, deleter: Deleter, saver: OutputSaver, source_probe: SourceProbe, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.clock = clock              # time.time(); a test passes its own (tests/agent/fakes.py)
        self.options = options
        self.access = access
        self.cache = cache
        self.jobs = jobs
        self.journal = journal
        self.releases = releases
        self.deleter = deleter
        self.saver = saver
        # Cleanup of a live pod asks this about the source job (docs/agent.md "Released pods").
        self.source_probe = source_probe

    def handle(self, text: str, uid: int) -> tuple[str, list[bytes]]:
        """Delete the job's pods (this and earlier attempts), Secrets and saved output; absent counts as done.

        Unless the cleanup interrupts live work: the router also cleans a routed job up when it
        could not push a status update to the schedd (JobRouter.cpp UpdateRoutedJobStatus), and
        then routes the source job again. So when the job's pod is live and the agent has not held
        the job, the source job decides (`sourceprobe`): gone → delete as always; waiting or
        unknown → the pod is released, not deleted, for the re-routed job to adopt (docs/agent.md
        "Released pods"); the GC deletes it if nobody does within `CE_K8S_RELEASE_GRACE`.
        """
        routed = self.access.admit(text, uid, "cleanup", (protocol.STATUS_NOTFOUND, [b"not a Kubernetes job"]))
        if not isinstance(routed, RoutedJob):
            return routed                             # refused, or another backend's job
        name, owner = routed.pod_name, routed.owner
        if not name:
            return protocol.STATUS_NOTFOUND, [b"no K8sPodName"]
        if not self.cache.ready.is_set():
            # "not found" before the relist could be a lie that leaks a running pod: retry later.
            return protocol.STATUS_BUSY, [b"agent is still listing pods"]
        now = self.clock()
        rec = self.jobs.record(name, owner)
        job = routed.job_id
        gjid = routed.source_global_job_id
        names = [name]
        if gjid:
            names += [pod_name(gjid, a) for a in range(routed.attempt) if pod_name(gjid, a) != name]
            alias = self.journal.alias_of(name)
            if alias is not None and alias not in names:
                names.append(alias)     # the pod this never-created name was given (`Updates._adopt`)
        keep = None
        source = routed.routed_from
        verdict = ""
        if gjid and valid_global_job_id(gjid):
            keep = self.releases.keepable(name, names, owner, gjid, routed, now)
            if keep is not None:
                verdict = self.source_probe.status(source)
                if verdict == GONE:
                    keep = None
        if keep is not None and not self.releases.release(keep, gjid, job, source, verdict):
            keep = None         # deleted meanwhile: nothing left to keep
        if keep is None or keep.name != name:
            with self.jobs.lock:
                rec.cleanup = Cleanup(rec.cleanup.asked_at or now, job)
        self.journal.record_done([n for n in names if keep is None or n != keep.name])
        deleted = 0
        for n in names:
            if keep is not None and n == keep.name:
                continue
            pod = self.cache.get(n)
            if pod is not None and not same_job(pod, owner, gjid):
                log.warning("%s", fields(event="cleanup-skipped", job=job, pod=n, namespace=pod.namespace,
                                         why="pod belongs to another job or owner"))
                continue
            gone = self.cache.get_gone(n) if pod is None else None
            uid = (pod.uid if pod is not None else gone.uid if gone is not None else "") or None
            self.saver.forget(n, uid, owner, gjid)
            if n != name and pod is None:
                continue
            namespace = pod.namespace if pod is not None else rec.creation.namespace
            if not namespace:
                continue        # never created by us and not in the cache: nothing to delete
            deleted += self.deleter.cleanup_delete(n, namespace, uid, job, now)
        log.info("%s", fields(event="cleanup", job=job, pod=name, pods_deleted=deleted,
                              released=keep.name if keep is not None else None))
        if keep is not None:
            return protocol.STATUS_OK, [(f"pod {keep.name} released, not deleted: source job {source or '?'} "
                                         f"is {verdict}; kept {self.options.release_grace} s for a re-route "
                                         f"({deleted} other pod(s) deleted)").encode()]
        return (protocol.STATUS_OK if deleted else protocol.STATUS_NOTFOUND), [f"{deleted} pod(s) deleted".encode()]
