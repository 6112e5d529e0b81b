"""Structured logs (issue 8 item 4, docs/agent.md "Logs"): every agent
line is `event=... key=value ...`, and every line about a job or pod names the job. The agent runs on
the in-memory fakes (fakes.py): the lines are the same with no API server behind it."""

from __future__ import annotations

import logging
from pathlib import Path

from ce_k8s import protocol
from ce_k8s.agent.logfmt import fields, parse
from ce_k8s.pods.names import pod_name

from .conftest import GJID, apply_output, routed_ad, text_of
from .fakes import run_effects

NAME = pod_name(GJID, 0)


def test_every_agent_line_is_key_value_with_the_job(memory_agent, settings, caplog):
    agent = memory_agent
    caplog.set_level(logging.INFO, logger="ce_k8s")
    ad = routed_ad(Path(settings.spool))
    apply_output(ad, agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)[1][0])
    run_effects(agent)
    assert agent.cache.get(NAME)
    agent.api.logs[NAME] = [("stdout", b"ok\n")]
    agent.api.set_status(NAME, {"phase": "Succeeded", "containerStatuses": [{"name": "pilot", "state": {
        "terminated": {"exitCode": 0, "startedAt": "2025-10-09T08:55:00Z", "finishedAt": "2025-10-09T09:05:00Z"}}}]})
    run_effects(agent)
    assert agent.output.has(NAME)
    apply_output(ad, agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)[1][0])
    agent.handle(protocol.VERB_LOGS, text_of(ad), 0)
    agent.handle(protocol.VERB_UPDATE, text_of(routed_ad(Path(settings.spool), owner="x")), 4242)
    agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    run_effects(agent)
    assert agent.cache.get(NAME) is None

    lines = [r.getMessage() for r in caplog.records if r.name.startswith("ce_k8s.agent")]
    events = [parse(line) for line in lines]
    assert all(line.startswith("event=") for line in lines), lines
    seen = {e["event"] for e in events}
    assert {"pod-created", "output-saved", "job-status", "output-returned", "request-denied", "cleanup",
            "pod-deleted"} <= seen, seen
    for e in events:
        if "pod" in e or e["event"].startswith(("job-", "output-", "request-", "cleanup", "pod-")):
            assert e.get("job") and e["job"] != "?", e
    assert {e["job"] for e in events if e["event"] != "request-denied" and "job" in e} == {"104711.0"}
    status = next(e for e in events if e["event"] == "job-status")
    assert status["status"] == "4" and status["pod"] == NAME


def test_job_text_cannot_forge_a_field_or_a_line():
    hostile = 'x" job=0.0 event=evil\nevent=forged'
    line = str(fields(event="build-failed", job="12.0", error=hostile))
    assert "\n" not in line
    assert parse(line) == {"event": "build-failed", "job": "12.0", "error": 'x" job=0.0 event=evil event=forged'}
