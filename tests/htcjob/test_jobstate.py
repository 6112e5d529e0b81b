"""Job ads → status: counts, per-proc states, the phase, and conditions that keep their
transition times. A spooled job held for its input is waiting, not held."""

from __future__ import annotations

from ce_k8s.htcjob.jobstate import COMPLETED, HELD, IDLE, REMOVED, RUNNING, job_conditions, summarise


def ad(proc, status, **kw):
    return {"ClusterId": 7, "ProcId": proc, "JobStatus": status, **kw}


def phase(ads, delivered=False, conds=None):
    return job_conditions(summarise(ads), conds if conds is not None else [], delivered=delivered, now=100.0,
                          generation=1)


def test_phases_in_order():
    assert phase([ad(0, HELD, HoldReasonCode=16)]) == "Submitted"
    assert phase([ad(0, IDLE), ad(1, RUNNING)]) == "Running"
    assert phase([ad(0, HELD, HoldReasonCode=6, HoldReason="x"), ad(1, RUNNING)]) == "Held"
    done = [ad(0, COMPLETED, ExitCode=0), ad(1, COMPLETED, ExitCode=0)]
    assert phase(done) == "Running"                       # output on its way
    assert phase(done, delivered=True) == "Completed"
    assert phase([ad(0, COMPLETED, ExitCode=0), ad(1, COMPLETED, ExitCode=2)], delivered=True) == "Failed"
    assert phase([ad(0, COMPLETED, ExitBySignal=True, ExitSignal=9)], delivered=True) == "Failed"
    assert phase([ad(0, COMPLETED, ExitCode=0), ad(1, REMOVED)], delivered=True) == "Failed"


def test_a_completed_job_a_router_still_manages_is_not_done():
    """On a CE, the router mirrors JobStatus 4 before its finalize hook wrote the output."""
    assert phase([ad(0, COMPLETED, ExitCode=0, Managed="External")], delivered=True) == "Running"
    assert not summarise([ad(0, COMPLETED, ExitCode=0, Managed="External")]).finished
    assert phase([ad(0, COMPLETED, ExitCode=0, Managed="ScheddDone")], delivered=True) == "Completed"


def test_counts_and_the_queue_wins_over_history():
    s = summarise([ad(0, RUNNING), ad(0, COMPLETED, ExitCode=0), ad(1, COMPLETED, ExitCode=1),
                   ad(2, HELD, HoldReasonCode=16), ad(3, HELD, HoldReasonCode=13, HoldReason="disk")])
    assert s.counts == {"submitted": 4, "idle": 1, "running": 1, "held": 1, "succeeded": 0, "failed": 1,
                        "removed": 0, "active": 3}
    assert [p.as_status()["state"] for p in s.procs] == ["Running", "Completed", "Idle", "Held"]
    assert s.procs[3].as_status()["holdReason"] == "disk"


def test_a_condition_keeps_its_transition_time_while_its_status_stays():
    conds = []
    job_conditions(summarise([ad(0, RUNNING)]), conds, delivered=False, now=100.0, generation=1)
    job_conditions(summarise([ad(0, RUNNING)]), conds, delivered=False, now=200.0, generation=1)
    running = next(c for c in conds if c["type"] == "Running")
    assert running["status"] == "True" and running["lastTransitionTime"] == "1970-01-01T00:01:40Z"
    job_conditions(summarise([ad(0, COMPLETED, ExitCode=0)]), conds, delivered=True, now=300.0, generation=1)
    running = next(c for c in conds if c["type"] == "Running")
    assert running["status"] == "False" and running["lastTransitionTime"] == "1970-01-01T00:05:00Z"
