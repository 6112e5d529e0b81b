"""The agent's work queue of pod writes (ce_k8s/agent/effects.py): one effect per pod at a time,
and an effect that will not run says so, so that nothing stays claimed by it."""

from __future__ import annotations

import threading

from ce_k8s.agent.effects import Effects
from tests.polling import wait_for


def _effects(turns: list[str]) -> Effects:
    return Effects(1, lambda name: turns.append(f"create {name}"), threading.Event())


def _drain(effects: Effects) -> None:
    """Start the workers, wait until every effect asked for has run, stop them."""
    effects.start()
    try:
        wait_for(effects.idle, timeout=10)
    finally:
        effects.stop()


def test_a_delete_takes_the_turn_of_a_waiting_refresh_and_the_refresh_is_dropped():
    turns: list[str] = []
    effects = _effects(turns)
    effects.refresh("p", lambda: turns.append("refresh p"), lambda: turns.append("dropped p"))
    effects.delete("p", lambda: turns.append("delete p"))
    _drain(effects)
    # No write to a pod being deleted; the refresh's asker hears it will not run.
    assert turns == ["dropped p", "delete p", "create p"]


def test_a_newer_refresh_replaces_a_waiting_one_which_is_dropped():
    turns: list[str] = []
    effects = _effects(turns)
    effects.refresh("p", lambda: turns.append("refresh 1"), lambda: turns.append("dropped 1"))
    effects.refresh("p", lambda: turns.append("refresh 2"), lambda: turns.append("dropped 2"))
    _drain(effects)
    assert turns == ["dropped 1", "refresh 2", "create p"]


def test_refreshes_still_waiting_at_stop_are_dropped():
    turns: list[str] = []
    effects = _effects(turns)          # never started: nothing runs
    effects.refresh("p", lambda: turns.append("refresh p"), lambda: turns.append("dropped p"))
    assert not effects.idle()
    effects.stop()
    assert turns == ["dropped p"]
    assert effects.refreshes_waiting() == 0


def test_a_refresh_dropped_for_a_delete_lets_the_next_changed_file_be_queued(tmp_path):
    """The refresher claims a pod while its refresh is queued (`busy`); a delete that took the
    turn used to leave the claim set, and that record never refreshed again."""
    import time
    from types import SimpleNamespace

    from ce_k8s.agent.credentials import CredentialRefresher, CredentialState
    from ce_k8s.agent.jobs import JobRecord

    proxy = tmp_path / "x509up"
    proxy.write_text("one")
    turns: list[str] = []
    effects = _effects(turns)
    refresher = CredentialRefresher(None, None, effects, threading.Event(), None, {}, None)
    rec = JobRecord("p", "alice")
    rec.credentials = cs = CredentialState(paths=(str(proxy),), since=0.0)
    pod = SimpleNamespace(name="p", namespace="ns", created=0.0)

    refresher.check(rec, None, "", None, pod, time.time())
    assert cs.busy and effects.refreshes_waiting() == 1
    effects.delete("p", lambda: turns.append("delete p"))
    _drain(effects)
    assert turns == ["delete p", "create p"]            # the refresh never ran
    assert cs.busy is False

    proxy.write_text("two")                             # renewed again: queued again
    refresher.check(rec, None, "", None, pod, time.time())
    assert cs.busy and effects.refreshes_waiting() == 1
