"""The schedd's job ads of one HTCJob → the resource's status. Pure: no I/O, the clock handed in.

The counts are htc-operator's (idle, running, held, succeeded, failed) plus `removed`; a job
counts as succeeded from the schedd's own record (`JobStatus` 4 with `ExitCode` 0, not by a
signal), not from a callback inside the job, so a lost message can never lose a result.

Phase, in order: `Invalid` (spec refused, nothing submitted), `Pending` (not submitted yet),
`Completed` (every proc exited 0 and the output is delivered), `Failed` (every proc is done, one
or more failed or were removed, output delivered), `Held` (a proc is held), `Running` (a proc is
running, or all are done and the output is on its way), `Submitted` (all idle).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# HTCondor's JobStatus values (condor_includes/proc.h).
IDLE, RUNNING, REMOVED, COMPLETED, HELD, TRANSFERRING_OUTPUT, SUSPENDED = 1, 2, 3, 4, 5, 6, 7
#: HoldReasonCode 16: held by the schedd until a spooled submit's input arrives (not a real hold).
SPOOLING_INPUT = 16
STATE_NAMES = {IDLE: "Idle", RUNNING: "Running", REMOVED: "Removed", COMPLETED: "Completed",
               HELD: "Held", TRANSFERRING_OUTPUT: "Running", SUSPENDED: "Suspended"}
#: The attributes read from every job ad (the projection of every query).
ATTRS = ("ClusterId", "ProcId", "JobStatus", "ExitCode", "ExitBySignal", "ExitSignal", "HoldReason",
         "HoldReasonCode", "JobStartDate", "CompletionDate", "EnteredCurrentStatus", "NumJobStarts",
         "RemoveReason", "HTCJobUid", "HTCJobAbandoned", "Managed")
CONDITION_TYPES = ("SpecValid", "Submitted", "Running", "Held", "Completed", "Failed",
                   "ScheddReachable", "OutputDelivered")


def iso(ts: float | int | None) -> str | None:
    if not ts:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass
class ProcState:
    proc: int
    state: str
    status: int
    exit_code: int | None = None
    exit_signal: int | None = None
    hold_reason: str | None = None
    hold_code: int | None = None
    start: float | None = None
    end: float | None = None

    @property
    def done(self) -> bool:
        return self.status in (COMPLETED, REMOVED)

    @property
    def succeeded(self) -> bool:
        return self.status == COMPLETED and self.exit_signal is None and self.exit_code == 0

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"proc": self.proc, "state": self.state}
        for key, value in (("exitCode", self.exit_code), ("exitSignal", self.exit_signal),
                           ("holdReason", self.hold_reason), ("holdReasonCode", self.hold_code),
                           ("startTime", iso(self.start)), ("completionTime", iso(self.end))):
            if value is not None:
                out[key] = value
        return out


def proc_state(ad: dict[str, Any]) -> ProcState:
    status = int(ad.get("JobStatus") or IDLE)
    hold_code = ad.get("HoldReasonCode")
    state = STATE_NAMES.get(status, "Unknown")
    if status == HELD and hold_code == SPOOLING_INPUT:
        state = "Idle"               # waiting for the operator's upload, not a hold a user must act on
    if status == COMPLETED and ad.get("Managed") == "External":
        # A job router still manages it (an HTCJob sent to a CE): the router mirrors the routed
        # job's JobStatus 4 before its finalize hook has written the output into the job's spool
        # (measured: 2 s before). Done only once the router lets go (Managed "ScheddDone").
        status, state = RUNNING, "Running"
    p = ProcState(proc=int(ad.get("ProcId", 0)), state=state, status=status,
                  start=ad.get("JobStartDate") or None)
    if status == HELD and hold_code != SPOOLING_INPUT:
        p.hold_reason = str(ad.get("HoldReason") or "held")
        p.hold_code = int(hold_code) if hold_code is not None else None
    if status == COMPLETED:
        if ad.get("ExitBySignal"):
            p.exit_signal = int(ad.get("ExitSignal") or 0)
        elif ad.get("ExitCode") is not None:
            p.exit_code = int(ad["ExitCode"])
        p.end = ad.get("CompletionDate") or ad.get("EnteredCurrentStatus")
    if status == REMOVED:
        p.end = ad.get("EnteredCurrentStatus")
    return p


@dataclass
class Summary:
    """What the job ads say: per proc, counts, and whether the cluster is finished."""

    procs: list[ProcState] = field(default_factory=list)

    def count(self, pred) -> int:
        return sum(1 for p in self.procs if pred(p))

    @property
    def finished(self) -> bool:
        return bool(self.procs) and all(p.done for p in self.procs)

    @property
    def counts(self) -> dict[str, int]:
        return {
            "submitted": len(self.procs),
            "idle": self.count(lambda p: p.state == "Idle"),
            "running": self.count(lambda p: p.state in ("Running", "Suspended")),
            "held": self.count(lambda p: p.state == "Held"),
            "succeeded": self.count(lambda p: p.succeeded),
            "failed": self.count(lambda p: p.status == COMPLETED and not p.succeeded),
            "removed": self.count(lambda p: p.status == REMOVED),
            "active": self.count(lambda p: not p.done),
        }


def summarise(ads: list[dict[str, Any]]) -> Summary:
    """One ProcState per proc; a proc seen in the queue and in the history is the queue's."""
    seen: dict[int, ProcState] = {}
    for ad in ads:
        p = proc_state(ad)
        if p.proc not in seen:
            seen[p.proc] = p
    return Summary(sorted(seen.values(), key=lambda p: p.proc))


def set_condition(conditions: list[dict[str, Any]], type_: str, status: bool | None, reason: str,
                  message: str, now: float, generation: int | None) -> None:
    """Kubernetes' condition convention: lastTransitionTime changes only when status does."""
    value = "Unknown" if status is None else ("True" if status else "False")
    for cond in conditions:
        if cond["type"] == type_:
            if cond["status"] != value:
                cond["lastTransitionTime"] = iso(now)
            cond.update(status=value, reason=reason, message=message)
            if generation is not None:
                cond["observedGeneration"] = generation
            return
    cond = {"type": type_, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": iso(now)}
    if generation is not None:
        cond["observedGeneration"] = generation
    conditions.append(cond)


def job_conditions(summary: Summary, conditions: list[dict[str, Any]], *, delivered: bool,
                   now: float, generation: int | None) -> str:
    """Update the job conditions from `summary`; return the phase."""
    c = summary.counts
    set_condition(conditions, "Submitted", True, "Submitted", f"{c['submitted']} job(s) in the schedd", now, generation)
    set_condition(conditions, "Running", c["running"] > 0, "Running" if c["running"] else "NotRunning",
                  f"{c['running']} running", now, generation)
    held = [p for p in summary.procs if p.state == "Held"]
    set_condition(conditions, "Held", bool(held), "JobHeld" if held else "NotHeld",
                  f"proc {held[0].proc}: {held[0].hold_reason} (code {held[0].hold_code})" if held else "",
                  now, generation)
    finished = summary.finished and delivered
    failed = c["failed"] + c["removed"]
    set_condition(conditions, "Completed", finished and not failed,
                  "AllSucceeded" if finished and not failed else ("NotFinished" if not finished else "SomeFailed"),
                  f"{c['succeeded']}/{c['submitted']} succeeded", now, generation)
    set_condition(conditions, "Failed", finished and failed > 0, "JobsFailed" if finished and failed else "NoFailure",
                  f"{c['failed']} failed, {c['removed']} removed" if failed else "", now, generation)
    if finished:
        return "Failed" if failed else "Completed"
    if held:
        return "Held"
    if c["running"] or summary.finished:
        return "Running"
    return "Submitted"
