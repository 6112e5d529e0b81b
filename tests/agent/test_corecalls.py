"""CoreCalls sends exactly what the typed CoreV1Api methods send, and fails the way they fail.

The agent's four per-pilot calls bypass the typed methods' pydantic round trip
(ce_k8s/agent/corecalls.py). Each test below records the request both paths hand to
`ApiClient.call_api` and compares method, URL, headers and body; then the real calls go to the
API emulator over HTTP.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ce_k8s.agent.corecalls import CoreCalls

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "p1", "labels": {"app": "x"}, "annotations": {"a": "b"}},
       "spec": {"restartPolicy": "Never", "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                "containers": [{"name": "pilot", "image": "busybox", "args": ["-c", "echo $(X)"],
                                "env": [{"name": "X", "value": "1"},
                                        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}],
                                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]}}
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "p1-sandbox"}, "type": "Opaque",
          "data": {"proxy": "UEVN"}}


class _Raw:
    def read(self, cache_content: bool = False) -> bytes:
        return b""


class _Answer:
    status = 200
    response = _Raw()

    def read(self) -> bytes:
        return b""


@pytest.fixture
def recorded():
    """An ApiClient (bearer token, a host) whose call_api records instead of sending."""
    conf = client.Configuration(host="https://k8s.example:6443")
    conf.api_key = {"authorization": "Bearer tok"}
    api = client.ApiClient(conf)
    seen: list[tuple] = []

    def call_api(method, url, header_params=None, body=None, post_params=None, _request_timeout=None):
        seen.append((method, url, dict(header_params or {}), json.dumps(body, sort_keys=True), _request_timeout))
        return _Answer()

    api.call_api = call_api
    return api, seen


@pytest.mark.parametrize("call", [
    ("create_namespaced_pod", ("ns1", POD), {}),
    ("create_namespaced_pod", ("ns1", POD), {"dry_run": "All"}),
    ("create_namespaced_secret", ("ns1", SECRET), {}),
    ("delete_namespaced_pod", ("p1", "ns1"), {"propagation_policy": "Background"}),
    ("read_namespaced_pod_log", ("p1", "ns1"), {"container": "pilot", "limit_bytes": 4096}),
    ("read_namespaced_pod_log", ("p1", "ns1"), {"container": "pilot", "limit_bytes": 10, "stream": "Stderr"}),
], ids=lambda c: f"{c[0]}{sorted(c[2])}")
def test_request_is_the_typed_methods_request(recorded, call):
    api, seen = recorded
    name, args, kwargs = call
    typed = getattr(client.CoreV1Api(api), name)(*args, **kwargs, _preload_content=False, _request_timeout=7)
    ours = getattr(CoreCalls(api), name)(*args, **kwargs, _preload_content=False, _request_timeout=7)
    assert typed is ours is _Answer.response
    assert len(seen) == 2 and seen[0] == seen[1], seen
    assert seen[0][2]["authorization"] == "Bearer tok"


def test_refuses_to_preload(recorded):
    api, _ = recorded
    with pytest.raises(TypeError):
        CoreCalls(api).create_namespaced_pod("ns1", POD, _preload_content=True)


def test_answers_and_errors_over_http(server):
    """Against the API emulator: 201 with the pod, 409, 404 and 400 as ApiException (the log
    answer itself is read by the agent's tests, which run pods)."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=server.kubeconfig_path)
    calls = CoreCalls(api)
    pod = json.loads(json.dumps(POD))
    created = json.loads(calls.create_namespaced_pod("default", pod, _request_timeout=5).data)
    assert created["metadata"]["name"] == "p1" and created["metadata"]["uid"]
    with pytest.raises(ApiException) as exc:
        calls.create_namespaced_pod("default", pod, _request_timeout=5)
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"
    dry = json.loads(calls.create_namespaced_pod("default", {**pod, "metadata": {"name": "p2"}},
                                                 dry_run="All").data)
    assert dry["metadata"]["name"] == "p2"
    with pytest.raises(ApiException) as exc:
        client.CoreV1Api(api).read_namespaced_pod("p2", "default")     # a dry run stores nothing
    assert exc.value.status == 404
    secret = json.loads(calls.create_namespaced_secret("default", dict(SECRET)).data)
    assert secret["data"] == {"proxy": "UEVN"}
    # Bound to a node whose kubelet never starts the container (no kubelet simulator here): 400.
    # (Unbound, there is no kubelet to ask and the log is empty, as on a real server.)
    assert calls.read_namespaced_pod_log("p1", "default", container="pilot", limit_bytes=100).data == b""
    server.call(server.api.bind, "default", "p1", {"target": {"name": "cpu-1"}})
    with pytest.raises(ApiException) as exc:
        calls.read_namespaced_pod_log("p1", "default", container="pilot", limit_bytes=100)
    assert exc.value.status == 400 and "waiting to start" in json.loads(exc.value.body)["message"]
    calls.delete_namespaced_pod("p1", "default", propagation_policy="Background")
    with pytest.raises(ApiException) as exc:
        calls.delete_namespaced_pod("p1-gone", "default")
    assert exc.value.status == 404


def test_agent_client_keeps_one_connection_per_calling_thread(server):
    """The agent's client pool covers every thread that calls the API (ce_k8s.agent.main): with
    that many threads calling at once, round after round, no connection is opened twice. (With
    the client's default pool of cpu_count * 5 connections, each round beyond the pool opened and
    dropped new ones.)"""
    import threading

    from ce_k8s.agent.main import api_client_for, connection_pool_size
    from ce_k8s.settings import Settings

    size = connection_pool_size(Settings(create_concurrency=8))
    assert size >= 8 + 8 + 2                       # create workers, I/O pool, watch and GC
    calls = CoreCalls(api_client_for(server.kubeconfig_path, size))
    before = server.connections
    barrier = threading.Barrier(size)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                barrier.wait(timeout=10)
                calls.request("GET", "/api/v1/namespaces/{namespace}/pods", {"namespace": "default"},
                              _request_timeout=10).read()
        except BaseException as exc:      # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert server.connections - before <= size


def test_every_answer_is_read_so_its_connection_is_reused(server):
    """A raw answer nobody reads keeps its connection out of the pool; CoreCalls reads each one,
    so one caller making many calls (whose answers it ignores) uses one connection."""
    from kubernetes import config

    calls = CoreCalls(config.new_client_from_config(config_file=server.kubeconfig_path))
    before = server.connections
    for i in range(20):
        calls.create_namespaced_pod("default", {**json.loads(json.dumps(POD)), "metadata": {"name": f"r{i}"}})
        calls.delete_namespaced_pod(f"r{i}", "default", propagation_policy="Background")
    assert server.connections - before == 1
