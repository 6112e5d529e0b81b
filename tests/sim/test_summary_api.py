"""The kubelet Summary API through the emulator's node proxy (docs/accounting.md, docs/testbed.md):
`GET /api/v1/nodes/{node}/proxy/stats/summary` answers in the stats/v1alpha1 shape with the usage
the simulated containers accumulate, authorised as `get` on `nodes/proxy`."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ce_k8s.sim.kube.apiserver import ApiServer

SCALE = 0.01


def summary(srv, node: str) -> dict:
    api = config.new_client_from_config(config_file=srv.kubeconfig_path)
    resp = api.call_api(*api.param_serialize("GET", "/api/v1/nodes/{n}/proxy/stats/summary", path_params={"n": node},
                                             auth_settings=["BearerToken"]))
    resp.read()
    if resp.status != 200:
        raise ApiException(status=resp.status, reason=resp.reason, http_resp=resp)
    return json.loads(resp.data)


def run_pod(srv, kcore, pod_body, name, scenario, cpu="2", memory="1Gi", usage=None):
    body = pod_body(name, scenario=scenario, cpu=cpu, memory=memory)
    if usage:
        body["metadata"].setdefault("annotations", {})["sim.ce-k8s.io/usage"] = usage
    kcore.create_namespaced_pod("default", body)
    srv.wait_for(lambda: (srv.store.get("pods", "default", name) or {}).get("status", {}).get("phase") == "Running",
                 timeout=10)
    return srv.store.get("pods", "default", name)["spec"]["nodeName"]


def pod_stats(doc, name):
    return next(p for p in doc["pods"] if p["podRef"]["name"] == name)


def test_summary_has_the_kubelet_shape_and_accumulates_cpu(cluster, kcore, pod_body):
    node = run_pod(cluster, kcore, pod_body, "sum-1", "run=forever")
    first = summary(cluster, node)
    assert first["node"]["nodeName"] == node and "usageCoreNanoSeconds" in first["node"]["cpu"]
    ps = pod_stats(first, "sum-1")
    stored = cluster.store.get("pods", "default", "sum-1")
    assert ps["podRef"] == {"name": "sum-1", "namespace": "default", "uid": stored["metadata"]["uid"]}
    assert ps["startTime"] == stored["status"]["startTime"]
    (c,) = ps["containers"]
    assert c["name"] == "pilot" and c["startTime"].endswith("Z")
    # 85 % of the 2-core request by default, as usageNanoCores; memory: half the 1Gi request.
    assert c["cpu"]["usageNanoCores"] == 1_700_000_000
    assert c["memory"]["rssBytes"] == 512 * 2**20
    assert c["memory"]["workingSetBytes"] >= c["memory"]["rssBytes"]
    assert c["memory"]["usageBytes"] >= c["memory"]["workingSetBytes"]
    cluster.wait_for(lambda: pod_stats(summary(cluster, node), "sum-1")["containers"][0]["cpu"]
                     ["usageCoreNanoSeconds"] > c["cpu"]["usageCoreNanoSeconds"], timeout=5)
    assert ps["cpu"]["usageCoreNanoSeconds"] == c["cpu"]["usageCoreNanoSeconds"]   # the pod sums its containers


def test_usage_stops_at_the_end_and_matches_the_containers_life(cluster, kcore, pod_body):
    node = run_pod(cluster, kcore, pod_body, "sum-2", "run=20s exit=0", usage="cpu=1.5 rss=300Mi")
    cluster.wait_for(lambda: cluster.store.get("pods", "default", "sum-2")["status"]["phase"] == "Succeeded",
                     timeout=10)
    c1 = pod_stats(summary(cluster, node), "sum-2")["containers"][0]
    time.sleep(0.1)
    c2 = pod_stats(summary(cluster, node), "sum-2")["containers"][0]
    assert c1["cpu"]["usageCoreNanoSeconds"] == c2["cpu"]["usageCoreNanoSeconds"] > 0   # frozen once terminated
    assert c2["cpu"]["usageNanoCores"] == 0 and c2["memory"]["rssBytes"] == 300 * 2**20
    meter = cluster.kubelet.usage.meters(("default", "sum-2"))["pilot"]
    # 20 simulated seconds at 1/100 → ~0.2 s of real life at 1.5 cores.
    life = meter.ended - meter.started
    assert c2["cpu"]["usageCoreNanoSeconds"] == pytest.approx(life * 1.5e9, rel=1e-6)
    assert 0.15 < life < 2.0


def test_a_deleted_pod_leaves_the_summary(cluster, kcore, pod_body):
    node = run_pod(cluster, kcore, pod_body, "sum-3", "run=forever")
    kcore.delete_namespaced_pod("sum-3", "default", grace_period_seconds=0)
    cluster.wait_for(lambda: cluster.store.get("pods", "default", "sum-3") is None, timeout=10)
    cluster.wait_for(lambda: all(p["podRef"]["name"] != "sum-3" for p in summary(cluster, node)["pods"]), timeout=5)


def test_unknown_node_is_404_and_a_lost_node_503(cluster, kcore, pod_body):
    with pytest.raises(ApiException) as err:
        summary(cluster, "no-such-node")
    assert err.value.status == 404
    node = run_pod(cluster, kcore, pod_body, "sum-4", "run=forever")
    cluster.kubelet.lose_node(node)
    with pytest.raises(ApiException) as err:
        summary(cluster, node)
    assert err.value.status == 503


def test_rbac_without_nodes_proxy_is_forbidden():
    rules = [{"verbs": ["*"], "resources": ["pods", "nodes"]}]
    with ApiServer.running(nodes="cpu:1x4c16g", time_scale=SCALE, enforce_rbac=True, rules=rules) as srv:
        with pytest.raises(ApiException) as err:
            summary(srv, "cpu-1")
        assert err.value.status == 403
        assert "nodes/proxy" in str(err.value.body)
        assert srv.calls[("get", "nodes/proxy")] == 1
    granted = [*rules, {"verbs": ["get"], "resources": ["nodes/proxy"]}]
    with ApiServer.running(nodes="cpu:1x4c16g", time_scale=SCALE, enforce_rbac=True, rules=granted) as srv:
        assert summary(srv, "cpu-1")["node"]["nodeName"] == "cpu-1"


def test_the_denied_switch_answers_403_like_a_site_without_the_grant(cluster):
    cluster.kubelet.usage.denied = True
    with pytest.raises(ApiException) as err:
        summary(cluster, "cpu-1")
    assert err.value.status == 403
    cluster.kubelet.usage.denied = False
    assert summary(cluster, "cpu-1")["node"]["nodeName"] == "cpu-1"


def test_the_typed_client_proxy_call_reaches_it(cluster):
    """`CoreV1Api.connect_get_node_proxy_with_path` (what kubectl get --raw does) gets the same document."""
    kcore = client.CoreV1Api(config.new_client_from_config(config_file=cluster.kubeconfig_path))
    resp = kcore.connect_get_node_proxy_with_path("cpu-1", "stats/summary", _preload_content=False)
    doc = json.loads(resp.data)
    assert doc["node"]["nodeName"] == "cpu-1"
