"""Agent-level checks of the fixes for the soak findings F1-F3 (docs/reliability.md, "Open findings").

References: DESIGN.md decision 5 (exactly one pod per attempt); docs/holds.md ("pod vanished while
ce-k8s was not watching" → next attempt); jobrouter-protocol.md §2.3 (update output).
"""

from __future__ import annotations

from pathlib import Path

from ce_k8s.agent import agent as agent_mod
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
    wait(lambda: agent.jobs[NAME].create.state == "done")
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
        wait(lambda: first.jobs[NAME].create.state == "retry")
    finally:
        first.stop()
    server.faults.clear()
    set_status(server, {"phase": "Pending", "containerStatuses": [
        {"name": "pilot", "state": {"waiting": {"reason": "ContainerCreating"}}}]})
    monkeypatch.setattr(agent_mod, "ENSURE_SECRET_AFTER", 3600)
    second = new_agent(server, settings)
    try:
        wait(lambda: second.cache.get(NAME) and second.cache.get(NAME).waiting_reason == "ContainerCreating")
        update(second, ad)
        assert second.jobs[NAME].create.state == "none"       # undecided, not "done"
        assert stored(server, secret_name(NAME), "secrets") is None
        monkeypatch.setattr(agent_mod, "ENSURE_SECRET_AFTER", 0)
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
    rec.failures, rec.create.state = 1, "retry"     # as after a lost answer
    agent._queue_create(rec, text_of(ad).decode())
    wait(lambda: rec.create.state == "done")
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
    wait(lambda: rec.create.state == "retry")
    involved = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": NAME, "namespace": "default", "uid": "u-lost"}}
    server.call(server.api.record_event, involved, "Killing", "Stopping container pilot")
    rec.next_try = 0
    update(agent, ad)
    wait(lambda: rec.create.state == "done")
    out = update(agent, ad)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == pod_name(GJID, 1)
    assert _pods(server) == []
