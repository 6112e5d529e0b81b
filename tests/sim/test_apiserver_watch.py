"""Watch semantics of the API emulator (official client and raw HTTP).

kmock's watch replays everything as ADDED, ignores resourceVersion, selectors and timeoutSeconds
and never ends (docs/design.md "kmock 0.8, measured"). The agent's cache (docs/design.md Decision 3) needs
the real contract: resume after a resourceVersion, 410 Gone as an ERROR event for a compacted
version, selector transitions, timeoutSeconds and bookmarks (issue 4 item 1).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from kubernetes import watch
from kubernetes.client import ApiException


def collect(core, n_events=None, **kwargs):
    """Run a watch in a thread and return its events (type, name, resourceVersion)."""
    events: list[tuple[str, str, str]] = []
    w = watch.Watch()

    def run():
        for ev in w.stream(core.list_namespaced_pod, "default", **kwargs):
            obj = ev["raw_object"]
            events.append((ev["type"], obj["metadata"].get("name", ""), obj["metadata"]["resourceVersion"]))
            if n_events and len(events) >= n_events:
                w.stop()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return events, t


def test_watch_sees_added_modified_deleted_in_order(core, pod_body):
    """A pod with no grace left (here: unscheduled) is still deleted gracefully: stored with its
    deletionTimestamp (MODIFIED), then removed (DELETED), as kube-apiserver does it
    (tests/real/test_emulator_parity.py shows it on the real server)."""
    events, t = collect(core, n_events=4, timeout_seconds=5)
    time.sleep(0.1)
    core.create_namespaced_pod("default", pod_body("p1"))
    core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"x": "y"}}})
    core.delete_namespaced_pod("p1", "default")
    t.join(5)
    assert [e[:2] for e in events] == [("ADDED", "p1"), ("MODIFIED", "p1"), ("MODIFIED", "p1"), ("DELETED", "p1")]
    rvs = [int(e[2]) for e in events]
    assert rvs == sorted(rvs) and len(set(rvs)) == 4


def test_watch_with_label_selector_turns_relabel_into_deleted(core, pod_body):
    """A real watch cache filters per event: an object leaving the selector is DELETED for that watch."""
    events, t = collect(core, n_events=3, label_selector="app=ours", timeout_seconds=5)
    time.sleep(0.1)
    core.create_namespaced_pod("default", pod_body("other", labels={"app": "theirs"}))
    core.create_namespaced_pod("default", pod_body("p1", labels={"app": "ours"}))
    core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"app": "gone"}}})
    core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"app": "ours"}}})
    t.join(5)
    assert [e[:2] for e in events] == [("ADDED", "p1"), ("DELETED", "p1"), ("ADDED", "p1")]


def test_watch_resumes_from_resource_version(core, pod_body):
    core.create_namespaced_pod("default", pod_body("p1"))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod_body("p2"))
    core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"a": "b"}}})
    events, t = collect(core, n_events=2, resource_version=rv, timeout_seconds=5)
    t.join(5)
    assert [e[:2] for e in events] == [("ADDED", "p2"), ("MODIFIED", "p1")]


def test_watch_without_version_starts_with_current_objects(core, pod_body):
    for n in ("p1", "p2"):
        core.create_namespaced_pod("default", pod_body(n))
    events, t = collect(core, n_events=2, timeout_seconds=5)
    t.join(5)
    assert sorted(e[:2] for e in events) == [("ADDED", "p1"), ("ADDED", "p2")]


def test_too_old_resource_version_is_410_gone_error_event(core, api_only, pod_body):
    """The real server answers 200 and sends one ERROR event carrying a 410 Expired Status."""
    core.create_namespaced_pod("default", pod_body("p1"))
    old = core.read_namespaced_pod("p1", "default").metadata.resource_version
    for i in range(30):  # history_size is 20 in the fixture
        core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"i": str(i)}}})
    url = f"{api_only.url}/api/v1/namespaces/default/pods?watch=true&resourceVersion={old}&timeoutSeconds=2"
    with urllib.request.urlopen(url) as r:
        assert r.status == 200
        line = json.loads(r.readline())
    assert line["type"] == "ERROR" and line["object"]["code"] == 410 and line["object"]["reason"] == "Expired"
    assert line["object"]["message"].startswith(f"too old resource version: {old} (")
    w = watch.Watch()
    with pytest.raises(ApiException) as e:
        for _ in w.stream(core.list_namespaced_pod, "default", resource_version=old, timeout_seconds=2):
            pass
    assert e.value.status == 410


def test_a_compaction_makes_every_held_version_too_old(core, api_only, pod_body):
    """`Store.compact` is an etcd compaction: even the newest version a client holds is gone."""
    core.create_namespaced_pod("default", pod_body("p1"))
    held = core.list_namespaced_pod("default").metadata.resource_version
    cut = api_only.call(api_only.store.compact, "pods")
    assert cut > int(held)
    w = watch.Watch()
    with pytest.raises(ApiException) as e:
        for _ in w.stream(core.list_namespaced_pod, "default", resource_version=held, timeout_seconds=2):
            pass
    assert e.value.status == 410
    fresh = core.list_namespaced_pod("default").metadata.resource_version
    assert int(fresh) >= cut
    core.create_namespaced_pod("default", pod_body("p2"))
    events, t = collect(core, n_events=1, resource_version=fresh, timeout_seconds=5)
    t.join(5)
    assert [e[:2] for e in events] == [("ADDED", "p2")]


def test_end_watches_ends_open_streams_cleanly(core, api_only, pod_body):
    """`Store.end_watches`: what an API server restart does to a watch; the client sees the
    stream end (no error) well before its timeoutSeconds."""
    events, t = collect(core, timeout_seconds=30)
    api_only.wait_for(lambda: api_only.call(api_only.store.watcher_count) == 1)
    core.create_namespaced_pod("default", pod_body("p1"))
    api_only.wait_for(lambda: events)
    t0 = time.monotonic()
    assert api_only.call(api_only.store.end_watches, "pods") == 1
    t.join(20)
    assert not t.is_alive() and time.monotonic() - t0 < 20
    assert [e[:2] for e in events] == [("ADDED", "p1")]


def test_timeout_seconds_ends_the_stream(core):
    """kmock's watch never ends; the client then needs a read timeout to get out."""
    t0 = time.monotonic()
    w = watch.Watch()
    assert list(w.stream(core.list_namespaced_pod, "default", timeout_seconds=1)) == []
    assert 0.9 <= time.monotonic() - t0 < 3


def test_bookmarks_carry_the_current_resource_version(api_only, core, pod_body):
    core.create_namespaced_pod("default", pod_body("p1"))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    url = (f"{api_only.url}/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv}"
           "&allowWatchBookmarks=true&timeoutSeconds=1")
    with urllib.request.urlopen(url) as r:
        lines = [json.loads(x) for x in r.read().splitlines() if x.strip()]
    assert lines and all(x["type"] == "BOOKMARK" for x in lines)
    assert lines[-1]["object"]["metadata"]["resourceVersion"] == rv
    assert lines[-1]["object"]["kind"] == "Pod"


def test_watch_single_object_and_field_selector(core, pod_body):
    core.create_namespaced_pod("default", pod_body("p1"))
    core.create_namespaced_pod("default", pod_body("p2"))
    events, t = collect(core, n_events=1, field_selector="metadata.name=p2", timeout_seconds=3)
    t.join(5)
    assert [e[:2] for e in events] == [("ADDED", "p2")]
