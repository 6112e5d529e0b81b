"""Agent-level checks of the fixes for the soak findings F1-F3 (docs/reliability.md, "Findings of the first run").

On the in-memory fakes (tests/agent/fakes.py; docs/agent.md "Testing the agent's decisions"): what
is checked is the create's decision (the Events, the post journal, the seen uid), not HTTP. F2 (a
young pod found after a restart waits for its Secret) is in test_decisions.py. One test stays on
the API emulator: the POST applied and its answer lost, which is the client's timeout on a real
socket.

References: docs/design.md Decision 5 (exactly one pod per attempt); docs/holds.md ("pod vanished while
ce-k8s was not watching" → next attempt); docs/hook-protocol.md §2.3 (update output).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ce_k8s import protocol
from ce_k8s.agent.status import CREATE_DONE, CREATE_RETRY
from ce_k8s.pods.names import pod_name

from .conftest import GJID, routed_ad, text_of, wait
from .fakes import api_error, fake_agent, run_effects
from .test_agent import NAME, stored, update


@pytest.fixture
def memory(settings):
    return fake_agent(settings)


def test_f1_event_of_an_earlier_pod_moves_to_the_next_attempt(memory, settings):
    """F1: an earlier agent answered (K8sPodReason in the ad), its pod vanished unseen, but an Event
    names it: the pod existed, so attempt 0 is not created again; the job gets attempt 1."""
    agent = memory
    agent.api.record_event(NAME, "Scheduled", "Successfully assigned default/x to n1", uid="u-old")
    ad = routed_ad(Path(settings.spool), K8sPodReason="creating pod")
    update(agent, ad)
    run_effects(agent)
    assert agent.jobs[NAME].creation.info.state == CREATE_DONE
    out = update(agent, ad)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == pod_name(GJID, 1)
    assert agent.api.pods == {} and agent.api.calls[("create", "pods")] == 0


def test_f1_without_history_the_pod_is_created(memory, settings):
    """F1, the other side: no Event names the pod, so it never existed and attempt 0 is created.
    (An Event of another pod does not count: the agent asks by the pod's name.)"""
    agent = memory
    agent.api.record_event(pod_name(GJID, 7), "Scheduled", "Successfully assigned default/y to n1")
    ad = routed_ad(Path(settings.spool), K8sPodReason="creating pod")
    update(agent, ad)
    run_effects(agent)
    assert agent.api.calls[("list", "events")] == 1
    assert list(agent.api.pods) == [NAME]


def test_f3_rerun_of_a_seen_and_vanished_pod_never_posts_it_again(memory, settings):
    """F3: a create re-run whose pod was seen (uid known) and is gone now probes with a dry run,
    finds it absent and ends the attempt instead of creating the pod again."""
    agent = memory
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    run_effects(agent)
    assert agent.cache.get(NAME)
    rec = agent.jobs[NAME]
    agent.api.remove(NAME)                          # deleted by someone else; the watch shows it
    assert agent.cache.get(NAME) is None
    agent.cache.gone.pop(NAME, None)                # no tombstone: only the uid proves the pod existed
    rec.creation.failures, rec.creation.info.state = 1, "retry"     # as after a lost answer
    agent.updates.queue_create(rec, text_of(ad).decode())
    run_effects(agent)
    assert rec.creation.info.state == CREATE_DONE
    assert agent.api.pods == {} and agent.api.calls[("create", "pods")] == 2   # the POST, then one dry run


def test_f3_rerun_after_a_lost_answer_checks_events_before_posting(memory, settings):
    """F3, the case the 1,500-pilot soak still hit: the first POST's answer was lost, the pod was
    created, evicted and deleted while the watch was cut (a relist leaves no tombstone), so the
    agent never saw it. The retry's dry run finds nothing; an Event still names the pod, so the
    attempt has ended: no second POST, the job moves to attempt 1."""
    agent = memory
    agent.api.fail[("create", "pods")] = [api_error(500, "etcd unavailable")]
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    rec = agent.jobs[NAME]
    run_effects(agent)
    assert rec.creation.info.state == CREATE_RETRY
    agent.api.record_event(NAME, "Killing", "Stopping container pilot", uid="u-lost")
    rec.creation.next_try = 0
    update(agent, ad)
    run_effects(agent)
    assert rec.creation.info.state == CREATE_DONE
    out = update(agent, ad)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == pod_name(GJID, 1)
    assert agent.api.pods == {}


def test_f1_pod_gone_before_any_event_after_restart_is_not_made_again(settings):
    """F1, the case Events cannot answer: a pod created by one agent process, deleted before the
    scheduler or kubelet wrote any Event, while no agent watched, and the dead agent's reply never
    reached the router (no K8sPodReason in the ad). The post journal (ce_k8s/agent/journal.py)
    remembers the POST across the restart: the attempt is over, the job gets attempt 1."""
    ad = routed_ad(Path(settings.spool))
    first = fake_agent(settings)
    update(first, ad)
    run_effects(first)
    assert NAME in first.api.pods
    first.api.watch = lambda kind, pod: None          # the agent dies; its memory goes with it
    first.api.remove(NAME)
    assert first.api.events == []
    second = fake_agent(settings, api=first.api)      # restarted: same cluster, same journal on disk
    update(second, ad)
    run_effects(second)
    assert second.jobs[NAME].creation.info.state == CREATE_DONE
    out = update(second, ad)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == pod_name(GJID, 1)
    assert list(second.api.pods) == []
    # one real POST by the first agent, one dry run by the second: never a second real POST
    assert second.api.calls[("create", "pods")] == 2


def test_f3_lost_answer_then_pod_gone_unseen_is_not_posted_again(agent, server, settings):
    """F3's residual: the POST was applied but its answer lost; the pod was then deleted before any
    Event and before the watch showed it (here: its tombstone dropped, as after a relist). The
    journal says a create was sent and not refused, so the retry's dry run finding nothing ends
    the attempt instead of posting attempt 0 again. On the emulator: the lost answer is the
    client's read timeout on a real socket, which the create must take as "maybe applied"."""
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
    assert server.call(server.api.list, "pods", "default")["items"] == []
    assert server.calls[("list", "events")] == 0


def test_a_refused_post_is_retried_as_a_post(memory, settings):
    """The other side of the journal: an error answer (500) proves nothing was stored, so the retry
    posts attempt 0 again and the pilot runs in it; no attempt number is skipped."""
    agent = memory
    agent.api.fail[("create", "pods")] = [api_error(500, "etcd unavailable")]
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    rec = agent.jobs[NAME]
    run_effects(agent)
    assert rec.creation.info.state == CREATE_RETRY
    assert not agent.journal.posted(NAME)
    rec.creation.next_try = 0
    update(agent, ad)
    run_effects(agent)
    assert list(agent.api.pods) == [NAME]
    assert agent.journal.posted(NAME)


def test_cleanup_forgets_the_names_in_the_journal(memory, settings):
    """Cleanup (hook-protocol.md §2.5) ends the routed job: its pod names leave the journal, so it stays as small as
    the number of jobs in flight."""
    agent = memory
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    run_effects(agent)
    assert NAME in agent.api.pods
    assert agent.journal.posted(NAME)
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert status == protocol.STATUS_OK
    assert not agent.journal.posted(NAME) and len(agent.journal) == 0
