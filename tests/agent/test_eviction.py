"""Evictions are new attempts, however the agent learns of them; only a deletion without any sign of
a disruption holds the pilot (docs/holds.md "Pod status → job status"; issue 5 finding 1).

The `ce-k8s demo` evicts through the policy/v1 Eviction API, which sets the `DisruptionTarget`
condition and then deletes the pod. The agent may see that condition first in a MODIFIED event, in
the DELETED event's object, in the LIST after a restart or a 410, or once and then never again
(a later status write from a stale copy): every one of these is an eviction.

All but the last test feed the agent's cache the watch lines themselves: the agent here runs on
in-memory collaborators (fakes.py), no API server; the last one goes through the emulator's
Eviction API end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ce_k8s.holds import HOLDS
from ce_k8s.pods.names import pod_name

from .conftest import GJID, new_agent, routed_ad, update, wait
from .fakes import fake_agent

NAME = pod_name(GJID, 0)
UID = "uid-attempt-0"


@pytest.fixture
def agent(settings):
    """The agent with a memory cache and no server (fakes.py): these tests are its watch."""
    return fake_agent(settings)


def pod_obj(name=NAME, uid=UID, phase="Running", disruption=False, deleting=False, rv="10"):
    conditions = [{"type": "Ready", "status": "True"}]
    if disruption:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                           "message": "Eviction API: evicting"})
    meta = {"name": name, "namespace": "default", "uid": uid, "resourceVersion": rv,
            "creationTimestamp": "2025-10-09T08:50:00Z",
            "labels": {"ce-k8s.htcondor.org/owner": "cmspilot"},
            "annotations": {"ce-k8s.htcondor.org/owner": "cmspilot", "ce-k8s.htcondor.org/global-job-id": GJID}}
    if deleting:
        meta["deletionTimestamp"] = "2025-10-09T09:00:30Z"
    return {"metadata": meta, "spec": {"nodeName": "node-1", "containers": [{"name": "pilot", "image": "pilot:1"}]},
            "status": {"phase": phase, "conditions": conditions, "startTime": "2025-10-09T08:55:00Z",
                       "containerStatuses": [{"name": "pilot", "state": {"running": {
                           "startedAt": "2025-10-09T08:55:00Z"}}}]}}


def _event(event: dict) -> bytes:
    """One WATCH stream line, as the API server writes it."""
    return json.dumps(event).encode()


def reported_running_ad(settings):
    """The routed ad after the update that reported the pod running (K8sPodUid known, hook-protocol.md §2.3)."""
    return routed_ad(Path(settings.spool), JobStatus=2, K8sPodUid=UID)



def assert_next_attempt(out):
    assert out["JobStatus"] == 1 and out["K8sAttempt"] == 1 and out["K8sPodName"] == pod_name(GJID, 1), out
    assert "evicted" in out["K8sPodReason"]


def test_deleted_event_is_the_first_sight_of_the_disruption(agent, settings):
    """The MODIFIED event with the condition was never seen: the DELETED object carries it."""
    agent.cache.apply_line(_event({"type": "ADDED", "object": pod_obj()}))
    agent.cache.apply_line(_event({"type": "DELETED", "object": pod_obj(disruption=True, deleting=True, rv="12")}))
    assert_next_attempt(update(agent, reported_running_ad(settings)))


def test_disruption_seen_once_is_not_forgotten_by_later_objects(agent, settings):
    """A later object without the condition (stale status write) must not turn the eviction into a
    deletion: this held pilots as "pod deleted outside ce-k8s" (8755) before the evidence was sticky."""
    agent.cache.apply_line(_event({"type": "MODIFIED", "object": pod_obj(disruption=True, rv="11")}))
    agent.cache.apply_line(_event({"type": "MODIFIED", "object": pod_obj(deleting=True, rv="12")}))
    assert agent.cache.get(NAME).disruption == "EvictionByEvictionAPI"
    agent.cache.apply_line(_event({"type": "DELETED", "object": pod_obj(deleting=True, rv="13")}))
    assert agent.cache.get_gone(NAME).disruption == "EvictionByEvictionAPI"
    assert_next_attempt(update(agent, reported_running_ad(settings)))


def test_relist_after_restart_is_the_first_sight(agent, settings):
    """After a restart or a 410, the LIST shows the terminating pod with its condition; the DELETED
    event that follows lacks it (here) and must still count as the eviction."""
    class OneList:
        def list_pod_for_all_namespaces(self, **_kw):
            import json

            class R:
                data = json.dumps({"metadata": {"resourceVersion": "20"},
                                   "items": [pod_obj(disruption=True, deleting=True)]}).encode()
            return R()

    # The agent's own cache (every part of the agent reads it) relists from the LIST above, as
    # after a restart or a 410; its watch (none here: a memory cache) is stopped first.
    cache = agent.cache
    cache.stop()
    cache.api = OneList()
    cache.relist()
    assert cache.get(NAME).disruption == "EvictionByEvictionAPI"
    cache.apply_line(_event({"type": "DELETED", "object": pod_obj(deleting=True, rv="21")}))
    out = update(agent, reported_running_ad(settings))
    assert_next_attempt(out)
    assert "EvictionByEvictionAPI" in out["K8sPodReason"], out    # the LIST's evidence, not "vanished"


def test_deletion_without_any_sign_of_disruption_is_pod_deleted(agent, settings):
    """docs/holds.md: deleted out of band (DELETED seen, never a DisruptionTarget) → held 21/8755."""
    agent.cache.apply_line(_event({"type": "ADDED", "object": pod_obj()}))
    agent.cache.apply_line(_event({"type": "DELETED", "object": pod_obj(deleting=True, rv="12")}))
    out = update(agent, reported_running_ad(settings))
    assert out["JobStatus"] == 5 and out["HoldReasonSubCode"] == HOLDS["pod-deleted"].subcode


def test_evidence_of_an_old_pod_does_not_stick_to_a_new_pod_of_the_same_name(agent):
    agent.cache.apply_line(_event({"type": "MODIFIED", "object": pod_obj(disruption=True, rv="11")}))
    agent.cache.apply_line(_event({"type": "DELETED", "object": pod_obj(disruption=True, rv="12")}))
    agent.cache.apply_line(_event({"type": "ADDED", "object": pod_obj(uid="another-uid", rv="13")}))
    assert agent.cache.get(NAME).disruption is None


def test_eviction_api_on_the_emulator_gives_a_new_attempt(server, settings):
    """End to end on the API emulator: Eviction API (condition, then graceful delete) → attempt 1."""
    from kubernetes import client

    agent = new_agent(server, settings)
    try:
        ad = routed_ad(Path(settings.spool))
        update(agent, ad)
        wait(lambda: agent.cache.get(NAME))

        def run(p):
            p["spec"]["nodeName"] = "node-1"
            p["status"] = {"phase": "Running", "containerStatuses": [{"name": "pilot", "state": {"running": {
                "startedAt": "2025-10-09T08:55:00Z"}}}]}
        server.call(server.api.write, "pods", "default", NAME, run)
        wait(lambda: agent.cache.get(NAME).phase == "Running")
        update(agent, ad)
        assert ad["JobStatus"] == 2 and ad["K8sPodUid"]
        client.CoreV1Api(agent.core.api_client).create_namespaced_pod_eviction(
            NAME, "default", {"apiVersion": "policy/v1", "kind": "Eviction",
                              "metadata": {"name": NAME, "namespace": "default"}})
        wait(lambda: agent.cache.get(NAME) is None or agent.cache.get(NAME).disruption)
        # The pod is Terminating (no kubelet here to end it): its pilot may still run, so the job
        # stays running and says why; the next attempt waits until the pod is gone (finding 5 of
        # docs/real-kubernetes.md: a real API server keeps such pods Running while their node is away).
        out = update(agent, ad)
        assert ad["JobStatus"] == 2 and "terminating" in out["K8sPodReason"] and "K8sAttempt" not in out
        client.CoreV1Api(agent.core.api_client).delete_namespaced_pod(NAME, "default", grace_period_seconds=0,
                                                                    _preload_content=False)
        wait(lambda: agent.cache.get(NAME) is None)
        assert_next_attempt(update(agent, ad))
    finally:
        agent.stop()
