"""A schedd in memory, beside the real one (ce_k8s.htcjob.schedd.HTCondorSchedd), for the operator's
tests on the real API server where the point is the Kubernetes side: faults and timings a real
schedd will not give on demand (a cut upload, an unreachable schedd). It keeps the real schedd's
rules the operator depends on, each checked on the real one in tests/real/test_htcjob_condor.py:
a spooled cluster is held (code 16) until its input is uploaded; a completed spooled job stays in
the queue until its output is retrieved (or `LeaveJobInQueue` is set false), then leaves; a
removed job goes to the history at once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from ce_k8s.htcjob.jobstate import COMPLETED, HELD, IDLE, REMOVED, RUNNING, SPOOLING_INPUT
from ce_k8s.htcjob.schedd import ScheddUnreachable, SubmitRefused, uid_constraint
from ce_k8s.htcjob.submitdesc import ABANDONED_ATTR, STDERR, STDOUT, UID_ATTR


class FakeSchedd:
    def __init__(self, name: str = "fake@test") -> None:
        self.name = name
        self.queue: dict[tuple[int, int], dict[str, Any]] = {}
        self.history: list[dict[str, Any]] = []
        self.descriptions: dict[int, dict[str, str]] = {}
        self.outputs: dict[tuple[int, int], dict[str, str]] = {}
        self.submits = 0
        self.next_cluster = 1
        self.unreachable = False
        self.cut_next_upload = False
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ the Schedd protocol
    def _check(self) -> None:
        if self.unreachable:
            raise ScheddUnreachable(f"fake schedd {self.name} is down")

    def _match(self, constraint: str, ad: dict[str, Any]) -> bool:
        # The operator's constraints: `HTCJobUid == "<uid>" && HTCJobAbandoned =!= true [&& JobStatus ...]`
        # and `ClusterId == N [&& JobStatus == 4]`.
        ok = True
        for clause in constraint.split("&&"):
            clause = clause.strip()
            if clause.startswith(f"{UID_ATTR} =="):
                ok &= ad.get(UID_ATTR) == clause.split('"')[1]
            elif clause.startswith(f"{ABANDONED_ATTR} =!= true"):
                ok &= ad.get(ABANDONED_ATTR) is not True
            elif clause.startswith("RoutedFromJobId =?= undefined"):
                ok &= "RoutedFromJobId" not in ad
            elif clause.startswith("ClusterId =="):
                ok &= ad["ClusterId"] == int(clause.split("==")[1])
            elif clause.startswith("JobStatus !="):
                ok &= ad["JobStatus"] != int(clause.split("!=")[1])
            elif clause.startswith("JobStatus =="):
                ok &= ad["JobStatus"] == int(clause.split("==")[1])
            else:
                raise AssertionError(f"the fake does not know the clause {clause!r}")
        return ok

    def jobs(self, uid: str, expected: int) -> list[dict[str, Any]]:
        with self.lock:
            self._check()
            c = uid_constraint(uid)
            ads = [{**ad, "_source": "queue"} for ad in self.queue.values() if self._match(c, ad)]
            if len(ads) < max(expected, 1):
                ads += [{**ad, "_source": "history"} for ad in self.history if self._match(c, ad)]
            return ads

    def submit(self, description: dict[str, str], count: int) -> int:
        with self.lock:
            self._check()
            if description.get("requirements", "").count("(") != description.get("requirements", "").count(")"):
                raise SubmitRefused(f"the schedd {self.name} refused the submit description: requirements")
            cluster = self.next_cluster
            self.next_cluster += 1
            self.submits += 1
            self.descriptions[cluster] = dict(description)
            uid = description[f"MY.{UID_ATTR}"].strip('"')
            for proc in range(count):
                self.queue[(cluster, proc)] = {
                    "ClusterId": cluster, "ProcId": proc, "JobStatus": HELD, "HoldReasonCode": SPOOLING_INPUT,
                    "HoldReason": "Spooling input data files", UID_ATTR: uid, "EnteredCurrentStatus": time.time(),
                    "NumJobStarts": 0}
            if self.cut_next_upload:
                self.cut_next_upload = False
                raise ScheddUnreachable("the upload was cut")
            for proc in range(count):
                ad = self.queue[(cluster, proc)]
                ad.update(JobStatus=IDLE)
                ad.pop("HoldReasonCode")
                ad.pop("HoldReason")
            return cluster

    def remove(self, constraint: str, reason: str) -> int:
        with self.lock:
            self._check()
            keys = [k for k, ad in self.queue.items() if self._match(constraint, ad)]
            for k in keys:
                ad = self.queue.pop(k)
                ad.update(JobStatus=REMOVED, RemoveReason=reason, EnteredCurrentStatus=time.time())
                self.history.append(ad)
            return len(keys)

    def retrieve(self, cluster: int) -> None:
        with self.lock:
            self._check()
            desc = self.descriptions[cluster]
            for (c, proc), ad in self.queue.items():
                if c != cluster or ad["JobStatus"] != COMPLETED:
                    continue
                iwd = Path(desc["initialdir"].replace("$(ProcId)", str(proc)))
                assert iwd.is_dir(), f"retrieve needs the submit-side initialdir {iwd}"
                for name, text in self.outputs.get((c, proc), {}).items():
                    (iwd / name).write_text(text)
            # Retrieved, a spooled job leaves the queue on its own (StageOutFinish is set).
            for key in [k for k, ad in self.queue.items() if k[0] == cluster and ad["JobStatus"] == COMPLETED]:
                self.history.append(self.queue.pop(key))

    def edit(self, constraint: str, attr: str, value: str) -> None:
        with self.lock:
            self._check()
            for k, ad in list(self.queue.items()):
                if not self._match(constraint, ad):
                    continue
                if attr == "LeaveJobInQueue" and value == "false" and ad["JobStatus"] == COMPLETED:
                    self.history.append(self.queue.pop(k))
                elif attr == ABANDONED_ATTR:
                    ad[ABANDONED_ATTR] = value == "true"

    # ------------------------------------------------------------------ the test drives the jobs
    def start(self, cluster: int, proc: int) -> None:
        with self.lock:
            self.queue[(cluster, proc)].update(JobStatus=RUNNING, JobStartDate=int(time.time()), NumJobStarts=1)

    def hold(self, cluster: int, proc: int, reason: str, code: int) -> None:
        with self.lock:
            self.queue[(cluster, proc)].update(JobStatus=HELD, HoldReason=reason, HoldReasonCode=code)

    def finish(self, cluster: int, proc: int, exit_code: int, stdout: str = "", stderr: str = "",
               files: dict[str, str] | None = None) -> None:
        with self.lock:
            self.queue[(cluster, proc)].update(JobStatus=COMPLETED, ExitCode=exit_code, ExitBySignal=False,
                                               CompletionDate=int(time.time()))
            self.outputs[(cluster, proc)] = {STDOUT: stdout, STDERR: stderr, **(files or {})}
