"""The `list` verb behind `ce-k8s status` (issue 8 item 3): one row per pilot pod, plus held jobs
whose pod is gone; root sees all, a pilot account its own jobs; never credential content.

The client side is `ce_k8s.ops.status.rows_from_agent`; the first test goes through it over the
real socket, so the two ends are checked against each other. The others ask the verb directly, of
an agent on in-memory collaborators (fakes.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ce_k8s import protocol
from ce_k8s.ops.status import PilotRow, agent_offers_list, rows_from_agent
from ce_k8s.pods.names import pod_name

from .conftest import make_spool, routed_ad, wait
from .fakes import run_effects
from .test_agent import NAME, update


def test_list_rows_match_the_status_client(agent, server, settings):
    ad = routed_ad(Path(settings.spool), ClusterId=104711, ProcId=0, RouteName="K8s_CPU")
    update(agent, ad)
    wait(lambda: agent.cache.get(NAME))
    update(agent, ad)
    assert agent_offers_list()
    rows = rows_from_agent(settings.socket)
    assert len(rows) == 1
    row = rows[0]
    assert (row.routed_job, row.source_job, row.owner, row.pod, row.namespace) == \
        ("104711.0", "4711.0", "cmspilot", NAME, "default")
    assert row.status == "Idle" and row.phase == "Pending" and row.attempt == 0 and row.created
    _status, parts = agent.handle(protocol.VERB_LIST, b"", 0)
    raw = json.loads(parts[0])["pilots"][0]
    expected = {f.name for f in dataclasses.fields(PilotRow)} - {"age"}
    assert set(raw) == expected
    assert b"PROXY" not in parts[0]                  # the spooled proxy's content (conftest.make_spool)


def test_held_job_whose_pod_is_gone_is_listed(memory_agent, settings):
    agent = memory_agent
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)                 # create the job's pod, let the agent report it once,
    run_effects(agent)
    update(agent, ad)
    agent.api.remove(NAME)            # then delete it outside ce-k8s
    assert agent.cache.get(NAME) is None
    out = update(agent, ad)
    assert out["JobStatus"] == 5
    _status, parts = agent.handle(protocol.VERB_LIST, b"", 0)
    pilots = json.loads(parts[0])["pilots"]
    assert [(p["pod"], p["status"], p["phase"]) for p in pilots] == [(NAME, "Held", "Gone")]
    assert "deleted" in pilots[0]["hold_reason"]


def test_pilot_account_sees_only_its_own_jobs(memory_agent, settings):
    agent = memory_agent
    for cluster in (1, 2):
        make_spool(Path(settings.spool).parent, cluster)
    mine = routed_ad(Path(settings.spool), owner="alice", gjid="ce#1.0#1", cluster=1)
    theirs = routed_ad(Path(settings.spool), owner="bob", gjid="ce#2.0#1", cluster=2)
    agent.access._uids.update({"alice": 50001, "bob": 50002})
    for ad in (mine, theirs):
        update(agent, ad)
    run_effects(agent)
    assert agent.cache.get(pod_name("ce#1.0#1", 0)) and agent.cache.get(pod_name("ce#2.0#1", 0))

    def owners(uid):
        status, parts = agent.handle(protocol.VERB_LIST, b"", uid)
        assert status == protocol.STATUS_OK
        return sorted(p["owner"] for p in json.loads(parts[0])["pilots"])
    assert owners(0) == ["alice", "bob"]
    assert owners(50001) == ["alice"]
    assert owners(50002) == ["bob"]
    assert owners(50003) == []
