"""The API clients read the proxy environment once, when they are built, not before every request."""

from __future__ import annotations

import pytest
from kubernetes.client import configuration as k8s_configuration

from ce_k8s.agent.main import api_client_for
from ce_k8s.kubeclient import new_api_client

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://api.example.test:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: "sekret"}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example.test:3128")
    return str(path)


@pytest.fixture
def proxy_reads(monkeypatch):
    """Counts the client's reads of the proxy environment."""
    reads = []
    real = k8s_configuration.getproxies

    def counting():
        reads.append(1)
        return real()

    monkeypatch.setattr(k8s_configuration, "getproxies", counting)
    return reads


@pytest.mark.parametrize("build", [lambda path: new_api_client(path), lambda path: api_client_for(path, 8)],
                         ids=["new_api_client", "agent"])
def test_requests_do_not_reread_the_proxy_environment(build, kubeconfig, proxy_reads):
    api = build(kubeconfig)
    conf = api.configuration
    assert conf.proxy == "http://proxy.example.test:3128"     # resolved from the environment at load
    before = len(proxy_reads)
    for _ in range(5):
        # What the client does before each request: the loader's refresh hook assigns the host.
        assert conf.auth_settings()["BearerToken"]["value"] == "Bearer sekret"
    assert len(proxy_reads) == before
    assert conf.host == "https://api.example.test:6443"
    assert conf.proxy == "http://proxy.example.test:3128"


def test_without_the_pin_each_request_rereads_it(kubeconfig, proxy_reads):
    """The cost this module avoids is real: the bare loader re-reads the environment per request."""
    from kubernetes import client, config

    conf = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=conf)
    before = len(proxy_reads)
    conf.auth_settings()
    conf.auth_settings()
    assert len(proxy_reads) == before + 2
