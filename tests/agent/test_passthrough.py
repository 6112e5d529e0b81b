"""Routed jobs of another backend reach the agent only by mistake (an old launcher, a forged call):
it answers update, cleanup and logs for them with an empty OK / notfound, makes no API call, keeps
no record, and `list` does not show them (docs/routes.md "CEs with other backends")."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ce_k8s import protocol

from .conftest import routed_ad, text_of, wait
from .test_agent import NAME, stored, update


def _writes_and_reads(server) -> dict:
    """API calls other than the agent's own list/watch of pods (those run on their own schedule)."""
    return {k: n for k, n in server.calls.items() if k[0] not in ("list", "watch")}


def test_other_backend_gets_no_pod_no_call_no_row(agent, server, settings):
    before = _writes_and_reads(server)
    for grid in ("batch slurm", "batch k8sx", None):
        ad = routed_ad(Path(settings.spool), RouteName="Slurm", GridResource=grid)
        assert agent.handle(protocol.VERB_UPDATE, text_of(ad), 0) == (protocol.STATUS_OK, [b""])
        assert agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)[0] == protocol.STATUS_NOTFOUND
        assert agent.handle(protocol.VERB_LOGS, text_of(ad), 0)[0] == protocol.STATUS_NOTFOUND
    time.sleep(0.3)                          # a create would be queued to the creator threads
    assert _writes_and_reads(server) == before
    assert stored(server) is None and not agent.jobs and agent.metrics["updates"] == 0
    _status, parts = agent.handle(protocol.VERB_LIST, b"", 0)
    assert json.loads(parts[0])["pilots"] == []


def test_other_backend_cleanup_never_deletes_a_kubernetes_pod(agent, server, settings):
    ours = routed_ad(Path(settings.spool))
    update(agent, ours)
    wait(lambda: agent.cache.get(NAME))
    forged = routed_ad(Path(settings.spool), GridResource="BATCH  slurm")   # same K8sPodName
    deletes = server.calls[("delete", "pods")]
    assert agent.handle(protocol.VERB_CLEANUP, text_of(forged), 0)[0] == protocol.STATUS_NOTFOUND
    assert server.calls[("delete", "pods")] == deletes and stored(server) is not None
    # the same words in another case and extra words still count as ours
    assert agent.handle(protocol.VERB_UPDATE, text_of(routed_ad(Path(settings.spool), GridResource="BATCH K8s b")),
                        0)[1] != [b""]
