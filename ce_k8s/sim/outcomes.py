"""A pilot's outcome, as the submitter reads it from its job's ad: completed, held, removed, or not yet.

Why a function of its own: both demos (the emulated `testbed.TestBed` and the real
`ce_k8s.demos.condordemo.RealDemo`) must name every way a pilot can end, and "lost" must mean what it
says: a pilot nobody can account for. On HTCondor-CE's own configuration the CE *removes* an evicted
pilot that had started (`ENABLE_JOB_RETRIES = False` in its `SYSTEM_PERIODIC_REMOVE`; docs/real-condor.md
"The CE's own configuration", the finding "An evicted pilot is not rerun"): the CE's job goes to
`JobStatus = 3` with `RemoveReason = "CE job removed by SYSTEM_PERIODIC_REMOVE due to disabled job
retries"` and leaves the queue for the history. A demo that only knew completed and held waited
for it until its timeout and called it lost (4 of 50 in `ce-k8s demo --condor real --pilots 50
--evict-fraction 0.1`), though the CE's history said why.

A factory's grid job does not see the removal as such: the gridmanager finds the CE's job gone and
holds its own (`condorjob.cpp`, `GM_POLL_ACTIVE`: "Job disappeared from remote schedd"). So a held
factory job is a removal when the CE's job it became (the last word of its `GridJobId`,
`condor <schedd> <pool> <cluster>.<proc>`, `CondorJob::SetRemoteJobId`) is removed on the CE; its
reason is the CE's `RemoveReason`.

The ads are `condor_q -json` / `condor_history -json` objects (attribute names as HTCondor spells
them) or the emulated schedd's ads evaluated the same way. Everything here is pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

QUEUED, COMPLETED, HELD, REMOVED, LOST = "queued", "completed", "held", "removed", "lost"
# JobStatus values (HTCondor's proc.h) and the hold `condor_submit -spool` starts with.
JOB_REMOVED, JOB_COMPLETED, JOB_HELD = 3, 4, 5
SPOOLING_INPUT = 16          # HoldReasonCode: waiting for its input sandbox, not an outcome
_GRID_JOB_ID = re.compile(r"^condor\s+\S+\s+\S+\s+(\d+)\.(\d+)$")


@dataclass(frozen=True, slots=True)
class Verdict:
    """One pilot's outcome (`QUEUED` while it has none yet) and the reason HTCondor gave for it."""

    status: str
    reason: str = ""


def classify(ad: Mapping[str, object] | None, ce_ad: Mapping[str, object] | None = None) -> Verdict:
    """The outcome the submitter's ad of a pilot's job shows (queue or history).

    `ce_ad`: for a factory's grid job, the CE's ad of the job it became (`ce_job_id`), when known.
    A completion counts once the router has finalized the job (`JobFinishedHookDone`: HTCondor-C
    waits for it too, `condorjob.cpp` `m_remoteJobFinished`). No ad at all is not an outcome: the
    history may not have the job yet, so only the caller's deadline makes a pilot lost.
    """
    if ad is None:
        return Verdict(QUEUED)
    status = ad.get("JobStatus")
    if status == JOB_REMOVED:
        return Verdict(REMOVED, _text(ad.get("RemoveReason")) or "removed (no RemoveReason)")
    if status == JOB_COMPLETED:
        return Verdict(COMPLETED) if ad.get("JobFinishedHookDone") is not None else Verdict(QUEUED)
    if status == JOB_HELD and ad.get("HoldReasonCode") != SPOOLING_INPUT:
        hold = _text(ad.get("HoldReason"))
        if ce_ad is not None and ce_ad.get("JobStatus") == JOB_REMOVED:
            why = _text(ce_ad.get("RemoveReason")) or "removed (no RemoveReason)"
            return Verdict(REMOVED, f"{why} (on the CE; the factory's job held: {hold or 'no HoldReason'})")
        return Verdict(HELD, hold)
    return Verdict(QUEUED)


def ce_job_id(ad: Mapping[str, object] | None) -> str | None:
    """`cluster.proc` of the CE job a factory's grid job became, from its `GridJobId`; None before
    the submission or for anything but an HTCondor-C job."""
    if ad is None:
        return None
    match = _GRID_JOB_ID.match(_text(ad.get("GridJobId")).strip())
    return f"{match.group(1)}.{match.group(2)}" if match else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
