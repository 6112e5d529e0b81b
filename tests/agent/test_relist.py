"""A relist at size: what an agent stopped in the middle of one leaves behind (nothing) and what
its successor serves (docs/agent.md "What the agent does", "Relists at size"; issue 17 "restart
while a relist runs must lose nothing").

The LIST is paced by the emulator's request latency so that the first agent is stopped while
it holds part of the pages; the second agent must then list everything, answer every job with
its pod's true status, and neither agent may create or delete a pod or write the post journal.
"""

from __future__ import annotations

import copy
from pathlib import Path

from kubernetes import config as kconfig

from ce_k8s import protocol
from ce_k8s.agent.agent import Agent
from ce_k8s.agent.cache import LIST_PAGE
from ce_k8s.agent.journal import PostJournal

from .conftest import make_spool, new_agent, routed_ad, text_of, wait
from .test_agent import set_status, update
from .test_release import RUNNING

JOBS = 3
FILLER = 2 * LIST_PAGE + 100        # three pages in all


def _jobs(agent, server, settings, root: Path) -> list:
    """JOBS routed jobs whose pods the agent created and that now run."""
    ads = []
    for i in range(JOBS):
        cluster = 4800 + i
        make_spool(root, cluster=cluster)
        gjid = f"ce.example.org#{cluster}.0#1760000000"
        ad = routed_ad(Path(settings.spool), cluster=cluster, gjid=gjid)
        update(agent, ad)
        name = ad["K8sPodName"]
        wait(lambda name=name: agent.cache.get(name))
        set_status(server, RUNNING, name=name)
        wait(lambda name=name: agent.cache.get(name).phase == "Running")
        ads.append(ad)
    return ads


def _fill(server, template: dict, count: int) -> None:
    """`count` more pods of this CE, stored directly (the create path is not under test)."""
    def put() -> None:
        for i in range(count):
            pod = copy.deepcopy(template)
            pod["metadata"]["name"] = f"filler-{i:05d}"
            pod["metadata"]["uid"] = f"filler-uid-{i:05d}"
            pod["metadata"].pop("resourceVersion", None)
            server.store.put("pods", pod, "ADDED")
    server.call(put, timeout=60)


def test_an_agent_stopped_mid_relist_leaves_nothing_behind_and_its_successor_serves_all(
        server, settings, tmp_root):
    first = new_agent(server, settings)
    try:
        ads = _jobs(first, server, settings, tmp_root)
    finally:
        first.stop()
    template = server.call(server.api.get, "pods", "default", ads[0]["K8sPodName"])
    _fill(server, template, FILLER)
    journal_before = PostJournal(first.output.directory).posted(ads[0]["K8sPodName"])
    calls_before = server.calls

    # The second agent lists slowly (every request waits 0.5 s) and is stopped after its first page.
    server.faults.configure(latency=0.5)
    lists_before = calls_before[("list", "pods")]
    api = kconfig.new_client_from_config(config_file=server.kubeconfig_path)
    second = Agent(settings, api, request_timeout=5.0, watch_timeout=5)
    second.start(wait_ready=None)
    try:
        wait(lambda: server.calls[("list", "pods")] > lists_before)
        # Until its LIST is complete the agent says so (the hook exits without output: "no sync"),
        # never a status read from part of the pods.
        assert second.handle(protocol.VERB_UPDATE, text_of(ads[0]), 0) == \
            (protocol.STATUS_BUSY, [b"agent is still listing pods"])
    finally:
        second.stop()
    assert not second.cache.ready.is_set() and second.cache.pods == {}, "the stop did not fall mid-relist"
    server.faults.configure(latency=0.0)

    third = new_agent(server, settings)
    try:
        assert len(third.cache.pods) == JOBS + FILLER
        for ad in ads:
            out = update(third, ad)
            assert out["JobStatus"] == 2 and out["K8sPodPhase"] == "Running", ad["K8sPodName"]
        after = server.calls
        for verb in ("create", "delete", "deletecollection"):
            assert after[(verb, "pods")] == calls_before[(verb, "pods")], verb
            assert after[(verb, "secrets")] == calls_before[(verb, "secrets")], verb
        assert PostJournal(third.output.directory).posted(ads[0]["K8sPodName"]) == journal_before
    finally:
        third.stop()



def test_an_expired_continue_token_restarts_the_list_and_keeps_no_page_of_the_first_try():
    """410 on a continuation (the server dropped the LIST's snapshot): the agent lists again from
    the first page, with the next page asked for before the current one is read (prefetch), and
    keeps exactly one copy of every pod."""
    import json

    from kubernetes.client.exceptions import ApiException

    from ce_k8s.agent.cache import PodCache

    def page(names, cont, rv="7"):
        return json.dumps({"metadata": {"resourceVersion": rv, **({"continue": cont} if cont else {})},
                           "items": [{"metadata": {"name": n, "uid": f"u-{n}"}} for n in names]}).encode()

    class Paged:
        def __init__(self):
            self.asked: list[str | None] = []
            self.expired = False

        def list_pod_for_all_namespaces(self, **kw):
            cont = kw.get("_continue")
            self.asked.append(cont)
            if cont == "t1" and not self.expired:
                self.expired = True
                raise ApiException(status=410, reason="Expired")

            class R:
                data = {None: page(["a", "b"], "t1"), "t1": page(["c"], "t2"), "t2": page(["d"], None)}[cont]
            return R()

    api = Paged()
    cache = PodCache(api, "x")
    cache.relist()
    assert sorted(cache.pods) == ["a", "b", "c", "d"] and cache.ready.is_set() and cache.resource_version == "7"
    assert api.asked == [None, "t1", None, "t1", "t2"]
