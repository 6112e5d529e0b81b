"""The six findings of issue 25 (docs/real-kubernetes.md "Findings"), each shown on the real control
plane first, then the product's handling of it, through the agent with the ServiceAccount's rights.

Each finding was read out of Kubernetes' source against our emulator; here the real
kube-apiserver (admission, Eviction API, garbage collector) and kwok (the kubelet's status shapes)
say whether it holds. The agent runs in-process on the agent's own kubeconfig (never admin).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import classad2
import pytest
from agent.conftest import routed_ad, text_of
from agent.test_agent import update
from kubernetes import client
from kubernetes.client.rest import ApiException

from ce_k8s.agent.jobs import JobRecord
from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.agent.status import completes
from ce_k8s.holds import HOLDS
from ce_k8s.pods.names import secret_name
from ce_k8s.real.kube import kwokstages

from .conftest import running_agent, wait_for

NS = "ce-k8s-pilots"
IMAGE = "registry.example.org/pilot:1"


def restricted_pod(name: str, annotations: dict[str, str] | None = None, **spec) -> dict:
    """A pod the `restricted` PodSecurity level admits, as small as one can be."""
    sc = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
          "seccompProfile": {"type": "RuntimeDefault"}}
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"restartPolicy": "Never", "securityContext": {"runAsUser": 1000},
                     "containers": [{"name": "c", "image": IMAGE, "securityContext": sc,
                                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                                   "limits": {"cpu": "100m", "memory": "64Mi"}}}]}}
    body["spec"].update(spec)
    return body


def _message(exc: ApiException) -> str:
    return json.loads(exc.body or "{}").get("message", "")


@pytest.fixture
def core(admin_client):
    return client.CoreV1Api(admin_client)


@pytest.fixture
def namespace(core, real_kube, request):
    """A fresh namespace labelled like the shipped pilot namespace, with the shipped agent Role in it."""
    from ce_k8s.real.kube.kubeserver import RealKubeServer

    name = "t-" + request.node.name.lower().replace("_", "-")[5:40].strip("-") + "-" + os.urandom(3).hex()
    server = RealKubeServer(real_kube)
    server.prepare_namespace(name)
    server.stop()
    yield name
    core.delete_namespace(name)


@pytest.fixture
def agent_env(real_kube, namespace):
    """(Agent on the agent's kubeconfig, Settings, spool root) for one test namespace, reading usage
    from the bed's kubelet stub and trusting its certificate (conftest.running_agent: a CE name of
    its own, so a pod of the same job left by an earlier test never looks like this agent's)."""
    with running_agent(real_kube, namespace, kubelet_ca=str(real_kube.kubelet_ca)) as env:
        yield env


def _ad(settings, namespace: str, **extra):
    return routed_ad(Path(settings.spool), K8sNamespace=namespace, K8sImage=IMAGE, **extra)


# --------------------------------------------------------------------------------------------
# Finding 1: ResourceQuota admission runs before AlreadyExists


def test_finding1_quota_answers_before_already_exists_on_the_real_server(core, namespace):
    """Confirmed: at a full quota, creating (or dry-running) a pod that exists answers 403
    "exceeded quota", never 409."""
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "one"}, "spec": {"hard": {"pods": "1"}}})
    wait_for(lambda: core.read_namespaced_resource_quota("one", namespace).status.hard, what="quota status")
    core.create_namespaced_pod(namespace, restricted_pod("p1"))
    for dry_run in ("All", None):
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod(namespace, restricted_pod("p1"), dry_run=dry_run)
        assert err.value.status == 403 and "exceeded quota" in _message(err.value), _message(err.value)


def test_finding1_agent_adopts_its_pod_at_a_full_quota_and_makes_the_secret(agent_env, core, namespace):
    """Fixed: a re-run of a create whose pod exists (an earlier POST was applied and its answer
    lost) adopts the pod at a full quota and creates its Secret, instead of retrying forever on
    the dry run's 403."""
    agent, settings, _root = agent_env
    ad = _ad(settings, namespace)
    built = agent.creator.build(text_of(ad).decode(), "cmspilot")
    # The quota first, its status computed, then the pod: admission charges the pod to the quota
    # as it creates it. A quota made after the pod is counted only by the controller manager from
    # its own cache of pods, which may not hold the pod yet; pod creations do not trigger a
    # recount, so the quota then read 0 pods for the resync period (5 min; the cold CI run at
    # 057a727 timed out here).
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "full"},
                                                      "spec": {"hard": {"pods": "1"}}})
    wait_for(lambda: core.read_namespaced_resource_quota("full", namespace).status.hard, what="quota status")
    core.create_namespaced_pod(namespace, built.pod)      # the POST that was applied
    assert (core.read_namespaced_resource_quota("full", namespace).status.used or {}).get("pods") == "1"
    rerun = JobRecord(built.name, "alice")
    rerun.creation.failures = 1                            # an earlier try of this create failed
    pod = agent.creator.create_pod(built, "4711.0", rerun)
    agent.creator.ensure_secret(built, pod)
    secret = core.read_namespaced_secret(secret_name(built.name), namespace)
    assert secret.metadata.owner_references[0].uid == core.read_namespaced_pod(built.name, namespace).metadata.uid
    assert agent.metrics["adopted"] == 1 and agent.metrics["creates"] == 0


def _get_secret(core, ns, name):
    try:
        return core.read_namespaced_secret(name, ns)
    except ApiException:
        return None


# --------------------------------------------------------------------------------------------
# Finding 2: PodInitializing hides an init container's image-pull failure


def test_finding2_init_container_pull_failure_shows_only_in_init_statuses(core, namespace):
    """Confirmed (kwok's kubelet stage, shaped as the kubelet shows it): the main container waits
    `PodInitializing`, the reason is on the init container."""
    body = restricted_pod("p2", {kwokstages.PULL_ERROR: "true"})
    body["spec"]["initContainers"] = [dict(body["spec"]["containers"][0], name="init")]
    core.create_namespaced_pod(namespace, body)

    def waiting():
        pod = core.read_namespaced_pod("p2", namespace)
        if not pod.status.init_container_statuses:
            return None
        return pod
    pod = wait_for(waiting, what="init container status")
    assert pod.status.container_statuses[0].state.waiting.reason == "PodInitializing"
    assert pod.status.init_container_statuses[0].state.waiting.reason == "ImagePullBackOff"


def test_finding2_pilot_with_sandbox_is_held_for_its_image(agent_env, core, namespace):
    """Fixed: a pilot whose sandbox init container cannot pull is held `image-pull-failed`."""
    agent, settings, _root = agent_env
    ad = _ad(settings, namespace, K8sAnnotations=classad2.ExprTree(f"[ '{kwokstages.PULL_ERROR}' = \"true\" ]"))
    update(agent, ad)
    name = ad["K8sPodName"]
    pod = wait_for(lambda: _exists(core, namespace, name) and core.read_namespaced_pod(name, namespace)
                   .status.init_container_statuses, what="the sandbox init container's status")
    assert pod[0].state.waiting.reason == "ImagePullBackOff"
    out = wait_for(lambda: (o := update(agent, ad)) and o.get("JobStatus") == 5 and o, what="the hold")
    hold = HOLDS["image-pull-failed"]
    assert (out["HoldReasonCode"], out["HoldReasonSubCode"]) == (hold.code, hold.subcode)
    assert "ImagePullBackOff" in out["HoldReason"] and IMAGE in out["HoldReason"], out["HoldReason"]


# --------------------------------------------------------------------------------------------
# Finding 3: PodSecurity rejects hostPath; LimitRange max becomes the default limit


def test_finding3_restricted_namespace_refuses_hostpath(core):
    """Confirmed: the shipped pilot namespace (`restricted`) refuses a hostPath volume (CVMFS as
    hostPath, as docs/routes.md once suggested), with PodSecurity's own words."""
    body = restricted_pod("p3")
    body["spec"]["volumes"] = [{"name": "cvmfs", "hostPath": {"path": "/cvmfs"}}]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(NS, body, dry_run="All")
    assert err.value.status == 403 and 'violates PodSecurity "restricted:latest"' in _message(err.value)
    assert "hostPath" in _message(err.value)


def test_finding3_limitrange_max_becomes_the_default_cpu_limit(core):
    """Confirmed: the shipped LimitRange states a CPU `max` and no CPU `default`, so LimitRanger
    gives a container without a CPU limit the max (128) as its limit."""
    body = restricted_pod("p3b")
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    pod = core.create_namespaced_pod(NS, body, dry_run="All")
    assert pod.spec.containers[0].resources.limits == {"cpu": "128", "memory": "2Gi"}


# --------------------------------------------------------------------------------------------
# Finding 4: the Eviction API marks finished pods too


def test_finding4_eviction_of_a_finished_pod_adds_disruption_target(core, namespace):
    """Confirmed: evicting a Succeeded pod adds DisruptionTarget=True (EvictionByEvictionAPI)
    before the pod is deleted."""
    core.create_namespaced_pod(namespace, restricted_pod("p4", {kwokstages.RUN_FOR: "1s"}))
    wait_for(lambda: core.read_namespaced_pod("p4", namespace).status.phase == "Succeeded", what="Succeeded")
    w = client.CoreV1Api(core.api_client)
    seen: list[dict] = []
    rv = core.read_namespaced_pod("p4", namespace).metadata.resource_version
    core.create_namespaced_pod_eviction("p4", namespace, {"metadata": {"name": "p4", "namespace": namespace}})
    resp = w.list_namespaced_pod(namespace, watch=True, resource_version=rv, field_selector="metadata.name=p4",
                                 timeout_seconds=20, _preload_content=False)
    for line in resp:
        ev = json.loads(line)
        seen.append(ev)
        if ev["type"] == "DELETED":
            break
    conds = [c for ev in seen for c in (ev["object"]["status"].get("conditions") or [])
             if c["type"] == "DisruptionTarget"]
    assert conds and conds[0]["status"] == "True" and conds[0]["reason"] == "EvictionByEvictionAPI"
    assert seen[-1]["object"]["status"]["phase"] == "Succeeded"
    # Fixed: the agent reads that pod as finished, not evicted, so the pilot is not run again.
    info = PodInfo.from_dict(seen[-1]["object"])
    assert info.disruption == "EvictionByEvictionAPI" and not info.disrupted and completes(info)


# --------------------------------------------------------------------------------------------
# Finding 5: a lost node's pods stay Running with a deletion timestamp


def test_finding5_pods_of_a_lost_node_stay_running_and_terminating(core, real_kube, namespace):
    """Confirmed: when a node stops reporting, the node controller taints it, the taint manager
    deletes its pods after their toleration (10 s in the bed), and the pods stay `Running` with a
    deletionTimestamp as long as the node is away: nothing makes them Failed."""
    node = "spare-1"
    core.create_namespaced_pod(namespace, restricted_pod("p5", nodeName=node))
    wait_for(lambda: core.read_namespaced_pod("p5", namespace).status.phase == "Running", what="Running")
    real_kube.lose_spare_node()
    try:
        pod = wait_for(lambda: (p := core.read_namespaced_pod("p5", namespace)).metadata.deletion_timestamp and p,
                       timeout=120, what="the taint manager's deletion")
        assert pod.status.phase == "Running"
        ready = {c.type: c.status for c in core.read_node(node).status.conditions}["Ready"]
        assert ready == "Unknown"
    finally:
        real_kube.return_spare_node()
    wait_for(lambda: not _exists(core, namespace, "p5"), timeout=60, what="the pod gone once the node is back")


def test_finding5_pilot_on_a_lost_node_is_not_run_again_while_its_pod_may_run(agent_env, core, real_kube):
    """Fixed: the taint manager marks the lost node's pod (DisruptionTarget, a deletion timestamp)
    but its pilot may still run there; the job stays running, says why, and no second pod is made
    until that pod is gone. Then the eviction gives the next attempt, one new pod."""
    agent, settings, _root = agent_env
    ad = _ad(settings, settings.namespace,
             K8sNodeSelector=classad2.ExprTree("[ 'sim.ce-k8s.io/pool' = \"spare\" ]"),
             K8sTolerations=classad2.ExprTree("{ [ key = \"ce-k8s.test/spare\"; operator = \"Exists\" ] }"))
    update(agent, ad)
    first = ad["K8sPodName"]
    wait_for(lambda: (o := update(agent, ad)) and ad["JobStatus"] == 2 and o, what="the pilot running on spare-1")
    assert core.read_namespaced_pod(first, settings.namespace).spec.node_name == "spare-1"
    real_kube.lose_spare_node()
    try:
        wait_for(lambda: _exists(core, settings.namespace, first)
                 and core.read_namespaced_pod(first, settings.namespace).metadata.deletion_timestamp,
                 timeout=120, what="the taint manager's deletion")
        wait_for(lambda: agent.cache.get(first) is not None and agent.cache.get(first).deleting, what="the cache")
        out = update(agent, ad)
        assert ad["JobStatus"] == 2 and ad["K8sPodName"] == first, out
        assert "terminating" in ad["K8sPodReason"] and "DeletionByTaintManager" in ad["K8sPodReason"]
        pods = core.list_namespaced_pod(settings.namespace).items
        assert [p.metadata.name for p in pods] == [first]          # no second pod while it may run
    finally:
        real_kube.return_spare_node()
    wait_for(lambda: not _exists(core, settings.namespace, first), timeout=60, what="the pod gone")
    wait_for(lambda: agent.cache.get(first) is None, what="the agent's cache")
    update(agent, ad)
    assert ad["K8sAttempt"] == 1 and ad["K8sPodName"] != first and ad["JobStatus"] == 1


def _exists(core, ns, name) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


# --------------------------------------------------------------------------------------------
# Finding 6: the Summary API forgets an exited container


def test_finding6_summary_drops_a_container_once_it_exited(core, namespace, real_kube, agent_client):
    """Shown through the direct kubelet path the agent uses (CE_K8S_USAGE_SOURCE = kubelet: the
    node's InternalIP and kubelet port, the agent's own token, get nodes/stats; the API server will
    not proxy to a loopback node): a running container is in the node's Summary, the same pod after
    its exit is not (the stub answers as a kubelet: stats of live cgroups)."""
    from ce_k8s.agent.accounting import KUBELET_SUMMARY_PATH, KubeletClient, kubelet_endpoint

    core.create_namespaced_pod(namespace, restricted_pod("p6", {kwokstages.RUN_FOR: "3s"}))
    pod = wait_for(lambda: (p := core.read_namespaced_pod("p6", namespace)).status.phase == "Running" and p,
                   what="Running")
    node = core.api_client.sanitize_for_serialization(core.read_node(pod.spec.node_name))
    endpoint = kubelet_endpoint(node)
    kubelet = KubeletClient(agent_client.configuration, ca=str(real_kube.kubelet_ca))

    def in_summary() -> bool:
        data = kubelet.get(endpoint, KUBELET_SUMMARY_PATH, 10)
        return any(p["podRef"]["name"] == "p6" for p in json.loads(data)["pods"])
    assert in_summary()
    wait_for(lambda: core.read_namespaced_pod("p6", namespace).status.phase == "Succeeded", what="Succeeded")
    assert not in_summary()
