"""The agent against the API emulator: what needs HTTP (a lost answer, a retry on the workers'
own schedule, the watch cut and relisted). The create, map, restart and clean-up decisions are in
test_decisions.py, on in-memory collaborators.

References: docs/design.md Decisions 3-5; docs/hook-protocol.md §2.3 (update output rules), §2.5
(cleanup), hook-protocol.md §8; design.md Decision 5 (exactly-once pods under faults).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ce_k8s.agent.cache import GoneError, PodCache
from ce_k8s.pods.names import pod_name, secret_name

from .conftest import GJID, new_agent, routed_ad, update, wait

NAME = pod_name(GJID, 0)



def stored(server, name=NAME, resource="pods"):
    try:
        return server.call(server.api.get, resource, "default", name)
    except Exception:
        return None


def set_status(server, status, name=NAME):
    def mutate(pod):
        pod["status"] = status
    server.call(server.api.write, "pods", "default", name, mutate)


def test_timeout_after_accept_is_adopted_not_duplicated(server, settings):
    """docs/design.md Decision 5: the server created the pod but the answer was lost."""
    server.faults.inject("timeout", verb="create", resource="pods")
    agent = new_agent(server, settings, request_timeout=1.0)
    try:
        ad = routed_ad(Path(settings.spool))
        update(agent, ad)
        wait(lambda: agent.jobs[NAME].creation.info.state == "retry", timeout=10)
        assert stored(server) is not None
        agent.jobs[NAME].creation.next_try = 0
        update(agent, ad)
        wait(lambda: agent.jobs[NAME].creation.info.state == "done", timeout=10)
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
        wait(lambda: agent.jobs[NAME].creation.info.state == "done", timeout=30)
        assert stored(server) is not None and stored(server, secret_name(NAME), "secrets") is not None
        assert agent.jobs[NAME].creation.failures == 0 and agent.effects.queue.failures(NAME) == 0
        assert len(server.call(server.api.list, "pods", "default")["items"]) == 1
    finally:
        agent.stop()


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
