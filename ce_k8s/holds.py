"""The one table of ce-k8s hold codes: build failures and pod outcomes → HoldReason/Code/SubCode.

Why one table: factory operators put `HoldReasonCode:HoldReasonSubCode` pairs in GlideinWMS
`recoverable_exitcodes` (htcondor-ce.md §6.4), so the numbers must be stable, documented in one
place (`docs/holds.md`), and shared by the builder and the agent.

`HoldReasonCode` reuses HTCondor's own values from `src/condor_utils/condor_holdcodes.h` where one
fits (6 FailedToCreateProcess, 13 TransferInputError, 21 StartdHeldJob, 32
MaxTransferInputSizeExceeded, 34 JobOutOfResources, 35 InvalidDockerImage, 46
JobDurationExceeded), so tools that already understand those codes keep working. The
`HoldReasonSubCode` is ours and unique per outcome: 8700-8749 for problems found while building the
pod (the route or the job is wrong; retrying will not help), 8750-8799 for what happened to the pod.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

REASON_PREFIX = "ce-k8s: "
MAX_REASON = 1024
SUBCODE_BUILD = range(8700, 8750)
SUBCODE_RUNTIME = range(8750, 8800)

# HTCondor HoldReasonCode values (condor_holdcodes.h)
FAILED_TO_CREATE_PROCESS = 6
TRANSFER_INPUT_ERROR = 13
STARTD_HELD_JOB = 21
MAX_TRANSFER_INPUT_SIZE_EXCEEDED = 32
JOB_OUT_OF_RESOURCES = 34
INVALID_DOCKER_IMAGE = 35
JOB_DURATION_EXCEEDED = 46


@dataclass(frozen=True)
class Hold:
    """One outcome: HTCondor hold code, our subcode, reason text (`str.format` fields from details)."""

    code: int
    subcode: int
    reason_template: str


HOLDS: dict[str, Hold] = {
    # -- the routed ad cannot become a pod (raised as PodBuildError by ce_k8s.pods) ---------------
    "missing-image": Hold(
        INVALID_DOCKER_IMAGE, 8701, "no container image: set K8sImage in the route or CE_K8S_IMAGE ({message})"
    ),
    "bad-image": Hold(INVALID_DOCKER_IMAGE, 8702, "invalid container image reference ({message})"),
    "bad-request-cpus": Hold(FAILED_TO_CREATE_PROCESS, 8703, "unusable RequestCpus ({message})"),
    "bad-request-memory": Hold(FAILED_TO_CREATE_PROCESS, 8704, "unusable RequestMemory ({message})"),
    "bad-request-disk": Hold(FAILED_TO_CREATE_PROCESS, 8705, "unusable RequestDisk ({message})"),
    "bad-request-gpus": Hold(FAILED_TO_CREATE_PROCESS, 8706, "unusable RequestGPUs ({message})"),
    "bad-walltime": Hold(FAILED_TO_CREATE_PROCESS, 8707, "unusable wall time ({message})"),
    "bad-whole-node": Hold(
        FAILED_TO_CREATE_PROCESS, 8708, "WantWholeNode without a usable node shape ({message})"
    ),
    "bad-k8s-value": Hold(FAILED_TO_CREATE_PROCESS, 8709, "unusable Kubernetes setting ({message})"),
    "bad-arguments": Hold(FAILED_TO_CREATE_PROCESS, 8710, "unparsable Arguments/Args ({message})"),
    "bad-environment": Hold(FAILED_TO_CREATE_PROCESS, 8711, "unusable Environment/Env ({message})"),
    "missing-executable": Hold(FAILED_TO_CREATE_PROCESS, 8712, "no executable ({message})"),
    "missing-job-id": Hold(FAILED_TO_CREATE_PROCESS, 8713, "no job identity to name the pod ({message})"),
    "patch-failed": Hold(FAILED_TO_CREATE_PROCESS, 8714, "K8sPodPatch could not be applied ({message})"),
    "patch-weakens-security": Hold(
        FAILED_TO_CREATE_PROCESS, 8715, "K8sPodPatch would weaken the pod's security ({message})"
    ),
    "sandbox-too-large": Hold(
        MAX_TRANSFER_INPUT_SIZE_EXCEEDED, 8720, "input sandbox too large for a Secret ({message})"
    ),
    "sandbox-path-outside-spool": Hold(
        TRANSFER_INPUT_ERROR, 8721, "input file outside the job's spool directory ({message})"
    ),
    "sandbox-file-missing": Hold(TRANSFER_INPUT_ERROR, 8722, "input file could not be read ({message})"),
    "sandbox-bad-entry": Hold(TRANSFER_INPUT_ERROR, 8723, "unsupported input sandbox entry ({message})"),
    # -- what happened to the pod (mapped by the agent) -------------------------------------------
    "oom-killed": Hold(JOB_OUT_OF_RESOURCES, 8750, "pod {pod} was OOM-killed: memory limit {limit} exceeded"),
    "deadline-exceeded": Hold(
        JOB_DURATION_EXCEEDED, 8751, "pod {pod} exceeded its wall time of {seconds} s (activeDeadlineSeconds)"
    ),
    "image-pull-failed": Hold(
        INVALID_DOCKER_IMAGE, 8752, "pod {pod} could not pull image {image}: {message}"
    ),
    "create-container-config-error": Hold(
        FAILED_TO_CREATE_PROCESS, 8753, "pod {pod} container could not be configured: {message}"
    ),
    "admission-denied": Hold(
        FAILED_TO_CREATE_PROCESS, 8754, "Kubernetes refused to create pod {pod}: {message}"
    ),
    "pod-deleted": Hold(STARTD_HELD_JOB, 8755, "pod {pod} was deleted outside ce-k8s"),
    "pending-timeout": Hold(
        FAILED_TO_CREATE_PROCESS, 8756, "pod {pod} stayed Pending for more than {seconds} s: {message}"
    ),
    "evictions-exhausted": Hold(
        STARTD_HELD_JOB, 8757, "pod {pod} was evicted and the job used all {attempts} attempts: {message}"
    ),
    "container-cannot-run": Hold(
        FAILED_TO_CREATE_PROCESS, 8758, "pod {pod} container could not start: {message}"
    ),
    "container-crashed": Hold(
        STARTD_HELD_JOB, 8759, "pod {pod} failed without a container exit status: {message}"
    ),
    "disk-exceeded": Hold(
        JOB_OUT_OF_RESOURCES, 8760, "pod {pod} was evicted for exceeding its ephemeral storage: {message}"
    ),
    "secret-create-failed": Hold(
        TRANSFER_INPUT_ERROR, 8761, "the sandbox Secret for pod {pod} could not be created: {message}"
    ),
    "internal-error": Hold(FAILED_TO_CREATE_PROCESS, 8799, "internal error ({message})"),
}


class _Details(dict):
    """Format mapping that renders a missing field as `?` instead of raising."""

    def __missing__(self, key: str) -> str:
        return "?"


def _one_line(text: str) -> str:
    """HoldReason travels in old-ClassAd text where a raw newline breaks the ad (hook-protocol.md §2.2): flatten it."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def hold_attributes(code: str, **details: object) -> dict[str, object]:
    """`HoldReason`, `HoldReasonCode`, `HoldReasonSubCode` for an outcome code.

    An unknown code is a programming error, but holding the job with `internal-error` (and the
    unknown code in the text) is better for the pilot than crashing the agent, so that is what
    happens, with a warning in the log.
    """
    hold = HOLDS.get(code)
    if hold is None:
        log.warning("unknown hold code %r; using internal-error", code)
        details = {"message": f"unknown hold code {code}: {details.get('message', '')}".strip()}
        hold = HOLDS["internal-error"]
    text = hold.reason_template.format_map(_Details({k: str(v) for k, v in details.items()}))
    reason = _one_line(REASON_PREFIX + text)
    if len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - 3] + "..."
    return {"HoldReason": reason, "HoldReasonCode": hold.code, "HoldReasonSubCode": hold.subcode}


def hold_for_error(error: Exception) -> dict[str, object]:
    """Hold attributes for a `PodBuildError` (anything with `.code` and `.message`)."""
    code = getattr(error, "code", "internal-error")
    message = getattr(error, "message", str(error))
    return hold_attributes(code, message=message)
