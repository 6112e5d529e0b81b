"""Fault injection and call counting of the API emulator (issue 4 item 1: "Fault injection: a rate
of 429/500 answers, timeouts *after* the write was applied, watch streams cut mid-way, latency",
reproducible from a seed; the benchmarks count API calls per pilot)."""

from __future__ import annotations

import time

import pytest
import urllib3
from kubernetes import watch
from kubernetes.client import ApiException

from ce_k8s.sim.kube.apiserver import ApiServer
from ce_k8s.sim.kube.faults import Faults


def test_scripted_429_has_retry_after_and_500_is_internal_error(core, api_only, pod_body):
    api_only.faults.configure(retry_after=3)
    api_only.faults.inject("429", verb="create", resource="pods")
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", pod_body("p1"))
    assert e.value.status == 429 and e.value.headers["Retry-After"] == "3"
    assert api_only.store.get("pods", "default", "p1") is None  # a throttled write is not applied
    api_only.faults.inject("500", verb="list")
    with pytest.raises(ApiException) as e:
        core.list_namespaced_pod("default")
    assert e.value.status == 500
    core.create_namespaced_pod("default", pod_body("p1"))  # the scripted faults are used up
    assert api_only.faults.injected == {"429": 1, "500": 1}


def test_timeout_after_write_applies_the_write_and_drops_the_answer(core, api_only, pod_body):
    """The client sees a failure, yet the pod exists: the agent adopts on AlreadyExists (design.md Decision 5)."""
    api_only.faults.inject("timeout", verb="create", resource="pods")
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.create_namespaced_pod("default", pod_body("p1"), _request_timeout=5)
    assert api_only.store.get("pods", "default", "p1") is not None
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", pod_body("p1"))
    assert e.value.status == 409


def test_timeout_hang_mode_runs_into_the_client_timeout(core, api_only, pod_body):
    """POST is not retried by urllib3, so the read timeout reaches the caller; the pod exists."""
    api_only.faults.configure(timeout_mode="hang", hang_seconds=3)
    api_only.faults.inject("timeout", verb="create", resource="pods")
    t0 = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core.create_namespaced_pod("default", pod_body("p1"), _request_timeout=0.3)
    assert time.monotonic() - t0 < 2
    assert api_only.store.get("pods", "default", "p1") is not None


def test_watch_cut_mid_stream(core, api_only, pod_body):
    """A cut watch ends without the final chunk: the client sees a protocol error, not a clean end."""
    for n in ("p1", "p2", "p3"):
        core.create_namespaced_pod("default", pod_body(n))
    api_only.faults.inject("cut", verb="watch", resource="pods")
    seen = []
    w = watch.Watch()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for ev in w.stream(core.list_namespaced_pod, "default", timeout_seconds=5):
            seen.append(ev["object"].metadata.name)
    assert seen == ["p1"]
    assert api_only.faults.injected["cut"] == 1


def test_watch_cut_after_seconds():
    with ApiServer.running(kubelet=False, faults=Faults(cut_after=0.3)) as srv:
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(config_file=srv.kubeconfig_path))
        t0 = time.monotonic()
        with pytest.raises(urllib3.exceptions.ProtocolError):
            list(watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=10))
        assert time.monotonic() - t0 < 2


def test_latency_is_added(core, api_only):
    api_only.faults.configure(latency=0.2)
    t0 = time.monotonic()
    core.list_namespaced_pod("default")
    assert time.monotonic() - t0 >= 0.2
    api_only.faults.clear()
    t0 = time.monotonic()
    core.list_namespaced_pod("default")
    assert time.monotonic() - t0 < 0.2


def _pattern(seed: int) -> tuple[list[int], dict[str, int]]:
    faults = Faults(rate_429=0.2, rate_500=0.2, retry_after=0, seed=seed)
    with ApiServer.running(kubelet=False, faults=faults) as srv:
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(config_file=srv.kubeconfig_path))
        out = []
        for _ in range(60):
            try:
                core.list_namespaced_pod("default")
                out.append(200)
            except ApiException as e:
                out.append(e.status)
        return out, dict(srv.faults.injected)


def test_random_faults_are_reproducible_from_the_seed():
    """Same seed, same faults. (urllib3 retries a GET answered 429 with Retry-After by itself, as it
    would against a real server, so the client mostly sees the 500s.)"""
    (a, ia), (b, ib), (c, ic) = _pattern(11), _pattern(11), _pattern(12)
    assert a == b and ia == ib and (a, ia) != (c, ic)
    assert ia["429"] >= 5 and ia["500"] >= 5
    assert a.count(500) == ia["500"]  # 500s are not retried by the client: each one is seen


def test_calls_are_counted_by_verb_and_resource(core, api_only, pod_body):
    api_only.reset_calls()
    core.create_namespaced_pod("default", pod_body("p1"))
    core.read_namespaced_pod("p1", "default")
    core.patch_namespaced_pod_status("p1", "default", {"status": {"phase": "Running"}})
    core.list_namespaced_pod("default")
    core.delete_namespaced_pod("p1", "default")
    assert api_only.calls == {("create", "pods"): 1, ("get", "pods"): 1, ("patch", "pods/status"): 1,
                              ("list", "pods"): 1, ("delete", "pods"): 1}
