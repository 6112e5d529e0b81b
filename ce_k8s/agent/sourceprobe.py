"""Where a routed job's source job stands on the CE's schedd: may a cleanup delete a live pod?

Why (docs/agent.md "Released pods"): the JOB_CLEANUP hook gets only the routed ad, and that ad is
the same whether the factory removed the pilot or the router merely lost its grip on it. HTCondor
23.9's router calls GracefullyRemoveJob, and so the cleanup hook, whenever it cannot push the
update hook's output to the schedd, for example while the schedd restarts (JobRouter.cpp:2380-2427,
UpdateRoutedJobStatus); after the cleanup it yields the source job back to idle and routes it
again (JobRouter.cpp:2852-2919, FinishCleanupJob). Only the source job tells the two apart:

* **gone**: no such job, or `JobStatus` 3 (removed), 4 (completed) or 5 (held by someone other
  than the router's mirror: the router keeps a real hold when it yields). Nobody will route it
  again soon, so the pod can go.
* **waiting**: `JobStatus` 1 (idle) or 2 (running, as mirrored from the routed job), or 6/7
  (yield sets those back to idle): the router will route it again and the re-routed job can
  adopt the live pod.
* **unknown**: the schedd did not answer (it is restarting, which is the case this exists for),
  no schedd is configured, the probe is off (`CE_K8S_SOURCE_PROBE = false`), or anything failed.
  The agent keeps the pod then, as for "waiting", for `CE_K8S_RELEASE_GRACE` seconds.

The HTCondor implementation asks the schedd of the agent process's own configuration
(`CONDOR_CONFIG`: on a CE the master starts the agent with the CE's), with one
`query(constraint="ClusterId == C && ProcId == P", projection=["JobStatus"], limit=1)`. `htcondor2`
is imported on the first question, not at agent start, so an agent that never needs it never pays
for it. A failed query makes the next `RETRY_AFTER` seconds answer "unknown" without asking: while
the schedd is down, a burst of cleanups must not queue on its connect timeout. At most one query
is in flight at a time, for the same reason and to spare a busy schedd.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ce_k8s.agent.logfmt import fields

log = logging.getLogger(__name__)

GONE, WAITING, UNKNOWN = "gone", "waiting", "unknown"
VERDICTS = frozenset({GONE, WAITING, UNKNOWN})

# JobStatus of the source job -> verdict (JobRouter.cpp FinishCheckSubmittedJobStatus and yield_job).
_BY_STATUS = {1: WAITING, 2: WAITING, 6: WAITING, 7: WAITING, 3: GONE, 4: GONE, 5: GONE}

RETRY_AFTER = 5.0        # seconds of "unknown" without asking after a failed query
WAIT_FOR_TURN = 10.0     # longest wait for the query another thread has in flight
LOG_EVERY = 60.0         # at most one warning per this many seconds about failing queries


def parse_job_id(text: str | None) -> tuple[int, int] | None:
    """`"cluster.proc"` (RoutedFromJobId) -> (cluster, proc); None for anything else."""
    if not text:
        return None
    cluster, dot, proc = text.strip().partition(".")
    if not dot or not cluster.isdigit() or not proc.isdigit() or not cluster.isascii() or not proc.isascii():
        return None
    return int(cluster), int(proc)


def verdict_for(job_status: object) -> str:
    """The verdict for a source job's `JobStatus` value (an unexpected value is "unknown")."""
    if isinstance(job_status, bool) or not isinstance(job_status, int):
        return UNKNOWN
    return _BY_STATUS.get(job_status, UNKNOWN)


class SourceProbe:
    """Asks about a source job by its `"cluster.proc"` id; this base class never knows.

    It is also what `CE_K8S_SOURCE_PROBE = false` gives. Implementations answer one of `GONE`,
    `WAITING`, `UNKNOWN`, never raise, and may be called from several threads at once.
    """

    def status(self, job_id: str) -> str:
        return UNKNOWN


class FixedProbe(SourceProbe):
    """Always the same answer (tests); records the job ids it was asked about."""

    def __init__(self, answer: str = UNKNOWN) -> None:
        if answer not in VERDICTS:
            raise ValueError(f"not a verdict: {answer!r}")
        self.answer = answer
        self.asked: list[str] = []

    def status(self, job_id: str) -> str:
        self.asked.append(job_id)
        return self.answer


class CondorSourceProbe(SourceProbe):
    """The source job's `JobStatus` from the local schedd, through `htcondor2` (module docstring).

    `schedd` makes the schedd object for each question (default: `htcondor2.Schedd()`, which
    locates the schedd of `CONDOR_CONFIG` afresh, so a restarted schedd is found at its new
    address); tests pass a fake. `clock` is `time.monotonic` unless a test moves time.
    """

    def __init__(self, schedd: Callable[[], object] | None = None, *, retry_after: float = RETRY_AFTER,
                 wait: float = WAIT_FOR_TURN, log_every: float = LOG_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._schedd = schedd or _local_schedd
        self.retry_after = retry_after
        self.wait = wait
        self.log_every = log_every
        self._clock = clock
        self._turn = threading.Lock()
        self._quiet_until = float("-inf")     # no query before this time (after a failure)
        self._last_warning = float("-inf")
        self.failures = 0                     # failed queries since start (tests, debugging)

    def status(self, job_id: str) -> str:
        ids = parse_job_id(job_id)
        if ids is None:
            return UNKNOWN
        if self._clock() < self._quiet_until:
            return UNKNOWN
        if not self._turn.acquire(timeout=self.wait):
            return UNKNOWN                    # another query is stuck on the schedd
        try:
            if self._clock() < self._quiet_until:
                return UNKNOWN                # the query we waited for failed
            cluster, proc = ids
            ads = self._schedd().query(constraint=f"ClusterId == {cluster} && ProcId == {proc}",
                                       projection=["JobStatus"], limit=1)
            ads = list(ads)
        except Exception as exc:
            self._failed(exc)
            return UNKNOWN
        finally:
            self._turn.release()
        if not ads:
            return GONE                       # no such job: removed and gone from the queue
        try:
            return verdict_for(ads[0].get("JobStatus"))
        except Exception:
            return UNKNOWN

    def _failed(self, exc: BaseException) -> None:
        now = self._clock()
        self.failures += 1
        self._quiet_until = now + self.retry_after
        if now - self._last_warning >= self.log_every:
            self._last_warning = now
            text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            log.warning("%s", fields(event="source-probe-failed", error=text, failures=self.failures,
                                     action="live pods of cleaned-up jobs are released, not deleted"))


def _local_schedd():
    # Imported here: only cleanups of live pods ask, and the import reads the HTCondor configuration.
    import htcondor2

    return htcondor2.Schedd()


def make_source_probe(enabled: bool) -> SourceProbe:
    """The agent's default: the schedd query when `CE_K8S_SOURCE_PROBE` is on, else never knowing."""
    return CondorSourceProbe() if enabled else SourceProbe()


__all__ = ["GONE", "UNKNOWN", "WAITING", "CondorSourceProbe", "FixedProbe", "SourceProbe", "make_source_probe",
           "parse_job_id", "verdict_for"]
