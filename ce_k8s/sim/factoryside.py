"""The factory's side of the emulated bed: what GlideinWMS does with each pilot it sent to the CE.

A completed pilot's output is staged out and its job leaves the CE queue; a held pilot is
removed (htcondor-ce.md §6.4); a pilot whose job left the queue unseen is removed (the history
says so) or lost. `Outcome` is what the factory saw per pilot: the bed's summary, the demo's JSON
and the end-to-end tests read it. Kept apart from `TestBed` (ce_k8s.sim.testbed), which drives
the daemons, because this is the bed's judge, not its machinery.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ce_k8s.sim.condor.router import Router
from ce_k8s.sim.condor.schedd import JobStatus, Schedd, eval_int, eval_str
from ce_k8s.sim.outcomes import REMOVED, classify
from ce_k8s.sim.pilots import Pilot

#: The ad attribute that sends a pilot to the bed's Slurm-style route (mixed mode).
BATCH_MARK = "TestBatchRoute"


@dataclass
class Outcome:
    """What the factory saw for one pilot."""

    pilot: Pilot
    job: str
    status: str = "queued"  # queued | completed | held | removed | lost (ce_k8s.sim.outcomes) | batch
    exit_code: int | None = None
    remove_reason: str = ""
    route: str = ""
    pod: str = ""
    node: str = ""
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def batch(self) -> bool:
        """A pilot for the Slurm-style route (mixed mode): routed, then left alone by ce-k8s."""
        return self.pilot.ad.get(BATCH_MARK) is True


class FactorySide:
    """The factory's turn over every pilot still queued, given the CE's schedd, the router (read
    for the routed job's pod and node, once it exists) and the tables the bed reports from."""

    def __init__(self, schedd: Schedd, router: Callable[[], Router | None], outcomes: dict[str, Outcome],
                 holds: dict[str, tuple[int | None, int | None, str | None]]) -> None:
        self.schedd = schedd
        self.router = router
        self.outcomes = outcomes
        self.holds = holds

    def turn(self) -> None:
        """GlideinWMS's side: stage out completed pilots, remove held ones (htcondor-ce.md §6.4)."""
        for job, out in self.outcomes.items():
            if out.status != "queued":
                continue
            ad = self.schedd.get(job)
            if ad is None:
                self._left_queue(job, out)
                continue
            rj = self.router().jobs.get(job) if self.router() else None
            if rj is not None and rj.dest_key:
                routed = self.schedd.get(rj.dest_key)
                if routed is not None:
                    out.route = eval_str(routed, "RouteName") or out.route
                    out.pod = eval_str(routed, "K8sPodName") or out.pod
                    out.node = eval_str(routed, "K8sNodeName") or out.node
                    if out.batch and out.route == "Slurm":
                        out.status = "batch"   # routed to the other backend; nothing more to wait for
                        continue
            status = eval_int(ad, "JobStatus")
            if status == JobStatus.REMOVED:
                self._removed(out, ad)
            elif status == JobStatus.COMPLETED and eval_str(ad, "Managed") == "ScheddDone":
                out.exit_code = eval_int(ad, "ExitCode")
                out.stdout, out.stderr = self._staged_out(ad)
                out.status = "completed"
                self.schedd.set_attributes(job, {"LeaveJobInQueue": False}, as_user=True)
            elif status == JobStatus.HELD:
                # Holds are unrecoverable by default, so the factory removes the pilot (htcondor-ce.md §6.4).
                out.status = "held"
                out.exit_code = None
                self.holds[job] = (eval_int(ad, "HoldReasonCode"), eval_int(ad, "HoldReasonSubCode"),
                                   eval_str(ad, "HoldReason"))
                self.schedd.remove(job, "held pilot removed by the factory")

    def _left_queue(self, job: str, out: Outcome) -> None:
        """The pilot's job left the queue with no outcome seen: removed if the schedd's history
        says so (with its reason), else lost: nothing accounts for it."""
        gone = self.schedd.history.get(job)
        if gone is not None and eval_int(gone, "JobStatus") == JobStatus.REMOVED:
            self._removed(out, gone)
        else:
            out.status = "lost"

    @staticmethod
    def _removed(out: Outcome, ad: Any) -> None:
        """Removed by the CE (its policy, an admin) before it finished: an outcome, not a loss."""
        verdict = classify({"JobStatus": eval_int(ad, "JobStatus"), "RemoveReason": eval_str(ad, "RemoveReason")})
        out.status = REMOVED
        out.remove_reason = verdict.reason

    @staticmethod
    def _staged_out(ad: Any) -> tuple[bytes, bytes]:
        iwd = Path(eval_str(ad, "Iwd") or ".")
        result = []
        for attr in ("Out", "Err"):
            name = eval_str(ad, attr) or ""
            path = Path(name) if os.path.isabs(name) else iwd / name
            try:
                result.append(path.read_bytes())
            except OSError:
                result.append(b"")
        return result[0], result[1]
