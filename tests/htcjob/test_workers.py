"""The HTCJob operator's workers side by side (ce_k8s.htcjob.operator, "Several workers"): passes
of different HTCJobs overlap, passes of one HTCJob never do, and each HTCJob is submitted once.
The API is test_stale_read's fake made thread-safe, which also counts what is in flight; the
schedd is tests/htcjob/fakeschedd.py, completing each job as it is submitted."""

from __future__ import annotations

import copy
import threading
from collections import Counter
from typing import Any

import pytest

from ce_k8s.htcjob import operator
from ce_k8s.htcjob.reconcile import GROUP, VERSION
from ce_k8s.htcjob.spec import Target
from ce_k8s.htcjob.submitdesc import UID_ATTR
from htcjob.fakeschedd import FakeSchedd
from htcjob.test_stale_read import NS, FakeApi

HTCJOBS = 24


class InFlightApi(FakeApi):
    """The fake API, thread-safe, counting the calls in flight per HTCJob and in all. With `company`,
    until two passes have been seen inside it at once, a finalizer patch waits (on a condition, up
    to 30 s) for a second one to come in: a second worker gets there in milliseconds, one worker
    never (so the overlap is shown, not left to the scheduler's luck)."""

    def __init__(self, company: bool) -> None:
        super().__init__()
        self.company = company
        self.cv = threading.Condition()
        self.in_flight: Counter[str] = Counter()
        self.most_per_key = 0
        self.most_at_once = 0

    def create_named(self, name: str) -> dict[str, Any]:
        with self.cv:
            return self._stored({"apiVersion": f"{GROUP}/{VERSION}", "kind": "HTCJob",
                                 "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}", "generation": 1},
                                 "spec": {"script": {"source": "#!/bin/sh\necho hi\n"}}})

    def _enter(self, name: str, wait_for_company: bool) -> None:
        with self.cv:
            self.in_flight[name] += 1
            self.most_per_key = max(self.most_per_key, self.in_flight[name])
            self.most_at_once = max(self.most_at_once, sum(self.in_flight.values()))
            self.cv.notify_all()
            if wait_for_company and self.company:
                self.cv.wait_for(lambda: self.most_at_once >= 2, timeout=30)

    def _leave(self, name: str) -> None:
        with self.cv:
            self.in_flight[name] -= 1
            self.cv.notify_all()

    def _call(self, name: str, fn, *args, wait_for_company: bool = False):
        self._enter(name, wait_for_company)
        try:
            with self.cv:
                return fn(*args)
        finally:
            self._leave(name)

    def get(self, namespace, name):
        return self._call(name, super().get, namespace, name)

    def patch_status(self, namespace, name, status, resource_version):
        written = self._call(name, super().patch_status, namespace, name, status, resource_version)
        with self.cv:
            self.cv.notify_all()
        return written

    def set_finalizers(self, namespace, name, finalizers, resource_version):
        return self._call(name, super().set_finalizers, namespace, name, finalizers, resource_version,
                          wait_for_company=True)

    def put_output(self, namespace, name, owner, data, binary):
        return self._call(name, super().put_output, namespace, name, owner, data, binary)

    def completed(self) -> int:
        with self.cv:
            return sum(1 for o in self.objs.values() if (o.get("status") or {}).get("phase") == "Completed")


class InstantSchedd(FakeSchedd):
    """Every submitted job finishes at once, exit code 0."""

    def submit(self, description: dict[str, str], count: int) -> int:
        cluster = super().submit(description, count)
        for proc in range(count):
            self.finish(cluster, proc, 0, stdout=f"cluster {cluster}\n")
        return cluster


def run_operator(tmp_path, workers: int) -> tuple[InFlightApi, InstantSchedd, operator.Operator]:
    api, schedd = InFlightApi(company=workers > 1), InstantSchedd()
    op = operator.Operator(None, namespace=None, default_target=Target(), default_token=None,
                           work_root=tmp_path / "work", claims_root=tmp_path / "claims", poll=0.01,
                           schedd_factory=lambda *key: schedd, workers=workers)
    op.kube = op.ctx.kube = api
    for i in range(HTCJOBS):
        op._note(copy.deepcopy(api.create_named(f"job-{i}")), "ADDED")
    threads = op.start_workers()
    try:
        with api.cv:
            assert api.cv.wait_for(lambda: sum(1 for o in api.objs.values()
                                               if (o.get("status") or {}).get("phase") == "Completed") == HTCJOBS,
                                   timeout=60), f"{api.completed()} of {HTCJOBS} Completed"
    finally:
        op.stop.set()
        op.queue.shut_down()
        for thread in threads:
            thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    return api, schedd, op


@pytest.mark.parametrize("workers", [2, 4])
def test_passes_of_different_htcjobs_overlap_and_each_htcjob_is_submitted_once(tmp_path, workers):
    api, schedd, op = run_operator(tmp_path, workers)
    assert api.most_at_once >= 2, "the workers never had two passes in the API at once"
    assert api.most_per_key == 1, "two passes of one HTCJob ran side by side"
    assert schedd.submits == HTCJOBS
    assert Counter(d[f"MY.{UID_ATTR}"] for d in schedd.descriptions.values()) == \
        Counter(f'"uid-job-{i}"' for i in range(HTCJOBS))          # each HTCJob's uid, once
    assert len(api.config_maps) == HTCJOBS
    assert op.reads == 0                       # every pass went from the watch copy or its own write


def test_one_worker_runs_one_pass_at_a_time(tmp_path):
    """The same run on one worker: the overlap above is the workers', not the fake's."""
    api, schedd, _ = run_operator(tmp_path, 1)
    assert api.most_at_once == 1
    assert schedd.submits == HTCJOBS


def test_workers_below_one_are_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        operator.Operator(None, namespace=None, default_target=Target(), default_token=None,
                          work_root=tmp_path / "work", claims_root=tmp_path / "claims", poll=1.0, workers=0)
