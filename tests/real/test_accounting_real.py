"""Accounting on the real control plane: the kubelet Summary read from each node's kubelet directly
(CE_K8S_USAGE_SOURCE = kubelet, the default) with the agent's own ServiceAccount token, authorised
by the real API server (the kubelet stub asks it a TokenReview and a SubjectAccessReview for get
nodes/stats, as a webhook-mode kubelet does), and what a Summary that forgot an exited container
leaves in the record (finding 6 of issue 25; docs/accounting.md).

The API server's node proxy (`nodes/proxy`) cannot even be exercised here: it refuses to proxy to
a node whose address is not global unicast ("address not allowed"), and the bed's nodes are on
127.0.0.1. The direct path is the one a CE uses by default.
"""

from __future__ import annotations

import logging
import shutil
import ssl
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import classad2
import pytest
from agent.conftest import make_spool
from agent.test_agent import update
from kubernetes import client
from kubernetes.client.rest import ApiException

from ce_k8s.agent.accounting import UsageCollector
from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.condor.wire import parse_old_ads
from ce_k8s.real.kube import kwokstages

from . import test_findings
from .conftest import running_agent, wait_for
from .test_findings import _ad, restricted_pod

# test_findings' fixtures: the admin client, and a fresh pilot namespace with the shipped Role.
core = test_findings.core
namespace = test_findings.namespace

LOG = "ce_k8s.agent.accounting"


def kubelet_ca(real_kube) -> str:
    return str(real_kube.kubelet_ca)


def running(core, namespace: str, name: str) -> PodInfo:
    def read():
        try:
            pod = core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:       # the agent has not created it yet
                return None
            raise
        return pod.status.phase == "Running" and pod
    pod = wait_for(read, what=f"{name} Running")
    return PodInfo.from_dict(core.api_client.sanitize_for_serialization(pod))


def kubelet_get(real_kube, node: str, path: str, token: str) -> tuple[int, bytes]:
    port = real_kube.state().node_ports[node]
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=kubelet_ca(real_kube)),
                                    timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def token_of(api_client) -> str:
    return api_client.configuration.auth_settings()["BearerToken"]["value"].split(" ", 1)[1]


def test_the_agent_s_own_token_reads_the_kubelet_directly_and_cpu_is_known(real_kube, agent_client, core,
                                                                             namespace):
    """A pod running on a kwok node: the agent's collector (its ServiceAccount token, not admin)
    reads the node's kubelet at its InternalIP and daemon port, verified against the bed's kubelet
    certificate; the kubelet's SubjectAccessReview (get nodes/stats) allows it; CPU is known. The
    same token may not reach the kubelet's other endpoints (nodes/proxy is not granted)."""
    core.create_namespaced_pod(namespace, restricted_pod("acct1", {kwokstages.RUN_FOR: "60s"}))
    pod = running(core, namespace, "acct1")
    collector = UsageCollector(agent_client, client.CoreV1Api(agent_client), lambda: [], source="kubelet",
                               kubelet_ca=kubelet_ca(real_kube))
    collector.pod_changed(pod)
    assert collector.endpoint(pod.node).address == "127.0.0.1"
    assert collector.endpoint(pod.node).port == real_kube.state().node_ports[pod.node]
    wait_for(lambda: collector.read_summary(pod.node) and (collector.usage[pod.name].cpu_ns or 0) > 0,
             what="a Summary with the pod's CPU")
    assert collector.forbidden_since is None

    token = token_of(agent_client)
    for path in ("/configz", "/pods", "/run/x/y/z"):
        status, body = kubelet_get(real_kube, pod.node, path, token)
        assert status == 403 and b"subresource(s)=[" in body and b"proxy]" in body, (path, status, body)


def test_a_token_without_the_grant_gets_403_from_the_kubelet_and_cpu_is_unknown(real_kube, agent_client, core,
                                                                                namespace, caplog):
    """A ServiceAccount with no nodes/stats: the kubelet's SubjectAccessReview says no, the kubelet
    answers 403 in its own words; the collector says so once and the attempt's CPU is unknown."""
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "no-stats"}})
    token = core.create_namespaced_service_account_token(
        "no-stats", namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    core.create_namespaced_pod(namespace, restricted_pod("acct2", {kwokstages.RUN_FOR: "60s"}))
    pod = running(core, namespace, "acct2")

    status, body = kubelet_get(real_kube, pod.node, "/stats/summary", token)
    assert status == 403, body
    assert body.decode() == (f"Forbidden (user=system:serviceaccount:{namespace}:no-stats, verb=get, "
                             "resource=nodes, subresource(s)=[stats])\n")
    assert kubelet_get(real_kube, pod.node, "/stats/summary", "not-a-token")[0] == 401

    conf = client.Configuration()
    conf.host = agent_client.configuration.host
    conf.ssl_ca_cert = agent_client.configuration.ssl_ca_cert
    conf.api_key = {"authorization": f"Bearer {token}"}
    caplog.set_level(logging.INFO, logger=LOG)
    collector = UsageCollector(client.ApiClient(conf), client.CoreV1Api(agent_client), lambda: [],
                               source="kubelet", kubelet_ca=kubelet_ca(real_kube))
    collector.pod_changed(pod)
    assert not collector.read_summary(pod.node) and not collector.read_summary(pod.node)
    said = [r.getMessage() for r in caplog.records if "usage-forbidden" in r.getMessage()]
    assert len(said) == 1 and "status=403" in said[0] and "nodes/stats" in said[0], said
    record = collector.settle_pod(pod_finished(pod))
    assert record is not None and record.cpu_seconds is None


def pod_finished(pod: PodInfo) -> PodInfo:
    """`pod` as the watch shows it once deleted while it ran (no finishedAt: the agent's clock ends it)."""
    return PodInfo.from_dict({
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                     "deletionTimestamp": "2030-01-01T00:00:00Z"},
        "spec": {"nodeName": pod.node, "containers": [{"name": "c"}]},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "c", "state": {"terminated": {
            "exitCode": 137, "startedAt": _rfc3339(pod.started_at), "finishedAt": _rfc3339(pod.started_at + 1)}}}]}})


def _rfc3339(t: int | None) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t or 0, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def kubelet_agent(real_kube, namespace):
    """The agent on its own kubeconfig, reading usage from the kubelets (the default source) with
    the bed's kubelet certificate as CE_K8S_KUBELET_CA, and writing APEL history files."""
    root = Path(tempfile.mkdtemp(prefix="ce-k8s-real-acct-", dir="/tmp"))
    root.chmod(0o755)
    make_spool(root)
    hist = root / "history"
    hist.mkdir()
    try:
        with running_agent(real_kube, namespace, root=root, per_job_history_dir=str(hist), usage_interval=0.3,
                           usage_source="kubelet", kubelet_ca=kubelet_ca(real_kube)) as (agent, settings, _root):
            yield agent, settings, hist
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_pilot_s_cpu_after_its_exit_is_the_last_sample_a_lower_bound(real_kube, kubelet_agent, agent_client, core,
                                                                       namespace):
    """A pilot through the agent: sampled while it runs (direct path, its own token); once its
    container exited the kubelet's Summary has nothing of it, so the record keeps the last sample,
    says it is a lower bound, and never claims more than wall x cores. No nodes/proxy call at all."""
    from ce_k8s.real.kube.kubeserver import RealKubeServer

    server = RealKubeServer(real_kube)
    server.reset_calls()
    agent, settings, hist = kubelet_agent
    ad = _ad(settings, namespace, K8sAnnotations=classad2.ExprTree(f"[ '{kwokstages.RUN_FOR}' = \"4s\" ]"))
    update(agent, ad)
    name = ad["K8sPodName"]
    pod = running(core, namespace, name)
    wait_for(lambda: (u := agent.usage.usage.get(name)) is not None and (u.cpu_ns or 0) > 0,
             what="a sample of the running pilot")
    wait_for(lambda: core.read_namespaced_pod(name, namespace).status.phase == "Succeeded", what="Succeeded")
    status, body = kubelet_get(real_kube, pod.node, "/stats/summary", token_of(agent_client))
    assert status == 200 and name not in body.decode()        # the exited container is gone
    out = wait_for(lambda: (o := update(agent, ad)) and o.get("JobStatus") == 4 and o, timeout=60,
                   what="the completion")
    assert out["K8sCpuUsageKnown"] is True and out["K8sCpuLowerBound"] is True
    assert 0 < out["RemoteUserCpu"] <= out["LastRemoteWallClockTime"] * out["CpusProvisioned"]
    files = wait_for(lambda: [p for p in hist.iterdir() if p.is_file()], what="the history file")
    (h,) = parse_old_ads(files[0].read_text())
    assert h["K8sCpuUsageKnown"] is True and h["K8sCpuLowerBound"] is True
    assert 0 < h["RemoteUserCpu"] <= h["RemoteWallClockTime"] * h["RequestCpus"]
    calls = server.calls
    server.stop()
    assert not [k for k in calls if k[1] == "nodes/proxy"], calls
