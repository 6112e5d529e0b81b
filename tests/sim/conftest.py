"""Fixtures for the emulator tests: a threaded API server (with or without simulated kubelets) and
official-client handles on it. Time runs 100× faster than simulated time (``time_scale=0.01``)."""

from __future__ import annotations

import pytest
from kubernetes import client, config

from ce_k8s.sim.kube.apiserver import ApiServer

SCALE = 0.01


def pod_body(name: str, *, image: str = "busybox:1.36", scenario: str | None = None, cpu: str | None = None,
             memory: str | None = None, labels: dict | None = None, **spec) -> dict:
    """A minimal pilot-like pod manifest."""
    meta: dict = {"name": name}
    if labels:
        meta["labels"] = labels
    if scenario is not None:
        meta["annotations"] = {"sim.ce-k8s.io/scenario": scenario}
    container: dict = {"name": "pilot", "image": image}
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    if requests:
        container["resources"] = {"requests": requests}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


@pytest.fixture
def api_only():
    """The API emulator without kubelets (pods stay as written), small history for 410 tests."""
    with ApiServer.running(kubelet=False, history_size=20, bookmark_interval=0.1, seed=7) as srv:
        yield srv


@pytest.fixture
def cluster():
    """API emulator + scheduler/kubelets: 2 cpu nodes (4 cores, 16Gi) and a tainted GPU node."""
    with ApiServer.running(nodes="cpu:2x4c16g,gpu:1x8c64g2gpu:taint=nvidia.com/gpu=present:NoSchedule",
                           time_scale=SCALE, seed=3) as srv:
        yield srv


def core_api(srv) -> client.CoreV1Api:
    """An official-client CoreV1Api built from the server's kubeconfig (as the agent builds it)."""
    return client.CoreV1Api(config.new_client_from_config(config_file=srv.kubeconfig_path))


@pytest.fixture
def core(api_only):
    return core_api(api_only)


@pytest.fixture
def kcore(cluster):
    return core_api(cluster)


@pytest.fixture(name="pod_body")
def pod_body_fixture():
    """:func:`pod_body` for tests (test modules here are not a package, so no relative imports)."""
    return pod_body


@pytest.fixture(name="core_api")
def core_api_fixture():
    """:func:`core_api` for tests."""
    return core_api
