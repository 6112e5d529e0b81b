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
from ce_k8s.agent.status import HELD, CreateInfo

if TYPE_CHECKING:
    from ce_k8s.agent.cache import PodCache


@dataclass(slots=True)
class Creation:
    """The create of this attempt's pod: asked by the update verb, done by the creator on the work
    queue (effects.py), read by `list`, the GC and the cleanup's delete."""

    info: CreateInfo = field(default_factory=CreateInfo)   # its state, and the hold or delay it met
    failures: int = 0                # consecutive temporary create failures (a re-run probes first)
    next_try: float = 0.0            # earliest time.time() an update may queue the create again
    ad_text: str | None = None       # the routed ad, kept only while a create is queued
    caller_uid: int | None = None    # SO_PEERCRED uid that sent `ad_text` (sandbox ownership check)
    namespace: str = ""              # where the create put (or would put) the pod
    # F1/F3 (docs/reliability.md): evidence that this attempt's pod already existed. `seen_uid` is
    # the uid of the pod once the cache, a create or an adoption showed it: a create re-run must
    # then never POST a new pod of this name (the attempt has had its one pod, docs/design.md Decision 5).
    # `check_history`: the first update this process saw already carried a reply of an earlier
    # agent (K8sPodReason), so the pod may have been created and vanished while no agent watched.
    seen_uid: str = ""
    check_history: bool = False


@dataclass(frozen=True, slots=True)
class Cleanup:
    """The cleanup hook's word about this pod name (cleanup.py); a release's adoption (release.py)
    or a re-routed job taking the pod over clears `asked_at`. Frozen and replaced whole: most
    records are never cleaned up and share `NOT_CLEANED` (no object per record)."""

    asked_at: float = 0.0            # time.time() when cleanup was asked (0 = not cleaned)
    job: str = ""                    # the routed job ("ClusterId.ProcId") that cleanup was for

    def cleared(self) -> Cleanup:
        """The pod is in use again: not cleaned any more (the cleaned job stays known)."""
        return Cleanup(0.0, self.job) if self.asked_at else self


NOT_CLEANED = Cleanup()


@dataclass(slots=True)
class Reporting:
    """What the last update said about the job (`list`, log lines, the release rule): ids from the
    routed ad, state as the agent last told the router (or as the ad said, for a final state)."""

    routed_job: str = ""             # the routed job's "ClusterId.ProcId"
    source_job: str = ""             # RoutedFromJobId
    route: str = ""
    attempt: int = 0
    job_status: int | None = None
    hold_reason: str = ""
    reason: str = ""

    def remember(self, desired: dict[str, object], job_status: int | None, hold_reason: str,
                 pod_reason: str) -> None:
        """Keep the job state the router will hold after an update reply `desired` (the ad's own
        values where the reply leaves them)."""
        status = desired.get("JobStatus")
        self.job_status = status if isinstance(status, int) else job_status
        self.hold_reason = str(desired.get("HoldReason") or hold_reason or "") if self.job_status == HELD else ""
        reason = desired.get("K8sPodReason")
        self.reason = str(reason) if reason is not None else pod_reason


@dataclass(frozen=True, slots=True)
class WarningNotes:
    """The API server's Warning headers on this pod's writes (ce_k8s.agent.apiwarnings), from the
    creator and the credential refresher: the texts logged (each once per pod), and the notes
    K8sPodReason carries while the pod is pending (a deprecated node label) or while it lives
    (something the server dropped or ignores). Frozen and replaced whole: most pods get no
    warning and share `NO_WARNINGS`."""

    texts: tuple[str, ...] = ()
    pending: str = ""
    always: str = ""


NO_WARNINGS = WarningNotes()


@dataclass(slots=True)
class JobRecord:
    """What this agent process knows about one pod name (one attempt of one routed job), in parts
    named for the paths that write them."""

    pod_name: str
    owner: str
    last_touch: float = 0.0          # time.time() of the last hook call naming this pod (the GC's clock)
    creation: Creation = field(default_factory=Creation)
    cleanup: Cleanup = NOT_CLEANED
    reporting: Reporting = field(default_factory=Reporting)
    warnings: WarningNotes = NO_WARNINGS
    credentials: CredentialState | None = None   # the pod's credential files and what its Secret holds


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
        if rec is not None and rec.reporting.routed_job:
            return rec.reporting.routed_job
        pod = self._cache.get(name) or self._cache.get_gone(name)
        return (pod.source_job if pod is not None else "") or "?"
