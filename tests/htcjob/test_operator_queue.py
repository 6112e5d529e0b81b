"""The HTCJob operator on the shared work queue (ce_k8s.workqueue): what each outcome of a pass does
to the HTCJob's next turn. The queue runs on a fake clock; the API is a fake (the real API server
judges the operator in tests/real/test_htcjob_kube.py)."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from ce_k8s.htcjob import operator
from ce_k8s.htcjob.spec import Target
from ce_k8s.workqueue import WorkQueue

KEY = "users/job-a"


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeKube:
    def __init__(self, fail: list[BaseException]) -> None:
        self.fail = fail

    def get(self, namespace: str, name: str):
        if self.fail:
            raise self.fail.pop(0)
        return {"metadata": {"namespace": namespace, "name": name}}


@pytest.fixture
def op(tmp_path, monkeypatch):
    o = operator.Operator(None, namespace=None, default_target=Target(), default_token=None,
                          work_root=tmp_path / "work", claims_root=tmp_path / "claims", poll=10.0)
    clock = Clock()
    o.queue = WorkQueue(base=operator.RETRY_BASE_S, cap=300.0, clock=clock)
    o.clock = clock
    monkeypatch.setattr(operator, "reconcile", lambda obj, ctx, fresh=False: 7.0)     # "look again in 7 s"
    return o


def taken_after(op, seconds: float) -> str | None:
    op.clock.now += seconds
    key = op.queue.get_nowait()
    if key is not None:
        op.queue.done(key)
    return key


def test_failed_passes_back_off_per_htcjob_and_a_good_pass_starts_over(op):
    op.kube = FakeKube([ApiException(status=500), RuntimeError("bug")])
    op.work_once(KEY)                                   # API error: first back-off, 2.5-5 s
    assert op.queue.failures(KEY) == 1
    assert taken_after(op, 2.4) is None and taken_after(op, 2.6) == KEY
    op.work_once(KEY)                                   # a crash: the second, 5-10 s
    assert op.queue.failures(KEY) == 2
    assert taken_after(op, 4.9) is None and taken_after(op, 5.1) == KEY
    op.work_once(KEY)                                   # the pass runs: the count is forgotten
    assert op.queue.failures(KEY) == 0
    assert taken_after(op, 6.9) is None and taken_after(op, 0.2) == KEY   # and its own 7 s hold
    assert op.passes == 3


def test_a_conflict_reads_again_at_once_without_counting_a_failure(op):
    op.kube = FakeKube([ApiException(status=409)])
    op.work_once(KEY)
    assert op.queue.failures(KEY) == 0
    assert taken_after(op, 0.4) is None and taken_after(op, 0.2) == KEY


def test_a_deleted_htcjob_is_not_queued_again(op):
    class Gone(FakeKube):
        def get(self, namespace, name):
            return None
    op.kube = Gone([])
    op.work_once(KEY)
    assert len(op.queue) == 0
