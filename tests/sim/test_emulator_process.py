"""The pipeline benchmark's emulator arrangement: ``/_sim/stats``, the API emulator in its own
process behind the test bed, and the structural copy that replaced ``copy.deepcopy``.

The stats endpoint is not Kubernetes: it must stay outside every API path, read-only and absent
unless enabled, so clients that discover the API (kubectl, the official client) never see it.
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from fractions import Fraction

import pytest
from kubernetes import client, config

from ce_k8s.sim.kube.api import clone
from ce_k8s.sim.kube.apiserver import ApiServer
from ce_k8s.sim.pilots import make_pilot
from ce_k8s.sim.testbed import TestBed


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_stats_endpoint_counts_calls_and_is_not_counted_itself():
    with ApiServer.running(kubelet=False) as srv:
        assert _get(f"{srv.url}/_sim/stats")[0] == 404  # absent unless enabled
        srv.enable_stats(lambda: {"extra": 7})
        core = client.CoreV1Api(config.new_client_from_config(config_file=srv.kubeconfig_path))
        core.list_namespaced_pod("default")
        core.list_namespaced_pod("default")
        status, doc = _get(f"{srv.url}/_sim/stats")
        assert status == 200
        assert ["list", "pods", 2] in doc["calls"] and doc["extra"] == 7
        assert _get(f"{srv.url}/_sim/stats")[1]["calls"] == doc["calls"]  # reading it is not a call
        assert _get(f"{srv.url}/_sim/other")[0] == 404
        req = urllib.request.Request(f"{srv.url}/_sim/stats", method="POST")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=10)
        assert exc.value.code == 404  # read-only


def test_clone_is_a_deep_copy_of_json_data():
    doc = {"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "args": ["x"]}]},
           "status": {"phase": "Running", "n": 1, "f": 1.5, "t": True, "z": None}, "odd": Fraction(1, 3)}
    copied = clone(doc)
    assert copied == doc == copy.deepcopy(doc)
    copied["spec"]["containers"][0]["args"].append("y")
    copied["metadata"]["labels"]["a"] = "changed"
    assert doc["spec"]["containers"][0]["args"] == ["x"] and doc["metadata"]["labels"]["a"] == "b"


@pytest.mark.slow
def test_testbed_with_api_process_and_spawner_threads_completes_pilots():
    """The benchmark's arrangement end to end: pilots complete, counters come over /_sim/stats
    (create pod, create Secret, log reads, delete pod per pilot), nothing is left."""
    with TestBed(time_scale=0.02, max_running_hooks=16, api_process=True, spawn_threads=2) as bed:
        assert bed.server.proc.poll() is None and bed.server.pid != 0
        bed.server.reset_calls()
        bed.submit([make_pilot(0, "cpu8", run_s=5), make_pilot(1, "cpu1", run_s=5, exit_code=3)])
        assert bed.run(timeout=60, poll_interval=0.3)
        assert [(o.status, o.exit_code) for o in bed.outcomes.values()] == [("completed", 0), ("completed", 3)]
        bed.drain(timeout=30, poll_interval=0.3)
        summary = bed.summary()
        assert summary["pods_created"] == 2 and summary["duplicate_pods"] == 0
        assert summary["pods_left"] == 0 and summary["secrets_left"] == 0
        calls = bed.server.calls
        assert calls[("create", "pods")] == 2 and calls[("delete", "pods")] == 2
        assert calls[("create", "secrets")] == 2 and calls[("get", "pods/log")] >= 2
        proc = bed.server.proc
    assert proc.poll() is not None  # the emulator process stops with the bed


def test_testbed_api_process_refuses_fault_injection():
    with pytest.raises(ValueError, match="in-process"):
        TestBed(api_process=True, fault_rate=0.1)
