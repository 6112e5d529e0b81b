"""Where accounting reads the kubelet Summary (CE_K8S_USAGE_SOURCE, docs/accounting.md): each node's
kubelet directly with the agent's own token (`kubelet`, the default: RBAC get nodes/stats), the API
server's node proxy (`proxy`: get nodes/proxy), or nowhere (`none`); and what a Summary that forgot
an exited container leaves in the record (a lower bound, said so; never a known 0).

The `kubelet` source is exercised against a small HTTPS kubelet on loopback with a self-signed
certificate (the real kubelet with webhook authorisation is played by ce_k8s.real.kube.kubeletstub on
the real control plane: tests/real/test_accounting_real.py). The `proxy` and `none` sources run the
real agent on the emulator, whose kubelets answer at the node proxy only (docs/testbed.md).
"""

from __future__ import annotations

import json
import logging
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes import client

from ce_k8s.agent.accounting import (
    KUBELET_SUMMARY_PATH,
    KubeletEndpoint,
    UsageCollector,
    history_ad,
    kubelet_endpoint,
    routed_attrs,
)
from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.settings import Settings, SettingsError
from ce_k8s.sim.kube.apiserver import ApiServer

from .conftest import new_agent, replace_settings, routed_ad, wait
from .test_accounting import history_files, one_ad, run_to_completion, update

TOKEN = "agent-token-123"


def _cert(tmp: Path, name: str) -> tuple[str, str]:
    crt, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(crt)],
                   capture_output=True, check=True)
    return str(crt), str(key)


class Kubelet:
    """One kubelet endpoint on loopback: answers `/stats/summary` with `doc`, or `status` if set."""

    def __init__(self, crt: str, key: str) -> None:
        self.doc: dict = {"pods": []}
        self.status = 200
        self.seen: list[tuple[str, str | None]] = []   # (path, Authorization) of each request
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                outer.seen.append((self.path, self.headers.get("Authorization")))
                body = json.dumps(outer.doc).encode() if outer.status == 200 else b"Forbidden (user=x)"
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Resp:
    def __init__(self, doc: dict) -> None:
        self.data = json.dumps(doc).encode()


class FakeCore:
    """`list_node` as the agent calls it (raw JSON): one node whose kubelet is `port` on loopback."""

    def __init__(self, port: int, addresses: list[dict] | None = None) -> None:
        self.lists = 0
        self.node = {"metadata": {"name": "n1"}, "status": {
            "addresses": addresses if addresses is not None else
            [{"type": "Hostname", "address": "localhost"}, {"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}}

    def list_node(self, **_kw) -> _Resp:
        self.lists += 1
        return _Resp({"items": [self.node]})


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kubelet-certs")
    return _cert(tmp, "kubelet"), _cert(tmp, "cluster-ca")


@pytest.fixture
def kubelet(certs):
    k = Kubelet(*certs[0])
    yield k
    k.close()


def api_client(ca: str) -> client.ApiClient:
    conf = client.Configuration()
    conf.host = "https://127.0.0.1:1"      # never called by the kubelet source
    conf.api_key = {"authorization": f"Bearer {TOKEN}"}
    conf.ssl_ca_cert = ca
    return client.ApiClient(conf)


def running_pod(name="ce-1-0-a0-x", uid="u1", node="n1") -> PodInfo:
    return PodInfo.from_dict({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "pilot", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "pilot", "state": {"running": {
            "startedAt": "2025-10-09T08:55:00Z"}}}]}})


def finished_pod(name="ce-1-0-a0-x", uid="u1", node="n1") -> PodInfo:
    return PodInfo.from_dict({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "pilot", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Succeeded", "containerStatuses": [{"name": "pilot", "state": {"terminated": {
            "exitCode": 0, "startedAt": "2025-10-09T08:55:00Z", "finishedAt": "2025-10-09T08:56:40Z"}}}]}})


def summary_doc(name: str, uid: str, cpu_ns: int) -> dict:
    return {"pods": [{"podRef": {"name": name, "namespace": "ns", "uid": uid}, "containers": [
        {"name": "pilot", "cpu": {"usageCoreNanoSeconds": cpu_ns},
         "memory": {"rssBytes": 2**20, "workingSetBytes": 2**20, "usageBytes": 2**20}}]}]}


# -- where a node's kubelet is ---------------------------------------------------------------------


def test_the_kubelet_endpoint_is_the_internal_ip_then_the_hostname_and_the_daemon_port():
    node = {"status": {"addresses": [{"type": "Hostname", "address": "cpu-1"},
                                     {"type": "ExternalIP", "address": "1.2.3.4"},
                                     {"type": "InternalIP", "address": "10.0.0.7"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 10255}}}}
    assert kubelet_endpoint(node) == KubeletEndpoint("10.0.0.7", 10255)
    node["status"]["addresses"] = [{"type": "Hostname", "address": "cpu-1"}]
    del node["status"]["daemonEndpoints"]
    assert kubelet_endpoint(node) == KubeletEndpoint("cpu-1", 10250)          # the kubelet's default port
    assert kubelet_endpoint({"status": {"addresses": [{"type": "ExternalIP", "address": "1.2.3.4"}]}}) is None
    assert KubeletEndpoint("fd00::7", 10250).url(KUBELET_SUMMARY_PATH) == "https://[fd00::7]:10250/stats/summary"


# -- the kubelet source ----------------------------------------------------------------------------


def test_kubelet_source_reads_the_node_s_kubelet_with_the_agent_s_own_token(kubelet, certs):
    (crt, _), _ca = certs
    core = FakeCore(kubelet.port)
    collector = UsageCollector(api_client(crt), core, lambda: [], source="kubelet")
    pod = running_pod()
    collector.pod_changed(pod)
    kubelet.doc = summary_doc(pod.name, "u1", 7_000_000_000)
    assert collector.read_summary("n1")
    assert kubelet.seen == [("/stats/summary", f"Bearer {TOKEN}")]
    assert collector.usage[pod.name].cpu_ns == 7_000_000_000
    assert collector.read_summary("n1") and core.lists == 1    # the node list is read once, not per read


def test_kubelet_certificate_is_verified_against_the_cluster_ca_unless_told_otherwise(kubelet, certs, caplog):
    """Default: the cluster CA of the agent's credentials; that is not what signed this kubelet's
    certificate, so the read fails (said once, with the two knobs), the token never sent.
    CE_K8S_KUBELET_CA names the right one; CE_K8S_KUBELET_INSECURE skips the check, warned once."""
    (crt, _), (cluster_ca, _) = certs
    caplog.set_level(logging.INFO, logger="ce_k8s.agent.accounting")
    strict = UsageCollector(api_client(cluster_ca), FakeCore(kubelet.port), lambda: [], source="kubelet")
    assert not strict.read_summary("n1") and not strict.read_summary("n1")
    assert kubelet.seen == []
    tls = [r for r in caplog.records if "CE_K8S_KUBELET_CA" in r.getMessage()]
    assert len(tls) == 1 and tls[0].levelno == logging.WARNING
    assert strict.forbidden_since is None        # not a refusal: tried again at the next read

    named = UsageCollector(api_client(cluster_ca), FakeCore(kubelet.port), lambda: [], source="kubelet",
                           kubelet_ca=crt)
    assert named.read_summary("n1")
    caplog.clear()
    loose = UsageCollector(api_client(cluster_ca), FakeCore(kubelet.port), lambda: [], source="kubelet",
                           kubelet_insecure=True)
    assert loose.read_summary("n1") and loose.read_summary("n1")
    said = [r for r in caplog.records if "kubelet-tls-unverified" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


@pytest.mark.parametrize("status", [401, 403])
def test_a_kubelet_that_refuses_is_said_once_and_cpu_is_unknown(kubelet, certs, caplog, status):
    """403: the kubelet's SubjectAccessReview says no (get nodes/stats not granted); 401: it does not
    take the token. Either way: said once, CPU unknown (not 0), tried again after an hour."""
    (crt, _), _ca = certs
    caplog.set_level(logging.INFO, logger="ce_k8s.agent.accounting")
    kubelet.status = status
    errors: list[tuple[str, str]] = []
    collector = UsageCollector(api_client(crt), FakeCore(kubelet.port), lambda: [], source="kubelet",
                               on_error=lambda verb, res, exc: errors.append((verb, res)))
    pod = running_pod()
    collector.pod_changed(pod)
    assert not collector.read_summary("n1") and not collector.read_summary("n1")
    assert len(kubelet.seen) == 1                 # the hour's wait: no second request
    said = [r for r in caplog.records if "usage-forbidden" in r.getMessage()]
    assert len(said) == 1 and "nodes/stats" in said[0].getMessage() and said[0].levelno == logging.WARNING
    assert errors == [("get", "nodes/stats")]
    collector.pod_changed(finished_pod())
    record = collector.settle_pod(finished_pod())
    assert record is not None and record.cpu_seconds is None
    assert routed_attrs(record)["K8sCpuUsageKnown"] is False and "RemoteUserCpu" not in routed_attrs(record)


def test_a_node_without_an_address_is_a_failed_read_not_a_crash(certs):
    (crt, _), _ca = certs
    collector = UsageCollector(api_client(crt), FakeCore(1, addresses=[]), lambda: [], source="kubelet")
    assert not collector.read_summary("n1") and collector.forbidden_since is None


# -- what a Summary that forgot the container leaves ----------------------------------------------


def test_the_last_sample_is_kept_as_a_lower_bound_when_the_final_read_finds_nothing(kubelet, certs, caplog):
    """A real kubelet forgets an exited container (finding 6): the final read has nothing, the
    record keeps the last sample and says it is a lower bound."""
    (crt, _), _ca = certs
    caplog.set_level(logging.INFO, logger="ce_k8s.agent.accounting")
    collector = UsageCollector(api_client(crt), FakeCore(kubelet.port), lambda: [], source="kubelet")
    pod = running_pod()
    collector.pod_changed(pod)
    kubelet.doc = summary_doc(pod.name, "u1", 42_000_000_000)
    assert collector.read_summary("n1")
    kubelet.doc = {"pods": []}                  # exited: gone from the Summary
    record = collector.settle_pod(finished_pod())
    assert len(kubelet.seen) == 2               # the final read was made, and found nothing
    assert record is not None and record.cpu_seconds == 42.0 and record.cpu_lower_bound
    assert record.cpu_seconds <= record.wall * record.cores
    ad = history_ad(record, "ce")
    assert ad["K8sCpuLowerBound"] is True and ad["K8sCpuUsageKnown"] is True and ad["RemoteUserCpu"] == 42.0
    assert routed_attrs(record)["K8sCpuLowerBound"] is True
    assert any("cpu-lower-bound" in r.getMessage() for r in caplog.records)


def test_a_final_read_that_still_shows_the_pod_is_the_final_figure(kubelet, certs):
    (crt, _), _ca = certs
    collector = UsageCollector(api_client(crt), FakeCore(kubelet.port), lambda: [], source="kubelet")
    pod = running_pod()
    collector.pod_changed(pod)
    kubelet.doc = summary_doc(pod.name, "u1", 42_000_000_000)
    assert collector.read_summary("n1")
    kubelet.doc = summary_doc(pod.name, "u1", 50_000_000_000)
    record = collector.settle_pod(finished_pod())
    assert record is not None and record.cpu_seconds == 50.0 and not record.cpu_lower_bound
    assert history_ad(record, "ce")["K8sCpuLowerBound"] is False


def test_no_sample_at_all_is_unknown_never_a_known_zero(kubelet, certs):
    (crt, _), _ca = certs
    collector = UsageCollector(api_client(crt), FakeCore(kubelet.port), lambda: [], source="kubelet")
    record = collector.settle_pod(finished_pod())       # ended before any periodic read
    assert record is not None and record.cpu_seconds is None
    ad = history_ad(record, "ce")
    assert ad["K8sCpuUsageKnown"] is False and ad["K8sCpuLowerBound"] is False


# -- the knobs and the emulated agent --------------------------------------------------------------


def test_the_usage_source_knobs(tmp_path):
    from ce_k8s.condor.config import CondorConfig

    def read(text: str) -> Settings:
        (tmp_path / "c.conf").write_text(text)
        return Settings.from_config(CondorConfig.load(tmp_path / "c.conf"))

    d = read("")
    assert (d.usage_source, d.kubelet_ca, d.kubelet_insecure) == ("kubelet", "", False)
    s = read("CE_K8S_USAGE_SOURCE = Proxy\nCE_K8S_KUBELET_CA = /etc/pki/kubelet-ca.crt\n"
             "CE_K8S_KUBELET_INSECURE = true\n")
    assert (s.usage_source, s.kubelet_ca, s.kubelet_insecure) == ("proxy", "/etc/pki/kubelet-ca.crt", True)
    with pytest.raises(SettingsError, match="CE_K8S_USAGE_SOURCE"):
        read("CE_K8S_USAGE_SOURCE = apiserver\n")
    with pytest.raises(SettingsError, match="CE_K8S_KUBELET_CA"):
        read("CE_K8S_KUBELET_CA = kubelet-ca.crt\n")


@pytest.fixture
def cluster():
    with ApiServer.running(nodes="cpu:2x16c64g", time_scale=0.01, seed=5, bookmark_interval=0.2) as srv:
        yield srv


def test_source_none_reads_nothing_and_accounts_cpu_as_unknown(cluster, settings, tmp_root):
    hist = tmp_root / "history"
    hist.mkdir()
    settings = replace_settings(settings, per_job_history_dir=str(hist), usage_interval=0.05, usage_source="none")
    agent = new_agent(cluster, settings)
    try:
        ad = routed_ad(Path(settings.spool))
        update(agent, ad)
        out = run_to_completion(agent, ad)
        assert "RemoteUserCpu" not in out and out["K8sCpuUsageKnown"] is False
        wait(lambda: history_files(hist))
        h = one_ad(history_files(hist)[0])
        assert h["K8sCpuUsageKnown"] is False and h["RemoteUserCpu"] == 0.0
        assert cluster.calls[("get", "nodes/proxy")] == 0 and agent.usage.summaries == 0
    finally:
        agent.stop()


def test_source_proxy_reads_through_the_node_proxy(cluster, settings, tmp_root):
    settings = replace_settings(settings, usage_interval=0.05, usage_source="proxy")
    agent = new_agent(cluster, settings)
    try:
        ad = routed_ad(Path(settings.spool))
        update(agent, ad)
        out = run_to_completion(agent, ad)
        assert out["K8sCpuUsageKnown"] is True and out["RemoteUserCpu"] > 0
        assert cluster.calls[("get", "nodes/proxy")] >= 1
    finally:
        agent.stop()
