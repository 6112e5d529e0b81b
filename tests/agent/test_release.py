"""Cleanup never destroys work a re-route will want back (docs/agent.md "Released pods").

HTCondor 23.9's router cleans a routed job up whenever it cannot push the update hook's output to
the schedd (JobRouter.cpp:2380-2427, UpdateRoutedJobStatus → GracefullyRemoveJob), calls the cleanup
hook again on every poll while it cannot yield the source job (JobRouter.cpp:2852-2919,
FinishCleanupJob; JobRouterHookMgr.cpp:838-880, CleanupClient::hookExited), and then routes the
source job again under the next attempt's pod name. These tests drive the agent through that
sequence with a fake `SourceProbe` (no schedd needed) on in-memory collaborators (fakes.py: no
API server; `run_effects` makes the agent's queued writes, `agent.clock` is its time).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ce_k8s import protocol
from ce_k8s.agent.journal import PostJournal
from ce_k8s.agent.logfmt import parse
from ce_k8s.agent.options import AgentOptions
from ce_k8s.agent.sourceprobe import GONE, UNKNOWN, WAITING, FixedProbe
from ce_k8s.pods.names import pod_name

from .conftest import GJID, routed_ad, text_of
from .fakes import FakeApi, FakeClock, fake_agent, run_effects
from .test_agent import NAME, update

NEXT = pod_name(GJID, 1)          # the name the translate hook gives the re-routed job
RUNNING = {"phase": "Running", "startTime": "2025-10-09T08:55:00Z",
           "containerStatuses": [{"name": "pilot", "state": {"running": {"startedAt": "2025-10-09T08:55:00Z"}}}]}


@pytest.fixture
def api():
    """The cluster (fakes.FakeApi): shared by an agent and the one that restarts after it."""
    return FakeApi(FakeClock())


def new_agent(api, settings, **kwargs):
    """An agent on `api`; a second one on the same `api` is the first restarted (fakes.fake_agent)."""
    return fake_agent(settings, api=api, **kwargs)


def pods(api) -> list[str]:
    return sorted(api.pods)


def stored(api, name=NAME):
    return api.pods.get(name)


def running_job(agent, api, settings, **extra):
    """Routed job 104711.0 (attempt 0) with its pod running, as the router's ad holds it."""
    ad = routed_ad(Path(settings.spool), **extra)
    update(agent, ad)
    run_effects(agent)
    assert agent.cache.get(NAME)
    api.set_status(NAME, RUNNING)
    assert agent.cache.get(NAME).phase == "Running"
    out = update(agent, ad)
    assert out["JobStatus"] == 2 and ad["K8sPodUid"]
    return ad


def rerouted(settings, cluster_id=104712, **extra):
    """The source job routed again: a new routed job, the translate hook's next attempt (K8sAttempt
    came to the source through CE_K8S_ATTRS_TO_COPY), the same GlobalJobId; no K8sPod* status."""
    return routed_ad(Path(settings.spool), attempt=1, ClusterId=cluster_id, **extra)


def cleanup(agent, ad):
    return agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)


@pytest.fixture
def waiting(api, settings):
    probe = FixedProbe(WAITING)
    a = new_agent(api, settings, source_probe=probe)
    a.probe = probe
    return a


def test_live_pod_of_a_waiting_source_is_released_and_adopted_by_the_rerouted_job(waiting, api, settings,
                                                                                   caplog):
    """The 23.9 incident: a failed push cleans the routed job up while its pod runs; the source job
    is still there (running), so the pod is kept, and the re-routed job (attempt 1's name) is told
    to use it: K8sPodName/K8sAttempt of the old pod, no second pod, the attempt number unchanged."""
    agent = waiting
    ad = running_job(agent, api, settings)
    uid = ad["K8sPodUid"]
    with caplog.at_level(logging.INFO, logger="ce_k8s.agent"):
        status, parts = cleanup(agent, ad)
    assert status == protocol.STATUS_OK and b"released" in parts[0]
    assert agent.probe.asked == ["4711.0"]                       # RoutedFromJobId of the routed ad
    assert pods(api) == [NAME] and agent.journal.released_at(NAME) is not None
    released = [parse(r.getMessage()) for r in caplog.records if "event=pod-released" in r.getMessage()]
    assert len(released) == 1 and released[0]["job"] == "104711.0" and released[0]["pod"] == NAME
    assert released[0]["source"] == WAITING and released[0]["why"]
    assert agent.jobs[NAME].cleanup.asked_at == 0.0             # kept: not a cleaned-up pod for the GC

    again = rerouted(settings)
    assert again["K8sPodName"] == NEXT
    with caplog.at_level(logging.INFO, logger="ce_k8s.agent"):
        out = update(agent, again)
    assert out["K8sPodName"] == NAME and out["K8sAttempt"] == 0
    assert out["JobStatus"] == 2 and out["K8sPodUid"] == uid and out["GridJobStatus"] == "RUNNING"
    assert any("event=pod-adopted" in r.getMessage() and f"alias={NEXT}" in r.getMessage() for r in caplog.records)
    assert agent.journal.released_at(NAME) is None and agent.journal.alias_of(NEXT) == NAME
    assert api.calls[("create", "pods")] == 1 and pods(api) == [NAME]
    # From now on the routed ad names the old pod: an ordinary job, nothing more to say.
    _status, parts = agent.handle(protocol.VERB_UPDATE, text_of(again), 0)
    assert parts[0] == b""
    assert NEXT not in agent.jobs and agent.jobs[NAME].reporting.routed_job == "104712.0"
    agent.garbage.collect(now=agent.clock() + 10_000)              # no grace applies to an adopted pod
    assert pods(api) == [NAME] and api.calls[("create", "pods")] == 1


def test_adopted_pod_keeps_the_eviction_and_next_attempt_logic(waiting, api, settings):
    """After the adoption the job is at attempt 0 again; an eviction of the adopted pod moves it to
    attempt 1, whose pod is then really created: the name the adoption replaced is not a vanished
    pod and costs no attempt."""
    agent = waiting
    ad = running_job(agent, api, settings)
    cleanup(agent, ad)
    again = rerouted(settings)
    update(agent, again)
    assert again["K8sPodName"] == NAME and again["K8sAttempt"] == 0
    api.evict(NAME)                                              # the policy/v1 Eviction API
    assert agent.cache.get(NAME) is None
    out = update(agent, again)
    assert out["K8sAttempt"] == 1 and out["K8sPodName"] == NEXT and "evicted" in out["K8sPodReason"]
    out = update(agent, again)
    assert out["K8sPodReason"] == "creating pod"
    run_effects(agent)
    assert stored(api, NEXT)
    assert again["K8sAttempt"] == 1 and pods(api) == [NEXT]


def test_a_lost_adoption_reply_is_given_again_not_a_new_pod(waiting, api, settings):
    """The router may not apply the adoption reply (the hook timed out, the push failed): the next
    update still names attempt 1's pod, and gets the same answer, also after an agent restart."""
    agent = waiting
    ad = running_job(agent, api, settings)
    cleanup(agent, ad)
    first = update(agent, rerouted(settings))
    assert first["K8sPodName"] == NAME
    second = update(agent, rerouted(settings))                   # the same ad as before: reply lost
    assert second["K8sPodName"] == NAME and second["K8sAttempt"] == 0
    agent.stop()
    fresh = new_agent(api, settings, source_probe=FixedProbe(WAITING))
    try:
        third = update(fresh, rerouted(settings))
        assert third["K8sPodName"] == NAME and third["K8sAttempt"] == 0
        assert api.calls[("create", "pods")] == 1 and pods(api) == [NAME]
    finally:
        fresh.stop()


def test_gone_source_deletes_the_live_pod_at_once(api, settings):
    """condor_rm of the source job (JobStatus 3), or a held source: the cleanup deletes as always."""
    probe = FixedProbe(GONE)
    agent = new_agent(api, settings, source_probe=probe)
    try:
        ad = running_job(agent, api, settings)
        status, parts = cleanup(agent, ad)
        assert status == protocol.STATUS_OK and parts == [b"1 pod(s) deleted"]
        assert probe.asked == ["4711.0"] and agent.journal.released_at(NAME) is None
        run_effects(agent)
        assert stored(api) is None
    finally:
        agent.stop()


def test_unknown_source_is_released_until_the_grace_and_a_second_cleanup_renews_it(api, settings):
    """Schedd down: every poll's cleanup asks, gets "unknown" and renews the release; once no
    cleanup or adoption came for CE_K8S_RELEASE_GRACE seconds, the GC deletes the pod."""
    probe = FixedProbe(UNKNOWN)
    agent = new_agent(api, settings, source_probe=probe, options=AgentOptions(release_grace=300))
    try:
        ad = running_job(agent, api, settings)
        status, parts = cleanup(agent, ad)
        assert status == protocol.STATUS_OK and b"released" in parts[0] and b"unknown" in parts[0]
        first = agent.journal.released_at(NAME)
        assert agent.garbage.collect(now=first + 299) == [] and pods(api) == [NAME]
        agent.clock.advance(0.2)
        assert cleanup(agent, ad)[0] == protocol.STATUS_OK           # the next poll: renewed
        second = agent.journal.released_at(NAME)
        assert second > first + 0.1 and probe.asked == ["4711.0", "4711.0"]
        assert agent.garbage.collect(now=first + 300.05) == [] and pods(api) == [NAME]
        assert agent.garbage.collect(now=second + 300) == [NAME]
        run_effects(agent)
        assert stored(api) is None
        assert agent.journal.released_at(NAME) is None
        assert PostJournal(agent.output.directory, clock=agent.clock).released_at(NAME) is None  # and on disk
    finally:
        agent.stop()


def test_finished_pod_is_deleted_whatever_the_probe_would_say(waiting, api, settings):
    """Normal completion: nothing live to keep, so the probe is not even asked."""
    agent = waiting
    ad = running_job(agent, api, settings)
    api.set_status(NAME, {"phase": "Succeeded", "containerStatuses": [{"name": "pilot", "state": {"terminated": {
        "exitCode": 0, "startedAt": "2025-10-09T08:55:00Z", "finishedAt": "2025-10-09T09:05:00Z"}}}]})
    assert agent.cache.get(NAME).phase == "Succeeded"
    status, parts = cleanup(agent, ad)
    assert status == protocol.STATUS_OK and parts == [b"1 pod(s) deleted"]
    assert agent.probe.asked == [] and agent.journal.released_at(NAME) is None


def test_held_job_pod_is_deleted_not_released(waiting, api, settings):
    """A job the agent (or anyone) holds gets no re-route from this cleanup worth keeping a pod for."""
    agent = waiting
    ad = running_job(agent, api, settings)
    ad["JobStatus"] = 5
    reply = cleanup(agent, ad)
    assert reply == (protocol.STATUS_OK, [b"1 pod(s) deleted"]) and agent.probe.asked == []


def test_agent_restart_between_release_and_adoption_still_adopts(api, settings):
    """The release is in the post journal: a fresh agent adopts, and its GC counts the grace from
    the release the dead agent wrote."""
    first = new_agent(api, settings, source_probe=FixedProbe(WAITING))
    try:
        ad = running_job(first, api, settings)
        cleanup(first, ad)
        released = first.journal.released_at(NAME)
    finally:
        first.stop()
    second = new_agent(api, settings, source_probe=FixedProbe(WAITING))
    try:
        assert second.journal.released_at(NAME) == pytest.approx(released, abs=0.001)
        out = update(second, rerouted(settings))
        assert out["K8sPodName"] == NAME and out["K8sAttempt"] == 0 and out["JobStatus"] == 2
        assert api.calls[("create", "pods")] == 1 and pods(api) == [NAME]
    finally:
        second.stop()


def test_released_pod_expires_after_a_restart_without_adoption(api, settings):
    first = new_agent(api, settings, source_probe=FixedProbe(UNKNOWN))
    try:
        cleanup(first, running_job(first, api, settings))
        released = first.journal.released_at(NAME)
    finally:
        first.stop()
    second = new_agent(api, settings, source_probe=FixedProbe(UNKNOWN))
    try:
        assert second.garbage.collect(now=released + 299) == []
        assert second.garbage.collect(now=released + 301) == [NAME]
        run_effects(second)
        assert stored(api) is None
    finally:
        second.stop()


@pytest.mark.parametrize("who", ["owner", "job"])
def test_released_pod_of_another_owner_or_job_is_never_adopted(waiting, api, settings, who):
    """Adoption needs the pod's global-job-id annotation and owner to be the re-routed job's."""
    agent = waiting
    ad = running_job(agent, api, settings)
    cleanup(agent, ad)
    other_gjid = "ce.example.org#4711.0#1760000999"
    stranger = rerouted(settings, owner="otherpilot") if who == "owner" else \
        routed_ad(Path(settings.spool), attempt=1, ClusterId=104712, gjid=other_gjid)
    out = update(agent, stranger)
    assert "K8sPodName" not in out and out["K8sPodReason"] == "creating pod"
    assert agent.journal.released_at(NAME) is not None
    run_effects(agent)
    assert stored(api, stranger["K8sPodName"])
    assert NAME in pods(api) and agent.journal.released_at(NAME) is not None


def test_rerouted_job_cleaned_up_before_adopting_renews_the_release(waiting, api, settings):
    """The schedd goes away again before the re-routed job's first update: its cleanup (naming the
    never-created attempt-1 pod) keeps the released attempt-0 pod; the third routing adopts it."""
    agent = waiting
    cleanup(agent, running_job(agent, api, settings))
    status, parts = cleanup(agent, rerouted(settings))
    assert status == protocol.STATUS_OK and NAME.encode() in parts[0] and b"released" in parts[0]
    assert pods(api) == [NAME]
    out = update(agent, rerouted(settings, cluster_id=104713))
    assert out["K8sPodName"] == NAME and api.calls[("create", "pods")] == 1


def test_a_name_cleaned_up_before_but_never_created_is_created_when_no_pod_can_be_adopted(waiting, api,
                                                                                          settings):
    """Same as above, but the released pod is evicted before the third routing: the job gets
    attempt 1's pod, although the cleanup of the second routing already saw that name."""
    agent = waiting
    cleanup(agent, running_job(agent, api, settings))
    cleanup(agent, rerouted(settings))
    api.evict(NAME)                                              # the policy/v1 Eviction API
    assert agent.cache.get(NAME) is None
    third = rerouted(settings, cluster_id=104713)
    out = update(agent, third)
    assert "K8sPodName" not in out and out["K8sPodReason"] == "creating pod"
    run_effects(agent)
    assert stored(api, NEXT)
    assert pods(api) == [NEXT]


def test_update_naming_a_released_pod_claims_it(waiting, api, settings):
    """The router re-adopted the routed job (AdoptOrphans after a router restart), or the re-routed
    job got the same name: the pod is in use again and the GC must not expire it."""
    agent = waiting
    ad = running_job(agent, api, settings)
    cleanup(agent, ad)
    update(agent, ad)
    assert agent.journal.released_at(NAME) is None
    agent.garbage.collect(now=agent.clock() + 10_000)
    assert pods(api) == [NAME]


def test_probe_off_means_unknown(api, settings):
    """CE_K8S_SOURCE_PROBE = false: no schedd is asked; a live pod is always released."""
    agent = new_agent(api, settings, source_probe=None, options=AgentOptions(source_probe=False))
    try:
        status, parts = cleanup(agent, running_job(agent, api, settings))
        assert status == protocol.STATUS_OK and b"unknown" in parts[0] and pods(api) == [NAME]
    finally:
        agent.stop()



# -- the htcondor2 probe, with a fake schedd ---------------------------------------------------------


class FakeSchedd:
    def __init__(self, answer):
        self.answer = answer
        self.queries: list[dict] = []

    def query(self, **kwargs):
        self.queries.append(kwargs)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(("ads", "verdict"), [
    ([], GONE), ([{"JobStatus": 3}], GONE), ([{"JobStatus": 4}], GONE), ([{"JobStatus": 5}], GONE),
    ([{"JobStatus": 1}], WAITING), ([{"JobStatus": 2}], WAITING), ([{}], UNKNOWN), ([{"JobStatus": "2"}], UNKNOWN),
])
def test_condor_probe_maps_the_source_jobstatus(ads, verdict):
    from ce_k8s.agent.sourceprobe import CondorSourceProbe

    schedd = FakeSchedd(ads)
    assert CondorSourceProbe(lambda: schedd).status("4711.3") == verdict
    assert schedd.queries == [{"constraint": "ClusterId == 4711 && ProcId == 3", "projection": ["JobStatus"],
                               "limit": 1}]


def test_condor_probe_failure_is_unknown_quiet_for_a_while_and_logged_once_a_minute(caplog):
    from ce_k8s.agent.sourceprobe import CondorSourceProbe

    clock = [1000.0]
    schedd = FakeSchedd(RuntimeError("Unable to locate local daemon"))
    probe = CondorSourceProbe(lambda: schedd, retry_after=5, log_every=60, clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="ce_k8s.agent"):
        assert probe.status("1.0") == UNKNOWN
        assert probe.status("2.0") == UNKNOWN                      # within retry_after: not asked
        assert len(schedd.queries) == 1
        for _ in range(5):
            clock[0] += 6
            assert probe.status("3.0") == UNKNOWN
    assert len(schedd.queries) == 6 and probe.failures == 6
    warnings = [r.getMessage() for r in caplog.records if "event=source-probe-failed" in r.getMessage()]
    assert len(warnings) == 1 and "Unable to locate" in warnings[0]
    clock[0] += 60
    schedd.answer = [{"JobStatus": 2}]
    assert probe.status("3.0") == WAITING


def test_condor_probe_refuses_a_bad_job_id_without_asking():
    from ce_k8s.agent.sourceprobe import CondorSourceProbe

    schedd = FakeSchedd([])
    probe = CondorSourceProbe(lambda: schedd)
    for bad in ("", "4711", "4711.x", "1.0 || true", "-1.0", None):
        assert probe.status(bad) == UNKNOWN
    assert schedd.queries == []


def test_default_probe_follows_the_knob(settings):
    from ce_k8s.agent.sourceprobe import CondorSourceProbe, SourceProbe, make_source_probe

    assert isinstance(make_source_probe(True), CondorSourceProbe)
    off = make_source_probe(False)
    assert type(off) is SourceProbe and off.status("1.0") == UNKNOWN
    assert isinstance(fake_agent(settings, source_probe=None).cleanups.source_probe, CondorSourceProbe)
    off_agent = fake_agent(settings, source_probe=None, options=AgentOptions(source_probe=False))
    assert type(off_agent.cleanups.source_probe) is SourceProbe


def test_knobs_are_read_from_the_configuration():
    from ce_k8s.agent.options import OptionsError
    from ce_k8s.condor.config import CondorConfig

    assert AgentOptions.from_config(CondorConfig.from_text("")).source_probe is True
    assert AgentOptions.from_config(CondorConfig.from_text("")).release_grace == 300
    opts = AgentOptions.from_config(CondorConfig.from_text("CE_K8S_SOURCE_PROBE = false\nCE_K8S_RELEASE_GRACE = 60\n"))
    assert (opts.source_probe, opts.release_grace) == (False, 60)
    for text in ("CE_K8S_SOURCE_PROBE = perhaps", "CE_K8S_RELEASE_GRACE = soon", "CE_K8S_RELEASE_GRACE = -1"):
        with pytest.raises(OptionsError, match=r"^x\.conf:1: CE_K8S_"):
            AgentOptions.from_config(CondorConfig.from_text(text, "x.conf"))
