"""The agent's watch cache against the real API server: a real 410 Gone, and a paged LIST.

A real kube-apiserver answers a WATCH from a resourceVersion it no longer holds with 410 (its
watch cache starts afresh at every start; etcd compaction removes the history below it), and
pages a LIST with `limit`/`continue`. The emulator plays both; these tests take the real
server's word that the agent's resume, relist and paging (ce_k8s/agent/cache.py) hold.
"""

from __future__ import annotations

import json
import logging
import urllib.request

from kubernetes.client.rest import ApiException

from ce_k8s.agent import cache as cache_module
from ce_k8s.real.kube import kwokstages

from .conftest import running_agent, wait_for
from .test_lifecycle import pilot, read_pod, status_is, until


def _etcd(etcd: str, path: str, body: dict) -> dict:
    """One call of etcd's JSON gateway (the bed's own loopback etcd)."""
    req = urllib.request.Request(etcd + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def etcd_revision(etcd: str) -> int:
    return int(_etcd(etcd, "/v3/kv/range", {"key": "AA=="})["header"]["revision"])


def etcd_compact(etcd: str) -> int:
    """Compact etcd, physically, at its current revision (kube-apiserver does it every 5 min)."""
    revision = etcd_revision(etcd)
    _etcd(etcd, "/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def our_pods(core, namespace: str) -> list[str]:
    return sorted(p.metadata.name for p in core.list_namespaced_pod(namespace).items)


def test_a_real_410_makes_the_agent_relist_and_every_job_stays_true(real_kube, admin_core, pilot_namespace,
                                                                     caplog):
    """The watch is cut (the agent keeps its resourceVersion), pods change meanwhile (one pilot
    ends, one is deleted by an admin), etcd is compacted and kube-apiserver restarted: the resumed
    WATCH gets a real 410, the agent relists, and the routed jobs read the truth from the LIST:
    the running one still running, the ended one completed with its exit code, the deleted one's
    fate unknowable (it vanished unwatched) and so a new attempt, as docs/holds.md says. No pod is
    created twice."""
    caplog.set_level(logging.INFO, logger="ce_k8s.agent.cache")
    with running_agent(real_kube, pilot_namespace) as (agent, settings, _):
        running = pilot(settings, pilot_namespace, cluster=4711)
        ending = pilot(settings, pilot_namespace, cluster=4712,
                       annotations={kwokstages.RUN_FOR: "2s", kwokstages.EXIT_CODE: "7"})
        deleted = pilot(settings, pilot_namespace, cluster=4713)
        for ad in (running, deleted):
            until(agent, ad, status_is(2), "the pilot running")
        until(agent, ending, lambda a: a.get("K8sPodUid"), "the ending pilot's pod")
        lists, creates = agent.cache.lists, agent.metrics["creates"]

        agent.cache.stop()                          # the watch is cut; its resourceVersion is kept
        old_rv = agent.cache.resource_version
        wait_for(lambda: admin_core.read_namespaced_pod(ending["K8sPodName"], pilot_namespace).status.phase
                 == "Failed", what="the ending pilot's pod to end")
        admin_core.delete_namespaced_pod(deleted["K8sPodName"], pilot_namespace)
        wait_for(lambda: read_pod(admin_core, pilot_namespace, deleted["K8sPodName"]) is None, what="deleted")
        assert etcd_compact(real_kube.state().etcd) > int(old_rv)
        real_kube.restart("kube-apiserver", progress=lambda m: None)
        with caplog.at_level(logging.INFO, logger="ce_k8s.agent.cache"):
            caplog.clear()
            agent.cache.start()
            wait_for(lambda: agent.cache.lists > lists, timeout=60, what="the relist")
        assert "event=watch-expired" in caplog.text and "event=relisted" in caplog.text, caplog.text

        until(agent, ending, status_is(4), "the ended pilot completed")
        assert ending["ExitCode"] == 7
        assert update_keeps(agent, running) == 2
        until(agent, deleted, lambda a: a.get("K8sAttempt") == 1, "the deleted pilot's next attempt")
        assert deleted["JobStatus"] == 1 and "not watching" in deleted["K8sPodReason"], dict(deleted)
        until(agent, deleted, status_is(2), "the next attempt running")
        assert agent.metrics["creates"] == creates + 1          # only the deleted pilot's next attempt
        assert our_pods(admin_core, pilot_namespace) == sorted(
            [running["K8sPodName"], ending["K8sPodName"], deleted["K8sPodName"]])
        assert sorted(agent.cache.pods) == our_pods(admin_core, pilot_namespace)


def update_keeps(agent, ad) -> int:
    from agent.test_agent import update

    update(agent, ad)
    return ad["JobStatus"]


def test_paged_relist_returns_every_pod_once(real_kube, admin_core, pilot_namespace, monkeypatch):
    """With a page smaller than the pods, the real server's `continue` tokens walk the whole set:
    every pod is in the cache once, after as many pages as it takes."""
    monkeypatch.setattr(cache_module, "LIST_PAGE", 2)
    with running_agent(real_kube, pilot_namespace) as (agent, settings, _):
        ads = [pilot(settings, pilot_namespace, cluster=c) for c in range(4711, 4718)]
        for ad in ads:
            until(agent, ad, lambda a: a.get("K8sPodUid"), "the pod created")
        pages: list[str | None] = []
        list_page = agent.cache._list_page

        def counted(cont):
            pages.append(cont)
            return list_page(cont)
        agent.cache._list_page = counted
        agent.cache.relist()
        names = sorted(ad["K8sPodName"] for ad in ads)
        assert sorted(agent.cache.pods) == names == our_pods(admin_core, pilot_namespace)
        assert len(pages) == 4 and pages[0] is None and all(pages[1:]), pages
        for ad in ads:      # the jobs read from the paged cache
            until(agent, ad, status_is(2), "the pilot running")


def test_a_watch_from_a_compacted_revision_is_410_on_the_real_server(agent_client, real_kube):
    """The server side of the test above, with the agent's own token: after a compaction and a
    restart, a WATCH from an old resourceVersion is refused with 410 Gone."""
    from kubernetes import client

    core = client.CoreV1Api(agent_client)
    old = core.list_pod_for_all_namespaces(limit=1).metadata.resource_version
    # Writes happen all the time (node leases): wait until etcd has moved past `old`.
    wait_for(lambda: etcd_revision(real_kube.state().etcd) > int(old), what="etcd moving on")
    etcd_compact(real_kube.state().etcd)
    real_kube.restart("kube-apiserver", progress=lambda m: None)
    try:
        resp = core.list_pod_for_all_namespaces(watch=True, resource_version=old, timeout_seconds=5,
                                                _preload_content=False)
        first = json.loads(next(iter(resp.stream())).splitlines()[0])
        status = first["object"]["code"] if first["type"] == "ERROR" else 200
    except ApiException as exc:
        status = exc.status
    assert status == 410


def test_the_agent_stops_at_once_with_its_watch_open(real_kube, pilot_namespace):
    """Stopping the agent (SIGTERM) must not wait for the real server to end the WATCH (up to
    `watch_timeout`, 300 s by default; a real server sends nothing while nothing changes): closing
    the response alone does not wake a thread blocked reading its socket."""
    import time

    with running_agent(real_kube, pilot_namespace) as (agent, _settings, _):
        agent.cache.watch_timeout = 120
        agent.cache.stop()          # reopen the watch with the long timeout
        agent.cache.start()
        wait_for(lambda: agent.cache._resp is not None, what="the watch open")
        started = time.monotonic()
        agent.cache.stop()
        took = time.monotonic() - started
        assert not agent.cache._thread.is_alive() and took < 2.0, f"stop took {took:.1f} s"
        agent.cache.start()         # the context's own stop finds a running cache, as it expects


def test_a_continue_expired_mid_relist_starts_the_list_over(real_kube, admin_core, pilot_namespace, monkeypatch):
    """Between two pages of the agent's relist, etcd moves on and is compacted and kube-apiserver
    restarts (its watch-cache snapshots, which would still serve the old continue, are gone): the
    continue gets a real 410 and the agent lists again from the start, keeping nothing of the
    abandoned pages; the cache ends with every pod once."""
    monkeypatch.setattr(cache_module, "LIST_PAGE", 2)
    with running_agent(real_kube, pilot_namespace) as (agent, settings, _):
        ads = [pilot(settings, pilot_namespace, cluster=c) for c in range(4711, 4716)]
        for ad in ads:
            until(agent, ad, lambda a: a.get("K8sPodUid"), "the pod created")
        pages: list[str | None] = []
        errors: list[int] = []
        list_page = agent.cache._list_page

        def expiring(cont):
            pages.append(cont)
            if cont and len(pages) == 2:        # the first continue: expire it
                admin_core.create_namespaced_config_map(pilot_namespace, {"metadata": {"name": "write"}})
                etcd_compact(real_kube.state().etcd)
                real_kube.restart("kube-apiserver", progress=lambda m: None)
            try:
                return list_page(cont)
            except ApiException as exc:
                errors.append(exc.status)
                raise
        agent.cache._list_page = expiring
        agent.cache.relist()
        names = sorted(ad["K8sPodName"] for ad in ads)
        assert errors == [410] and pages[2] is None, (errors, pages)
        assert sorted(agent.cache.pods) == names == our_pods(admin_core, pilot_namespace)
