"""ce_k8s.workqueue: the one keyed work queue of the agent's effects and the HTCJob operator.

Driven by a fake clock and `get_nowait`, so every assertion is about order and due times, never
about how long a thread slept.
"""

from __future__ import annotations

import threading

import pytest

from ce_k8s import ratelimit
from ce_k8s.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_key_waits_once_at_its_earliest_due_time(clock):
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add("a", 10)
    q.add("a", 5)            # earlier: moves it up
    q.add("a", 20)           # later: ignored
    assert len(q) == 1 and q.get_nowait() is None
    clock.now += 5
    assert q.get_nowait() == "a"
    assert q.get_nowait() is None and len(q) == 0


def test_due_keys_come_in_due_order_then_in_the_order_added(clock):
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add("late", 2)
    q.add("b")
    q.add("c")
    q.add("early", 1)
    clock.now += 3
    assert [q.get_nowait() for _ in range(4)] == ["b", "c", "early", "late"]


def test_a_key_held_by_a_worker_is_not_handed_out_again_until_done(clock):
    """One effect per key at a time: an add while a worker holds the key runs after `done`."""
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add("pod")
    assert q.get_nowait() == "pod"
    q.add("pod")
    q.add("other")
    assert q.get_nowait() == "other"        # the held key is passed over, not lost
    assert q.get_nowait() is None
    assert "pod" in q and q.processing() == 2
    q.done("pod")
    assert q.get_nowait() == "pod"
    q.done("pod")
    q.done("other")
    assert q.get_nowait() is None and q.processing() == 0


def test_retry_backs_off_per_key_and_forget_starts_over(clock, monkeypatch):
    monkeypatch.setattr(ratelimit, "random", __import__("random").Random(7))
    q: WorkQueue[str] = WorkQueue(base=1.0, cap=8.0, clock=clock)
    delays = []
    for _ in range(6):
        delays.append(q.retry("pod"))
        clock.now += delays[-1]
        assert q.get_nowait() == "pod"
        q.done("pod")
    ceilings = [1, 2, 4, 8, 8, 8]           # base * 2**(n-1), capped
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    assert q.failures("pod") == 6 and q.failures("other") == 0
    q.retry("other")
    assert q.failures("other") == 1         # per key
    q.forget("pod")
    assert q.failures("pod") == 0
    assert q.retry("pod") <= 1.0


def test_a_retry_while_held_waits_for_done_and_for_its_back_off(clock):
    q: WorkQueue[str] = WorkQueue(base=4.0, cap=4.0, clock=clock)
    q.add("pod")
    assert q.get_nowait() == "pod"
    delay = q.retry("pod")                  # the worker's own failure, while it holds the key
    q.done("pod")
    assert q.get_nowait() is None
    clock.now += delay
    assert q.get_nowait() == "pod"


def test_discard_drops_a_waiting_key(clock):
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add("a")
    q.add("b")
    q.discard("a")
    assert q.get_nowait() == "b" and q.get_nowait() is None and len(q) == 0


def test_shut_down_wakes_a_waiting_worker_and_refuses_new_keys():
    q: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    waiting = threading.Event()

    def worker() -> None:
        waiting.set()
        got.append(q.get())

    t = threading.Thread(target=worker)
    t.start()
    assert waiting.wait(10)
    q.shut_down()
    t.join(10)
    assert not t.is_alive() and got == [None]
    q.add("late")
    assert q.closed and len(q) == 0


def test_get_returns_a_key_added_from_another_thread():
    q: WorkQueue[str] = WorkQueue()
    stop = threading.Event()
    adder = threading.Thread(target=q.add, args=("pod",))
    adder.start()
    assert q.get(stop, timeout=30) == "pod"
    adder.join(10)
    stop.set()
    assert q.get(stop) is None              # a set stop event ends the wait
