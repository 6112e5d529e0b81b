"""An emulated condor_schedd job queue: the source (user-visible) and routed jobs of a CE.

The JobRouter emulator, the end-to-end tests and the demo need a job queue that reacts the way
the CE's schedd does to what the router and a factory do to it, because those reactions decide
whether a pilot is lost, duplicated or left behind (docs/hook-protocol.md §2.3, §2.5, §3):

* job ids are ``"cluster.proc"`` strings, clusters count up from 1, every job gets ``QDate``,
  ``EnteredCurrentStatus`` and a ``GlobalJobId``;
* a ``JobStatus`` change stamps ``EnteredCurrentStatus`` and ``LastJobStatus``;
* a client writing as the job's user (qmgmt ``SetAttribute``) may not change the immutable
  attributes (``SYSTEM_IMMUTABLE_JOB_ATTRS``; ``ClusterId``/``ProcId`` only to their current
  value) nor the secure ones (``SYSTEM_SECURE_JOB_ATTRS``); a transaction with such a write fails
  as a whole (hook-protocol.md §2.3 "Push rules");
* ``condor_rm`` marks a job REMOVED; an externally managed job (``Managed == "External"``: a
  source job the router has claimed) then stays in the queue until its manager yields it, others
  leave the queue at once (hook-protocol.md §3, schedd ``abort_job_myself``); a yielded REMOVED job is destroyed
  (submit_job.cpp ``yield_job``);
* a COMPLETED job leaves the queue once ``LeaveJobInQueue`` is false, unless it is externally
  managed;
* a Kubernetes routed job is ``Managed == "ScheddDone"`` (docs/internals.md, "Routed jobs"), not
  externally managed: the schedd is responsible for it. A removed one leaves the queue at once,
  like any job the schedd manages. A completed one stays while ``LeaveJobInQueue``
  (``JobStatus == 4``) holds and leaves once finalize has set it false (hook-protocol.md §2.4): HTCondor's
  periodic-expression pass (src/condor_schedd.V6/schedd.cpp ``PeriodicExprEval``) calls
  ``DestroyProc`` for COMPLETED and REMOVED jobs the schedd is responsible for. The emulation
  applies that pass's verdict right after each change instead of on the schedd's timer.

What is *not* emulated: users and authorization, the job_queue.log mirror lag, user logs,
spooling and file transfer. The emulated mirror is always in sync; see ``docs/demo.md``.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import IntEnum

import classad2

log = logging.getLogger(__name__)


class JobStatus(IntEnum):
    """HTCondor's JobStatus codes (hook-protocol.md §3.1)."""

    IDLE = 1
    RUNNING = 2
    REMOVED = 3
    COMPLETED = 4
    HELD = 5
    TRANSFERRING_OUTPUT = 6
    SUSPENDED = 7


# SYSTEM_IMMUTABLE_JOB_ATTRS (param_info.in:3332), lower-case.
IMMUTABLE_ATTRS = frozenset(
    {"owner", "clusterid", "jobuniverse", "procid", "mytype", "targettype", "user", "osuser"}
)
# SYSTEM_SECURE_JOB_ATTRS: only the schedd itself may set these (hook-protocol.md §2.3).
SECURE_ATTRS = frozenset(
    {
        "x509userproxysubject",
        "x509userproxyexpiration",
        "x509userproxyemail",
        "x509userproxyvoname",
        "x509userproxyfirstfqan",
        "x509userproxyfqan",
        "authtokensubject",
        "authtokenissuer",
        "authtokengroups",
        "authtokenscopes",
        "authtokenid",
        "totalsubmitprocs",
        "osuser",
    }
)
# Attributes submit_job() filters out of a routed job (submit_job.cpp:224-386, hook-protocol.md §2.2 step 5): the
# x509 and AuthToken ones of SECURE_ATTRS; TotalSubmitProcs and OsUser are the schedd's own.
ROUTED_SUBMIT_FILTER = SECURE_ATTRS - {"totalsubmitprocs", "osuser"}


class ScheddError(Exception):
    """A queue operation the schedd refuses; ``job`` is the job id it was about."""

    def __init__(self, job: str, message: str) -> None:
        self.job = job
        super().__init__(f"job {job}: {message}")


class NoSuchJob(ScheddError):
    """The job id is not (or no longer) in the queue."""


class PushRejected(ScheddError):
    """A SetAttribute transaction was refused; nothing of it was applied."""

    def __init__(self, job: str, attr: str, reason: str) -> None:
        self.attr = attr
        super().__init__(job, f"refused to set {attr}: {reason}")


Value = object  # a Python value, classad2.ExprTree or classad2.Value accepted by ClassAd.__setitem__


def eval_attr(ad: classad2.ClassAd, name: str, default: object = None) -> object:
    """Evaluate ``name`` in ``ad``; ``default`` when missing, undefined or error."""
    try:
        value = ad.eval(name)
    except KeyError:
        return default
    if isinstance(value, classad2.Value):
        return default
    return value


def eval_int(ad: classad2.ClassAd, name: str, default: int | None = None) -> int | None:
    """``EvaluateAttrInt``: ints and bools count (as the C++ does), reals are truncated."""
    value = eval_attr(ad, name)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    return default


def eval_str(ad: classad2.ClassAd, name: str, default: str | None = None) -> str | None:
    value = eval_attr(ad, name)
    return value if isinstance(value, str) else default


def is_true(ad: classad2.ClassAd, name: str) -> bool:
    """Boolean-equivalent truth of an attribute; undefined/error/missing are false."""
    value = eval_attr(ad, name)
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    return False


def expr_text(ad: classad2.ClassAd, name: str) -> str | None:
    """The unparsed expression of an attribute (for "did it change" comparisons), None if absent."""
    try:
        return str(ad.lookup(name))
    except KeyError:
        return None


def copy_ad(ad: classad2.ClassAd) -> classad2.ClassAd:
    """An independent copy (the router keeps snapshots, never live references)."""
    return copy.deepcopy(ad)


class Schedd:
    """One emulated schedd queue. Thread-safe: the demo's factory and router run in threads.

    ``clock`` is injectable so tests can move time (LeaveJobInQueue expressions use the real
    ``time()`` of the ClassAd library, which is fine because they compare against stamps we set).
    """

    def __init__(self, name: str = "ce.example.org", clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.clock = clock
        self._jobs: dict[str, classad2.ClassAd] = {}
        self.history: dict[str, classad2.ClassAd] = {}
        self._next_cluster = 1
        self._lock = threading.RLock()
        # Every write, for tests that assert what reached the queue: (job, attr, unparsed value).
        self.write_log: list[tuple[str, str, str]] = []
        self.keep_write_log = False

    # ----------------------------------------------------------------- reading
    def __contains__(self, job: str) -> bool:
        return job in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, job: str) -> classad2.ClassAd | None:
        """The live ad (do not mutate it; use set_attributes) or None."""
        return self._jobs.get(job)

    def snapshot(self, job: str) -> classad2.ClassAd | None:
        with self._lock:
            ad = self._jobs.get(job)
            return copy_ad(ad) if ad is not None else None

    def job_ids(self) -> list[str]:
        with self._lock:
            return list(self._jobs)

    def items(self) -> Iterator[tuple[str, classad2.ClassAd]]:
        """(id, live ad) pairs over a copy of the id list, so callers may write while iterating."""
        for job in self.job_ids():
            ad = self._jobs.get(job)
            if ad is not None:
                yield job, ad

    def query(self, constraint: str | Callable[[classad2.ClassAd], bool]) -> list[str]:
        """Ids of jobs for which ``constraint`` (a ClassAd expression or a predicate) is true."""
        if isinstance(constraint, str):
            expr = classad2.ExprTree(constraint)

            def predicate(ad: classad2.ClassAd) -> bool:
                return expr.eval(ad) is True

        else:
            predicate = constraint
        return [job for job, ad in self.items() if predicate(ad)]

    def status(self, job: str) -> int | None:
        ad = self._jobs.get(job)
        return eval_int(ad, "JobStatus") if ad is not None else None

    # ----------------------------------------------------------------- writing
    def submit(self, ad: classad2.ClassAd | Mapping[str, Value], owner: str | None = None) -> str:
        """Queue a new job as the schedd does for an incoming submission (factory or Condor-C).

        ``Owner`` comes from ``owner`` (the authenticated mapping) when given.
        """
        with self._lock:
            new = self._new_ad(ad)
            if owner is not None:
                new["Owner"] = owner
            if "JobStatus" not in new:
                new["JobStatus"] = int(JobStatus.IDLE)
            return self._commit_new(new)

    def submit_cluster(self, ads: Iterable[classad2.ClassAd | Mapping[str, Value]],
                       owner: str | None = None) -> list[str]:
        """Queue several procs in one cluster (ids ``C.0``, ``C.1``…), like one submit file."""
        with self._lock:
            cluster = self._next_cluster
            self._next_cluster += 1
            ids = []
            for proc, ad in enumerate(ads):
                new = self._new_ad(ad)
                if owner is not None:
                    new["Owner"] = owner
                if "JobStatus" not in new:
                    new["JobStatus"] = int(JobStatus.IDLE)
                ids.append(self._commit_new(new, f"{cluster}.{proc}"))
            return ids

    def submit_routed(self, ad: classad2.ClassAd) -> str:
        """Queue a routed job the way the router's ``submit_job()`` does (hook-protocol.md §2.2 step 5).

        Sets ``ClusterId``/``ProcId``/``QDate``/``EnteredCurrentStatus``/``LeaveJobInQueue`` **on
        the caller's ad too** (the router's in-memory dest ad gets them, submit_job.cpp) and
        leaves the secure attributes out of what reaches the queue.
        """
        with self._lock:
            job = self._allocate_id()
            cluster, proc = (int(x) for x in job.split("."))
            now = int(self.clock())
            ad["ProcId"] = proc
            ad["ClusterId"] = cluster
            ad["QDate"] = now
            ad["EnteredCurrentStatus"] = now
            ad["LeaveJobInQueue"] = classad2.ExprTree("JobStatus == 4")
            stored = classad2.ClassAd()
            for name in ad.keys():
                if name.lower() in ROUTED_SUBMIT_FILTER:
                    continue
                stored[name] = ad.lookup(name)
            stored["GlobalJobId"] = f"{self.name}#{job}#{now}"
            self._jobs[job] = stored
            log.debug("schedd %s: routed job %s submitted", self.name, job)
            return job

    def set_attributes(
        self, job: str, updates: classad2.ClassAd | Mapping[str, Value] | Iterable[tuple[str, Value]],
        as_user: bool = True,
    ) -> None:
        """One qmgmt transaction of SetAttribute calls: all applied, or none and PushRejected.

        ``as_user`` = a client connected as the job's user (the router pushing hook output or
        status): immutable and secure attributes are refused (hook-protocol.md §2.3).
        """
        with self._lock:
            ad = self._jobs.get(job)
            if ad is None:
                raise NoSuchJob(job, "not in the queue")
            pairs = self._pairs(updates)
            if as_user:
                for name, value in pairs:
                    self._check_user_write(job, ad, name, value)
            for name, value in pairs:
                self._set(job, ad, name, value)
            self._after_change(job)

    def delete_attribute(self, job: str, name: str) -> None:
        with self._lock:
            ad = self._jobs.get(job)
            if ad is not None and name in ad:
                del ad[name]

    def remove(self, job: str, reason: str = "via condor_rm") -> bool:
        """``condor_rm``: REMOVED with ``RemoveReason``; False if the job is not in the queue."""
        with self._lock:
            ad = self._jobs.get(job)
            if ad is None:
                return False
            if eval_int(ad, "JobStatus") != JobStatus.REMOVED:
                self._set(job, ad, "RemoveReason", reason)
                self._set(job, ad, "JobStatus", int(JobStatus.REMOVED))
            self._after_change(job)
            return True

    def hold(self, job: str, reason: str, code: int = 1, subcode: int = 0) -> bool:
        """``condor_hold`` by a user or policy (code 1 = UserRequest by default)."""
        with self._lock:
            ad = self._jobs.get(job)
            if ad is None or eval_int(ad, "JobStatus") in (JobStatus.REMOVED, JobStatus.COMPLETED):
                return False
            self._set(job, ad, "HoldReason", reason)
            self._set(job, ad, "HoldReasonCode", code)
            self._set(job, ad, "HoldReasonSubCode", subcode)
            self._set(job, ad, "JobStatus", int(JobStatus.HELD))
            return True

    def release(self, job: str) -> bool:
        """``condor_release``: a held job goes back to IDLE and its hold attributes are cleared."""
        with self._lock:
            ad = self._jobs.get(job)
            if ad is None or eval_int(ad, "JobStatus") != JobStatus.HELD:
                return False
            for name in ("HoldReason", "HoldReasonCode", "HoldReasonSubCode", "HoldCopiedFromTargetJob"):
                if name in ad:
                    del ad[name]
            self._set(job, ad, "JobStatus", int(JobStatus.IDLE))
            return True

    def destroy(self, job: str) -> bool:
        """DestroyProc: the job leaves the queue for the history."""
        with self._lock:
            ad = self._jobs.pop(job, None)
            if ad is None:
                return False
            self.history[job] = ad
            log.debug("schedd %s: job %s left the queue", self.name, job)
            return True

    # ----------------------------------------------------------------- internals
    def _allocate_id(self) -> str:
        job = f"{self._next_cluster}.0"
        self._next_cluster += 1
        return job

    def _new_ad(self, ad: classad2.ClassAd | Mapping[str, Value]) -> classad2.ClassAd:
        if isinstance(ad, classad2.ClassAd):
            return copy_ad(ad)
        new = classad2.ClassAd()
        for name, value in ad.items():
            new[name] = value
        return new

    def _commit_new(self, new: classad2.ClassAd, job: str | None = None) -> str:
        job = job or self._allocate_id()
        cluster, proc = (int(x) for x in job.split("."))
        now = int(self.clock())
        new["ClusterId"] = cluster
        new["ProcId"] = proc
        new["QDate"] = now
        new["EnteredCurrentStatus"] = now
        new["GlobalJobId"] = f"{self.name}#{job}#{now}"
        self._jobs[job] = new
        log.debug("schedd %s: job %s submitted", self.name, job)
        return job

    @staticmethod
    def _pairs(updates: object) -> list[tuple[str, Value]]:
        if isinstance(updates, classad2.ClassAd):
            return [(name, updates.lookup(name)) for name in updates.keys()]
        if isinstance(updates, Mapping):
            return list(updates.items())
        return list(updates)  # type: ignore[call-overload]

    def _check_user_write(self, job: str, ad: classad2.ClassAd, name: str, value: Value) -> None:
        low = name.lower()
        if low in ("clusterid", "procid"):
            probe = classad2.ClassAd()
            probe["X"] = value
            if eval_attr(probe, "X") != eval_attr(ad, name):
                raise PushRejected(job, name, "ClusterId/ProcId may only be set to their current value")
            return
        if low in IMMUTABLE_ATTRS:
            raise PushRejected(job, name, "attribute is in SYSTEM_IMMUTABLE_JOB_ATTRS")
        if low in SECURE_ATTRS:
            raise PushRejected(job, name, "attribute is in SYSTEM_SECURE_JOB_ATTRS (schedd only)")

    def _set(self, job: str, ad: classad2.ClassAd, name: str, value: Value) -> None:
        if name.lower() == "jobstatus":
            probe = classad2.ClassAd()
            probe["X"] = value
            new_status = eval_int(probe, "X")
            old_status = eval_int(ad, "JobStatus")
            if new_status != old_status:
                if old_status is not None:
                    ad["LastJobStatus"] = old_status
                ad["EnteredCurrentStatus"] = int(self.clock())
        ad[name] = value
        if self.keep_write_log:
            self.write_log.append((job, name, expr_text(ad, name) or ""))

    def _after_change(self, job: str) -> None:
        """Leave-the-queue rules applied after every transaction (module docstring)."""
        ad = self._jobs.get(job)
        if ad is None:
            return
        if eval_str(ad, "Managed") == "External":
            return
        status = eval_int(ad, "JobStatus")
        if status == JobStatus.REMOVED:
            self.destroy(job)
        elif status == JobStatus.COMPLETED and not is_true(ad, "LeaveJobInQueue"):
            self.destroy(job)

    def yield_job(self, job: str, done: bool, manager: str, release_on_hold: bool = True) -> bool:
        """submit_job.cpp ``yield_job``: hand the job back to the schedd (hook-protocol.md §2.5 FinishCleanupJob).

        Returns False (nothing changed) when the job is gone or not managed by ``manager``.
        """
        with self._lock:
            ad = self._jobs.get(job)
            if ad is None or eval_str(ad, "Managed") != "External":
                return False
            current = eval_str(ad, "ManagedManager")
            if current is not None and current != manager:
                return False
            self._set(job, ad, "Managed", "ScheddDone" if done else "Schedd")
            self._set(job, ad, "ManagedManager", "")
            status = eval_int(ad, "JobStatus")
            if status == JobStatus.REMOVED:
                self.destroy(job)
                return True
            if status not in (JobStatus.IDLE, JobStatus.COMPLETED):
                mirrored = False
                if status == JobStatus.HELD and release_on_hold:
                    mirrored = bool(eval_int(ad, "HoldCopiedFromTargetJob", 0))
                    if mirrored:
                        del ad["HoldCopiedFromTargetJob"]
                if status != JobStatus.HELD or mirrored:
                    self._set(job, ad, "JobStatus", int(JobStatus.IDLE))
            self._after_change(job)
            return True

    def claim_job(self, job: str, manager: str) -> bool:
        """submit_job.cpp ``claim_job``: only an IDLE job managed by the schedd can be claimed."""
        with self._lock:
            ad = self._jobs.get(job)
            if ad is None or eval_int(ad, "JobStatus") != JobStatus.IDLE:
                return False
            managed = eval_str(ad, "Managed")
            if "Managed" in ad and managed != "Schedd":
                return False
            self._set(job, ad, "Managed", "External")
            self._set(job, ad, "ManagedManager", manager)
            return True
