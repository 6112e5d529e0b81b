"""The typed fast path of snapshot loading (ce_k8s/info/listschema.py, issue 17) gives exactly the
snapshot of the generic path, or steps aside (None) so the generic path answers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ce_k8s.info.snapshot import decode_json, load_snapshot_file, snapshot_from_document, typed_snapshot

from .conftest import SNAPSHOTS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def generic(data: bytes):
    return snapshot_from_document(decode_json(data), "x")


def test_the_shipped_test_snapshots_read_the_same_both_ways():
    files = sorted(SNAPSHOTS.glob("*.json"))
    assert files
    taken = 0
    for path in files:
        data = path.read_bytes()
        try:
            want = generic(data)
        except Exception:       # a deliberately broken snapshot: the typed path must step aside
            assert typed_snapshot(data, "x") is None, path
            continue
        got = typed_snapshot(data, "x")
        if got is not None:
            taken += 1
            assert got == want, path
    assert taken >= len(files) // 2          # the fast path is the usual path, not the exception


def test_a_big_generated_cluster_reads_the_same_both_ways(tmp_path):
    import bench_info

    path = tmp_path / "cluster.json"
    bench_info.generate(path, 300, 6000, "ce-example-org", "pilots")
    data = path.read_bytes()
    got = typed_snapshot(data, "x")
    assert got is not None
    assert got == generic(data)
    assert load_snapshot_file(path) == snapshot_from_document(decode_json(data), str(path))


_QTY = st.sampled_from(["1", "500m", "2Gi", "1.5", "0", "3e3", "1Ki", 2, 0.5, 7, "bad", "", "-1", 10**20])
_RESLIST = st.none() | st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "pods"]), _QTY,
                                       max_size=3)
_RES = st.none() | st.fixed_dictionaries({}, optional={"requests": _RESLIST, "limits": _RESLIST})
_CONTAINER = st.fixed_dictionaries({"name": st.just("c")}, optional={
    "resources": _RES, "restartPolicy": st.sampled_from(["Always", "OnFailure"])})
_LABELS = st.none() | st.dictionaries(st.sampled_from(["a", "app.kubernetes.io/managed-by", "x"]),
                                      st.sampled_from(["ce-k8s", "v", ""]) | st.integers(0, 3), max_size=3)
_META = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["p", "n-1", ""]) | st.none(), "namespace": st.sampled_from(["pilots", "kube-system"]),
    "labels": _LABELS, "uid": st.just("u")})
_POD = st.fixed_dictionaries({"kind": st.sampled_from(["Pod", None])}, optional={
    "metadata": _META,
    "spec": st.fixed_dictionaries({}, optional={
        "nodeName": st.sampled_from(["n-1", "", None]), "containers": st.lists(_CONTAINER, max_size=3),
        "initContainers": st.lists(_CONTAINER, max_size=2), "overhead": _RESLIST, "resources": _RES,
        "volumes": st.just([{"name": "v"}])}),
    "status": st.fixed_dictionaries({}, optional={
        "phase": st.sampled_from(["Running", "Pending", "Succeeded", "Failed", None])})})
_NODE = st.fixed_dictionaries({"kind": st.just("Node"), "metadata": _META}, optional={
    "spec": st.fixed_dictionaries({}, optional={
        "unschedulable": st.booleans() | st.just("yes"),
        "taints": st.lists(st.fixed_dictionaries({"key": st.sampled_from(["k", ""]), "effect": st.just("NoSchedule")},
                                                 optional={"value": st.just("v")}), max_size=2)}),
    "status": st.fixed_dictionaries({}, optional={
        "allocatable": _RESLIST, "capacity": _RESLIST,
        "conditions": st.lists(st.fixed_dictionaries({"type": st.sampled_from(["Ready", "DiskPressure"]),
                                                      "status": st.sampled_from(["True", "False"])}), max_size=2)})})
_QUOTA = st.fixed_dictionaries({"kind": st.just("ResourceQuota"), "metadata": _META}, optional={
    "spec": st.fixed_dictionaries({}, optional={
        "hard": st.dictionaries(st.sampled_from(["requests.cpu", "pods", "limits.memory"]), _QTY, max_size=2),
        "scopes": st.lists(st.sampled_from(["NotTerminating", "BestEffort"]), max_size=1),
        "scopeSelector": st.just({"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                                                        "values": ["x"]}]})}),
    "status": st.fixed_dictionaries({}, optional={"used": _RESLIST})})


@settings(max_examples=300, deadline=None)
@given(st.lists(_POD | _NODE | _QUOTA | st.just({"kind": "Service", "metadata": {"name": "s"}}), max_size=8),
       st.sampled_from(["List", "PodList", "NodeList"]))
def test_any_list_reads_the_same_both_ways_or_the_fast_path_steps_aside(items, kind):
    data = json.dumps({"apiVersion": "v1", "kind": kind, "items": items}).encode()
    try:
        want = generic(data)
    except Exception:
        want = None
    got = typed_snapshot(data, "x")
    if got is not None:
        assert want is not None and got == want


def test_documents_that_are_not_lists_step_aside():
    for doc in (b"[]", b"{}", b'{"kind": "Pod", "metadata": {"name": "p"}}', b"not json", b'{"items": 3}'):
        assert typed_snapshot(doc, "x") is None


def test_pods_with_init_containers_nodes_and_quotas_keep_their_order_on_the_fast_path():
    pod = {"kind": "Pod", "metadata": {"name": "a", "namespace": "pilots"},
           "spec": {"nodeName": "n", "containers": [{"resources": {"requests": {"cpu": "1"}}}]},
           "status": {"phase": "Running"}}
    init = {"kind": "Pod", "metadata": {"name": "b", "namespace": "pilots"},
            "spec": {"nodeName": "n", "containers": [{"resources": {"requests": {"cpu": "1"}}}],
                     "initContainers": [{"resources": {"requests": {"cpu": "4"}}}]},
            "status": {"phase": "Pending"}}
    node = {"kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "8", "memory": "1Gi"}}}
    quota = {"kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "pilots"},
             "spec": {"hard": {"requests.cpu": "10"}}, "status": {"used": {"requests.cpu": "2"}}}
    data = json.dumps({"kind": "List", "items": [pod, node, init, quota, dict(pod, metadata={"name": "c"})]}).encode()
    got = typed_snapshot(data, "x")
    assert got is not None and got == generic(data)
    assert [p.name for p in got.pods] == ["a", "b", "c"] and got.pods[1].requests == {"cpu": 4000}
