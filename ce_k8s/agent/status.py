"""Pod status → routed-job attributes: the one table of docs/holds.md, as a pure function.

Why pure: every row of the table is a unit test, and the agent's hot path calls this with data
it already has in memory (the cached pod summary and a few attributes scanned from the routed ad).

The router copies the routed job's `JobStatus` and run statistics to the source job, and the
factory reads `GridJobStatus` to tell pending from running (htcondor-ce.md §6.4), so:

* Pending → idle (1), `GridJobStatus = "PENDING"`, the scheduler's reason in `K8sPodReason`;
* Running → running (2) with start dates, node, `GridJobId`, `NumJobStarts`;
* Succeeded/Failed → completed (4) with the real `ExitCode` and `JobFinishedHookDone`, which the
  router needs to finish the job (docs/hook-protocol.md §2.3, last bullet);
* failures with a name → held (5) with the stable codes of `ce_k8s.holds`;
* eviction/preemption → idle again with the next attempt's pod name, up to `K8sMaxAttempts`; on a
  CE that removes a started pilot idle again (HTCondor-CE's ENABLE_JOB_RETRIES = False), a pilot
  that had started waits `K8sRetryAfter` with no pod for that removal first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ce_k8s.agent.podinfo import (
    CANNOT_RUN_REASONS,
    CONFIG_ERROR_REASONS,
    EVICTION_REASONS,
    IMAGE_PULL_REASONS,
    NO_EXIT_STATUS_REASONS,
    PodInfo,
)
from ce_k8s.holds import hold_attributes

IDLE, RUNNING, REMOVED, COMPLETED, HELD = 1, 2, 3, 4, 5

# Creation states the agent tracks per pod (see ce_k8s.agent.creator).
CREATE_NONE = "none"          # never asked to create (first sight, or agent restarted)
CREATE_PENDING = "pending"    # queued or in flight
CREATE_RETRY = "retry"        # a temporary failure; will be retried with back-off
CREATE_DONE = "done"          # the API server has (or had) the pod
CREATE_HOLD = "hold"          # permanent failure: build error, admission denied


@dataclass(slots=True)
class JobView:
    """The few routed-ad values the mapping needs (scanned from the update hook's stdin)."""

    pod_name: str
    attempt: int = 0
    max_attempts: int = 3
    pending_timeout: int = 21600
    job_status: int | None = None
    pod_uid: str | None = None            # K8sPodUid: set once we reported a live pod
    job_start_date: int | None = None
    global_job_id: str | None = None
    ce_removes_restarts: bool = False     # Settings.ce_removes_restarts (HTCondor-CE's retry policy)
    retry_wait: int = 90                  # Settings.retry_wait
    retry_after: int | None = None        # K8sRetryAfter: a started pilot's next attempt waits till then
    num_job_starts: int | None = None     # NumJobStarts as last reported: attempts that started


@dataclass(slots=True)
class CreateInfo:
    """What the agent knows about creating the pod (its own memory; empty after a restart)."""

    state: str = CREATE_NONE
    hold_code: str | None = None
    hold_details: dict = field(default_factory=dict)
    message: str = ""


@dataclass(slots=True)
class Decision:
    """Attributes the routed job should have, plus what the agent must do about the pod."""

    attrs: dict[str, object]
    create: bool = False          # start creating `JobView.pod_name`
    delete: bool = False          # delete the pod (it holds resources but will never run)


def _one_line(text: str, limit: int = 512) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _held(code: str, info: PodInfo | None, **details: object) -> dict[str, object]:
    attrs: dict[str, object] = {"JobStatus": HELD, "GridJobStatus": "HELD"}
    attrs.update(hold_attributes(code, **details))
    if info is not None:
        attrs["K8sPodPhase"] = info.phase
    return attrs


def _grid_id(pod: PodInfo) -> str:
    return f"kubernetes {pod.namespace}/{pod.name}"


def _pod_attrs(pod: PodInfo) -> dict[str, object]:
    return {"K8sPodUid": pod.uid, "K8sPodNamespace": pod.namespace, "K8sPodPhase": pod.phase,
            "GridJobId": _grid_id(pod)}


def _evicted(pod: PodInfo) -> str | None:
    """Why the pod was disrupted (preemption, eviction, node shutdown), or None."""
    if pod.disrupted:
        return _one_line(f"{pod.disruption}: {pod.message}" if pod.message else pod.disruption)
    if pod.phase == "Failed" and pod.reason in EVICTION_REASONS:
        return _one_line(f"{pod.reason}: {pod.message}" if pod.message else pod.reason)
    return None


def _next_attempt(job: JobView, pod: PodInfo | None, why: str, new_name: str | None, now: int) -> Decision:
    """Back to idle under a new pod name, or held when the route's attempts are used up.

    On a CE that removes a routed pilot idle again after a start (HTCondor-CE's `ENABLE_JOB_RETRIES =
    False`), a pilot that had started (`JobStartDate`) first goes idle with no next pod until
    `K8sRetryAfter`: the CE's removal pass comes then, and a pod made before it would start the pilot a
    second time only to be deleted with the job (seen on the real 25.14.1 daemons with HTCondor-CE's
    files: 2 of 4 evicted pilots got such a pod). A job the CE kept past that time gets its next attempt.
    """
    # NumJobStarts counts the attempts that started, this one too if its container ran before the
    # agent could report it: HTCondor-CE's policy reads it, so it must not count pods that never ran.
    started_unreported = job.job_status != RUNNING and pod is not None and pod.started_at is not None
    starts = (job.num_job_starts or 0) + (1 if started_unreported else 0)
    if job.ce_removes_restarts and starts and (not job.retry_after or now < job.retry_after):
        if job.retry_after:
            return Decision({})               # still waiting for the CE's decision; no pod
        until = now + job.retry_wait
        return Decision({
            "JobStatus": IDLE, "GridJobStatus": "PENDING", "K8sPodPhase": "Evicted", "K8sRetryAfter": until,
            "NumJobStarts": starts, "JobStartDate": job.job_start_date or (pod.started_at if pod else None) or now,
            "K8sPodReason": _one_line(f"attempt {job.attempt} evicted: {why}; no next pod for {job.retry_wait} s: "
                                      "the CE removes a started pilot that is idle again (ENABLE_JOB_RETRIES false)"),
        })
    if job.attempt + 1 >= job.max_attempts or new_name is None:
        return Decision(_held("evictions-exhausted", pod, pod=job.pod_name, attempts=job.max_attempts,
                              message=why))
    return Decision({
        "JobStatus": IDLE, "GridJobStatus": "PENDING", "K8sAttempt": job.attempt + 1, "NumJobStarts": starts,
        "K8sPodName": new_name, "K8sPodUid": "", "K8sPodPhase": "Evicted", "K8sRetryAfter": 0,
        "K8sPodReason": _one_line(f"attempt {job.attempt} evicted: {why}"),
    })


def _starts_now(job: JobView) -> dict[str, object]:
    """NumJobStarts when this attempt is reported running: one more than the starts before it, set
    on the transition only (a job already running keeps its count; the ad carries it across restarts)."""
    return {} if job.job_status == RUNNING else {"NumJobStarts": (job.num_job_starts or 0) + 1}


def decide(
    job: JobView,
    pod: PodInfo | None,
    gone: PodInfo | None,
    create: CreateInfo,
    now: int,
    image_pull_timeout: int,
    config_error_grace: int,
    next_pod_name: str | None,
) -> Decision:
    """The routed job's attributes for the current pod state (see the module docstring).

    `pod` is the live pod from the watch cache, `gone` its last state if the watch saw it
    deleted, `next_pod_name` the name the next attempt would get (None if it cannot be named).
    A held, completed or removed routed job is final here: nothing is changed.
    """
    if job.job_status in (COMPLETED, HELD, REMOVED):
        return Decision({})
    if create.state == CREATE_HOLD and pod is None:
        return Decision(_held(create.hold_code or "internal-error", None, pod=job.pod_name, **create.hold_details))

    if pod is None:
        if gone is not None:
            why = _evicted(gone)
            if why is not None:
                return _next_attempt(job, gone, why, next_pod_name, now)
            if gone.finished:
                return _finished(job, gone)
            return Decision(_held("pod-deleted", gone, pod=job.pod_name))
        if (job.pod_uid and create.state != CREATE_PENDING) or create.state == CREATE_DONE:
            # We created it or reported it live before (K8sPodUid), and it vanished while this
            # agent was not watching (restart, or between two LISTs): an eviction and a deletion
            # look the same now. The pilot is not lost for that: it gets the next attempt.
            return _next_attempt(job, None, "pod vanished while ce-k8s was not watching (cause unknown)",
                                 next_pod_name, now)
        reason = "creating pod"
        if create.state == CREATE_RETRY:
            reason = _one_line(f"pod creation delayed: {create.message}")
        return Decision({"JobStatus": IDLE, "GridJobStatus": "PENDING", "K8sPodReason": reason},
                        create=create.state in (CREATE_NONE, CREATE_RETRY))

    if pod.phase == "Failed" and pod.reason == "Evicted" and "ephemeral" in pod.message.lower():
        return Decision(_held("disk-exceeded", pod, pod=pod.name, message=_one_line(pod.message)))
    if pod.deleting and not pod.finished:
        return _terminating(job, pod, now)
    why = _evicted(pod)
    if why is not None:
        return _next_attempt(job, pod, why, next_pod_name, now)
    if pod.phase in ("Succeeded", "Failed"):
        return _finished(job, pod)
    if pod.phase == "Running":
        start = pod.started_at or pod.start_time or now
        attrs = _pod_attrs(pod)
        attrs.update({
            "JobStatus": RUNNING, "GridJobStatus": "RUNNING", "JobCurrentStartDate": start,
            "JobStartDate": job.job_start_date or start, "RemoteHost": pod.node, "K8sNodeName": pod.node,
            "K8sPodReason": "", **_starts_now(job),
        })
        return Decision(attrs)
    if pod.phase != "Pending":
        return Decision({})   # Unknown: the node is unreachable; keep the last state we reported

    age = now - (pod.created or now)
    wr = pod.waiting_reason
    if wr in IMAGE_PULL_REASONS and (age >= image_pull_timeout or wr == "InvalidImageName"):
        return Decision(_held("image-pull-failed", pod, pod=pod.name, image=pod.image,
                              message=_one_line(f"{wr}: {pod.waiting_message}")), delete=True)
    if wr in CONFIG_ERROR_REASONS and age >= config_error_grace:
        return Decision(_held("create-container-config-error", pod, pod=pod.name,
                              message=_one_line(f"{wr}: {pod.waiting_message}")), delete=True)
    if wr in CANNOT_RUN_REASONS and age >= config_error_grace:
        return Decision(_held("container-cannot-run", pod, pod=pod.name,
                              message=_one_line(f"{wr}: {pod.waiting_message}")), delete=True)
    reason = pod.unscheduled or (f"{wr}: {pod.waiting_message}" if wr and pod.waiting_message else wr)
    reason = _one_line(reason or ("scheduled on " + pod.node if pod.node else "waiting for the scheduler"))
    if age >= job.pending_timeout:
        return Decision(_held("pending-timeout", pod, pod=pod.name, seconds=job.pending_timeout, message=reason),
                        delete=True)
    attrs = _pod_attrs(pod)
    attrs.update({"JobStatus": IDLE, "GridJobStatus": "PENDING", "K8sPodReason": reason})
    return Decision(attrs)


def _terminating(job: JobView, pod: PodInfo, now: int) -> Decision:
    """A pod that is being deleted and has not ended: the job stays as it was, saying why.

    An eviction, the taint manager (a node unreachable) or an admin deleted it, but its containers
    may still run: during their grace period, and on a node that cannot be reached for as long as
    it stays away, where a real API server keeps the pod `Running` with a deletion timestamp
    (finding 5 of docs/real-kubernetes.md). The next attempt waits until this pod has ended or is
    gone (the `gone` path above decides then), so a pilot never runs twice at once.
    """
    why = _evicted(pod) or "deleted"
    reason = _one_line(f"pod {pod.name} terminating ({why}); the next attempt waits until it has ended")
    attrs = _pod_attrs(pod)
    if pod.phase == "Running":
        start = pod.started_at or pod.start_time or now
        attrs.update({"JobStatus": RUNNING, "GridJobStatus": "RUNNING", "JobCurrentStartDate": start,
                      "JobStartDate": job.job_start_date or start, "RemoteHost": pod.node,
                      "K8sNodeName": pod.node, **_starts_now(job)})
    else:
        attrs.update({"JobStatus": IDLE, "GridJobStatus": "PENDING"})
    attrs["K8sPodReason"] = reason
    return Decision(attrs)


def _finish_hold(pod: PodInfo) -> Decision | None:
    """The hold a finished pod gets instead of completion (failures with a name), or None."""
    if pod.term_reason == "OOMKilled" and not _survived_oom(pod):
        return Decision(_held("oom-killed", pod, pod=pod.name, limit=pod.memory_limit))
    if pod.reason == "DeadlineExceeded":
        return Decision(_held("deadline-exceeded", pod, pod=pod.name, seconds=pod.deadline or "?"))
    if pod.phase == "Failed" and pod.term_reason in CANNOT_RUN_REASONS:
        return Decision(_held("container-cannot-run", pod, pod=pod.name,
                              message=_one_line(f"{pod.term_reason}: {pod.message}")))
    if pod.phase == "Failed" and pod.exit_code is None:
        return Decision(_held("container-crashed", pod, pod=pod.name,
                              message=_one_line(f"{pod.reason}: {pod.message}" if pod.reason else pod.message)))
    if pod.phase == "Failed" and pod.term_reason in NO_EXIT_STATUS_REASONS:
        return Decision(_held("container-crashed", pod, pod=pod.name, message=(
            f"its container ended {pod.term_reason} (the runtime's placeholder {pod.exit_code}, not the pilot's "
            "exit code): the container died unseen, as when its node is lost")))
    return None


def _survived_oom(pod: PodInfo) -> bool:
    """The kernel's OOM killer killed *a* process of the container, and its main process lived on
    and exited by itself (exit code below 128).

    On a cgroup v1 node the kernel kills one process: a pilot whose child was killed can go on and
    exit 0, and the kubelet still says `OOMKilled` (seen on the bed's real node,
    tests/real/test_real_node.py). On cgroup v2 (`memory.oom.group`) the whole container dies, 137.
    The pilot's own exit code is its verdict then: the job completes with it, saying what happened.
    """
    return pod.exit_code is not None and pod.exit_code < 128


def completes(pod: PodInfo) -> bool:
    """Whether `decide` maps this pod to a completed job (so finalize will want its output).

    The agent saves the output of exactly these pods before it reports `JobStatus = 4`.
    """
    if not pod.finished or _evicted(pod) is not None:
        return False
    if pod.phase == "Failed" and pod.reason == "Evicted" and "ephemeral" in pod.message.lower():
        return False
    return _finish_hold(pod) is None


def _finished(job: JobView, pod: PodInfo) -> Decision:
    """Succeeded or Failed: completed with the container's exit code, unless it failed by name."""
    hold = _finish_hold(pod)
    if hold is not None:
        return hold
    finished = pod.finished_at or pod.started_at or pod.start_time or pod.created or 0
    started = pod.started_at or pod.start_time or finished
    attrs = _pod_attrs(pod)
    attrs.update({
        "JobStatus": COMPLETED, "GridJobStatus": "COMPLETED", "ExitCode": pod.exit_code or 0,
        "CompletionDate": finished, "RemoteWallClockTime": max(finished - started, 0),
        "JobFinishedHookDone": finished, "K8sPodReason": "",
    })
    if pod.term_reason == "OOMKilled":
        attrs["K8sPodReason"] = _one_line(
            f"OOMKilled: the kernel killed a process of pod {pod.name} at its memory limit "
            f"{pod.memory_limit or '?'}; the pilot's main process lived on and exited {pod.exit_code}")
    if pod.node:
        attrs["K8sNodeName"] = pod.node
    if started and not job.job_start_date:
        attrs["JobStartDate"] = started
    return Decision(attrs)
