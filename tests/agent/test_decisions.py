"""The agent's decisions with in-memory collaborators (tests/agent/fakes.py): no API server.

The update verb's reply for each state of the pod in the cache, the create it queues and when it
is sent, a cleanup, the GC of pods whose job is gone (released pods and their adoption:
test_release.py; the cache's view of evictions: test_eviction.py, on the same fakes). These need
no server because the agent takes its API calls, cache, I/O pool and clock as collaborators
(docs/agent.md "Testing the agent's decisions"); what needs HTTP stays in test_agent.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ce_k8s import protocol
from ce_k8s.agent.outputsave import SAVING_OUTPUT
from ce_k8s.agent.status import CREATE_DONE, CREATE_PENDING, CREATE_RETRY
from ce_k8s.holds import HOLDS
from ce_k8s.pods.names import pod_name, secret_name

from .conftest import GJID, replace_settings, routed_ad, text_of, update
from .fakes import START, api_error, fake_agent, run_effects

NAME = pod_name(GJID, 0)
NEXT = pod_name(GJID, 1)
STARTED = "2025-10-09T08:55:00Z"     # 1760000100
RUNNING = {"phase": "Running", "startTime": STARTED,
           "containerStatuses": [{"name": "pilot", "state": {"running": {"startedAt": STARTED}}}]}


@pytest.fixture
def agent(settings):
    return fake_agent(settings)



def cleanup(agent, ad):
    return agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)


def created(agent, ad):
    """The job's first update, and its create run: the pod is in the cache, as the watch showed it."""
    out = update(agent, ad)
    assert run_effects(agent) == 1
    assert agent.cache.get(NAME) is not None
    return out


# -- the update verb ---------------------------------------------------------------------------------

def test_first_update_queues_the_create_and_sends_nothing_itself(agent, settings):
    """The hot path makes no API call: the reply says "creating pod" and the create waits on the
    work queue (effects.py) until its turn."""
    ad = routed_ad(Path(settings.spool))
    out = update(agent, ad)
    assert out["K8sPodReason"] == "creating pod" and out["GridJobStatus"] == "PENDING"
    assert agent.jobs[NAME].creation.info.state == CREATE_PENDING and agent.effects.waiting() == 1
    assert sum(agent.api.calls.values()) == 0
    assert run_effects(agent) == 1
    assert agent.api.calls[("create", "pods")] == 1 and agent.api.calls[("create", "secrets")] == 1
    secret = agent.api.secrets[secret_name(NAME)]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == agent.api.pods[NAME]["metadata"]["uid"]
    assert agent.jobs[NAME].creation.info.state == CREATE_DONE
    assert agent.jobs[NAME].creation.seen_uid == agent.api.pods[NAME]["metadata"]["uid"]


def test_create_on_first_sight_pod_then_owned_secret(agent, settings):
    """docs/design.md Decision 5 and creator.py: pod first, then the Secret owned by the pod."""
    ad = routed_ad(Path(settings.spool))
    out = update(agent, ad)
    assert out["K8sPodReason"] == "creating pod" and out["GridJobStatus"] == "PENDING"
    run_effects(agent)
    pod = agent.api.pods[NAME]
    secret = agent.api.secrets[secret_name(NAME)]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert pod["metadata"]["labels"]["ce-k8s.htcondor.org/ce"] == "test-ce"
    assert agent.cache.get(NAME)
    out = update(agent, ad)
    assert out["K8sPodUid"] == pod["metadata"]["uid"] and out["GridJobId"] == f"kubernetes default/{NAME}"
    assert "JobStatus" not in out            # still 1: unchanged attributes are not printed (hook-protocol.md §2.3)
    _status, parts = agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)
    assert parts[0] == b""                   # nothing changed → nothing printed
    assert agent.api.calls[("create", "pods")] == 1


def test_running_then_completed_then_cleanup(agent, settings):
    ad = routed_ad(Path(settings.spool))
    created(agent, ad)
    agent.api.set_status(NAME, {"phase": "Running", "startTime": STARTED,
                                "containerStatuses": [{"name": "pilot", "state": {"running": {"startedAt": STARTED}}}]})
    assert agent.cache.get(NAME).phase == "Running"
    out = update(agent, ad)
    assert out["JobStatus"] == 2 and out["GridJobStatus"] == "RUNNING" and out["JobCurrentStartDate"] == 1760000100
    agent.api.set_status(NAME, {"phase": "Succeeded", "containerStatuses": [{"name": "pilot", "state": {"terminated": {
        "exitCode": 0, "startedAt": STARTED, "finishedAt": "2025-10-09T09:05:00Z"}}}]})
    assert agent.cache.get(NAME).phase == "Succeeded"
    run_effects(agent)                        # the log save the watch started
    assert agent.output.has(NAME)             # completion waits for the saved log (test_output.py)
    out = update(agent, ad)
    assert out["JobStatus"] == 4 and out["ExitCode"] == 0 and out["JobFinishedHookDone"] == 1760000700
    assert out["RemoteWallClockTime"] == 600
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert status == protocol.STATUS_OK
    assert NAME not in agent.api.pods and secret_name(NAME) not in agent.api.secrets
    agent.clock.advance(10)                   # the router's next poll
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert status == protocol.STATUS_NOTFOUND     # the hook maps this to exit 0 (hook-protocol.md §2.5)


def test_update_reply_follows_the_pod_in_the_cache(agent, settings):
    """Pending → Running → Succeeded as the watch shows them; only changed attributes are printed
    (hook-protocol.md §2.3); completion waits for the saved log (output.py)."""
    ad = routed_ad(Path(settings.spool))
    created(agent, ad)
    out = update(agent, ad)
    uid = agent.api.pods[NAME]["metadata"]["uid"]
    assert out["K8sPodUid"] == uid and out["GridJobId"] == f"kubernetes default/{NAME}"
    assert "JobStatus" not in out
    _status, parts = agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)
    assert parts[0] == b""                   # nothing changed → nothing printed
    agent.api.set_status(NAME, RUNNING)
    out = update(agent, ad)
    assert out["JobStatus"] == 2 and out["GridJobStatus"] == "RUNNING" and out["JobCurrentStartDate"] == 1760000100
    assert agent.jobs[NAME].reporting.job_status == 2
    agent.api.logs[NAME] = [("stdout", b"pilot out\n"), ("stderr", b"pilot err\n")]
    agent.api.set_status(NAME, {"phase": "Failed", "containerStatuses": [{"name": "pilot", "state": {"terminated": {
        "exitCode": 3, "startedAt": STARTED, "finishedAt": "2025-10-09T09:05:00Z"}}}]})
    out = update(agent, ad)
    assert out["K8sPodPhase"] == "Failed" and out["K8sPodReason"] == SAVING_OUTPUT and "JobStatus" not in out
    run_effects(agent)                                           # the log save the watch started
    assert agent.output.has(NAME)
    out = update(agent, ad)
    assert out["JobStatus"] == 4 and out["ExitCode"] == 3 and out["GridJobStatus"] == "COMPLETED"
    assert out["CompletionDate"] == 1760000700 and out["RemoteWallClockTime"] == 600
    assert agent.api.calls[("create", "pods")] == 1


def test_pod_deleted_out_of_band_is_held(agent, settings):
    ad = routed_ad(Path(settings.spool))
    created(agent, ad)
    update(agent, ad)
    agent.api.remove(NAME)                         # deleted outside ce-k8s
    assert agent.cache.get(NAME) is None and agent.cache.get_gone(NAME) is not None
    out = update(agent, ad)
    assert out["JobStatus"] == 5 and out["HoldReasonSubCode"] == HOLDS["pod-deleted"].subcode
    assert agent.jobs[NAME].reporting.job_status == 5 and agent.jobs[NAME].reporting.hold_reason


def test_eviction_moves_to_a_new_pod(agent, settings):
    ad = routed_ad(Path(settings.spool))
    created(agent, ad)
    agent.api.set_status(NAME, {"phase": "Failed", "reason": "Evicted", "message": "node pressure",
                                "conditions": [{"type": "DisruptionTarget", "status": "True",
                                                "reason": "TerminationByKubelet"}]})
    out = update(agent, ad)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == NEXT and ad["JobStatus"] == 1
    update(agent, ad)                      # the next poll carries the new name: create attempt 1
    run_effects(agent)
    assert agent.api.pods[NEXT]["metadata"]["labels"]["ce-k8s.htcondor.org/attempt"] == "1"
    assert agent.jobs[NEXT].reporting.attempt == 1


def test_build_error_holds_with_its_code(agent, settings):
    ad = routed_ad(Path(settings.spool), K8sImage=None)
    update(agent, ad)
    run_effects(agent)
    assert agent.jobs[NAME].creation.info.state == "hold"
    out = update(agent, ad)
    assert out["JobStatus"] == 5 and out["HoldReasonSubCode"] == HOLDS["missing-image"].subcode
    assert sum(agent.api.calls.values()) == 0


def test_update_for_another_users_job_is_denied(agent, settings):
    """SO_PEERCRED rule: a uid that does not own the job gets `denied` (the hook exits 1)."""
    ad = routed_ad(Path(settings.spool), owner="nobody")
    status, _ = agent.handle(protocol.VERB_UPDATE, text_of(ad), 12345)
    assert status == protocol.STATUS_DENIED
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 12345)
    assert status == protocol.STATUS_DENIED


def test_restart_rebuilds_from_relist_without_duplicates(settings):
    """docs/design.md Decision 4: no local database; a restarted agent finds its pods by the relist."""
    ad = routed_ad(Path(settings.spool))
    first = fake_agent(settings)
    update(first, ad)
    run_effects(first)
    assert secret_name(NAME) in first.api.secrets and first.cache.get(NAME)
    update(first, ad)
    second = fake_agent(settings, api=first.api)
    for _ in range(3):
        status, parts = second.handle(protocol.VERB_UPDATE, text_of(ad), 0)
        assert status == protocol.STATUS_OK and b"creating" not in parts[0]
    run_effects(second)
    assert second.api.calls[("create", "pods")] == 1


def test_cleanup_deletes_only_the_pod_and_leaves_shared_secrets(agent, settings):
    """A route may mount a shared site Secret (K8sVolumes); cleanup must never delete it. The
    sandbox Secret goes with its owner pod (garbage collection), so cleanup is one API call."""
    import json

    agent.api.secrets["site-ca"] = {"metadata": {"name": "site-ca"}, "data": {}}
    volumes = {"volumes": [{"name": "site-ca", "secret": {"secretName": "site-ca"}}],
               "volumeMounts": [{"name": "site-ca", "mountPath": "/etc/site-ca", "readOnly": True}]}
    ad = routed_ad(Path(settings.spool), K8sVolumes=json.dumps(volumes))
    update(agent, ad)
    run_effects(agent)
    assert secret_name(NAME) in agent.api.secrets and agent.cache.get(NAME)
    deletes_before = agent.api.calls[("delete", "pods")] + agent.api.calls[("delete", "secrets")]
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert status == protocol.STATUS_OK
    run_effects(agent)
    assert NAME not in agent.api.pods and secret_name(NAME) not in agent.api.secrets
    assert "site-ca" in agent.api.secrets
    assert agent.api.calls[("delete", "pods")] + agent.api.calls[("delete", "secrets")] == deletes_before + 1


def test_quota_exceeded_keeps_job_idle(agent, settings):
    """docs/design.md Decision 8: a full quota is temporary. The job stays idle with the reason, the
    create comes back after the pod's back-off (not at once), and an update before `next_try` queues
    nothing; the retry probes with a dry run first (the first POST may have been applied)."""
    agent.api.fail[("create", "pods")] = [api_error(403, 'pods "x" is forbidden: exceeded quota: q')]
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    run_effects(agent)
    rec = agent.jobs[NAME]
    assert rec.creation.info.state == CREATE_RETRY and rec.creation.failures == 1
    assert rec.creation.next_try > 0 and rec.creation.ad_text is not None
    out = update(agent, ad)
    assert "quota" in out["K8sPodReason"] and "JobStatus" not in out
    assert run_effects(agent) == 0 and NAME not in agent.api.pods     # backing off: not stored
    rec.creation.next_try = 0
    agent.effects.queue.add(NAME)                                   # the back-off ran out
    assert run_effects(agent) == 1
    assert rec.creation.info.state == CREATE_DONE and rec.creation.failures == 0
    assert agent.api.calls[("create", "pods")] == 3                 # the refused POST, the dry run, the POST
    assert agent.api.calls[("list", "events")] == 1                 # F3: no earlier pod of the attempt


def test_foreign_pod_of_same_name_is_never_touched(agent, settings):
    """An existing pod whose owner differs is not adopted, not reported on, not deleted."""
    agent.api.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": NAME, "namespace": "default",
                     "labels": {"app.kubernetes.io/managed-by": "ce-k8s", "ce-k8s.htcondor.org/ce": "test-ce",
                                "ce-k8s.htcondor.org/owner": "intruder"},
                     "annotations": {"ce-k8s.htcondor.org/owner": "intruder"}},
        "spec": {"containers": [{"name": "pilot", "image": "x"}]}})
    agent.api.calls.clear()
    ad = routed_ad(Path(settings.spool))
    out = update(agent, ad)
    assert out["JobStatus"] == 5 and out["HoldReasonSubCode"] == HOLDS["admission-denied"].subcode
    agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    run_effects(agent)
    assert NAME in agent.api.pods and agent.api.calls[("create", "pods")] == 0
    assert sum(agent.api.calls.values()) == 0


def test_a_young_pending_pod_found_after_a_restart_waits_for_its_secret(settings):
    """F2 (docs/reliability.md; F1 and F3 in test_findings_fixes.py): a pod this process did not
    create, still waiting in ContainerCreating, is left undecided until it has waited
    ENSURE_SECRET_AFTER; then the create is re-run, which adopts the pod and makes the Secret the
    dead agent never made."""
    first = fake_agent(settings)
    ad = routed_ad(Path(settings.spool))
    update(first, ad)
    first.api.fail[("create", "secrets")] = [api_error(500, "etcd unavailable")]
    run_effects(first)                                   # the pod is made, its Secret is not
    assert first.jobs[NAME].creation.info.state == CREATE_RETRY
    pod = first.api.pods[NAME]
    second = fake_agent(settings, clock=first.clock)     # a restart: new memory, same cluster
    second.api.pods[NAME] = pod
    second.api.set_status(NAME, {"phase": "Pending", "containerStatuses": [
        {"name": "pilot", "state": {"waiting": {"reason": "ContainerCreating"}}}]})
    assert second.cache.get(NAME).waiting_reason == "ContainerCreating"
    update(second, ad)
    assert second.jobs[NAME].creation.info.state == "none" and second.effects.waiting() == 0
    assert secret_name(NAME) not in second.api.secrets   # undecided, not "done": no Secret yet
    second.clock.advance(25)
    update(second, ad)
    assert run_effects(second) == 1
    assert second.jobs[NAME].creation.info.state == CREATE_DONE
    assert secret_name(NAME) in second.api.secrets and second.metrics["adopted"] == 1
    assert second.api.calls[("create", "pods")] == 1             # the dry run only: adopted, not POSTed
    assert list(second.api.pods) == [NAME]


# -- the cleanup verb (released pods: test_release.py) ----------------------------------------------

def test_cleanup_of_a_finished_job_deletes_its_pod(agent, settings):
    ad = routed_ad(Path(settings.spool))
    created(agent, ad)
    status, parts = cleanup(agent, ad)
    assert status == protocol.STATUS_OK and parts == [b"1 pod(s) deleted"]
    assert NAME not in agent.api.pods and secret_name(NAME) not in agent.api.secrets
    assert agent.jobs[NAME].cleanup.asked_at == agent.clock() and agent.jobs[NAME].cleanup.job == "104711.0"
    agent.clock.advance(10)                       # the router's next poll: the delete is an old one now
    status, _ = cleanup(agent, ad)
    assert status == protocol.STATUS_NOTFOUND     # the hook maps this to exit 0 (hook-protocol.md §2.5)
    assert agent.api.calls[("delete", "pods")] == 1


# -- the GC ------------------------------------------------------------------------------------------

def test_gc_deletes_a_finished_pod_no_hook_names_any_more(agent, settings):
    """A finished pod whose job stopped calling the hooks goes after CE_K8S_GC_GRACE; a live one
    never does, however long it is silent."""
    ad = routed_ad(Path(settings.spool))
    created(agent, ad)
    agent.clock.advance(settings.gc_grace + 1)
    assert agent.garbage.collect() == []                 # live: never collected for silence
    agent.api.set_status(NAME, {"phase": "Succeeded", "containerStatuses": [{"name": "pilot", "state": {
        "terminated": {"exitCode": 0, "startedAt": STARTED, "finishedAt": "2025-10-09T09:05:00Z"}}}]})
    update(agent, ad)
    assert agent.garbage.collect() == []                 # just named by a hook
    agent.clock.advance(settings.gc_grace + 1)
    assert agent.garbage.collect() == [NAME]
    run_effects(agent)
    assert NAME not in agent.api.pods and agent.api.calls[("delete", "pods")] == 1


def test_gc_retries_the_delete_a_cleanup_could_not_make(agent, settings):
    ad = routed_ad(Path(settings.spool))
    created(agent, ad)
    agent.api.fail[("delete", "pods")] = [api_error(500, "etcd unavailable")]
    status, _ = cleanup(agent, ad)
    assert status == protocol.STATUS_ERROR and NAME in agent.api.pods
    assert agent.jobs[NAME].cleanup.asked_at == START
    assert agent.garbage.collect() == [NAME]             # cleaned up: no grace
    run_effects(agent)
    assert NAME not in agent.api.pods and agent.api.calls[("delete", "pods")] == 2


def test_gc_deletes_finished_untouched_pods_only(settings):
    settings = replace_settings(settings, gc_grace=1)
    agent = fake_agent(settings)
    ads = [routed_ad(Path(settings.spool), gjid=f"ce#{n}.0#1", cluster=4711) for n in (1, 2)]
    names = [pod_name(f"ce#{n}.0#1", 0) for n in (1, 2)]
    for ad in ads:
        update(agent, ad)
    run_effects(agent)
    assert all(agent.cache.get(n) for n in names)
    agent.api.set_status(names[0], {"phase": "Succeeded"})
    agent.api.set_status(names[1], {"phase": "Running"})
    assert agent.cache.get(names[0]).phase == "Succeeded" and agent.cache.get(names[1]).phase == "Running"
    assert agent.garbage.collect(now=agent.clock()) == []          # touched just now
    victims = agent.garbage.collect(now=agent.clock() + 5)
    assert victims == [names[0]]                                  # never the running one
    run_effects(agent)
    assert names[0] not in agent.api.pods
    assert names[1] in agent.api.pods
