"""A compact, immutable summary of one of our pods: only what the status mapping reads.

Why not keep the API objects: at 20,000 pods a full pod dict (or a kubernetes-client model) costs
tens of KB each and the benchmark allows 300 MB RSS; a slotted summary built once per watch event
costs a few hundred bytes, and the update path then reads plain attributes (docs/design.md Decision 3).
"""

from __future__ import annotations

import calendar
import sys
import time
from dataclasses import dataclass

from ce_k8s.agent.quantity import quantity

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_CE = "ce-k8s.htcondor.org/ce"
LABEL_OWNER = "ce-k8s.htcondor.org/owner"
LABEL_JOB = "ce-k8s.htcondor.org/job"
LABEL_ATTEMPT = "ce-k8s.htcondor.org/attempt"
LABEL_ROUTE = "ce-k8s.htcondor.org/route"
ANN_ROUTED_FROM = "ce-k8s.htcondor.org/routed-from"
ANN_GLOBAL_JOB_ID = "ce-k8s.htcondor.org/global-job-id"
ANN_OWNER = "ce-k8s.htcondor.org/owner"
MANAGER = "ce-k8s"

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                                "RegistryUnavailable"})
CONFIG_ERROR_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError"})
CANNOT_RUN_REASONS = frozenset({"RunContainerError", "CrashLoopBackOff", "StartError", "ContainerCannotRun"})
EVICTION_REASONS = frozenset({"Evicted", "Preempting", "Shutdown", "NodeShutdown", "Terminated",
                              "NodeAffinity", "UnexpectedAdmissionError"})


def parse_time(value: object) -> int | None:
    """RFC 3339 timestamp (as the API server writes it) → epoch seconds; None when absent/bad."""
    if not isinstance(value, str) or len(value) < 19:
        return None
    try:
        return calendar.timegm(time.strptime(value[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What ce-k8s needs to know about one pod (see `from_dict` for where each field comes from)."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    owner: str                   # owner annotation (exact Owner), else the sanitised label
    global_job_id: str           # annotation; identifies the source job across attempts
    created: int | None          # metadata.creationTimestamp
    deleting: bool               # metadata.deletionTimestamp set
    phase: str                   # Pending / Running / Succeeded / Failed / Unknown
    reason: str                  # status.reason (Evicted, DeadlineExceeded, ...)
    message: str
    node: str                    # spec.nodeName
    start_time: int | None       # status.startTime
    disruption: str | None       # DisruptionTarget condition reason when True
    unscheduled: str | None      # "reason: message" of PodScheduled=False
    image: str                   # first container's image
    waiting_reason: str          # main (or init) container waiting reason
    waiting_message: str
    started_at: int | None       # main container running/terminated startedAt
    finished_at: int | None      # main container terminated finishedAt
    exit_code: int | None        # main container terminated exitCode
    term_reason: str             # main container terminated reason (OOMKilled, Error, Completed)
    memory_limit: str            # first container's memory limit, for the OOM hold text
    deadline: int | None         # spec.activeDeadlineSeconds
    route: str = ""              # route label (metrics, `list`); interned: a few distinct values
    source_job: str = ""         # routed-from annotation, else the job label ("cluster.proc")
    attempt: int = 0             # attempt label
    cpu_request: float = 0.0     # cores the containers request (accounting: RequestCpus, CpusProvisioned)
    memory_request: int = 0      # bytes the containers request (accounting: MemoryProvisioned)

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @classmethod
    def from_dict(cls, pod: dict) -> PodInfo:
        """Summarise a pod as the API server returns it (JSON dict, camelCase keys)."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        containers = spec.get("containers") or [{}]
        main_name = containers[0].get("name")
        limits = (containers[0].get("resources") or {}).get("limits") or {}

        disruption = unscheduled = None
        for cond in status.get("conditions") or ():
            ctype, cstat = cond.get("type"), cond.get("status")
            if ctype == "DisruptionTarget" and cstat == "True":
                disruption = cond.get("reason") or "DisruptionTarget"
            elif ctype == "PodScheduled" and cstat == "False":
                unscheduled = _join(cond.get("reason"), cond.get("message"))

        main = None
        statuses = status.get("containerStatuses") or ()
        for cs in statuses:
            if cs.get("name") == main_name:
                main = cs
                break
        if main is None and statuses:
            main = statuses[0]
        waiting_reason = waiting_message = term_reason = ""
        started_at = finished_at = exit_code = None
        state = (main or {}).get("state") or {}
        if "waiting" in state:
            waiting_reason = state["waiting"].get("reason") or ""
            waiting_message = state["waiting"].get("message") or ""
        if "running" in state:
            started_at = parse_time(state["running"].get("startedAt"))
        if "terminated" in state:
            term = state["terminated"]
            started_at = parse_time(term.get("startedAt"))
            finished_at = parse_time(term.get("finishedAt"))
            exit_code = term.get("exitCode")
            term_reason = term.get("reason") or ""
        if not waiting_reason:  # an init container stuck on its image blocks the pod just the same
            for cs in status.get("initContainerStatuses") or ():
                w = (cs.get("state") or {}).get("waiting")
                if w and w.get("reason") in IMAGE_PULL_REASONS | CONFIG_ERROR_REASONS | CANNOT_RUN_REASONS:
                    waiting_reason, waiting_message = w.get("reason") or "", w.get("message") or ""
                    break

        return cls(
            name=meta.get("name") or "",
            namespace=meta.get("namespace") or "",
            uid=meta.get("uid") or "",
            resource_version=meta.get("resourceVersion") or "",
            owner=ann.get(ANN_OWNER) or labels.get(LABEL_OWNER) or "",
            global_job_id=ann.get(ANN_GLOBAL_JOB_ID) or "",
            created=parse_time(meta.get("creationTimestamp")),
            deleting=bool(meta.get("deletionTimestamp")),
            phase=status.get("phase") or "Pending",
            reason=status.get("reason") or "",
            message=status.get("message") or "",
            node=spec.get("nodeName") or "",
            start_time=parse_time(status.get("startTime")),
            disruption=disruption,
            unscheduled=unscheduled,
            image=containers[0].get("image") or "",
            waiting_reason=waiting_reason,
            waiting_message=waiting_message,
            started_at=started_at,
            finished_at=finished_at,
            exit_code=exit_code if isinstance(exit_code, int) else None,
            term_reason=term_reason,
            memory_limit=str(limits.get("memory") or "?"),
            deadline=spec.get("activeDeadlineSeconds"),
            route=sys.intern(str(labels.get(LABEL_ROUTE) or "")),
            source_job=str(ann.get(ANN_ROUTED_FROM) or labels.get(LABEL_JOB) or ""),
            attempt=_int(labels.get(LABEL_ATTEMPT)),
            cpu_request=_request_sum(spec.get("containers") or (), "cpu"),
            memory_request=int(_request_sum(spec.get("containers") or (), "memory")),
        )


def _request_sum(containers: object, resource: str) -> float:
    """The sum of the containers' requests of `resource` (cores or bytes); 0 when none is set."""
    total = 0.0
    for c in containers if isinstance(containers, list | tuple) else ():
        if isinstance(c, dict):
            total += quantity(((c.get("resources") or {}).get("requests") or {}).get(resource)) or 0.0
    return total


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _join(reason: object, message: object) -> str:
    reason = str(reason or "")
    message = str(message or "")
    return f"{reason}: {message}" if reason and message else reason or message
