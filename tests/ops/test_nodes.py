"""`ce-k8s nodes reclaim/release` against the API emulator, the kubelet simulator and the real agent.

The hand-over of docs/operations.md "Sharing nodes with Slurm", done so that pilots are
not lost: eviction goes through the Eviction API, whose DisruptionTarget condition the agent maps
to a new attempt (Kubernetes "Pod disruption conditions": running work is never killed unnoticed).
"""

from __future__ import annotations

import time

import pytest
from ops_helpers import NAMESPACE, ce_host, gjid, run_cli

from ce_k8s.info.capacity import CapacityModel, PodShape
from ce_k8s.info.snapshot import snapshot_from_api
from ce_k8s.ops import nodes
from ce_k8s.pods.names import pod_name
from ce_k8s.sim.kube.cluster import NodeSpec


def reclaim(host, node: str, *extra: str) -> tuple[int, list[str]]:
    code, out = run_cli("nodes", "reclaim", node, "--kubeconfig", host.kubeconfig, "--poll", "0.05", *extra)
    return code, out.rstrip("\n").split("\n")


def release(host, node: str, *extra: str) -> tuple[int, list[str]]:
    code, out = run_cli("nodes", "release", node, "--kubeconfig", host.kubeconfig, *extra)
    return code, out.rstrip("\n").split("\n")


def node_obj(host, name: str) -> dict:
    return host.server.store.get("nodes", "", name)


def raw_pilot(host, name: str, node: str, scenario: str, grace: int = 30) -> None:
    """A pilot-labelled pod pinned to `node` whose simulated behaviour is `scenario`."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {"app.kubernetes.io/managed-by": "ce-k8s"},
                     "annotations": {"sim.ce-k8s.io/scenario": scenario}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
                 "nodeSelector": {"kubernetes.io/hostname": node},
                 "containers": [{"name": "pilot", "image": "pilot:1",
                                 "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
    }
    host.server.call(host.server.api.create, "pods", NAMESPACE, pod)


@pytest.fixture
def one_node_host():
    """Pilots all land on cpu-1; cpu-2 joins once they run, so evicted pilots have somewhere to go."""
    with ce_host(nodes="cpu:1x8c32g") as h:
        h.start_agent()
        yield h


def test_reclaim_lets_short_pilots_finish_evicts_the_rest_and_the_agent_reports_them_idle(one_node_host):
    host = one_node_host
    host.submit(1)
    host.submit(2)
    host.submit(3, image="pilot:run-100s")         # finishes within the grace period (1 s real)
    host.server.kubelet.add_node(NodeSpec(name="cpu-2", cpu="8", memory="32Gi"))

    started = time.monotonic()
    code, lines = reclaim(host, "cpu-1", "--grace", "3", "--evict-timeout", "10")
    took = time.monotonic() - started
    assert code == nodes.EXIT_OK, lines
    assert lines[0] == "ce-k8s nodes reclaim: node cpu-1: cordoned"
    evicted = sorted(line.split()[4].rstrip(":") for line in lines if "evicted (grace period" in line)
    assert evicted == sorted(f"{NAMESPACE}/{pod_name(gjid(c), 0)}" for c in (1, 2))
    assert lines[-1].startswith("ce-k8s nodes reclaim: node cpu-1: no pilot pods left")
    assert 3 <= took < 9
    assert node_obj(host, "cpu-1")["spec"]["unschedulable"] is True

    # the short pilot completed normally
    assert host.update(3).get("JobStatus") == 4
    # the evicted ones are idle again with their next attempt's pod (agent status mapping)
    for cluster in (1, 2):
        ad = host.update(cluster)
        assert (ad.get("JobStatus"), ad.get("GridJobStatus"), ad.get("K8sAttempt")) == (1, "PENDING", 1)
        assert ad.get("K8sPodName") == pod_name(gjid(cluster), 1)
        assert "evicted" in ad.get("K8sPodReason")
    # ... and their next pods run elsewhere, never on the reclaimed node
    for cluster in (1, 2):
        host.update_until(cluster, lambda ad: ad.get("K8sPodPhase") == "Running", f"pilot {cluster}'s next pod running")
        assert host.ads[cluster].get("K8sNodeName") == "cpu-2"


def test_pilots_that_have_not_started_are_evicted_at_once(host):
    raw_pilot(host, "slow-pull", "cpu-2", "pull=1000s run=forever")
    host.server.wait_for(lambda: node_of(host, "slow-pull") == "cpu-2")
    started = time.monotonic()
    code, lines = reclaim(host, "cpu-2", "--grace", "60")
    assert code == nodes.EXIT_OK
    assert f"ce-k8s nodes reclaim: pod {NAMESPACE}/slow-pull: evicted (not started yet)" in lines
    assert time.monotonic() - started < 10, "no reason to wait for the grace period"


def node_of(host, name: str) -> str | None:
    try:
        return host.server.store.get("pods", NAMESPACE, name)["spec"].get("nodeName")
    except Exception:
        return None


def test_reclaim_is_bounded_and_says_which_pods_remain(host):
    """A pod that ignores SIGTERM keeps the node busy; the command still ends, with exit 3."""
    raw_pilot(host, "stubborn", "cpu-3", "run=forever ignore-sigterm", grace=3000)
    host.server.wait_for(lambda: host.server.store.get("pods", NAMESPACE, "stubborn")["status"].get("phase")
                         == "Running")
    started = time.monotonic()
    code, lines = reclaim(host, "cpu-3", "--grace", "0", "--evict-timeout", "0.5")
    assert code == nodes.EXIT_TIMEOUT
    assert time.monotonic() - started < 5
    assert lines[-1].startswith("ce-k8s nodes reclaim: node cpu-3: 1 pod(s) still on the node after")
    assert lines[-1].endswith(f"{NAMESPACE}/stubborn")


def test_reclaim_and_release_are_idempotent(host):
    assert reclaim(host, "cpu-1", "--grace", "0") [0] == nodes.EXIT_OK
    code, lines = reclaim(host, "cpu-1", "--grace", "0")
    assert code == nodes.EXIT_OK and "already cordoned by ce-k8s" in lines[0]
    code, lines = release(host, "cpu-1")
    assert (code, lines) == (0, ["ce-k8s nodes release: node cpu-1: uncordoned"])
    assert not node_obj(host, "cpu-1")["spec"].get("unschedulable")
    assert nodes.ANN_RECLAIMED not in (node_obj(host, "cpu-1")["metadata"].get("annotations") or {})
    assert release(host, "cpu-1") == (0, ["ce-k8s nodes release: node cpu-1: already schedulable"])


def test_release_leaves_a_node_an_admin_cordoned(host):
    host.server.kubelet.cordon("cpu-2")                   # kubectl cordon, for maintenance
    code, lines = reclaim(host, "cpu-2", "--grace", "0")
    assert code == 0 and "already cordoned by someone else" in lines[0]
    code, lines = release(host, "cpu-2")
    assert code == 0 and "left cordoned" in lines[0]
    assert node_obj(host, "cpu-2")["spec"]["unschedulable"] is True
    code, lines = release(host, "cpu-2", "--force")
    assert code == 0 and lines == ["ce-k8s nodes release: node cpu-2: uncordoned"]
    assert not node_obj(host, "cpu-2")["spec"].get("unschedulable")


def test_unknown_node_exits_4(host):
    assert reclaim(host, "slurm-only-7")[0] == nodes.EXIT_NO_NODE
    assert release(host, "slurm-only-7")[0] == nodes.EXIT_NO_NODE


def test_unreachable_api_exits_1_within_bounds(host, tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text(open(host.kubeconfig).read().replace(host.server.url, "http://127.0.0.1:9"))
    started = time.monotonic()
    code, out = run_cli("nodes", "reclaim", "cpu-1", "--kubeconfig", str(bad))
    assert code == nodes.EXIT_ERROR and "reading node cpu-1" in out
    assert time.monotonic() - started < 5


def test_negative_grace_is_a_usage_error(host):
    assert reclaim(host, "cpu-1", "--grace", "-1")[0] == nodes.EXIT_USAGE


def test_information_provider_drops_a_reclaimed_node_at_once(host):
    """The cordon is all the provider needs: a cordoned node is excluded from capacity (ce_k8s.info.capacity)."""
    shape = PodShape(namespace=NAMESPACE, requests={"cpu": 1000, "memory": 2**30, "pods": 1})

    def model():
        return CapacityModel(snapshot_from_api(host.kubeconfig, timeout=5), ["nvidia.com/gpu"])

    before = model()
    assert before.totals().nodes_schedulable == 3
    fit_before = before.route_capacity(shape).fit_now
    assert reclaim(host, "cpu-1", "--grace", "0")[0] == 0
    during = model()
    assert during.totals().nodes_schedulable == 2
    assert during.route_capacity(shape).exclusions == {"cordoned": 1}
    assert during.route_capacity(shape).fit_now == fit_before * 2 // 3
    assert release(host, "cpu-1")[0] == 0
    assert model().totals().nodes_schedulable == 3


def test_all_pods_spares_static_and_daemonset_pods(host):
    """--all-pods evicts what `kubectl drain --ignore-daemonsets` would, and nothing else."""
    def pod(name, **meta):
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE, **meta},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": "cpu-1"},
                         "containers": [{"name": "c", "image": "x:forever"}]}}

    host.server.call(host.server.api.create, "pods", NAMESPACE, pod("tenant"))
    host.server.call(host.server.api.create, "pods", NAMESPACE,
                     pod("static", annotations={"kubernetes.io/config.mirror": "abc"}))
    host.server.wait_for(lambda: all(host.server.store.get("pods", NAMESPACE, n)["status"].get("phase") == "Running"
                                     for n in ("tenant", "static")))
    code, lines = reclaim(host, "cpu-1", "--grace", "0", "--all-pods")
    assert code == 0
    assert any(f"pod {NAMESPACE}/tenant: evicted" in line for line in lines)
    assert not any("static" in line for line in lines)
    assert host.server.store.get("pods", NAMESPACE, "static")["status"]["phase"] == "Running"
    # a DaemonSet's pod would be recreated on the node at once: never evicted
    ds_pod = pod("ds-x", ownerReferences=[{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u"}])
    assert not nodes.evictable(ds_pod) and nodes.evictable(pod("plain"))
