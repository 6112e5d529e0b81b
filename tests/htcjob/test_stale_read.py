"""The HTCJob operator's passes read the watch copy, not the API server: what keeps a stale copy
harmless (ce_k8s.htcjob.reconcile, "A stale read acts on nothing"). The API is a fake with
versions and conditional writes, as the real one has them (the real API server judges the
operator in tests/real/test_htcjob_kube.py); the schedd is tests/htcjob/fakeschedd.py."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ce_k8s.htcjob import operator
from ce_k8s.htcjob.reconcile import FINALIZER, GROUP, VERSION, Conflict
from ce_k8s.htcjob.spec import Target
from ce_k8s.workqueue import WorkQueue
from htcjob.fakeschedd import FakeSchedd
from htcjob.test_operator_queue import taken_after

NS, NAME = "users", "job-a"
KEY = f"{NS}/{NAME}"


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386), as the API server applies one."""
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class FakeApi:
    """HTCJobs in memory with resourceVersions; the two resource writes conditional, as the real
    Kube makes them (a stale version → Conflict); every call counted."""

    def __init__(self) -> None:
        self.objs: dict[str, dict[str, Any]] = {}
        self.config_maps: dict[str, dict[str, str]] = {}
        self.version = 100
        self.calls: Counter[str] = Counter()

    def _stored(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objs[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = obj
        return copy.deepcopy(obj)

    def create(self) -> dict[str, Any]:
        return self._stored({"apiVersion": f"{GROUP}/{VERSION}", "kind": "HTCJob",
                             "metadata": {"namespace": NS, "name": NAME, "uid": "uid-a", "generation": 1},
                             "spec": {"script": {"source": "#!/bin/sh\necho hi\n"}}})

    def now(self) -> dict[str, Any]:
        return copy.deepcopy(self.objs[KEY])

    def label(self) -> dict[str, Any]:
        """Someone else changes the metadata (not the spec, not the status)."""
        obj = self.objs[KEY]
        obj["metadata"].setdefault("labels", {})["team"] = "b"
        return self._stored(obj)

    def _current(self, namespace: str, name: str, resource_version: str) -> dict[str, Any]:
        obj = self.objs.get(f"{namespace}/{name}")
        if obj is None:
            raise ApiException(status=404)
        if obj["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(f"409: {resource_version} is not {obj['metadata']['resourceVersion']}")
        return obj

    # -- the KubeSide protocol
    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls["get"] += 1
        obj = self.objs.get(f"{namespace}/{name}")
        return copy.deepcopy(obj) if obj is not None else None

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str):
        self.calls["patch_status"] += 1
        obj = self._current(namespace, name, resource_version)
        obj["status"] = merge(obj.get("status") or {}, status)
        return self._stored(obj)

    def set_finalizers(self, namespace: str, name: str, finalizers: list[str], resource_version: str):
        self.calls["set_finalizers"] += 1
        obj = self._current(namespace, name, resource_version)
        obj["metadata"]["finalizers"] = list(finalizers)
        return self._stored(obj)

    def read_data(self, kind: str, namespace: str, name: str) -> dict[str, bytes]:
        raise KeyError(name)

    def put_output(self, namespace, name, owner, data, binary) -> None:
        self.calls["put_output"] += 1
        self.config_maps[f"{namespace}/{name}"] = dict(data)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def bed(tmp_path):
    api, schedd = FakeApi(), FakeSchedd()
    op = operator.Operator(None, namespace=None, default_target=Target(), default_token=None,
                           work_root=tmp_path / "work", claims_root=tmp_path / "claims", poll=10.0,
                           schedd_factory=lambda *key: schedd)
    op.kube = op.ctx.kube = api
    op.clock = Clock()
    op.queue = WorkQueue(base=operator.RETRY_BASE_S, cap=300.0, clock=op.clock)
    return op, api, schedd


def serve_stale(op, stale: dict[str, Any]) -> None:
    """The watch copy is behind: it holds `stale` (its events since not yet arrived)."""
    op.cache.drop(KEY)
    op.cache.put(stale)


def submitted_once(op, api, schedd) -> dict[str, Any]:
    """An HTCJob whose first pass added the finalizer and submitted cluster 1; the version the
    watch showed between the two writes is returned (it has the finalizer, not the jobId)."""
    op._note(api.create(), "ADDED")
    api.set_finalizers(NS, NAME, [FINALIZER], api.now()["metadata"]["resourceVersion"])
    between = api.now()
    op._note(between, "MODIFIED")
    op.work_once(KEY)
    assert schedd.submits == 1 and api.now()["status"]["jobId"] == "1"
    return between


def test_a_pass_reads_the_watch_copy_and_writes_what_the_floor_writes(bed):
    op, api, schedd = bed
    op._note(api.create(), "ADDED")
    assert taken_after(op, 0) == KEY
    op.work_once(KEY)               # the finalizer, and on the version it answers, the submit
    assert schedd.submits == 1
    assert api.now()["metadata"]["finalizers"] == [FINALIZER]
    assert api.now()["status"]["phase"] == "Submitted"
    op._note(api.now(), "MODIFIED")   # the watch brings our own writes back: no news to the queue
    assert taken_after(op, 9.9) is None and taken_after(op, 0.2) == KEY   # the poll, not at once
    schedd.finish(1, 0, 0, stdout="hi\n")
    op.work_once(KEY)
    status = api.now()["status"]
    assert status["phase"] == "Completed" and status["output"]["delivered"] is True
    assert api.config_maps[f"{NS}/{NAME}-output"]["0.stdout"] == "hi\n"
    # Two passes, no read of the resource: the writes are the bench's floor (finalizer, two status, output).
    assert op.passes == 2 and op.reads == 0 and api.calls["get"] == 0
    assert api.calls == Counter(set_finalizers=1, patch_status=2, put_output=1)


def test_a_copy_that_lacks_the_htcjob_is_read_from_the_api_server(bed):
    op, api, schedd = bed
    api.create()                    # the watch has not brought it yet
    op.work_once(KEY)
    assert op.reads == 1 and schedd.submits == 1


def test_a_stale_copy_without_the_job_id_never_submits_again(bed):
    op, api, schedd = bed
    between = submitted_once(op, api, schedd)
    with schedd.lock:               # and the schedd has lost the cluster (queue and history)
        schedd.queue.clear()
        schedd.history.clear()
    serve_stale(op, between)        # the copy: finalizer on, no jobId, so "never submitted"
    op.queue.discard(KEY)           # (the test calls work_once itself: what the queue holds is its own)
    gets = api.calls["get"]
    op.work_once(KEY)
    assert schedd.submits == 1, "a stale copy submitted a second time"
    assert api.calls["get"] == gets + 1     # the read before the submit found a newer version
    assert op.queue.failures(KEY) == 0 and taken_after(op, 0.4) is None and taken_after(op, 0.2) == KEY
    reads = op.reads
    op.work_once(KEY)               # from the API server now: it says cluster 1, which is gone
    assert op.reads == reads + 1
    assert schedd.submits == 1
    assert "in neither the queue nor the history" in api.now()["status"]["message"]


def test_a_current_copy_without_the_job_id_submits_after_one_read(bed):
    op, api, schedd = bed
    op._note(api.create(), "ADDED")
    api.set_finalizers(NS, NAME, [FINALIZER], api.now()["metadata"]["resourceVersion"])
    op._note(api.now(), "MODIFIED")   # e.g. a restarted operator: the finalizer is there already
    op.work_once(KEY)
    assert schedd.submits == 1 and api.calls["get"] == 1
    assert api.now()["status"]["jobId"] == "1"


def test_a_stale_copy_never_overwrites_a_newer_status(bed):
    op, api, schedd = bed
    submitted_once(op, api, schedd)
    submitted = api.now()
    schedd.finish(1, 0, 0, stdout="hi\n")
    op.work_once(KEY)
    assert api.now()["status"]["phase"] == "Completed"
    done = api.now()
    writes = api.calls["patch_status"]
    serve_stale(op, submitted)      # the copy still says Submitted, output not delivered
    op.work_once(KEY)               # the jobs are in the history, the files gone: it would say OutputGone
    assert api.calls["patch_status"] == writes + 1     # tried, refused
    assert api.now()["status"] == done["status"], "a stale pass overwrote the status"
    op.work_once(KEY)               # read from the API server: Completed, nothing to do
    assert api.now() == done and api.calls["patch_status"] == writes + 1
    assert schedd.submits == 1


def test_a_status_write_that_conflicts_over_a_label_is_written_on_the_new_version(bed):
    op, api, schedd = bed
    submitted_once(op, api, schedd)
    schedd.finish(1, 0, 0, stdout="hi\n")
    api.label()                     # its watch event not yet arrived
    op.work_once(KEY)               # delivers; the status write conflicts; the status it read is still the status
    obj = api.now()
    assert obj["status"]["phase"] == "Completed" and obj["status"]["output"]["delivered"] is True
    assert obj["metadata"]["labels"] == {"team": "b"}
    assert op.cache.get(KEY)["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    assert op.queue.failures(KEY) == 0


def test_a_finalizer_patch_on_a_stale_copy_conflicts_and_the_next_pass_reads(bed):
    op, api, schedd = bed
    created = api.create()
    op._note(created, "ADDED")
    api.set_finalizers(NS, NAME, ["someone.else/keep"], created["metadata"]["resourceVersion"])
    op.work_once(KEY)               # the copy's version is gone: the patch is refused
    assert schedd.submits == 0 and api.now()["metadata"]["finalizers"] == ["someone.else/keep"]
    op.work_once(KEY)
    assert api.now()["metadata"]["finalizers"] == ["someone.else/keep", FINALIZER]
    assert schedd.submits == 1 and op.reads == 1
