"""A pilot whose node is lost, through the agent on the emulator with its kubelet simulator.

The simulator now shows a lost node as a real cluster does (tests/real/test_emulator_parity.py):
the taint manager marks the pod `DisruptionTarget DeletionByTaintManager` and deletes it, and the
pod stays `Running` with a deletionTimestamp for as long as the node is away, past its grace
period. Its pilot may still run there, so the job stays running and the next attempt waits until
the pod is gone (finding 5 of docs/real-kubernetes.md); once the node is back its kubelet ends and
confirms the pod, and the eviction gives the next attempt.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ce_k8s.pods.names import pod_name
from ce_k8s.sim.kube.apiserver import ApiServer

from .conftest import GJID, new_agent, routed_ad, wait
from .test_eviction import assert_next_attempt, update

NAME = pod_name(GJID, 0)
SCALE = 0.01       # simulated seconds → real: the default 300 s unreachable toleration is 3 s


@pytest.fixture
def cluster():
    with ApiServer.running(nodes="cpu:1x16c64g", time_scale=SCALE,
                           kubelet_options={"default_scenario": "run=forever"}) as srv:
        yield srv


def test_a_lost_nodes_pilot_keeps_running_until_its_pod_is_gone(cluster, settings):
    agent = new_agent(cluster, settings)
    try:
        ad = routed_ad(Path(settings.spool))
        update(agent, ad)
        wait(lambda: (p := agent.cache.get(NAME)) and p.phase == "Running")
        out = update(agent, ad)
        assert out["JobStatus"] == 2 and out["RemoteHost"] == "cpu-1"
        cluster.kubelet.lose_node("cpu-1")
        wait(lambda: (p := agent.cache.get(NAME)) and p.deleting and p.disruption == "DeletionByTaintManager")
        time.sleep(60 * SCALE)        # past the pod's 30 s grace period: nobody confirms the kill
        pod = agent.cache.get(NAME)
        assert pod is not None and pod.phase == "Running" and pod.deleting
        out = update(agent, ad)
        assert ad["JobStatus"] == 2 and "terminating" in out["K8sPodReason"] and "K8sAttempt" not in out
        assert cluster.calls[("create", "pods")] == 1      # no second pod beside one that may run
        cluster.kubelet.restore_node("cpu-1")
        wait(lambda: agent.cache.get(NAME) is None)
        assert_next_attempt(update(agent, ad))
    finally:
        agent.stop()
