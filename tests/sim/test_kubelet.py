"""The kubelet/scheduler simulator (issue 4 item 2): scheduling rules and messages, pod phases,
container states, logs, evictions, deletion and node loss, as the kube-scheduler and kubelet
report them. Time runs at 1/100 (``time_scale=0.01``): a "2s" container takes 20 ms."""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client, watch

from ce_k8s.sim.kube.cluster import NodeSpecError, parse_nodes
from ce_k8s.sim.kube.scenario import ScenarioError, parse_scenario, scenario_from_image

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pod(srv, name):
    return srv.store.get("pods", "default", name)


def phase(srv, name):
    p = pod(srv, name)
    return p["status"]["phase"] if p else None


def cstate(srv, name, i=0):
    return pod(srv, name)["status"]["containerStatuses"][i]["state"]


def conditions(p):
    return {c["type"]: c for c in p["status"].get("conditions", [])}


def record(srv, name):
    """Every stored version of pod ``name``, in write order (a store listener on the server loop)."""
    seen: list[tuple[str, dict]] = []

    def listener(resource, ev):
        if resource == "pods" and ev.obj["metadata"]["name"] == name:
            seen.append((ev.type, ev.obj))
    srv.call(srv.store.add_listener, listener)
    return seen


def failed_version(seen):
    return next(obj for _, obj in seen if obj["status"].get("phase") == "Failed")


def wait_phase(srv, name, want, timeout=5):
    return srv.wait_for(lambda: phase(srv, name) == want, timeout=timeout)


def test_pod_runs_to_success_with_interleaved_logs(cluster, kcore, pod_body):
    scenario = 'run=2s exit=0 stdout="hello\\nworld" stderr="warn: x" out="bye"'
    kcore.create_namespaced_pod("default", pod_body("p1", scenario=scenario, cpu="1"))
    cluster.wait_for(lambda: phase(cluster, "p1") == "Running")
    p = pod(cluster, "p1")
    assert p["spec"]["nodeName"].startswith("cpu-") and p["status"]["startTime"]
    assert conditions(p)["Ready"]["status"] == "True" and conditions(p)["PodScheduled"]["status"] == "True"
    assert cstate(cluster, "p1")["running"]["startedAt"]
    wait_phase(cluster, "p1", "Succeeded")
    term = cstate(cluster, "p1")["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed" and term["finishedAt"]
    assert kcore.read_namespaced_pod_log("p1", "default") == "hello\nworld\nwarn: x\nbye\n"
    assert kcore.read_namespaced_pod_log("p1", "default", tail_lines=1) == "bye\n"
    stamped = kcore.read_namespaced_pod_log("p1", "default", timestamps=True).splitlines()
    assert stamped[0].endswith(" hello") and stamped[0][:4].isdigit()


def test_watch_sees_every_transition(cluster, kcore, pod_body):
    """The kubelet writes through the API's write path, so a watch sees each phase change."""
    phases = []
    w = watch.Watch()

    def run():
        for ev in w.stream(kcore.list_namespaced_pod, "default", timeout_seconds=5):
            phases.append(ev["raw_object"]["status"].get("phase"))
            if phases[-1] == "Succeeded":
                w.stop()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    kcore.create_namespaced_pod("default", pod_body("p1", scenario="run=1s"))
    t.join(6)
    assert phases[0] == "Pending" and "Running" in phases and phases[-1] == "Succeeded"


@pytest.mark.parametrize("scenario,reason,code", [
    ("run=1s exit=3", "Error", 3),
    ("oom-after=1s", "OOMKilled", 137),
])
def test_failures_carry_exit_codes(cluster, kcore, pod_body, scenario, reason, code):
    kcore.create_namespaced_pod("default", pod_body("p1", scenario=scenario))
    wait_phase(cluster, "p1", "Failed")
    term = cstate(cluster, "p1")["terminated"]
    assert (term["reason"], term["exitCode"]) == (reason, code)


@pytest.mark.parametrize("image,reason,code", [("busybox:fail", "Error", 1), ("busybox:oom", "OOMKilled", 137),
                                               ("busybox:exit-7", "Error", 7)])
def test_image_name_conventions(cluster, kcore, pod_body, image, reason, code):
    kcore.create_namespaced_pod("default", pod_body("p1", image=image))
    wait_phase(cluster, "p1", "Failed")
    assert cstate(cluster, "p1")["terminated"]["reason"] == reason
    assert cstate(cluster, "p1")["terminated"]["exitCode"] == code


def test_active_deadline_seconds_fails_with_deadline_exceeded(cluster, kcore, pod_body):
    kcore.create_namespaced_pod("default", pod_body("p1", scenario="run=forever", activeDeadlineSeconds=3))
    wait_phase(cluster, "p1", "Failed")
    st = pod(cluster, "p1")["status"]
    assert st["reason"] == "DeadlineExceeded"
    assert st["message"] == "Pod was active on the node longer than the specified deadline"


def test_image_pull_error_then_back_off(cluster, kcore, pod_body):
    kcore.create_namespaced_pod("default", pod_body("p1", image="registry.example.org/does-not-exist:1"))
    cluster.wait_for(lambda: cstate(cluster, "p1").get("waiting", {}).get("reason") == "ErrImagePull")
    assert 'Failed to pull image "registry.example.org/does-not-exist:1"' in cstate(cluster, "p1")["waiting"]["message"]
    cluster.wait_for(lambda: cstate(cluster, "p1").get("waiting", {}).get("reason") == "ImagePullBackOff")
    assert phase(cluster, "p1") == "Pending"
    with pytest.raises(client.ApiException) as e:
        kcore.read_namespaced_pod_log("p1", "default")
    assert e.value.status == 400 and "is waiting to start: trying and failing to pull image" in e.value.body


def test_missing_secret_env_is_create_container_config_error_until_it_appears(cluster, kcore, pod_body):
    body = pod_body("p1", scenario="run=forever")
    body["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}]
    kcore.create_namespaced_pod("default", body)
    cluster.wait_for(lambda: cstate(cluster, "p1").get("waiting", {}).get("reason") == "CreateContainerConfigError")
    assert cstate(cluster, "p1")["waiting"]["message"] == 'secret "creds" not found'
    kcore.create_namespaced_secret("default", {"metadata": {"name": "creds"}, "stringData": {"token": "t"}})
    wait_phase(cluster, "p1", "Running")


def test_missing_secret_volume_keeps_container_creating(cluster, kcore, pod_body):
    body = pod_body("p1", scenario="run=forever")
    body["spec"]["volumes"] = [{"name": "sandbox", "secret": {"secretName": "sbx"}}]
    kcore.create_namespaced_pod("default", body)
    cluster.wait_for(lambda: any(e["reason"] == "FailedMount" for e in cluster.store.list("events", "default")))
    assert cstate(cluster, "p1")["waiting"]["reason"] == "ContainerCreating" and phase(cluster, "p1") == "Pending"
    kcore.create_namespaced_secret("default", {"metadata": {"name": "sbx"}})
    wait_phase(cluster, "p1", "Running")


def test_unschedulable_message_and_retry_when_resources_free(cluster, kcore, pod_body):
    """kube-scheduler's FitError text: sorted "count reason" parts plus the preemption summary."""
    kcore.create_namespaced_pod("default", pod_body("a", scenario="run=forever", cpu="3"))
    kcore.create_namespaced_pod("default", pod_body("b", scenario="run=forever", cpu="3"))
    kcore.create_namespaced_pod("default", pod_body("c", scenario="run=forever", cpu="3"))
    cluster.wait_for(lambda: conditions(pod(cluster, "c")).get("PodScheduled", {}).get("reason") == "Unschedulable")
    cond = conditions(pod(cluster, "c"))["PodScheduled"]
    assert cond["status"] == "False"
    assert cond["message"] == ("0/3 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
                               "2 Insufficient cpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful "
                               "for scheduling, 2 No preemption victims found for incoming pod.")
    assert any(e["reason"] == "FailedScheduling" for e in cluster.store.list("events", "default"))
    kcore.delete_namespaced_pod("a", "default")
    wait_phase(cluster, "c", "Running")


def test_scheduler_follows_a_change_of_node_allocatable(cluster, kcore, pod_body):
    """The scheduler keeps each node's parsed allocatable only while the node is unchanged."""
    kcore.create_namespaced_pod("default", pod_body("a", scenario="run=forever", cpu="1"))
    wait_phase(cluster, "a", "Running")                    # the scheduler has read both cpu nodes
    for name in ("cpu-1", "cpu-2"):
        kcore.patch_node_status(name, {"status": {"allocatable": {"cpu": "2"}}})
    kcore.create_namespaced_pod("default", pod_body("b", scenario="run=forever", cpu="3"))
    cluster.wait_for(lambda: "2 Insufficient cpu" in
                     conditions(pod(cluster, "b")).get("PodScheduled", {}).get("message", ""))


def test_gpu_pods_need_toleration_and_land_on_gpu_nodes(cluster, kcore, pod_body):
    gpu = pod_body("g1", scenario="run=forever", tolerations=[GPU_TOLERATION])
    gpu["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    kcore.create_namespaced_pod("default", gpu)
    wait_phase(cluster, "g1", "Running")
    assert pod(cluster, "g1")["spec"]["nodeName"] == "gpu-1"
    more = pod_body("g2", scenario="run=forever", tolerations=[GPU_TOLERATION])
    more["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    kcore.create_namespaced_pod("default", more)
    cluster.wait_for(lambda: "3 Insufficient nvidia.com/gpu" in
                     conditions(pod(cluster, "g2")).get("PodScheduled", {}).get("message", ""))


def test_node_selector_and_required_affinity(cluster, kcore, pod_body):
    kcore.create_namespaced_pod("default", pod_body("sel", nodeSelector={"disk": "ssd"}))
    # Filters run in the scheduler's order and the first failure counts: the taint comes first.
    cluster.wait_for(lambda: conditions(pod(cluster, "sel")).get("PodScheduled", {}).get("message", "").startswith(
        "0/3 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, 2 node(s) didn't "
        "match Pod's node affinity/selector. preemption:"))
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["cpu-2"]}]}]}}}
    kcore.create_namespaced_pod("default", pod_body("aff", scenario="run=forever", affinity=aff))
    wait_phase(cluster, "aff", "Running")
    assert pod(cluster, "aff")["spec"]["nodeName"] == "cpu-2"


def test_cordon_and_uncordon(cluster, kcore, pod_body):
    cluster.kubelet.cordon("cpu-1")
    cluster.kubelet.cordon("cpu-2")
    node = cluster.store.get("nodes", None, "cpu-1")
    assert node["spec"]["unschedulable"] is True
    assert {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"} in node["spec"]["taints"]
    kcore.create_namespaced_pod("default", pod_body("p1", scenario="run=forever"))
    cluster.wait_for(lambda: "2 node(s) were unschedulable" in
                     conditions(pod(cluster, "p1")).get("PodScheduled", {}).get("message", ""))
    cluster.kubelet.uncordon("cpu-2")
    wait_phase(cluster, "p1", "Running")
    assert pod(cluster, "p1")["spec"]["nodeName"] == "cpu-2"


def test_api_eviction_of_running_pod(cluster, kcore, pod_body):
    kcore.create_namespaced_pod("default", pod_body("p1", scenario="run=forever"))
    wait_phase(cluster, "p1", "Running")
    seen = record(cluster, "p1")
    kcore.create_namespaced_pod_eviction("p1", "default", client.V1Eviction(
        metadata=client.V1ObjectMeta(name="p1", namespace="default")))
    cluster.wait_for(lambda: pod(cluster, "p1") is None)
    p = failed_version(seen)  # SIGTERM → exit 143 → Failed, then the kubelet confirms the delete
    assert conditions(p)["DisruptionTarget"]["reason"] == "EvictionByEvictionAPI"
    assert p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    assert seen[-1][0] == "DELETED"


def test_drain_cordons_and_evicts(cluster, kcore, pod_body):
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["cpu-1"]}]}]}}}
    for n in ("p1", "p2"):
        kcore.create_namespaced_pod("default", pod_body(n, scenario="run=forever", affinity=aff))
    wait_phase(cluster, "p1", "Running")
    wait_phase(cluster, "p2", "Running")
    assert sorted(cluster.kubelet.drain("cpu-1")) == ["p1", "p2"]
    cluster.wait_for(lambda: pod(cluster, "p1") is None and pod(cluster, "p2") is None)
    assert cluster.store.get("nodes", None, "cpu-1")["spec"]["unschedulable"] is True


def test_node_pressure_eviction_leaves_failed_evicted_pod(cluster, kcore, pod_body):
    kcore.create_namespaced_pod("default", pod_body("p1", scenario="run=forever evict-after=1s"))
    wait_phase(cluster, "p1", "Failed")
    p = pod(cluster, "p1")
    assert p["status"]["reason"] == "Evicted" and "The node was low on resource: memory" in p["status"]["message"]
    assert conditions(p)["DisruptionTarget"]["reason"] == "TerminationByKubelet"


def test_graceful_delete_of_running_pod(cluster, kcore, pod_body):
    kcore.create_namespaced_pod("default", pod_body("p1", scenario="run=forever"))
    wait_phase(cluster, "p1", "Running")
    seen = record(cluster, "p1")
    kcore.delete_namespaced_pod("p1", "default")
    cluster.wait_for(lambda: pod(cluster, "p1") is None)
    # graceful: first marked for deletion (kept while the kubelet stops it), then removed. Read from
    # the store's own history, since on a loaded machine the removal can come before a GET.
    assert seen[0][0] == "MODIFIED" and seen[0][1]["metadata"]["deletionTimestamp"]
    assert seen[-1][0] == "DELETED"


def test_node_loss(cluster, kcore, pod_body):
    tol = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
            "tolerationSeconds": 5}]
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["cpu-1"]}]}]}}}
    kcore.create_namespaced_pod("default", pod_body("p1", scenario="run=forever", tolerations=tol, affinity=aff))
    wait_phase(cluster, "p1", "Running")
    seen = record(cluster, "p1")
    cluster.kubelet.lose_node("cpu-1")
    node = cluster.store.get("nodes", None, "cpu-1")
    ready = {c["type"]: c for c in node["status"]["conditions"]}["Ready"]
    assert ready["status"] == "Unknown" and ready["reason"] == "NodeStatusUnknown"
    assert any(t["key"] == "node.kubernetes.io/unreachable" for t in node["spec"]["taints"])
    # As on a real cluster (tests/real/test_emulator_parity.py): the taint manager marks and
    # deletes the pod, and it stays Running and Terminating while nobody can confirm the kill,
    # past its grace period (30 simulated s).
    p = cluster.wait_for(lambda: (x := pod(cluster, "p1")) and x["metadata"].get("deletionTimestamp") and x)
    time.sleep(40 * 0.01)     # the cluster fixture runs at time_scale 0.01
    p = pod(cluster, "p1")
    assert p is not None and p["status"]["phase"] == "Running" and "reason" not in p["status"]
    assert conditions(p)["DisruptionTarget"]["reason"] == "DeletionByTaintManager"
    assert conditions(p)["Ready"]["status"] == "False"
    assert not any(obj["status"].get("phase") == "Failed" for _, obj in seen)
    cluster.kubelet.restore_node("cpu-1")
    ready = {c["type"]: c for c in cluster.store.get("nodes", None, "cpu-1")["status"]["conditions"]}["Ready"]
    assert ready["status"] == "True"
    cluster.wait_for(lambda: pod(cluster, "p1") is None)     # its kubelet is back and confirms the kill


def test_bad_scenario_is_reported_on_the_container(cluster, kcore, pod_body):
    kcore.create_namespaced_pod("default", pod_body("p1", scenario="run=2s exti=1"))
    cluster.wait_for(lambda: cstate(cluster, "p1").get("waiting", {}).get("reason") == "CreateContainerError")
    assert "unknown word 'exti=1'" in cstate(cluster, "p1")["waiting"]["message"]


def test_scenario_grammar():
    sc = parse_scenario('run=1.5m exit=2 out="a\\nb" err=c lines=2 pull=500ms term-exit=0 ignore-sigterm')
    assert sc.run == 90.0 and sc.exit_code == 2 and sc.pull == 0.5 and sc.term_exit == 0 and sc.ignore_sigterm
    assert sc.output == [("stdout", "a\nb"), ("stderr", "c"), ("stdout", "line 1"), ("stdout", "line 2")]
    assert parse_scenario("run=forever").run is None
    for bad in ("run=soon", "exit=x", 'out="unclosed', "bogus"):
        with pytest.raises(ScenarioError):
            parse_scenario(bad)
    assert scenario_from_image("docker.io/x/does-not-exist:1") == "image-pull-error"
    assert scenario_from_image("localhost:5000/pilot") is None
    assert scenario_from_image("pilot:run-30s") == "run=30s exit=0"


def test_node_spec_grammar():
    nodes = parse_nodes("cpu:3x16c64g,gpu:1x32c256g4gpu:taint=nvidia.com/gpu=present:NoSchedule:label=zone=a")
    assert [n.name for n in nodes] == ["cpu-1", "cpu-2", "cpu-3", "gpu-1"]
    gpu = nodes[3]
    assert gpu.capacity() == {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "100Gi",
                              "nvidia.com/gpu": "4"}
    assert gpu.taints == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert gpu.labels == {"sim.ce-k8s.io/pool": "gpu", "zone": "a"}
    assert parse_nodes("small:2x0.5c1g:pods=4:cordon:res=example.org/fpga=1")[0].capacity()["example.org/fpga"] == "1"
    for bad in ("cpu", "cpu:0x4c", "cpu:3x4q", "Cpu:1x1c", "cpu:1x1c:taint=a:Never", "cpu:1x1c:wat", "a:1x1c,a:1x1c"):
        with pytest.raises(NodeSpecError):
            parse_nodes(bad)


def test_per_container_scenarios_and_log_container_choice(cluster, kcore, pod_body):
    body = pod_body("p1", scenario='run=1s out="main"')
    body["metadata"]["annotations"]["sim.ce-k8s.io/scenario.side"] = 'run=2s exit=4 err="side"'
    body["spec"]["containers"].append({"name": "side", "image": "busybox:1.36"})
    kcore.create_namespaced_pod("default", body)
    wait_phase(cluster, "p1", "Failed")  # all containers ended, one non-zero
    codes = [cs["state"]["terminated"]["exitCode"] for cs in pod(cluster, "p1")["status"]["containerStatuses"]]
    assert codes == [0, 4]
    with pytest.raises(client.ApiException) as e:
        kcore.read_namespaced_pod_log("p1", "default")
    assert e.value.status == 400 and "a container name must be specified for pod p1, choose one of: [pilot side]" \
        in e.value.body
    assert kcore.read_namespaced_pod_log("p1", "default", container="side") == "side\n"
    assert kcore.read_namespaced_pod_log("p1", "default", container="pilot", limit_bytes=2) == "ma"


def test_node_status_subresource_and_static_nodes(core_api):
    """Without kubelets, requested nodes are still registered; node status is a subresource."""
    from ce_k8s.sim.kube.apiserver import ApiServer

    with ApiServer.running(kubelet=False, nodes="cpu:1x8c32g") as srv:
        core = core_api(srv)
        node = core.read_node("cpu-1")
        assert node.status.allocatable["cpu"] == "8" and node.status.conditions[0].status == "True"
        core.patch_node_status("cpu-1", {"status": {"allocatable": {"cpu": "6"}}, "spec": {"unschedulable": True}})
        node = core.read_node("cpu-1")
        assert node.status.allocatable["cpu"] == "6" and not node.spec.unschedulable
        core.patch_node("cpu-1", {"spec": {"unschedulable": True}, "status": {"allocatable": {"cpu": "1"}}})
        node = core.read_node("cpu-1")
        assert node.spec.unschedulable and node.status.allocatable["cpu"] == "6"
