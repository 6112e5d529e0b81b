"""Agent-level checks of the fixes for the soak findings F1-F3 (docs/reliability.md, "Findings of the first run").

References: docs/design.md Decision 5 (exactly one pod per attempt); docs/holds.md ("pod vanished while
ce-k8s was not watching" → next attempt); docs/hook-protocol.md §2.3 (update output).
"""

from __future__ import annotations

from pathlib import Path

from ce_k8s.agent import update as update_mod
from ce_k8s.pods.names import pod_name, secret_name

from .conftest import GJID, new_agent, routed_ad, text_of, wait
from .test_agent import NAME, set_status, stored, update


def _pods(server) -> list[dict]:
    return server.call(server.api.list, "pods", "default")["items"]


def test_f1_event_of_an_earlier_pod_moves_to_the_next_attempt(agent, server, settings):
    """F1: an earlier agent answered (K8sPodReason in the ad), its pod vanished unseen, but an Event
    names it: the pod existed, so attempt 0 is not created again; the job gets attempt 1."""
    involved = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": NAME, "namespace": "default", "uid": "u-old"}}
    server.call(server.api.record_event, involved, "Scheduled", "Successfully assigned default/x to n1")
    ad = routed_ad(Path(settings.spool), K8sPodReason="creating pod")
    update(agent, ad)
    wait(lambda: agent.jobs[NAME].creation.info.state == "done")
    out = update(agent, ad)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == pod_name(GJID, 1)
    assert _pods(server) == [] and server.calls[("create", "pods")] == 0


def test_f1_without_history_the_pod_is_created(agent, server, settings):
    """F1, the other side: no Event names the pod, so it never existed and attempt 0 is created."""
    ad = routed_ad(Path(settings.spool), K8sPodReason="creating pod")
    update(agent, ad)
    wait(lambda: stored(server))
    assert server.calls[("list", "events")] == 1
    assert [p["metadata"]["name"] for p in _pods(server)] == [NAME]


def test_f2_young_pod_waiting_after_restart_gets_its_secret(server, settings, monkeypatch):
    """F2: a pod found after a restart, waiting in ContainerCreating, is not marked created while
    young; once it has waited ENSURE_SECRET_AFTER the create is re-run and the Secret made."""
    server.faults.inject("500", verb="create", resource="secrets", count=1000)
    first = new_agent(server, settings)
    ad = routed_ad(Path(settings.spool))
    try:
        update(first, ad)
        wait(lambda: first.jobs[NAME].creation.info.state == "retry")
    finally:
        first.stop()
    server.faults.clear()
    set_status(server, {"phase": "Pending", "containerStatuses": [
        {"name": "pilot", "state": {"waiting": {"reason": "ContainerCreating"}}}]})
    monkeypatch.setattr(update_mod, "ENSURE_SECRET_AFTER", 3600)
    second = new_agent(server, settings)
    try:
        wait(lambda: second.cache.get(NAME) and second.cache.get(NAME).waiting_reason == "ContainerCreating")
        update(second, ad)
        assert second.jobs[NAME].creation.info.state == "none"       # undecided, not "done"
        assert stored(server, secret_name(NAME), "secrets") is None
        monkeypatch.setattr(update_mod, "ENSURE_SECRET_AFTER", 0)
        update(second, ad)
        wait(lambda: stored(server, secret_name(NAME), "secrets"))
        assert len(_pods(server)) == 1
    finally:
        second.stop()


def test_f3_rerun_of_a_seen_and_vanished_pod_never_posts_it_again(agent, server, settings):
    """F3: a create re-run whose pod was seen (uid known) and is gone now probes with a dry run,
    finds it absent and ends the attempt instead of creating the pod again."""
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    wait(lambda: agent.cache.get(NAME))
    rec = agent.jobs[NAME]
    server.call(server.api.delete, "pods", "default", NAME, {})
    wait(lambda: agent.cache.get(NAME) is None)
    agent.cache.gone.pop(NAME, None)                # no tombstone: only the uid proves the pod existed
    rec.creation.failures, rec.creation.info.state = 1, "retry"     # as after a lost answer
    agent.updates.queue_create(rec, text_of(ad).decode())
    wait(lambda: rec.creation.info.state == "done")
    assert _pods(server) == [] and server.calls[("create", "pods")] == 2   # the POST, then one dry run


def test_f3_rerun_after_a_lost_answer_checks_events_before_posting(agent, server, settings):
    """F3, the case the 1,500-pilot soak still hit: the first POST's answer was lost, the pod was
    created, evicted and deleted while the watch was cut (a relist leaves no tombstone), so the
    agent never saw it. The retry's dry run finds nothing; an Event still names the pod, so the
    attempt has ended: no second POST, the job moves to attempt 1."""
    server.faults.inject("500", verb="create", resource="pods", count=1)
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    rec = agent.jobs[NAME]
    wait(lambda: rec.creation.info.state == "retry")
    involved = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": NAME, "namespace": "default", "uid": "u-lost"}}
    server.call(server.api.record_event, involved, "Killing", "Stopping container pilot")
    rec.creation.next_try = 0
    update(agent, ad)
    wait(lambda: rec.creation.info.state == "done")
    out = update(agent, ad)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == pod_name(GJID, 1)
    assert _pods(server) == []


def test_f1_pod_gone_before_any_event_after_restart_is_not_made_again(server, settings):
    """F1, the case Events cannot answer: a pod created by one agent process, deleted before the
    scheduler or kubelet wrote any Event, while no agent watched, and the dead agent's reply never
    reached the router (no K8sPodReason in the ad). The post journal (ce_k8s/agent/journal.py)
    remembers the POST across the restart: the attempt is over, the job gets attempt 1."""
    ad = routed_ad(Path(settings.spool))
    first = new_agent(server, settings)
    try:
        update(first, ad)
        wait(lambda: stored(server))
    finally:
        first.stop()                                   # the agent dies; its memory goes with it
    server.call(server.api.delete, "pods", "default", NAME, {"gracePeriodSeconds": 0})
    assert server.call(server.api.list, "events", "default")["items"] == []
    second = new_agent(server, settings)
    try:
        update(second, ad)
        wait(lambda: second.jobs[NAME].creation.info.state == "done")
        out = update(second, ad)
        assert out["K8sAttempt"] == 1 and out["K8sPodName"] == pod_name(GJID, 1)
        assert [p["metadata"]["name"] for p in _pods(server)] == []
        # one real POST by the first agent, one dry run by the second: never a second real POST
        assert server.calls[("create", "pods")] == 2
    finally:
        second.stop()


def test_f3_lost_answer_then_pod_gone_unseen_is_not_posted_again(agent, server, settings):
    """F3's residual: the POST was applied but its answer lost; the pod was then deleted before any
    Event and before the watch showed it (here: its tombstone dropped, as after a relist). The
    journal says a create was sent and not refused, so the retry's dry run finding nothing ends
    the attempt instead of posting attempt 0 again."""
    server.faults.inject("timeout", verb="create", resource="pods", count=1)
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    rec = agent.jobs[NAME]
    wait(lambda: rec.creation.info.state == "retry")
    assert stored(server) is not None                 # applied, although the answer was lost
    server.call(server.api.delete, "pods", "default", NAME, {"gracePeriodSeconds": 0})
    wait(lambda: agent.cache.get(NAME) is None)
    agent.cache.gone.pop(NAME, None)
    rec.creation.seen_uid = ""                                 # nothing in memory proves the pod existed
    rec.creation.next_try = 0
    update(agent, ad)
    wait(lambda: rec.creation.info.state == "done")
    out = update(agent, ad)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == pod_name(GJID, 1)
    assert _pods(server) == [] and server.calls[("list", "events")] == 0


def test_a_refused_post_is_retried_as_a_post(agent, server, settings):
    """The other side of the journal: an error answer (500) proves nothing was stored, so the retry
    posts attempt 0 again and the pilot runs in it; no attempt number is skipped."""
    server.faults.inject("500", verb="create", resource="pods", count=1)
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    rec = agent.jobs[NAME]
    wait(lambda: rec.creation.info.state == "retry")
    assert not agent.journal.posted(NAME)
    rec.creation.next_try = 0
    update(agent, ad)
    wait(lambda: stored(server))
    assert [p["metadata"]["name"] for p in _pods(server)] == [NAME]
    assert agent.journal.posted(NAME)


def test_cleanup_forgets_the_names_in_the_journal(agent, server, settings):
    """Cleanup (hook-protocol.md §2.5) ends the routed job: its pod names leave the journal, so it stays as small as
    the number of jobs in flight."""
    from ce_k8s import protocol

    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    wait(lambda: stored(server))
    assert agent.journal.posted(NAME)
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert status == protocol.STATUS_OK
    assert not agent.journal.posted(NAME) and len(agent.journal) == 0
