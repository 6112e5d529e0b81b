"""The agent against the API emulator: create, adopt, map, watch, restart, clean up.

References: docs/design.md Decisions 3-5; docs/hook-protocol.md §2.3 (update output rules), §2.5
(cleanup), hook-protocol.md §8; design.md Decision 5 (exactly-once pods under faults).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ce_k8s import protocol
from ce_k8s.agent.cache import GoneError, PodCache
from ce_k8s.holds import HOLDS
from ce_k8s.pods.names import pod_name, secret_name

from .conftest import GJID, apply_output, new_agent, replace_settings, routed_ad, text_of, wait

NAME = pod_name(GJID, 0)


def update(agent, ad, uid=0):
    status, parts = agent.handle(protocol.VERB_UPDATE, text_of(ad), uid)
    assert status == protocol.STATUS_OK, parts
    return apply_output(ad, parts[0])


def stored(server, name=NAME, resource="pods"):
    try:
        return server.call(server.api.get, resource, "default", name)
    except Exception:
        return None


def set_status(server, status, name=NAME):
    def mutate(pod):
        pod["status"] = status
    server.call(server.api.write, "pods", "default", name, mutate)


def test_create_on_first_sight_pod_then_owned_secret(agent, server, settings):
    """docs/design.md Decision 5 and creator.py: pod first, then the Secret owned by the pod."""
    ad = routed_ad(Path(settings.spool))
    out = update(agent, ad)
    assert out["K8sPodReason"] == "creating pod" and out["GridJobStatus"] == "PENDING"
    pod = wait(lambda: stored(server))
    secret = wait(lambda: stored(server, secret_name(NAME), "secrets"))
    assert secret["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert pod["metadata"]["labels"]["ce-k8s.htcondor.org/ce"] == "test-ce"
    wait(lambda: agent.cache.get(NAME))
    out = update(agent, ad)
    assert out["K8sPodUid"] == pod["metadata"]["uid"] and out["GridJobId"] == f"kubernetes default/{NAME}"
    assert "JobStatus" not in out            # still 1: unchanged attributes are not printed (hook-protocol.md §2.3)
    _status, parts = agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)
    assert parts[0] == b""                   # nothing changed → nothing printed
    assert server.calls[("create", "pods")] == 1


def test_running_then_completed_then_cleanup(agent, server, settings):
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    wait(lambda: agent.cache.get(NAME))
    running = {"running": {"startedAt": "2025-10-09T08:55:00Z"}}
    set_status(server, {"phase": "Running", "startTime": "2025-10-09T08:55:00Z",
                        "containerStatuses": [{"name": "pilot", "state": running}]})
    wait(lambda: agent.cache.get(NAME).phase == "Running")
    out = update(agent, ad)
    assert out["JobStatus"] == 2 and out["GridJobStatus"] == "RUNNING" and out["JobCurrentStartDate"] == 1760000100
    set_status(server, {"phase": "Succeeded", "containerStatuses": [{"name": "pilot", "state": {"terminated": {
        "exitCode": 0, "startedAt": "2025-10-09T08:55:00Z", "finishedAt": "2025-10-09T09:05:00Z"}}}]})
    wait(lambda: agent.cache.get(NAME).phase == "Succeeded")
    wait(lambda: agent.output.has(NAME))      # completion waits for the saved log (test_output.py)
    out = update(agent, ad)
    assert out["JobStatus"] == 4 and out["ExitCode"] == 0 and out["JobFinishedHookDone"] == 1760000700
    assert out["RemoteWallClockTime"] == 600
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert status == protocol.STATUS_OK
    wait(lambda: stored(server) is None and stored(server, secret_name(NAME), "secrets") is None)
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert status == protocol.STATUS_NOTFOUND     # the hook maps this to exit 0 (hook-protocol.md §2.5)


def test_timeout_after_accept_is_adopted_not_duplicated(server, settings):
    """docs/design.md Decision 5: the server created the pod but the answer was lost."""
    server.faults.inject("timeout", verb="create", resource="pods")
    agent = new_agent(server, settings, request_timeout=1.0)
    try:
        ad = routed_ad(Path(settings.spool))
        update(agent, ad)
        wait(lambda: agent.jobs[NAME].create.state == "retry", timeout=10)
        assert stored(server) is not None
        agent.jobs[NAME].next_try = 0
        update(agent, ad)
        wait(lambda: agent.jobs[NAME].create.state == "done", timeout=10)
        assert agent.metrics["adopted"] == 1
        assert len([p for p in server.call(server.api.list, "pods", "default")["items"]]) == 1
        assert stored(server, secret_name(NAME), "secrets") is not None
    finally:
        agent.stop()


def test_a_temporary_create_failure_retries_on_its_own_schedule(server, settings):
    """Issue 33: a create refused for a reason that passes (here two 500s) comes back on the agent's
    work queue after the pod's own back-off; no further update poll is needed to make the pod."""
    server.faults.inject("500", verb="create", resource="pods", count=2)
    agent = new_agent(server, settings)
    try:
        update(agent, routed_ad(Path(settings.spool)))       # the only hook call of this test
        wait(lambda: agent.jobs[NAME].create.state == "done", timeout=30)
        assert stored(server) is not None and stored(server, secret_name(NAME), "secrets") is not None
        assert agent.jobs[NAME].failures == 0 and agent.effects.queue.failures(NAME) == 0
        assert len(server.call(server.api.list, "pods", "default")["items"]) == 1
    finally:
        agent.stop()


def test_foreign_pod_of_same_name_is_never_touched(agent, server, settings):
    """An existing pod whose owner differs is not adopted, not reported on, not deleted."""
    server.call(server.api.create, "pods", "default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": NAME, "namespace": "default",
                     "labels": {"app.kubernetes.io/managed-by": "ce-k8s", "ce-k8s.htcondor.org/ce": "test-ce",
                                "ce-k8s.htcondor.org/owner": "intruder"},
                     "annotations": {"ce-k8s.htcondor.org/owner": "intruder"}},
        "spec": {"containers": [{"name": "pilot", "image": "x"}]}})
    wait(lambda: agent.cache.get(NAME))
    ad = routed_ad(Path(settings.spool))
    out = update(agent, ad)
    assert out["JobStatus"] == 5 and out["HoldReasonSubCode"] == HOLDS["admission-denied"].subcode
    agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    time.sleep(0.2)
    assert stored(server) is not None and server.calls[("create", "pods")] == 0


def test_build_error_holds_with_its_code(agent, settings):
    ad = routed_ad(Path(settings.spool), K8sImage=None)
    update(agent, ad)
    wait(lambda: agent.jobs[NAME].create.state == "hold")
    out = update(agent, ad)
    assert out["JobStatus"] == 5 and out["HoldReasonSubCode"] == HOLDS["missing-image"].subcode


def test_quota_exceeded_keeps_job_idle(agent, server, settings):
    """docs/design.md Decision 8: a full quota is temporary; the job stays idle and is retried."""
    server.call(server.api.create, "resourcequotas", "default", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "default"},
        "spec": {"hard": {"pods": "0"}}})
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    wait(lambda: agent.jobs[NAME].create.state == "retry")
    out = update(agent, ad)
    assert "quota" in out["K8sPodReason"] and "JobStatus" not in out
    assert stored(server) is None


def test_eviction_moves_to_a_new_pod(agent, server, settings):
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    wait(lambda: agent.cache.get(NAME))
    set_status(server, {"phase": "Failed", "reason": "Evicted", "message": "node pressure",
                        "conditions": [{"type": "DisruptionTarget", "status": "True",
                                        "reason": "TerminationByKubelet"}]})
    wait(lambda: agent.cache.get(NAME).phase == "Failed")
    out = update(agent, ad)
    new = pod_name(GJID, 1)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == new and ad["JobStatus"] == 1
    update(agent, ad)                      # the next poll carries the new name: create attempt 1
    pod = wait(lambda: stored(server, new))
    assert pod["metadata"]["labels"]["ce-k8s.htcondor.org/attempt"] == "1"


def delete_reported_pod(agent, server, ad) -> None:
    """Create the job's pod, let the agent report it once, then delete it outside ce-k8s."""
    update(agent, ad)
    wait(lambda: agent.cache.get(NAME))
    update(agent, ad)
    server.call(server.api.delete, "pods", "default", NAME, {"gracePeriodSeconds": 0})
    wait(lambda: agent.cache.get(NAME) is None)


def test_pod_deleted_out_of_band_is_held(agent, server, settings):
    ad = routed_ad(Path(settings.spool))
    delete_reported_pod(agent, server, ad)
    out = update(agent, ad)
    assert out["JobStatus"] == 5 and out["HoldReasonSubCode"] == HOLDS["pod-deleted"].subcode


def test_watch_resumes_after_cut_and_relists_on_410(agent, server, settings):
    """docs/design.md Decision 3: resume from the last resourceVersion; relist only on 410 Gone."""
    assert agent.cache.lists == 1
    server.faults.inject("cut", verb="watch", resource="pods")
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    wait(lambda: agent.cache.get(NAME), timeout=10)
    wait(lambda: agent.cache.watches >= 2, timeout=10)
    assert agent.cache.lists == 1
    # A watch from a version the server has compacted away gets 410 Gone: relist, then watch.
    for i in range(60):
        set_status(server, {"phase": "Pending", "message": f"tick {i}"})
    cache = PodCache(agent.core, agent.cache.selector, watch_timeout=2, request_timeout=3)
    cache.resource_version = "1"
    with pytest.raises(GoneError):
        cache.watch_once()
    cache.start()
    try:
        wait(lambda: cache.ready.is_set(), timeout=10)
        assert cache.lists == 1 and cache.get(NAME).message == "tick 59"
    finally:
        cache.stop()


def test_restart_rebuilds_from_relist_without_duplicates(server, settings):
    """docs/design.md Decision 4: no local database; a restarted agent finds its pods by the relist."""
    ad = routed_ad(Path(settings.spool))
    first = new_agent(server, settings)
    try:
        update(first, ad)
        wait(lambda: stored(server, secret_name(NAME), "secrets"))
        wait(lambda: first.cache.get(NAME))
        update(first, ad)
    finally:
        first.stop()
    second = new_agent(server, settings)
    try:
        for _ in range(3):
            status, parts = second.handle(protocol.VERB_UPDATE, text_of(ad), 0)
            assert status == protocol.STATUS_OK and b"creating" not in parts[0]
        time.sleep(0.2)
        assert server.calls[("create", "pods")] == 1
    finally:
        second.stop()


def test_gc_deletes_finished_untouched_pods_only(server, settings):
    settings = replace_settings(settings, gc_grace=1)
    agent = new_agent(server, settings, gc_interval=3600)
    try:
        ads = [routed_ad(Path(settings.spool), gjid=f"ce#{n}.0#1", cluster=4711) for n in (1, 2)]
        names = [pod_name(f"ce#{n}.0#1", 0) for n in (1, 2)]
        for ad in ads:
            update(agent, ad)
        wait(lambda: all(agent.cache.get(n) for n in names))
        set_status(server, {"phase": "Succeeded"}, names[0])
        set_status(server, {"phase": "Running"}, names[1])
        wait(lambda: agent.cache.get(names[0]).phase == "Succeeded" and agent.cache.get(names[1]).phase == "Running")
        assert agent.garbage.collect(now=time.time()) == []          # touched just now
        victims = agent.garbage.collect(now=time.time() + 5)
        assert victims == [names[0]]                                 # never the running one
        wait(lambda: stored(server, names[0]) is None)
        assert stored(server, names[1]) is not None
    finally:
        agent.stop()


def test_update_for_another_users_job_is_denied(agent, settings):
    """SO_PEERCRED rule: a uid that does not own the job gets `denied` (the hook exits 1)."""
    ad = routed_ad(Path(settings.spool), owner="nobody")
    status, _ = agent.handle(protocol.VERB_UPDATE, text_of(ad), 12345)
    assert status == protocol.STATUS_DENIED
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 12345)
    assert status == protocol.STATUS_DENIED


def test_cleanup_deletes_only_the_pod_and_leaves_shared_secrets(agent, server, settings):
    """A route may mount a shared site Secret (K8sVolumes); cleanup must never delete it. The
    sandbox Secret goes with its owner pod (garbage collection), so cleanup is one API call."""
    import json

    server.call(server.api.create, "secrets", "default", {"metadata": {"name": "site-ca"}, "data": {}})
    volumes = {"volumes": [{"name": "site-ca", "secret": {"secretName": "site-ca"}}],
               "volumeMounts": [{"name": "site-ca", "mountPath": "/etc/site-ca", "readOnly": True}]}
    ad = routed_ad(Path(settings.spool), K8sVolumes=json.dumps(volumes))
    update(agent, ad)
    wait(lambda: stored(server, secret_name(NAME), "secrets"))
    wait(lambda: agent.cache.get(NAME))
    deletes_before = server.calls[("delete", "pods")] + server.calls[("delete", "secrets")]
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert status == protocol.STATUS_OK
    wait(lambda: stored(server) is None and stored(server, secret_name(NAME), "secrets") is None)
    assert stored(server, "site-ca", "secrets") is not None
    assert server.calls[("delete", "pods")] + server.calls[("delete", "secrets")] == deletes_before + 1
