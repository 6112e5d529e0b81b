"""What this agent process knows about each pod name it has heard of: the `JobRecord` table.

Why one table that the agent's parts share: the update verb creates the records, the creator and
the credential refresher fill them in, the cleanup marks them, `list`, the GC and every log line
read them. Each part gets this table (and its lock) instead of the whole agent.

State is only what Kubernetes and the routed ads hold (decision 4): the table is a memory of what
this process did (creation in flight, last hook contact) and is rebuilt from the next hook calls
after a restart; pods are found again by the relist, and their names come from the ads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ce_k8s.agent.credentials import CredentialState
from ce_k8s.agent.status import CreateInfo

if TYPE_CHECKING:
    from ce_k8s.agent.cache import PodCache


@dataclass(slots=True)
class JobRecord:
    """What this agent process knows about one pod name (one attempt of one routed job)."""

    pod_name: str
    owner: str
    create: CreateInfo = field(default_factory=CreateInfo)
    last_touch: float = 0.0          # time.time() of the last hook call naming this pod
    failures: int = 0                # consecutive temporary create failures
    next_try: float = 0.0            # earliest time.time() for the next create attempt
    ad_text: str | None = None       # the routed ad, kept only while a create is queued
    cleaned: float = 0.0             # time.time() when cleanup was asked (0 = not cleaned)
    cleaned_job: str = ""            # the routed job ("ClusterId.ProcId") that cleanup was for
    namespace: str = ""
    caller_uid: int | None = None    # SO_PEERCRED uid that sent `ad_text` (sandbox ownership check)
    # What the last update said about the job (`list`, log lines): ids from the routed ad, state
    # as the agent last told the router (or as the ad said, for a final state).
    routed_job: str = ""             # the routed job's "ClusterId.ProcId"
    source_job: str = ""             # RoutedFromJobId
    route: str = ""
    attempt: int = 0
    job_status: int | None = None
    hold_reason: str = ""
    reason: str = ""
    # F1/F3 (docs/reliability.md): evidence that this attempt's pod already existed. `seen_uid` is
    # the uid of the pod once the cache, a create or an adoption showed it: a create re-run must
    # then never POST a new pod of this name (the attempt has had its one pod, docs/design.md Decision 5).
    # `check_history`: the first update this process saw already carried a reply of an earlier
    # agent (K8sPodReason), so the pod may have been created and vanished while no agent watched.
    seen_uid: str = ""
    check_history: bool = False
    cred: CredentialState | None = None   # the pod's credential files and what its Secret holds
    # The API server's Warning headers on this pod's writes (ce_k8s.agent.apiwarnings): the texts
    # logged (each once per pod), and the notes K8sPodReason carries while the pod is pending
    # (a deprecated node label) or while it lives (something the server dropped or ignores).
    api_warnings: tuple[str, ...] = ()
    note_pending: str = ""
    note_always: str = ""


class JobTable(dict[str, JobRecord]):
    """Pod name -> JobRecord. A plain dict to read (the update path's `get` takes no lock); `lock`
    serialises the writes that must not cross (a record made twice, a create queued after its
    cleanup, the GC forgetting a record)."""

    def __init__(self, cache: PodCache) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self._cache = cache

    def record(self, name: str, owner: str) -> JobRecord:
        """The record of `name`, made on first sight."""
        rec = self.get(name)
        if rec is None:
            with self.lock:
                rec = self.get(name)
                if rec is None:
                    rec = self[name] = JobRecord(name, owner)
        return rec

    def fresh(self, name: str, owner: str) -> JobRecord:
        """Replace the record of `name` by an empty one (a new routed job names a never-created pod)."""
        with self.lock:
            rec = self[name] = JobRecord(name, owner)
        return rec

    def job_for(self, name: str) -> str:
        """The job id for a log line about pod `name`: routed id if an update named it, else the source id."""
        rec = self.get(name)
        if rec is not None and rec.routed_job:
            return rec.routed_job
        pod = self._cache.get(name) or self._cache.get_gone(name)
        return (pod.source_job if pod is not None else "") or "?"
