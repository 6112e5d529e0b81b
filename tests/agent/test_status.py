"""Every row of the `## Pod status → job status` table (docs/holds.md), on the pure mapping.

References: htcondor-ce.md §6.4 (GridJobStatus strings the factory reads), docs/hook-protocol.md
§2.3 (JobStatus 4 needs JobFinishedHookDone), design.md Decision 8 (name every failure).
"""

from __future__ import annotations

from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.agent.status import (
    CREATE_DONE,
    CREATE_HOLD,
    CREATE_NONE,
    CREATE_PENDING,
    CREATE_RETRY,
    CreateInfo,
    JobView,
    decide,
)
from ce_k8s.holds import HOLDS

NOW = 1_760_000_600
T0 = "2025-10-09T08:53:20Z"      # 1760000000
T1 = "2025-10-09T08:55:00Z"      # 1760000100
T2 = "2025-10-09T09:05:00Z"      # 1760000700


def pod(phase="Pending", *, conditions=(), state=None, init_state=None, reason=None, node="node-1", created=T0,
        limits=None, deadline=None):
    status = {"phase": phase, "conditions": list(conditions)}
    if reason:
        status["reason"] = reason
        status["message"] = "because"
    if state is not None:
        status["containerStatuses"] = [{"name": "pilot", "state": state}]
    if init_state is not None:
        status["initContainerStatuses"] = [{"name": "sandbox-links", "state": init_state}]
    if phase != "Pending":
        status["startTime"] = T1
    resources = {"limits": limits or {"memory": "2000Mi"}}
    spec = {"containers": [{"name": "pilot", "image": "pilot:1", "resources": resources}], "nodeName": node}
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    return PodInfo.from_dict({
        "metadata": {"name": "p0", "namespace": "ns", "uid": "u-1", "creationTimestamp": created,
                     "annotations": {"ce-k8s.htcondor.org/owner": "cmspilot"}},
        "spec": spec, "status": status})


def job(**kw):
    base = {"pod_name": "p0", "attempt": 0, "max_attempts": 3, "pending_timeout": 3600, "job_status": 1,
            "global_job_id": "g"}
    base.update(kw)
    return JobView(**base)


def run(p, j=None, gone=None, create=None, pull=300, grace=120):
    return decide(j or job(), p, gone, create or CreateInfo(CREATE_DONE), NOW, pull, grace, "p1")


def subcode(code):
    return HOLDS[code].subcode


def test_pending_is_idle_with_scheduler_reason():
    d = run(pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": "0/3 nodes are available: 3 Insufficient cpu."}]))
    assert d.attrs["JobStatus"] == 1 and d.attrs["GridJobStatus"] == "PENDING"
    assert d.attrs["K8sPodReason"].startswith("Unschedulable: 0/3 nodes")


def test_running():
    d = run(pod("Running", state={"running": {"startedAt": T1}}))
    a = d.attrs
    assert (a["JobStatus"], a["GridJobStatus"], a["RemoteHost"], a["K8sNodeName"]) == (2, "RUNNING", "node-1", "node-1")
    assert a["GridJobId"] == "kubernetes ns/p0"
    assert a["JobCurrentStartDate"] == 1760000100 and a["JobStartDate"] == 1760000100 and a["NumJobStarts"] == 1


def test_running_keeps_first_start_date():
    d = run(pod("Running", state={"running": {"startedAt": T1}}),
            job(job_start_date=1750000000, attempt=1, num_job_starts=1))
    assert d.attrs["JobStartDate"] == 1750000000 and d.attrs["NumJobStarts"] == 2


def test_num_job_starts_counts_attempts_that_ran_not_pods():
    """HTCondor-CE removes a routed job whose NumJobStarts passes 1 when it disables retries, so the
    count is of starts: a second attempt after a pod that never ran is the first start; a job
    already reported running keeps its count; an attempt that ran unreported counts at its eviction."""
    running = pod("Running", state={"running": {"startedAt": T1}})
    assert run(running, job(attempt=1, num_job_starts=0)).attrs["NumJobStarts"] == 1
    assert "NumJobStarts" not in run(running, job(attempt=1, num_job_starts=1, job_status=2)).attrs
    ran = pod("Failed", reason="Evicted", state={"terminated": {"startedAt": T1, "finishedAt": T2, "exitCode": 137}})
    assert run(ran, job(num_job_starts=0)).attrs["NumJobStarts"] == 1
    never = pod("Failed", reason="Evicted")
    assert run(never, job(num_job_starts=0)).attrs["NumJobStarts"] == 0


def test_succeeded_completes_with_hook_done():
    """docs/hook-protocol.md §2.3: completion needs JobStatus 4 and JobFinishedHookDone."""
    d = run(pod("Succeeded", state={"terminated": {"exitCode": 0, "startedAt": T1, "finishedAt": T2}}))
    a = d.attrs
    assert a["JobStatus"] == 4 and a["GridJobStatus"] == "COMPLETED" and a["ExitCode"] == 0
    assert a["CompletionDate"] == 1760000700 and a["JobFinishedHookDone"] == 1760000700
    assert a["RemoteWallClockTime"] == 600


def test_failed_completes_with_real_exit_code():
    d = run(pod("Failed", state={"terminated": {"exitCode": 3, "reason": "Error", "startedAt": T1, "finishedAt": T2}}))
    assert d.attrs["JobStatus"] == 4 and d.attrs["ExitCode"] == 3


def test_an_exit_status_nobody_saw_is_held_not_completed():
    """A node lost outright and back: containerd reports the dead container `Unknown`, 255 (the real
    node, tests/real/node/test_vo_pool.py); the kubelet's own placeholder is ContainerStatusUnknown,
    137. Neither number is the pilot's, so the job is held `container-crashed`, not completed."""
    for reason, code in (("Unknown", 255), ("ContainerStatusUnknown", 137)):
        d = run(pod("Failed", state={"terminated": {"exitCode": code, "reason": reason, "startedAt": T1,
                                                    "finishedAt": T2}}))
        assert d.attrs["JobStatus"] == 5 and d.attrs["HoldReasonSubCode"] == subcode("container-crashed"), d.attrs
        assert f"ended {reason} (the runtime's placeholder {code}" in d.attrs["HoldReason"]


def test_oom_killed_held():
    d = run(pod("Failed", state={"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": T1,
                                                "finishedAt": T2}}))
    assert d.attrs["JobStatus"] == 5 and d.attrs["HoldReasonSubCode"] == subcode("oom-killed")
    assert "2000Mi" in d.attrs["HoldReason"]


def test_oom_kill_of_a_child_the_pilot_survived_completes_with_its_exit_code():
    """cgroup v1 (the bed's real node): the kernel killed a child, the main process exited 0."""
    d = run(pod("Succeeded", state={"terminated": {"exitCode": 0, "reason": "OOMKilled", "startedAt": T1,
                                                   "finishedAt": T2}}))
    assert d.attrs["JobStatus"] == 4 and d.attrs["ExitCode"] == 0
    assert d.attrs["K8sPodReason"].startswith("OOMKilled: ") and "2000Mi" in d.attrs["K8sPodReason"]
    assert "exited 0" in d.attrs["K8sPodReason"]


def test_deadline_exceeded_held():
    d = run(pod("Failed", reason="DeadlineExceeded", deadline=172800))
    assert d.attrs["HoldReasonSubCode"] == subcode("deadline-exceeded") and "172800" in d.attrs["HoldReason"]


def test_image_pull_error_waits_then_holds_and_deletes():
    state = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    young = run(pod(state=state, created="2025-10-09T09:09:00Z"), pull=300)   # 60 s old
    assert young.attrs["JobStatus"] == 1 and "ImagePullBackOff" in young.attrs["K8sPodReason"]
    old = run(pod(state=state), pull=300)                                    # 600 s old
    assert old.attrs["HoldReasonSubCode"] == subcode("image-pull-failed") and old.delete


def test_image_pull_error_in_init_container():
    d = run(pod(init_state={"waiting": {"reason": "ErrImagePull", "message": "not found"}}), pull=60)
    assert d.attrs["HoldReasonSubCode"] == subcode("image-pull-failed")


def test_create_container_config_error_after_grace():
    state = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "x" not found'}}
    assert run(pod(state=state, created="2025-10-09T09:09:50Z"), grace=120).attrs["JobStatus"] == 1
    d = run(pod(state=state), grace=120)
    assert d.attrs["HoldReasonSubCode"] == subcode("create-container-config-error") and d.delete


def test_pending_timeout_holds():
    d = run(pod(), job(pending_timeout=300))
    assert d.attrs["HoldReasonSubCode"] == subcode("pending-timeout") and d.delete


def test_admission_denied_and_build_errors_hold():
    for code in ("admission-denied", "missing-image"):
        d = run(None, create=CreateInfo(CREATE_HOLD, code, {"message": "no"}))
        assert d.attrs["JobStatus"] == 5 and d.attrs["HoldReasonSubCode"] == subcode(code)


def test_deleted_out_of_band_held():
    gone = pod("Running", state={"running": {"startedAt": T1}})
    assert run(None, gone=gone).attrs["HoldReasonSubCode"] == subcode("pod-deleted")



def test_pod_vanished_unseen_gets_next_attempt_not_a_hold():
    """After an agent restart (no tombstone) an eviction and a deletion look alike: the pilot is
    not lost for it (issue 5: zero lost pilots); K8sPodUid in the ad proves the pod existed."""
    d = run(None, job(pod_uid="u-1"), create=CreateInfo(CREATE_NONE))
    assert d.attrs["K8sAttempt"] == 1 and d.attrs["JobStatus"] == 1 and "vanished" in d.attrs["K8sPodReason"]
    d = run(None, job(pod_uid="u-1", attempt=2), create=CreateInfo(CREATE_NONE))
    assert d.attrs["HoldReasonSubCode"] == subcode("evictions-exhausted")


def test_eviction_is_a_new_attempt_then_held():
    evicted = pod("Failed", reason="Evicted")
    d = run(evicted)
    assert d.attrs["JobStatus"] == 1 and d.attrs["K8sAttempt"] == 1 and d.attrs["K8sPodName"] == "p1"
    assert d.attrs["K8sPodUid"] == ""
    preempted = pod("Running", conditions=[{"type": "DisruptionTarget", "status": "True",
                                            "reason": "PreemptionByScheduler"}])
    assert run(None, gone=preempted).attrs["K8sAttempt"] == 1
    last = run(evicted, job(attempt=2, max_attempts=3))
    assert last.attrs["HoldReasonSubCode"] == subcode("evictions-exhausted")


def test_on_a_ce_that_removes_restarts_a_started_pilot_waits_for_the_removal_with_no_pod():
    """HTCondor-CE's ENABLE_JOB_RETRIES = False: the CE removes a routed pilot idle again after a
    start, so its next pod would be deleted with the job once started; it gets none until
    K8sRetryAfter, and only if the CE kept the job that long. An agent restart changes nothing (the
    wait is in the ad); a pilot evicted before any start is retried at once, as the CE never counted it."""
    evicted = pod("Failed", reason="Evicted")
    started = {"ce_removes_restarts": True, "retry_wait": 19, "job_start_date": NOW - 50, "pod_uid": "u-1",
               "num_job_starts": 1}
    first = run(evicted, job(**started))
    assert first.attrs["JobStatus"] == 1 and first.attrs["K8sRetryAfter"] == NOW + 19 and not first.create
    assert "K8sPodName" not in first.attrs and "K8sAttempt" not in first.attrs
    assert "ENABLE_JOB_RETRIES" in first.attrs["K8sPodReason"]
    waiting = job(**started, retry_after=NOW + 5)
    assert run(evicted, waiting).attrs == {} and not run(evicted, waiting).create
    # the pod gone and the agent restarted (no tombstone, no memory): still no pod before the time
    assert run(None, waiting, create=CreateInfo(CREATE_NONE)).attrs == {}
    assert not run(None, waiting, create=CreateInfo(CREATE_NONE)).create
    kept = run(evicted, job(**started, retry_after=NOW))                 # the CE kept it: next attempt
    assert kept.attrs["K8sAttempt"] == 1 and kept.attrs["K8sPodName"] == "p1" and kept.attrs["K8sRetryAfter"] == 0
    never_started = run(evicted, job(ce_removes_restarts=True, retry_wait=19))
    assert never_started.attrs["K8sAttempt"] == 1 and never_started.attrs["K8sPodName"] == "p1"
    elsewhere = run(evicted, job(job_start_date=NOW - 50, num_job_starts=1))   # a CE that removes nothing
    assert elsewhere.attrs["K8sAttempt"] == 1
    # a pod that ran before its start was reported is a start all the same: the CE is told, and waits
    ran = pod("Failed", reason="Evicted", state={"terminated": {"startedAt": T1, "finishedAt": T2, "exitCode": 137}})
    unreported = run(ran, job(ce_removes_restarts=True, retry_wait=19))
    assert unreported.attrs["NumJobStarts"] == 1 and unreported.attrs["JobStartDate"] == 1760000100
    assert unreported.attrs["K8sRetryAfter"] == NOW + 19 and "K8sPodName" not in unreported.attrs


def test_temporary_create_failure_keeps_idle_and_retries():
    d = run(None, create=CreateInfo(CREATE_RETRY, message="quota exceeded"))
    assert d.attrs["JobStatus"] == 1 and "quota" in d.attrs["K8sPodReason"] and d.create


def test_first_sight_creates_and_pending_does_not_repeat():
    assert run(None, create=CreateInfo(CREATE_NONE)).create
    assert not run(None, create=CreateInfo(CREATE_PENDING)).create


def test_final_states_are_left_alone():
    for status in (3, 4, 5):
        assert run(pod("Running"), job(job_status=status)).attrs == {}


def test_container_cannot_run_and_disk_eviction_hold():
    d = run(pod("Failed", state={"terminated": {"exitCode": 128, "reason": "StartError"}}))
    assert d.attrs["HoldReasonSubCode"] == subcode("container-cannot-run")
    d = run(PodInfo.from_dict({
        "metadata": {"name": "p0", "namespace": "ns", "creationTimestamp": T0},
        "spec": {"containers": [{"name": "pilot"}]},
        "status": {"phase": "Failed", "reason": "Evicted",
                   "message": "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi."}}))
    assert d.attrs["HoldReasonSubCode"] == subcode("disk-exceeded")
