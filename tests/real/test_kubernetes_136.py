"""The older minor we support: the findings' tests again, on Kubernetes v1.36.3.

ce-k8s is built and judged on the newest release the Go module proxy serves (v1.37.2, the rest
of tests/real/) and supports the minor before it. This module brings up a v1.36.3 control plane
of its own (`RealKube(minor="1.36")`, built and cached like the other: docs/real-kubernetes.md)
and collects the admission, quota, eviction and image-pull tests of test_findings.py against it,
and the main tests of test_real_node.py against its real node (a kubelet v1.36.3), so a behaviour
that differs between the two minors fails here by name.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ce_k8s.real.kube.kube import RealKube

from .test_findings import (  # noqa: F401 - collected again here, against v1.36.3
    agent_env,
    core,
    namespace,
    test_finding1_agent_adopts_its_pod_at_a_full_quota_and_makes_the_secret,
    test_finding1_quota_answers_before_already_exists_on_the_real_server,
    test_finding2_pilot_with_sandbox_is_held_for_its_image,
    test_finding3_limitrange_max_becomes_the_default_cpu_limit,
    test_finding3_restricted_namespace_refuses_hostpath,
    test_finding4_eviction_of_a_finished_pod_adds_disruption_target,
)
from .test_real_node import (  # noqa: F401 - the real node of the same release: its kubelet judges these
    real_node,
    test_an_init_container_s_missing_image_shows_only_in_init_statuses,
    test_exit_codes_are_the_container_s_own,
    test_oom_kill_under_a_real_memory_limit,
    test_removal_sends_sigterm_and_a_pilot_that_handles_it_exits_143,
    test_the_real_kubelet_judges_the_agent_s_token_as_the_stub_does,
)

pytestmark = pytest.mark.slow
MINOR = "1.36"


@pytest.fixture(scope="module")
def real_kube():
    if os.geteuid() != 0:
        pytest.fail("the real-Kubernetes tests need root (CI runs as root); see docs/real-kubernetes.md")
    env = RealKube(Path("/var/tmp") / f"ce-k8s-real-kube-tests-{os.getpid()}-{MINOR}", minor=MINOR)
    # With a real node of its own: the kubelet v1.36.3 on the same containerd and runc.
    env.up(progress=lambda m: print(f"real-kube {MINOR}: {m}", flush=True), real_nodes=1, owner_pid=os.getpid())
    try:
        yield env
    finally:
        env.down(progress=lambda m: print(f"real-kube {MINOR}: {m}", flush=True))
        shutil.rmtree(env.state_dir, ignore_errors=True)   # etcd's data and the logs: ~70 MB a run


@pytest.fixture(scope="module")
def admin_client(real_kube):
    from kubernetes.config import new_client_from_config

    api = new_client_from_config(config_file=str(real_kube.admin_kubeconfig))
    yield api
    api.close()


def test_the_bed_runs_the_older_minor(real_kube, admin_client):
    from kubernetes import client

    version = client.VersionApi(admin_client).get_code()
    assert (version.major, version.minor, version.git_version) == ("1", "36", "v1.36.3")
    assert real_kube.status()["kubernetes"] == "v1.36.3"
    (node,) = real_kube.real_node_names()
    info = client.CoreV1Api(admin_client).read_node(node).status.node_info
    assert (info.kubelet_version, info.container_runtime_version) == ("v1.36.3", "containerd://2.1.9+unknown")
