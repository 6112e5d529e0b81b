"""Open findings of the soak (docs/reliability.md, "Findings of the first run"), each reduced to a deterministic run.

These pin bugs in code this room does not own. Each test asserts the *correct* behaviour and is
marked `xfail(strict=True)`: it fails today for the documented reason, and the day the owner fixes
the bug it passes, which strict mode turns into a failure so the marker gets removed.
"""

from __future__ import annotations

import signal
import time

import pytest

from ce_k8s.sim.pilots import make_pilot
from ce_k8s.sim.testbed import TestBed

pytestmark = pytest.mark.slow


def _pods_of(bed: TestBed) -> list[dict]:
    def find() -> list[dict]:
        return [p for p in bed.server.store.peek_list("pods")
                if ((p.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == "ce-k8s"]
    return bed.server.call(find)


def test_f1_pod_vanishing_during_agent_restart_gets_a_new_attempt(soak):
    """docs/design.md Decision 5 ("exactly one pod per attempt") and docs/holds.md ("pod vanished while
    ce-k8s was not watching" → next attempt). Sequence: the first update asks for the pod; the
    agent creates it; the agent is SIGKILLed before a second update can report `K8sPodUid`; the pod
    is evicted and gone; a fresh agent starts. The next pod must be attempt 1, not attempt 0 again."""
    ledger = soak.AttemptLedger()
    with TestBed(time_scale=0.05, max_running_hooks=4) as bed:
        bed.server.call(bed.server.store.add_listener, ledger)
        (job,) = bed.submit([make_pilot(0, "cpu1", run_s=40)])
        deadline = time.monotonic() + 30
        while bed.router.hook_counts["UPDATE_JOB_INFO"] < 1:          # exactly one update hook
            assert time.monotonic() < deadline, "the routed job never got its first update"
            bed.router.poll()
            bed.router.process_events(0.2)
        while not _pods_of(bed):                                      # the agent creates attempt 0
            assert time.monotonic() < deadline, "the agent never created the pod"
            bed.router.process_events(0.05)
        routed = bed.schedd.get(bed.router.jobs[job].dest_key)
        assert not (routed.eval("K8sPodUid") if "K8sPodUid" in routed else ""), "uid already reported"
        bed.stop_agent(signal.SIGKILL)
        (pod,) = _pods_of(bed)
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        bed._core.create_namespaced_pod_eviction(name, ns, {"apiVersion": "policy/v1", "kind": "Eviction",
                                                            "metadata": {"name": name, "namespace": ns}})
        bed.server.wait_for(lambda: not _pods_of(bed), timeout=20)
        bed.start_agent()
        deadline = time.monotonic() + 30
        while not _pods_of(bed) and time.monotonic() < deadline:
            bed.tick(0.2)
        assert _pods_of(bed), "no pod after the restart"
    assert ledger.pods_created == 2
    assert not ledger.duplicates(), f"attempt 0 got a second pod: {ledger.duplicates()}"


def test_f2_missing_secret_after_restart_is_made_and_the_pilot_runs():
    """docs/agent.md ("After a restart, a pod that still waits for its Secret gets it re-ensured")
    and docs/holds.md (no pilot stays idle forever). Sequence: the agent creates the pod, its Secret
    create fails (500), the agent is SIGKILLed, the API heals, a fresh agent starts within seconds.
    The pilot must run and complete; today its pod waits in ContainerCreating for ever (until the
    6-hour pending timeout)."""
    with TestBed(time_scale=0.05, max_running_hooks=4) as bed:
        bed.server.faults.inject("500", verb="create", resource="secrets", count=10_000)
        (job,) = bed.submit([make_pilot(0, "cpu1", run_s=5)])
        deadline = time.monotonic() + 30
        while not _pods_of(bed):
            assert time.monotonic() < deadline, "the agent never created the pod"
            bed.tick(0.2)
        bed.stop_agent(signal.SIGKILL)
        bed.server.faults.clear()
        bed.start_agent()
        deadline = time.monotonic() + 26          # ENSURE_SECRET_AFTER (20 s) + a few polls
        while bed.outcomes[job].status == "queued" and time.monotonic() < deadline:
            bed.tick(0.5)
        (pod,) = _pods_of(bed) or [None]
        waiting = pod and [c.get("state", {}).get("waiting", {}).get("reason")
                           for c in pod.get("status", {}).get("containerStatuses") or []]
        assert bed.outcomes[job].status == "completed", f"pilot stuck; pod waiting: {waiting}"


def test_f3_create_rerun_after_eviction_does_not_recreate_the_old_attempt(soak):
    """docs/design.md Decision 5: one pod per attempt, and never two live pods of one job. Sequence: the
    first pod create is applied but its answer is lost (the agent will re-run the create to adopt
    the pod and ensure its Secret); the API is slow (1.5 s per request); while that second create
    request waits in the server, the pod is evicted. The agent must not bring attempt 0 back."""
    ledger = soak.AttemptLedger()
    with TestBed(time_scale=0.05, max_running_hooks=4) as bed:
        srv = bed.server
        srv.call(srv.store.add_listener, ledger)
        srv.faults.inject("timeout", verb="create", resource="pods", count=1)
        (job,) = bed.submit([make_pilot(0, "cpu1", run_s=60)])
        deadline = time.monotonic() + 30
        while not _pods_of(bed):
            assert time.monotonic() < deadline, "the agent never created the pod"
            bed.tick(0.1)
        srv.faults.configure(latency=1.5)
        evicted = False
        deadline = time.monotonic() + 30
        while bed.outcomes[job].status == "queued" and time.monotonic() < deadline:
            bed.router.poll()
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                bed.router.process_events(0.02)
                if not evicted and srv.calls[("create", "pods")] >= 2:     # the re-run is in the server
                    (pod,) = _pods_of(bed)
                    srv.call(srv.api.evict, pod["metadata"]["namespace"], pod["metadata"]["name"],
                             {"kind": "Eviction"})
                    evicted = True
                    srv.faults.configure(latency=0.0)
            bed.factory_turn()
        assert evicted, "the agent never re-ran the create"
    assert not ledger.duplicates(), f"attempt 0 was created again: {dict(ledger.history)}"
