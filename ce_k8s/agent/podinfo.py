"""A compact, immutable summary of one of our pods: only what the status mapping reads.

Why not keep the API objects: at 20,000 pods a full pod dict (or a kubernetes-client model) costs
tens of KB each and the benchmark allows 300 MB RSS; a slotted summary built once per watch event
costs a few hundred bytes, and the update path then reads plain attributes (docs/design.md Decision 3).
"""

from __future__ import annotations

import calendar
import datetime
import functools
import sys
import time
from collections.abc import Sequence

import msgspec

from ce_k8s.agent.podschema import Container, Metadata, Pod, Spec, Status, pod_of
from ce_k8s.quantity import quantity_float

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
# A terminated container whose exit status nobody saw: containerd's placeholder when the task died
# with its shim (a node lost outright and back: "Unknown", 255, seen on the real node) and the
# kubelet's when the container is gone at the pod's end ("ContainerStatusUnknown", 137). The
# number is not the pilot's.
NO_EXIT_STATUS_REASONS = frozenset({"Unknown", "ContainerStatusUnknown"})
EVICTION_REASONS = frozenset({"Evicted", "Preempting", "Shutdown", "NodeShutdown", "Terminated",
                              "NodeAffinity", "UnexpectedAdmissionError"})


def parse_time(value: object) -> int | None:
    """RFC 3339 timestamp (as the API server writes it) → epoch seconds; None when absent/bad.

    The API server writes `YYYY-MM-DDTHH:MM:SSZ`; that shape goes through the C parser of
    `datetime.fromisoformat` (a relist reads three per pod, and `time.strptime` was a sixth of its
    time); anything else through strptime on its first 19 characters, offset ignored, as before.
    """
    if not isinstance(value, str) or len(value) < 19 or not value.isascii():
        return None
    if len(value) == 20 and value[19] == "Z" and value[10] == "T" and value[4] == "-" and value[7] == "-":
        try:
            return int(_fromisoformat(value).timestamp())
        except ValueError:
            return None
    try:
        return calendar.timegm(time.strptime(value[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


_fromisoformat = datetime.datetime.fromisoformat


class PodInfo(msgspec.Struct, frozen=True, gc=False):
    """What ce-k8s needs to know about one pod (see `from_pod` for where each field comes from).

    A frozen msgspec Struct rather than a frozen dataclass: built in C (a frozen dataclass sets
    its 29 fields one `object.__setattr__` at a time, a tenth of a relist), and untracked by the
    cyclic GC (`gc=False`: it holds only strings and numbers, so it can never be part of a
    cycle), which 50,000 long-lived summaries would otherwise make every full collection walk.
    Copy with changes through `msgspec.structs.replace`.
    """

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
    disruption_at: int | None = None   # DisruptionTarget's lastTransitionTime (whole seconds)

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def disrupted(self) -> bool:
        """Whether a disruption (eviction, preemption, node shutdown) ended this pod's pilot.

        A real API server adds `DisruptionTarget` to a pod it evicts even when the pod has already
        Succeeded or Failed (finding 4 of docs/real-kubernetes.md): a drain after the pilot's end
        must not count as an eviction, or the finished pilot would run again. So a finished pod's
        disruption counts only when it came no later than the pilot's end and the pilot died of a
        signal (137 SIGKILL, 143 SIGTERM) or without an exit code; a pilot that exited on its own
        terms is done whatever came after. Timestamps are whole seconds, so "no later" includes the
        same second; the exit code decides that case.
        """
        if not self.disruption:
            return False
        if not self.finished:
            return True
        if self.disruption_at is not None and self.finished_at is not None and self.disruption_at > self.finished_at:
            return False
        return self.exit_code is None or self.exit_code in (137, 143)

    @classmethod
    def from_dict(cls, pod: dict) -> PodInfo:
        """Summarise a pod as the API server returns it (JSON dict, camelCase keys)."""
        return cls.from_pod(pod_of(pod))

    @classmethod
    def from_pod(cls, pod: Pod) -> PodInfo:
        """Summarise a pod decoded into the agent's schema (`ce_k8s.agent.podschema`).

        Strings few pods differ in (namespace, phase, node, image, owner, route, reasons) are
        interned: at 50,000 pods one shared copy each instead of one per pod.
        """
        meta = pod.metadata or _NO_META
        spec = pod.spec or _NO_SPEC
        status = pod.status or _NO_STATUS
        labels = meta.labels or _EMPTY
        ann = meta.annotations or _EMPTY
        containers = spec.containers or _NO_CONTAINERS
        first = containers[0]
        limits = (first.resources.limits if first.resources else None) or _EMPTY

        disruption = unscheduled = disruption_at = None
        for cond in status.conditions or ():
            if cond.type == "DisruptionTarget" and cond.status == "True":
                disruption = cond.reason or "DisruptionTarget"
                disruption_at = parse_time(cond.last_transition_time)
            elif cond.type == "PodScheduled" and cond.status == "False":
                unscheduled = _join(cond.reason, cond.message)

        main = None
        statuses = status.container_statuses or ()
        for cs in statuses:
            if cs.name == first.name:
                main = cs
                break
        if main is None and statuses:
            main = statuses[0]
        waiting_reason = waiting_message = term_reason = ""
        started_at = finished_at = exit_code = None
        state = main.state if main is not None else None
        if state is not None:
            if state.waiting is not None:
                waiting_reason = state.waiting.reason or ""
                waiting_message = state.waiting.message or ""
            if state.running is not None:
                started_at = parse_time(state.running.started_at)
            if state.terminated is not None:
                term = state.terminated
                started_at = parse_time(term.started_at)
                finished_at = parse_time(term.finished_at)
                exit_code = term.exit_code
                term_reason = term.reason or ""
        # An init container stuck on its image blocks the pod just the same. A real kubelet shows
        # the main container waiting `PodInitializing` meanwhile, so that reason says nothing and
        # the init containers are read (finding 2 of docs/real-kubernetes.md, confirmed on a real
        # API server with kwok: tests/real/test_findings.py).
        if not waiting_reason or waiting_reason in _NOT_STARTED_REASONS:
            for cs in status.init_container_statuses or ():
                w = cs.state.waiting if cs.state is not None else None
                if w is not None and w.reason in _BLOCKING_REASONS:
                    waiting_reason, waiting_message = w.reason or "", w.message or ""
                    break

        return cls(
            name=meta.name or "",
            namespace=_intern(meta.namespace),
            uid=meta.uid or "",
            resource_version=meta.resource_version or "",
            owner=_intern(ann.get(ANN_OWNER) or labels.get(LABEL_OWNER)),
            global_job_id=ann.get(ANN_GLOBAL_JOB_ID) or "",
            created=parse_time(meta.creation_timestamp),
            deleting=bool(meta.deletion_timestamp),
            phase=_intern(status.phase or "Pending"),
            reason=_intern(status.reason),
            message=status.message or "",
            node=_intern(spec.node_name),
            start_time=parse_time(status.start_time),
            disruption=disruption,
            unscheduled=unscheduled,
            image=_intern(first.image),
            waiting_reason=_intern(waiting_reason),
            waiting_message=waiting_message,
            started_at=started_at,
            finished_at=finished_at,
            exit_code=exit_code,
            term_reason=_intern(term_reason),
            memory_limit=_intern(str(limits.get("memory") or "?")),
            deadline=spec.active_deadline_seconds,
            route=_intern(labels.get(LABEL_ROUTE)),
            source_job=ann.get(ANN_ROUTED_FROM) or labels.get(LABEL_JOB) or "",
            attempt=_int(labels.get(LABEL_ATTEMPT)),
            cpu_request=_request_sum(containers, "cpu"),
            memory_request=int(_request_sum(containers, "memory")),
            disruption_at=disruption_at,
        )


_EMPTY: dict[str, str] = {}
_NO_META = Metadata()
_NO_SPEC = Spec()
_NO_STATUS = Status()
_NO_CONTAINERS = (Container(),)
_BLOCKING_REASONS = IMAGE_PULL_REASONS | CONFIG_ERROR_REASONS | CANNOT_RUN_REASONS
# What a main container waits with while the pod's init containers have not finished.
_NOT_STARTED_REASONS = frozenset({"PodInitializing", "ContainerCreating"})


def _intern(value: str | None) -> str:
    return sys.intern(value) if value else ""


def _request_sum(containers: Sequence[Container], resource: str) -> float:
    """The sum of the containers' requests of `resource` (cores or bytes); 0 when none is set."""
    total = 0.0
    for c in containers:
        requests = c.resources.requests if c.resources is not None else None
        if requests:
            total += _quantity(requests.get(resource)) or 0.0
    return total


@functools.lru_cache(maxsize=1024)
def _quantity(value: str | float | None) -> float | None:
    """`quantity_float`, remembered: a CE's pods request a handful of distinct amounts."""
    return quantity_float(value)


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _join(reason: object, message: object) -> str:
    reason = str(reason or "")
    message = str(message or "")
    return f"{reason}: {message}" if reason and message else reason or message
