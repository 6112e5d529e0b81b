"""Loading cluster snapshots: the `kubectl get nodes,pods,resourcequotas -A -o json` List shape.

Bad input is a typed SnapshotError naming the file (and line:column for JSON syntax errors, the
item index and name for a bad object) -- issue 6 and the charter's "clear typed error" rule.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ce_k8s.info.snapshot import (
    SnapshotError,
    SourceUnavailable,
    decode_json,
    load_snapshot_file,
    ping_agent,
    snapshot_from_api,
    snapshot_from_document,
)

from .conftest import SNAPSHOTS, snapshot_doc, write_doc


def test_mixed_snapshot_loads_every_kind():
    """Nodes, pods and quotas of a List are all read; node state and quota status come along."""
    snap = load_snapshot_file(SNAPSHOTS / "mixed.json")
    # 19 pods in the dump; the 2 finished ones hold nothing and are dropped at load
    assert (len(snap.nodes), len(snap.pods), len(snap.quotas)) == (8, 17, 2)
    assert not any(p.phase in ("Succeeded", "Failed") for p in snap.pods)
    by_name = {n.name: n for n in snap.nodes}
    assert by_name["cpu-4"].unschedulable and by_name["cpu-4"].ready
    assert by_name["cpu-5"].unschedulable and not by_name["cpu-5"].ready  # handed over to Slurm
    assert by_name["gpu-1"].allocatable["nvidia.com/gpu"] == 4
    assert by_name["cpu-1"].allocatable["cpu"] == 31850
    quota = next(q for q in snap.quotas if q.name == "pilots")
    assert quota.hard["requests.cpu"] == 96000 and quota.used["requests.cpu"] == 36000
    assert snap.taken_at is None  # a file does not say when it was taken


def test_typed_lists_and_unknown_kinds():
    """A NodeList (no per-item kind) loads; kinds capacity does not use are ignored."""
    doc = {"kind": "NodeList", "items": [{"metadata": {"name": "a"}, "status": {"allocatable": {"cpu": "2"}}}]}
    assert snapshot_from_document(doc, "x").nodes[0].allocatable == {"cpu": 2000}
    mixed = {"kind": "List", "items": [{"kind": "Service", "metadata": {"name": "s"}}]}
    assert snapshot_from_document(mixed, "x").nodes == []


def test_json_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"kind": "List",\n "items": [\n   {"kind": "Node",,}\n]}\n')
    with pytest.raises(SnapshotError) as info:
        load_snapshot_file(path)
    assert str(info.value).startswith(f"{path}:3:")
    assert "invalid JSON" in str(info.value)


def test_bad_quantity_names_item_and_field(tmp_path):
    doc = snapshot_doc("mixed")
    doc["items"][1]["status"]["allocatable"]["memory"] = "lots"
    with pytest.raises(SnapshotError) as info:
        load_snapshot_file(write_doc(tmp_path, doc))
    msg = str(info.value)
    assert "items[1] (Node 'cpu-2')" in msg and "status.allocatable.memory" in msg and "'lots'" in msg


def test_not_a_list_and_missing_file(tmp_path):
    with pytest.raises(SnapshotError, match="expected a List"):
        snapshot_from_document({"kind": "Status"}, "f.json")
    with pytest.raises(SnapshotError, match="expected a JSON object"):
        snapshot_from_document([], "f.json")
    with pytest.raises(SnapshotError) as info:
        load_snapshot_file(tmp_path / "missing.json")
    assert "missing.json" in str(info.value)


def test_node_without_ready_condition_counts_as_ready_and_capacity_fallback():
    """Hand-made nodes often omit conditions and allocatable: capacity stands in, Ready assumed."""
    doc = {"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "a"},
                                      "status": {"capacity": {"cpu": "4", "pods": "10"}}}]}
    n = snapshot_from_document(doc, "x").nodes[0]
    assert n.ready and n.allocatable == {"cpu": 4000, "pods": 10}


def test_api_unreachable_is_source_unavailable(tmp_path):
    """An unreachable API server (nothing listens) is SourceUnavailable, quickly, with the URL."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    with pytest.raises(SourceUnavailable) as info:
        snapshot_from_api(str(kubeconfig), timeout=5)
    assert "https://127.0.0.1:1" in str(info.value)


def test_bad_kubeconfig_is_source_unavailable(tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("this: is: not: a kubeconfig")
    with pytest.raises(SourceUnavailable, match="cannot load"):
        snapshot_from_api(str(bad), timeout=5)


def test_agent_down_is_source_unavailable(tmp_path):
    """No agent listening on the socket: SourceUnavailable naming the socket."""
    sock = tmp_path / "agent.sock"
    with pytest.raises(SourceUnavailable) as info:
        ping_agent(str(sock), timeout=1)
    assert str(sock) in str(info.value)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


@given(st.one_of(_json_values.map(lambda v: json.dumps(v).encode()),
                 st.binary(max_size=40),
                 st.sampled_from([b"[NaN]", b"[1e400]", b'"\\ud800"', b'{"a":1,"a":2}', b"[1,]",
                                  '{"x": 1}'.encode("utf-16"), b"\xef\xbb\xbf{}", b" [1] "])))
@example(b"[123456789012345678901234567890]")
def test_decode_json_answers_as_the_stdlib_does(data):
    """decode_json (msgspec first) returns or raises exactly what json.loads does."""
    try:
        want = ("ok", json.loads(data))
    except (ValueError, UnicodeDecodeError) as exc:
        want = ("error", type(exc), str(exc))
    try:
        got = ("ok", decode_json(data))
    except (ValueError, UnicodeDecodeError) as exc:
        got = ("error", type(exc), str(exc))
    assert repr(got) == repr(want)           # repr: NaN and -0.0 compare as text
