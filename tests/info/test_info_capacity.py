"""Capacity arithmetic: placement predicates, packing, quota and the MaxPilots rule.

References: the kube-scheduler filter plugins NodeUnschedulable, TaintToleration, NodeAffinity and
NodeResourcesFit; ResourceQuota admission; htcondor-ce.md §3.2/§3.4 (MaxPilots is the factory's
entry glidein limit); issue 6 ("allocatable minus what non-finished pods request, cordoned and
NoSchedule/NoExecute-tainted nodes excluded, quota applied, per-node bin packing").
"""

from __future__ import annotations

from ce_k8s.info.capacity import CapacityModel, PodShape, fits_count, node_admits, quota_room, tolerates
from ce_k8s.info.quantity import pod_resources
from ce_k8s.info.snapshot import ClusterSnapshot, Node, Pod, Quota, Taint, load_snapshot_file

from .conftest import SNAPSHOTS

GPU = "nvidia.com/gpu"


def node(name="n1", cpu=16000, mem=64 * 2**30, pods=110, labels=None, **kw) -> Node:
    return Node(name=name, labels=labels or {}, allocatable={"cpu": cpu, "memory": mem, "pods": pods}, **kw)


def shape(cpu=1000, mem=2**30, ns="pilots", **kw) -> PodShape:
    return PodShape(namespace=ns, requests={"cpu": cpu, "memory": mem, "pods": 1}, **kw)


def test_taints_need_matching_tolerations():
    """NoSchedule/NoExecute taints exclude a node unless tolerated; PreferNoSchedule never does."""
    n = node(taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),))
    assert node_admits(n, shape()) == "untolerated taint nvidia.com/gpu:NoSchedule"
    tol = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
    assert node_admits(n, shape(tolerations=tol)) is None
    wrong_value = ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"},)
    assert node_admits(n, shape(tolerations=wrong_value)) is not None
    assert node_admits(node(taints=(Taint("x", "", "PreferNoSchedule"),)), shape()) is None
    assert node_admits(node(taints=(Taint("x", "", "NoExecute"),)), shape()) is not None
    assert tolerates([{"operator": "Exists"}], "anything", "v", "NoExecute")  # the wildcard toleration


def test_cordoned_and_not_ready_nodes_are_excluded():
    """spec.unschedulable excludes a node (NodeUnschedulable) and so does Ready != True."""
    assert node_admits(node(unschedulable=True), shape()) == "cordoned"
    assert node_admits(node(ready=False), shape()) == "not Ready"
    tol = ({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},)
    assert node_admits(node(unschedulable=True), shape(tolerations=tol)) is None


def test_node_selector_and_required_affinity():
    """nodeSelector is an AND of equalities; required affinity terms are ORed, expressions ANDed."""
    n = node(labels={"pool": "cpu", "gen": "5"})
    assert node_admits(n, shape(node_selector={"pool": "cpu"})) is None
    assert node_admits(n, shape(node_selector={"pool": "gpu"})) == "nodeSelector pool=gpu"
    terms = ({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["6"]}]},
             {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu", "mem"]},
                                   {"key": "spot", "operator": "DoesNotExist"}]})
    assert node_admits(n, shape(required_terms=terms)) is None
    assert node_admits(n, shape(required_terms=terms[:1])) == "required node affinity"
    by_name = ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},)
    assert node_admits(n, shape(required_terms=by_name)) is None
    assert node_admits(n, shape(required_terms=({},))) is not None  # an empty term matches nothing


def test_fits_count_is_per_resource_minimum():
    """How many identical pods fit: the scarcest resource decides, pod count included."""
    free = {"cpu": 10000, "memory": 100 * 2**30, "pods": 3}
    assert fits_count(free, {"cpu": 2000, "memory": 2**30, "pods": 1}) == 3
    assert fits_count(free, {"cpu": 4000, "memory": 2**30, "pods": 1}) == 2
    assert fits_count(free, {"cpu": 1000, GPU: 1, "pods": 1}) == 0  # the node has no GPUs


def test_effective_pod_request_includes_init_peak_sidecars_and_overhead():
    """max(app + sidecars, init peak) + overhead, like the scheduler's resource helper."""
    spec = {
        "containers": [{"resources": {"requests": {"cpu": "1"}}}, {"resources": {"limits": {"cpu": "500m"}}}],
        "initContainers": [
            {"resources": {"requests": {"cpu": "4"}}},
            {"restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    requests, limits = pod_resources(spec)
    assert requests["cpu"] == 4000 + 100  # the 4-core init container is the peak
    assert limits["cpu"] == 500
    spec["initContainers"][0]["resources"]["requests"]["cpu"] = "1"
    assert pod_resources(spec)[0]["cpu"] == 1000 + 500 + 250 + 100  # limit-only container defaulted


def _snap(nodes, pods=(), quotas=()):
    return ClusterSnapshot(nodes=list(nodes), pods=list(pods), quotas=list(quotas), source="test")


def _pilot(name, node_name, route="r", phase="Running", cpu=4000):
    labels = {"app.kubernetes.io/managed-by": "ce-k8s", "ce-k8s.htcondor.org/route": route,
              "ce-k8s.htcondor.org/ce": "ce1"}
    return Pod("pilots", name, node_name, phase, labels, {"cpu": cpu, "memory": 2**30})


def test_packing_is_per_node_not_from_totals():
    """Two nodes with 3 free cores each hold zero 4-core pilots, though 6 cores are free in total."""
    snap = _snap([node("a", cpu=3000), node("b", cpu=3000)])
    cap = CapacityModel(snap, [GPU]).route_capacity(shape(cpu=4000, labels={"ce-k8s.htcondor.org/route": "r"}))
    assert (cap.fit_now, cap.max_pilots, cap.eligible_nodes) == (0, 0, 2)


def test_max_pilots_counts_placed_pilots_plus_what_fits():
    """MaxPilots is the factory's total limit (htcondor-ce.md §3.4): a full cluster of our pilots keeps its number."""
    pods = [_pilot(f"p{i}", "a") for i in range(4)] + [_pilot("q", None, phase="Pending"),
                                                        _pilot("done", "a", phase="Succeeded")]
    snap = _snap([node("a", cpu=16000)], pods)
    s = shape(cpu=4000, labels={"ce-k8s.htcondor.org/route": "r", "ce-k8s.htcondor.org/ce": "ce1"})
    cap = CapacityModel(snap, [GPU], ce_label="ce1").route_capacity(s)
    assert (cap.placed, cap.pending, cap.fit_now, cap.max_pilots) == (4, 1, 0, 4)
    other_route = CapacityModel(snap, [GPU], ce_label="ce1").route_capacity(
        shape(cpu=4000, labels={"ce-k8s.htcondor.org/route": "other"}))
    assert other_route.max_pilots == 0


def test_headroom_and_cap():
    """Autoscaler headroom adds pilots beyond what fits; MaxJobs-style caps bound the total."""
    snap = _snap([node("a", cpu=8000)])
    model = CapacityModel(snap, [GPU])
    assert model.route_capacity(shape(cpu=4000), headroom=5).max_pilots == 7
    assert model.route_capacity(shape(cpu=4000), headroom=5, cap=3).max_pilots == 3


def test_quota_limits_new_pilots():
    """ResourceQuota hard - used bounds new pilots; status.used is preferred, pods are the fallback."""
    q = Quota("pilots", "q", hard={"requests.cpu": 10000, "pods": 100}, used={"requests.cpu": 4000, "pods": 1})
    assert quota_room([q], shape(cpu=2000), {}) == (3, "quota q requests.cpu")
    no_status = Quota("pilots", "q", hard={"pods": 5}, used=None)
    assert quota_room([no_status], shape(), {"pods": 4})[0] == 1
    elsewhere = Quota("other", "q", hard={"pods": 0}, used=None)
    assert quota_room([elsewhere], shape(), {})[0] is None


def test_quota_tracking_memory_rejects_pilot_without_memory_request():
    """Quota admission requires cpu/memory requests when a quota tracks them; GPUs are just not charged."""
    s = PodShape(namespace="pilots", requests={"cpu": 1000, "pods": 1})
    assert quota_room([Quota("pilots", "m", {"requests.memory": 10**12}, {})], s, {})[0] == 0
    assert quota_room([Quota("pilots", "g", {"requests.nvidia.com/gpu": 4}, {})], s, {})[0] is None


def test_quota_scopes():
    """Terminating (activeDeadlineSeconds set), PriorityClass scope selectors decide if a quota applies."""
    terminating = Quota("pilots", "t", {"pods": 0}, {}, scopes=("Terminating",))
    not_terminating = Quota("pilots", "n", {"pods": 0}, {}, scopes=("NotTerminating",))
    pilot = shape(active_deadline=3600)
    assert quota_room([terminating], pilot, {})[0] == 0
    assert quota_room([not_terminating], pilot, {})[0] is None
    by_class = Quota("pilots", "pc", {"pods": 0}, {}, scope_selector=(
        {"scopeName": "PriorityClass", "operator": "In", "values": ["pilot-gpu"]},))
    assert quota_room([by_class], shape(priority_class="pilot-gpu"), {})[0] == 0
    assert quota_room([by_class], shape(priority_class="pilot"), {})[0] is None


def test_mixed_cluster_totals():
    """CE totals are over Ready, uncordoned nodes; finished pods free their requests (mixed.json)."""
    snap = load_snapshot_file(SNAPSHOTS / "mixed.json")
    t = CapacityModel(snap, [GPU], ce_label="ce01.example.edu").totals()
    # cpu-1..3 (31.85), gpu-1..2 (63.8), control-1 (3.8); cpu-4 cordoned, cpu-5 handed over to Slurm
    assert (t.nodes_total, t.nodes_schedulable) == (8, 6)
    assert t.cpu_milli_total == 3 * 31850 + 2 * 63800 + 3800
    used = 6 * 100 + 3 * 8000 + 4000 + 16000 + 20000 + 6000  # daemonset, pilots, trainer, etl, init peak
    assert t.cpu_milli_free == t.cpu_milli_total - used
    assert (t.gpus_total, t.gpus_free) == (8, 4)
    assert (t.pilots_running, t.pilots_pending) == (4, 1)
