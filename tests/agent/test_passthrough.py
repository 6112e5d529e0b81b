"""Routed jobs of another backend reach the agent only by mistake (an old launcher, a forged call):
it answers update, cleanup and logs for them with an empty OK / notfound, makes no API call, keeps
no record, and `list` does not show them (docs/routes.md "CEs with other backends"). The agent here
runs on in-memory collaborators (fakes.py): every call it would make is counted, none is sent."""

from __future__ import annotations

import json
from pathlib import Path

from ce_k8s import protocol

from .conftest import routed_ad, text_of
from .fakes import run_effects
from .test_agent import NAME, update


def _writes_and_reads(api) -> dict:
    """API calls other than the agent's own list/watch of pods (those run on their own schedule)."""
    return {k: n for k, n in api.calls.items() if k[0] not in ("list", "watch")}


def test_other_backend_gets_no_pod_no_call_no_row(memory_agent, settings):
    agent = memory_agent
    before = _writes_and_reads(agent.api)
    for grid in ("batch slurm", "batch k8sx", None):
        ad = routed_ad(Path(settings.spool), RouteName="Slurm", GridResource=grid)
        assert agent.handle(protocol.VERB_UPDATE, text_of(ad), 0) == (protocol.STATUS_OK, [b""])
        assert agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)[0] == protocol.STATUS_NOTFOUND
        assert agent.handle(protocol.VERB_LOGS, text_of(ad), 0)[0] == protocol.STATUS_NOTFOUND
    assert run_effects(agent) == 0           # a create would be queued on the work queue
    assert _writes_and_reads(agent.api) == before
    assert NAME not in agent.api.pods and not agent.jobs and agent.metrics["updates"] == 0
    _status, parts = agent.handle(protocol.VERB_LIST, b"", 0)
    assert json.loads(parts[0])["pilots"] == []


def test_other_backend_cleanup_never_deletes_a_kubernetes_pod(memory_agent, settings):
    agent, api = memory_agent, memory_agent.api
    ours = routed_ad(Path(settings.spool))
    update(agent, ours)
    run_effects(agent)
    assert agent.cache.get(NAME)
    forged = routed_ad(Path(settings.spool), GridResource="BATCH  slurm")   # same K8sPodName
    deletes = api.calls[("delete", "pods")]
    assert agent.handle(protocol.VERB_CLEANUP, text_of(forged), 0)[0] == protocol.STATUS_NOTFOUND
    run_effects(agent)
    assert api.calls[("delete", "pods")] == deletes and api.pods.get(NAME) is not None
    # the same words in another case and extra words still count as ours
    assert agent.handle(protocol.VERB_UPDATE, text_of(routed_ad(Path(settings.spool), GridResource="BATCH K8s b")),
                        0)[1] != [b""]
