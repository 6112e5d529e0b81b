"""The real Kubernetes control plane for the tests of this directory (ce_k8s.real.kube).

One control plane per test session, in its own state directory, brought up on first use (the
binaries are built from the Go module proxy and cached on first use: docs/real-kubernetes.md) and
down at the end. Tests get the admin client (the site's hands) and the agent's kubeconfig (the
ServiceAccount token `up` issued: the only rights the agent has). Needs root, as CI runs, for the
cache directory under /var/cache.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ce_k8s.real.kube import RealKube

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def real_kube():
    if os.geteuid() != 0:
        pytest.fail("the real-Kubernetes tests need root (CI runs as root); see docs/real-kubernetes.md")
    reuse = os.environ.get("CE_K8S_REAL_KUBE_TEST_STATE")   # a developer's bed that is up already
    if reuse and RealKube(reuse).status().get("up"):
        yield RealKube(reuse)
        return
    state = Path("/var/tmp") / f"ce-k8s-real-kube-tests-{os.getpid()}"
    env = RealKube(state)
    env.up(progress=lambda m: print(f"real-kube: {m}", flush=True))
    try:
        yield env
    finally:
        env.down(progress=lambda m: print(f"real-kube: {m}", flush=True))


@pytest.fixture(scope="session")
def admin_client(real_kube):
    from kubernetes.config import new_client_from_config

    api = new_client_from_config(config_file=str(real_kube.admin_kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="session")
def agent_client(real_kube):
    """A client with exactly the agent's rights (its ServiceAccount's token)."""
    from kubernetes.config import new_client_from_config

    api = new_client_from_config(config_file=str(real_kube.kubeconfig))
    yield api
    api.close()


def wait_for(predicate, timeout: float = 60.0, poll: float = 0.2, what: str = ""):
    """Poll `predicate` until it returns something true; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or predicate}")
