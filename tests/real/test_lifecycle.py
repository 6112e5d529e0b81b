"""A pilot's life on the real control plane, driven through the in-process agent.

Each test routes one pilot into a fresh namespace (tests/real/conftest.py `pilot_namespace`),
asks the agent as the update hook does (`update`) and asserts what the job becomes, with the
real API server's admission, the real garbage collector and Eviction API, and kwok playing the
kubelet from the pod's annotations (ce_k8s/real/kube/kwokstages.py). Hold codes are compared with
ce_k8s.holds.HOLDS, the table docs/holds.md is generated from.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import classad2
import jsonpatch
import pytest
from agent.conftest import make_spool, routed_ad, text_of
from agent.test_agent import update
from kubernetes.client.rest import ApiException

from ce_k8s.holds import HOLDS
from ce_k8s.pods.names import pod_name, secret_name
from ce_k8s.real.kube import kwokstages

from .conftest import running_agent, wait_for

IMAGE = "registry.example.org/pilot:1"
SCENARIO = "sim.ce-k8s.io/scenario"


@pytest.fixture
def bed(real_kube, pilot_namespace):
    with running_agent(real_kube, pilot_namespace) as (agent, settings, root):
        yield agent, settings, root


def pilot(settings, namespace: str, cluster: int = 4711, annotations: dict[str, str] | None = None, **extra):
    """A routed pilot of job `cluster`.0, its sandbox in the spool; `annotations` tell kwok its life."""
    make_spool(Path(settings.spool).parent, cluster)
    gjid = f"ce.example.org#{cluster}.0#1760000000"
    if annotations:
        pairs = "; ".join(f"'{k}' = {json.dumps(v)}" for k, v in annotations.items())
        extra["K8sAnnotations"] = classad2.ExprTree(f"[ {pairs} ]")
    return routed_ad(Path(settings.spool), cluster=cluster, gjid=gjid, K8sNamespace=namespace, K8sImage=IMAGE,
                     K8sPodName=pod_name(gjid, 0), **extra)


def until(agent, ad, predicate, what: str, timeout: float = 60.0):
    """Poll the agent as the router does until the routed job satisfies `predicate`; a timeout shows
    the routed job as it stands."""
    def step():
        update(agent, ad)
        return predicate(ad)
    wait_for(step, timeout=timeout, poll=0.3, what=what, on_timeout=lambda: f"the routed job now: {dict(ad)}")
    return ad


def status_is(code: int):
    return lambda ad: ad.get("JobStatus") == code


def assert_hold(ad, code: str) -> None:
    hold = HOLDS[code]
    assert ad.get("JobStatus") == 5, dict(ad)
    assert (ad["HoldReasonCode"], ad["HoldReasonSubCode"]) == (hold.code, hold.subcode), ad.get("HoldReason")
    assert ad["HoldReason"].startswith("ce-k8s: "), ad["HoldReason"]


def read_or_none(read, name: str, ns: str):
    """`read(name, ns)`, or None when the object does not exist (404)."""
    try:
        return read(name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def read_pod(core, ns, name):
    return read_or_none(core.read_namespaced_pod, name, ns)


def read_secret(core, ns, name):
    return read_or_none(core.read_namespaced_secret, name, ns)


# --------------------------------------------------------------------------------------------
# Garbage collection and eviction


def test_secret_is_collected_by_the_real_garbage_collector_with_its_pod(bed, admin_core, pilot_namespace):
    """The agent never deletes a pilot's Secret after its pod is gone by other hands: the
    ownerReference it sets makes the controller manager's garbage collector do it."""
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace)
    name = ad["K8sPodName"]
    until(agent, ad, status_is(2), "the pilot running")
    secret = wait_for(lambda: read_secret(admin_core, pilot_namespace, secret_name(name)), what="the Secret")
    pod = read_pod(admin_core, pilot_namespace, name)
    (owner,) = secret.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == ("Pod", name, pod.metadata.uid)
    agent.stop()   # nobody of ce-k8s is watching: only Kubernetes may remove the Secret now
    admin_core.delete_namespaced_pod(name, pilot_namespace)
    wait_for(lambda: read_secret(admin_core, pilot_namespace, secret_name(name)) is None, timeout=90,
             what="the garbage collector deleting the orphaned Secret")


def test_eviction_through_the_real_eviction_api_starts_the_next_attempt(bed, admin_core, pilot_namespace):
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace)
    first = ad["K8sPodName"]
    until(agent, ad, status_is(2), "the pilot running")
    admin_core.create_namespaced_pod_eviction(first, pilot_namespace,
                                              {"metadata": {"name": first, "namespace": pilot_namespace}})
    until(agent, ad, lambda a: a.get("K8sAttempt") == 1, "the next attempt")
    assert ad["JobStatus"] == 1 and "evicted" in ad["K8sPodReason"], dict(ad)
    second = ad["K8sPodName"]
    assert second == pod_name(ad["K8sSourceGlobalJobId"], 1) != first
    until(agent, ad, status_is(2), "the second attempt running")
    wait_for(lambda: read_pod(admin_core, pilot_namespace, first) is None, what="the evicted pod gone")
    pods = admin_core.list_namespaced_pod(pilot_namespace).items
    assert [p.metadata.name for p in pods] == [second]
    assert pods[0].metadata.labels["ce-k8s.htcondor.org/attempt"] == "1"


# --------------------------------------------------------------------------------------------
# How a pilot ends: exit codes and holds


@pytest.mark.parametrize("code", [0, 3])
def test_container_exit_code_completes_the_job_with_it(bed, pilot_namespace, code):
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace, annotations={kwokstages.RUN_FOR: "1s", kwokstages.EXIT_CODE: str(code)})
    until(agent, ad, status_is(4), "the pilot completed")
    assert ad["ExitCode"] == code and ad["GridJobStatus"] == "COMPLETED", dict(ad)


@pytest.mark.parametrize("life", [{SCENARIO: "oom-after=20s"},     # 1 s at the bed's time scale
                                  {kwokstages.RUN_FOR: "1s", kwokstages.EXIT_CODE: "137",
                                   kwokstages.REASON: "OOMKilled"}], ids=["scenario", "annotations"])
def test_oom_kill_holds_oom_killed(bed, pilot_namespace, life):
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace, annotations=life)
    until(agent, ad, status_is(5), "the hold")
    assert_hold(ad, "oom-killed")
    assert ad["K8sPodName"] in ad["HoldReason"] and "2000Mi" in ad["HoldReason"], ad["HoldReason"]


def test_wall_time_sets_active_deadline_and_holds_deadline_exceeded(bed, admin_core, pilot_namespace):
    """`BatchRuntime` (the CE's maxWallTime, in seconds) becomes activeDeadlineSeconds; the pod runs
    on past it (no end of its own), and the kubelet's DeadlineExceeded becomes the hold."""
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace, BatchRuntime=3)
    until(agent, ad, status_is(2), "the pilot running")
    assert read_pod(admin_core, pilot_namespace, ad["K8sPodName"]).spec.active_deadline_seconds == 3
    until(agent, ad, status_is(5), "the hold")
    assert_hold(ad, "deadline-exceeded")
    assert "wall time of 3 s" in ad["HoldReason"], ad["HoldReason"]


def test_pod_deleted_out_of_band_holds_pod_deleted(bed, admin_core, pilot_namespace):
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace)
    until(agent, ad, status_is(2), "the pilot running")
    admin_core.delete_namespaced_pod(ad["K8sPodName"], pilot_namespace)
    until(agent, ad, status_is(5), "the hold")
    assert_hold(ad, "pod-deleted")


def test_pod_security_refusal_holds_admission_denied(bed, admin_core, pilot_namespace):
    """An NFS volume (a site's shared area) passes ce-k8s's own patch check but not PodSecurity
    `restricted`: the server's refusal, in its own words, becomes the hold."""
    agent, settings, _ = bed
    patch = [{"op": "add", "path": "/spec/volumes/-",
              "value": {"name": "data", "nfs": {"server": "nfs.example.org", "path": "/data"}}}]
    ad = pilot(settings, pilot_namespace, K8sPodPatch=json.dumps(patch))
    until(agent, ad, status_is(5), "the hold")
    assert_hold(ad, "admission-denied")
    assert 'violates PodSecurity "restricted:latest"' in ad["HoldReason"] and "nfs" in ad["HoldReason"], \
        ad["HoldReason"]
    assert read_pod(admin_core, pilot_namespace, ad["K8sPodName"]) is None


@pytest.mark.parametrize("op", [
    {"op": "add", "path": "/spec/volumes/-", "value": {"name": "cvmfs", "hostPath": {"path": "/cvmfs"}}},
    {"op": "add", "path": "/spec/containers/0/ports", "value": [{"containerPort": 8080, "hostPort": 8080}]},
], ids=["hostPath", "hostPort"])
def test_patches_podsecurity_forbids_never_reach_the_server(bed, admin_core, pilot_namespace, op):
    """hostPath (CVMFS the wrong way) and a hostPort are refused by ce-k8s before any create:
    PodSecurity refuses both here (shown by a dry run of the same pod), but in a namespace
    without it the pod must not be made either."""
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace, K8sPodPatch=json.dumps([op]))
    plain = agent.creator.build(text_of(pilot(settings, pilot_namespace, cluster=4712)).decode(), "cmspilot")
    pod = jsonpatch.JsonPatch([op]).apply(plain.pod, in_place=False)
    with pytest.raises(ApiException) as err:
        admin_core.create_namespaced_pod(pilot_namespace, pod, dry_run="All")
    assert err.value.status == 403 and "PodSecurity" in json.loads(err.value.body)["message"]
    until(agent, ad, status_is(5), "the hold")
    assert_hold(ad, "patch-weakens-security")
    assert agent.metrics["creates"] == 0


def test_full_quota_keeps_the_job_idle_with_a_readable_reason(bed, admin_core, pilot_namespace):
    """Temporary, so not a hold: the factory keeps seeing a queued pilot; the quota's own words
    are in K8sPodReason. Once room is made the pod is created."""
    agent, settings, _ = bed
    admin_core.create_namespaced_resource_quota(pilot_namespace, {"metadata": {"name": "full"},
                                                                  "spec": {"hard": {"pods": "0"}}})
    wait_for(lambda: admin_core.read_namespaced_resource_quota("full", pilot_namespace).status.hard,
             what="the quota's status")
    ad = pilot(settings, pilot_namespace)
    until(agent, ad, lambda a: "exceeded quota" in a.get("K8sPodReason", ""), "the quota's reason")
    assert ad["JobStatus"] == 1 and "HoldReasonCode" not in ad, dict(ad)
    assert "pod creation delayed" in ad["K8sPodReason"] and "full" in ad["K8sPodReason"], ad["K8sPodReason"]
    admin_core.delete_namespaced_resource_quota("full", pilot_namespace)
    until(agent, ad, status_is(2), "the pilot running once the quota is gone", timeout=90)


def test_unschedulable_pod_shows_the_schedulers_reason_then_holds_pending_timeout(bed, admin_core,
                                                                                 pilot_namespace):
    """The real scheduler's words reach the factory while the job waits (idle, not held); past
    K8sPendingTimeout the job is held and the pod deleted (it would otherwise wait forever)."""
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace, RequestCpus=1000, K8sPendingTimeout=8)
    until(agent, ad, lambda a: "Insufficient cpu" in a.get("K8sPodReason", ""), "the scheduler's reason")
    assert ad["JobStatus"] == 1 and ad["K8sPodReason"].startswith("Unschedulable: 0/"), ad["K8sPodReason"]
    until(agent, ad, status_is(5), "the hold")
    assert_hold(ad, "pending-timeout")
    assert "Insufficient cpu" in ad["HoldReason"], ad["HoldReason"]
    wait_for(lambda: read_pod(admin_core, pilot_namespace, ad["K8sPodName"]) is None, what="the pod deleted")


def test_eviction_of_the_last_attempt_holds_evictions_exhausted(bed, admin_core, pilot_namespace):
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace, K8sMaxAttempts=1)
    until(agent, ad, status_is(2), "the pilot running")
    name = ad["K8sPodName"]
    admin_core.create_namespaced_pod_eviction(name, pilot_namespace, {"metadata": {"name": name,
                                                                                   "namespace": pilot_namespace}})
    until(agent, ad, status_is(5), "the hold")
    assert_hold(ad, "evictions-exhausted")
    assert ad["K8sAttempt"] == 0 and agent.metrics["creates"] == 1


def test_container_start_error_holds_container_cannot_run(bed, pilot_namespace):
    """A kubelet's terminated `StartError` (exec of a missing executable), as kwok reports it."""
    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace, annotations={kwokstages.RUN_FOR: "1s", kwokstages.EXIT_CODE: "128",
                                                       kwokstages.REASON: "StartError"})
    until(agent, ad, status_is(5), "the hold")
    assert_hold(ad, "container-cannot-run")


def test_a_sandbox_of_exactly_one_mib_is_taken_by_the_real_server(bed, admin_core, pilot_namespace):
    """ce-k8s's sandbox limit counts what the API server counts (the Secret's data values, at most
    1 MiB): a sandbox at the limit becomes a Secret and runs; the server refuses one byte more,
    which ce-k8s never sends (the builder's `sandbox-too-large` hold comes first)."""
    from ce_k8s.settings import SECRET_HARD_MAX

    agent, settings, _ = bed
    ad = pilot(settings, pilot_namespace)
    iwd = Path(ad["Iwd"])
    proxy = (iwd / "x509up").stat().st_size
    (iwd / "glidein_startup.sh").write_bytes(b"#" * (SECRET_HARD_MAX - proxy))
    until(agent, ad, status_is(2), "the pilot running")
    secret = read_secret(admin_core, pilot_namespace, secret_name(ad["K8sPodName"]))
    assert sum(len(base64.b64decode(v)) for v in secret.data.values()) == SECRET_HARD_MAX
    with pytest.raises(ApiException) as err:
        admin_core.create_namespaced_secret(pilot_namespace, {"metadata": {"name": "over"}, "data": {
            "x": base64.b64encode(b"#" * (SECRET_HARD_MAX + 1)).decode()}})
    assert err.value.status == 422 and "1048576" in json.loads(err.value.body)["message"]

    over = pilot(settings, pilot_namespace, cluster=4712)
    (Path(over["Iwd"]) / "glidein_startup.sh").write_bytes(b"#" * (SECRET_HARD_MAX - proxy + 1))
    until(agent, over, status_is(5), "the hold")
    assert_hold(over, "sandbox-too-large")


def test_awkward_input_file_names_make_secret_keys_the_real_server_takes(bed, admin_core, pilot_namespace):
    """Secret keys must match [-._a-zA-Z0-9]+ on a real server; spooled inputs may be named
    anything. The pod mounts each file under its key, so the server must take every key made."""
    agent, settings, _ = bed
    names = ["a b.txt", "x+y@z=1.dat", "\u00fcn\u00efcode.txt", "-dash", "...", "a b.txt.1"]
    ad = pilot(settings, pilot_namespace, TransferInput=", ".join(names))
    for name in names:
        (Path(ad["Iwd"]) / name).write_text(name)
    until(agent, ad, status_is(2), "the pilot running")
    secret = read_secret(admin_core, pilot_namespace, secret_name(ad["K8sPodName"]))
    contents = sorted(base64.b64decode(v).decode() for k, v in secret.data.items() if k not in (
        "glidein_startup.sh", "x509up"))
    assert contents == sorted(names), secret.data.keys()


def test_a_full_secret_quota_is_waited_out_never_held(bed, admin_core, pilot_namespace, caplog):
    """A quota on Secrets refuses the sandbox after the pod is made: temporary, so the agent
    retries and the job is never held; the Secret comes once there is room. (A kubelet would
    keep that pod ContainerCreating, so the job idle, until its Secret volume exists; kwok does
    not mount volumes and shows it Running, so the job's state meanwhile is not asserted.)"""
    agent, settings, _ = bed
    caplog.set_level(logging.INFO, logger="ce_k8s.agent.creator")
    admin_core.create_namespaced_resource_quota(pilot_namespace, {"metadata": {"name": "no-secrets"},
                                                                  "spec": {"hard": {"secrets": "0"}}})
    wait_for(lambda: admin_core.read_namespaced_resource_quota("no-secrets", pilot_namespace).status.hard,
             what="the quota's status")
    ad = pilot(settings, pilot_namespace)
    name = secret_name(ad["K8sPodName"])
    until(agent, ad, lambda a: "event=create-delayed" in caplog.text and "exceeded quota" in caplog.text,
          "the Secret's quota refusal")
    assert "create secret: quota exceeded" in caplog.text and read_secret(admin_core, pilot_namespace, name) is None
    admin_core.delete_namespaced_resource_quota("no-secrets", pilot_namespace)
    until(agent, ad, lambda a: read_secret(admin_core, pilot_namespace, name) is not None,
          "the Secret once there is room", timeout=120)
    assert ad["JobStatus"] != 5 and "HoldReasonCode" not in ad, dict(ad)


# --------------------------------------------------------------------------------------------
# What operators see: kubectl and `ce-k8s status`


def test_kubectl_and_ce_k8s_status_show_the_agents_pods(bed, real_kube, pilot_namespace, tmp_path):
    import subprocess
    import sys

    agent, settings, _ = bed
    ads = [pilot(settings, pilot_namespace, cluster=c) for c in (4711, 4712)]
    for ad in ads:
        until(agent, ad, status_is(2), "the pilot running")
    names = sorted(ad["K8sPodName"] for ad in ads)

    listed = json.loads(real_kube.kubectl("get", "pods", "-n", pilot_namespace, "-o", "json").stdout)["items"]
    assert sorted(p["metadata"]["name"] for p in listed) == names
    for p in listed:
        labels = p["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "ce-k8s"
        assert labels["ce-k8s.htcondor.org/ce"] == settings.ce_name
        assert labels["ce-k8s.htcondor.org/job"] in {"4711.0", "4712.0"}, labels

    config = tmp_path / "condor_config"
    config.write_text(f"CE_K8S_CE_NAME = {settings.ce_name}\n")
    ce_k8s = str(Path(sys.executable).parent / "ce-k8s")
    for how in (["--source", "api", "--kubeconfig", str(real_kube.kubeconfig)],     # the agent's rights
                ["--source", "agent", "--socket", settings.socket]):
        out = subprocess.run([ce_k8s, "status", "--config", str(config), "--json", *how], capture_output=True,
                             text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        rows = rows["pilots"] if isinstance(rows, dict) else rows
        assert sorted(r["pod"] for r in rows) == names, rows
        assert {r["phase"] for r in rows} == {"Running"} and {r["namespace"] for r in rows} == {pilot_namespace}
