"""The real Kubernetes control plane for the tests of this directory (ce_k8s.real.kube.kube).

One control plane per test session, in its own state directory, brought up on first use (the
binaries are built from the Go module proxy and cached on first use: docs/real-kubernetes.md) and
down at the end. Tests get the admin client (the site's hands) and the agent's kubeconfig (the
ServiceAccount token `up` issued: the only rights the agent has). Needs root, as CI runs, for the
cache directory under /var/cache.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import polling
import pytest

from ce_k8s.real.kube.kube import RealKube

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def real_kube(real_node_wanted):
    if os.geteuid() != 0:
        pytest.fail("the real-Kubernetes tests need root (CI runs as root); see docs/real-kubernetes.md")
    reuse = os.environ.get("CE_K8S_REAL_KUBE_TEST_STATE")   # a developer's bed that is up already
    if reuse and RealKube(reuse).status().get("up"):
        yield RealKube(reuse)
        return
    state = Path("/var/tmp") / f"ce-k8s-real-kube-tests-{os.getpid()}"
    env = RealKube(state)
    # One real node (a real kubelet on containerd and runc: ce_k8s.real.node.node) beside the kwok
    # nodes; it is tainted, so only the tests that mean to run there do (test_real_node.py). None
    # on the bed of the worker that runs only kwok-only modules beside the emulators
    # (tests/conftest.py): one real node at a time on the machine.
    # The reaper takes the bed down if this test run dies without doing it (ce_k8s.real.reaper).
    env.up(progress=lambda m: print(f"real-kube: {m}", flush=True), real_nodes=1 if real_node_wanted else 0,
           owner_pid=os.getpid())
    try:
        yield env
    finally:
        env.down(progress=lambda m: print(f"real-kube: {m}", flush=True))
        shutil.rmtree(env.state_dir, ignore_errors=True)   # etcd's data and the logs: ~70 MB a run


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


def wait_for(predicate, timeout: float = 60.0, poll: float = 0.2, what: str = "", on_timeout=None):
    """The suite's poll-until (tests/polling.py) at a real bed's pace: a real API server, not an
    in-process emulator, answers each poll. Kept under this signature for this directory's ~100 waits."""
    return polling.wait_for(predicate, timeout=timeout, interval=poll, what=what, on_timeout=on_timeout)


@pytest.fixture
def admin_core(admin_client):
    from kubernetes import client

    return client.CoreV1Api(admin_client)


@pytest.fixture
def pilot_namespace(real_kube, admin_core, request):
    """A fresh pilot namespace as a site makes one (RealKubeServer.prepare_namespace: restricted
    PodSecurity, the agent's Role copied in), so each test's pods, quotas and holds stay its own."""
    from ce_k8s.real.kube.kubeserver import RealKubeServer

    name = f"it-{request.node.name.lower().replace('_', '-')[5:30].strip('-')}-{os.urandom(3).hex()}"
    server = RealKubeServer(real_kube)
    try:
        server.prepare_namespace(name)
    finally:
        server.stop()
    yield name
    admin_core.delete_namespace(name)


@contextlib.contextmanager
def running_agent(real_kube, namespace: str, **overrides):
    """The in-process Agent on the agent's own kubeconfig (its ServiceAccount token, never the
    admin's), a CE name of its own (`ce_name=` to share one), a spool holding one pilot's sandbox;
    yields (agent, settings, spool root).
    A context manager rather than a fixture so that a test can stop one agent and start another
    on the same spool, as a restart does."""
    from agent.conftest import make_spool
    from kubernetes.config import new_client_from_config

    from ce_k8s.agent.agent import Agent
    from ce_k8s.agent.sourceprobe import GONE, FixedProbe
    from ce_k8s.settings import Settings

    root = overrides.pop("root", None)
    own_root = root is None
    if own_root:
        root = Path(tempfile.mkdtemp(prefix="ce-k8s-real-", dir="/tmp"))
        root.chmod(0o755)
        make_spool(root)
    values = {"ce_name": f"{AGENT_CE}-{os.urandom(3).hex()}", "namespace": namespace, "spool": str(root / "spool"),
              "socket": str(root / "agent.sock"), "qps": 100.0, "burst": 100, "create_concurrency": 2,
              "gc_grace": 3600, "image_pull_timeout": 0}
    values.update(overrides)
    settings = Settings(**values)
    api = new_client_from_config(config_file=str(real_kube.kubeconfig))
    agent = Agent(settings, api, request_timeout=10.0, watch_timeout=10, source_probe=FixedProbe(GONE))
    agent.start()
    try:
        yield agent, settings, root
    finally:
        agent.stop()
        api.close()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)


# The agent's CE name here, made unique per agent: its pods carry it as a label and its watch
# selects on it, so an agent never sees another test's pods (same job ids, other namespace).
AGENT_CE = "real-kube-it"
