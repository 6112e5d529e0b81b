"""One HTCJob: read the resource and the schedd, decide, then act. Level-triggered and idempotent.

Every pass starts from what Kubernetes and the schedd say, never from memory of its own, so a
pass cut anywhere (operator killed, API server or schedd gone) is finished by the next one:

* **Submit once.** The jobs carry the resource's uid (`HTCJobUid`). Before submitting, the pass
  asks the schedd's queue *and* history for that uid; jobs found are adopted, whatever the
  status says. A submit whose input upload was cut (the cluster still held by the schedd for its
  input, code 16, never started) is marked `HTCJobAbandoned`, removed, and submitted again: its
  jobs never ran, so nothing runs twice.
* **A stale read acts on nothing.** The resource a pass starts from is the operator's watch copy
  (ce_k8s.htcjob.cache), which may be behind the API server. Every write of the pass is
  conditional on the resourceVersion it read (a `Conflict` when the resource moved on), and a
  submit goes ahead only on a resource known current: read by a GET, or answered by a
  conditional write of this very pass (the finalizer's). A status write that conflicts only
  because the resource's metadata or spec moved (a label, a new generation) is written again on
  the new version when the status it was computed from is still the status: the operator is
  the status's only writer, so the pass's decisions still hold.
* **Finalizer first.** The finalizer is on the resource before anything is submitted, so a
  deleted resource always gets its jobs removed.
* **The schedd is the truth.** Counts, per-proc states, exit codes and hold reasons are read from
  the job ads every pass (ce_k8s.htcjob.jobstate); the operator keeps nothing of its own.
* **Output kept until delivered.** A spooled cluster stays in the queue after it completes
  (HTCondor's LeaveJobInQueue for spooled jobs) until its output is retrieved, then leaves on its
  own; the pass retrieves it and writes it where the spec says. The retrieved files stay in the
  work directory until they are delivered, so a pass cut in between delivers them next time.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ce_k8s.htcjob import jobstate, output, submitdesc
from ce_k8s.htcjob.jobstate import COMPLETED, HELD, REMOVED, SPOOLING_INPUT, set_condition
from ce_k8s.htcjob.schedd import Schedd, ScheddUnreachable, SubmitRefused, uid_constraint
from ce_k8s.htcjob.spec import HTCJobSpec, SpecError, Target, parse_spec

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "ce-k8s.io", "v1alpha1", "htcjobs"
FINALIZER = "ce-k8s.io/htcjob-remove-jobs"
TERMINAL = ("Completed", "Failed", "Invalid")


class TargetError(RuntimeError):
    """The spec's target cannot be used yet (its token Secret is missing, say): a condition, retried."""


class Conflict(RuntimeError):
    """The pass read a version of the resource that is no longer the current one (a conditional
    write was refused with 409, or a read before a submit found a newer version): the pass's
    decisions are void, and the next one reads the resource from the API server."""


class KubeSide(Protocol):
    """What a pass needs of Kubernetes (ce_k8s.htcjob.operator.Kube is the real one). The two
    resource writes are conditional on `resource_version`, raise `Conflict` when it is not the
    current one, and return the resource as written."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def patch_status(self, namespace: str, name: str, status: dict[str, Any],
                     resource_version: str) -> dict[str, Any]: ...
    def set_finalizers(self, namespace: str, name: str, finalizers: list[str],
                       resource_version: str) -> dict[str, Any]: ...
    def read_data(self, kind: str, namespace: str, name: str) -> dict[str, bytes]: ...
    def put_output(self, namespace: str, name: str, owner: dict[str, Any], data: dict[str, str],
                   binary: dict[str, str]) -> None: ...


@dataclass
class Context:
    kube: KubeSide
    schedd_for: Callable[[Target, str], Schedd]    # (target, namespace) → Schedd; TargetError
    work_root: Path
    claims_root: Path
    clock: Callable[[], float]
    poll: float = 10.0
    upload_grace: float = 60.0       # how old a cluster held for its input must be to be abandoned
    # Every version a write of a pass answers with (the operator keeps it in its watch copy).
    remember: Callable[[dict[str, Any]], None] = lambda obj: None


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def is_settled(obj: dict[str, Any]) -> bool:
    """Nothing to ask the schedd: a terminal status of this generation, not being deleted."""
    meta, status = obj["metadata"], obj.get("status") or {}
    return (not meta.get("deletionTimestamp") and status.get("phase") in TERMINAL
            and status.get("observedGeneration") == meta.get("generation"))


class Pass:
    """One reconcile pass of one resource. `fresh`: `obj` was just read from the API server (not
    from the watch copy), so a submit may be decided on it without reading it again."""

    def __init__(self, obj: dict[str, Any], ctx: Context, *, fresh: bool = False) -> None:
        self.obj = obj
        self.ctx = ctx
        self.fresh = fresh
        meta = obj["metadata"]
        self.ns, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.generation = meta.get("generation")
        self.key = _key(obj)
        self.old_status = obj.get("status") or {}
        self.status = copy.deepcopy(self.old_status)
        self.status.setdefault("conditions", [])
        self.work = ctx.work_root / self.uid
        self.now = ctx.clock()

    # ------------------------------------------------------------------ helpers
    def cond(self, type_: str, ok: bool | None, reason: str, message: str = "") -> None:
        set_condition(self.status["conditions"], type_, ok, reason, message, self.now, self.generation)

    def _written(self, obj: dict[str, Any]) -> None:
        """A conditional write of this pass succeeded: `obj` is the resource now, current."""
        self.obj = obj
        self.fresh = True
        self.ctx.remember(obj)

    def _version(self) -> str:
        return self.obj["metadata"]["resourceVersion"]

    def save(self) -> None:
        """Write the status, on the version read. On a conflict, write it again on the current version
        if the status there is still the one this pass started from; otherwise the pass was stale."""
        self.status["observedGeneration"] = self.generation
        if self.status == self.old_status:
            return
        try:
            written = self.ctx.kube.patch_status(self.ns, self.name, self.status, self._version())
        except Conflict:
            current = self.ctx.kube.get(self.ns, self.name)
            if current is None or current["metadata"].get("uid") != self.uid or \
                    (current.get("status") or {}) != (self.obj.get("status") or {}):
                raise
            written = self.ctx.kube.patch_status(self.ns, self.name, self.status,
                                                 current["metadata"]["resourceVersion"])
        self._written(written)
        self.old_status = copy.deepcopy(self.status)

    def ensure_current(self) -> None:
        """Before an act that must not be repeated on a stale view: make sure `obj` is current."""
        if self.fresh:
            return
        current = self.ctx.kube.get(self.ns, self.name)
        if current is None or current["metadata"].get("resourceVersion") != self._version():
            if current is not None:
                self.ctx.remember(current)
            raise Conflict(f"htcjob {self.key}: the watch copy is behind the API server; not submitting from it")
        self.fresh = True

    # ------------------------------------------------------------------ the pass
    def run(self) -> float | None:
        """Reconcile; seconds until the next pass is due, or None when only a change needs one."""
        meta = self.obj["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if meta.get("deletionTimestamp"):
            return self.finalize(finalizers) if FINALIZER in finalizers else None
        if is_settled(self.obj):
            return None
        try:
            spec = parse_spec(self.obj.get("spec"))
        except SpecError as exc:
            self.cond("SpecValid", False, "InvalidSpec", str(exc))
            self.status.update(phase="Invalid", message=str(exc))
            log.warning("htcjob %s: invalid spec, nothing submitted: %s", self.key, exc)
            self.save()
            return None
        self.cond("SpecValid", True, "Valid")
        if FINALIZER not in finalizers:
            # Conditional: its answer is the current resource, on which this pass goes on.
            self._written(self.ctx.kube.set_finalizers(self.ns, self.name, [*finalizers, FINALIZER],
                                                       meta["resourceVersion"]))
        try:
            schedd = self.ctx.schedd_for(spec.target, self.ns)
            return self.track(spec, schedd)
        except SubmitRefused as exc:
            self.cond("SpecValid", False, "SubmitRefused", str(exc))
            self.status.update(phase="Invalid", message=str(exc))
            log.warning("htcjob %s: %s; nothing submitted", self.key, exc)
            self.save()
            return None
        except (ScheddUnreachable, TargetError) as exc:
            reason = "TargetNotReady" if isinstance(exc, TargetError) else "ScheddUnreachable"
            self.cond("ScheddReachable", False, reason, str(exc))
            self.status.setdefault("phase", "Pending")
            self.status["message"] = str(exc)
            log.warning("htcjob %s: %s", self.key, exc)
            self.save()
            return max(self.ctx.poll, 5.0)

    def track(self, spec: HTCJobSpec, schedd: Schedd) -> float | None:
        ads = schedd.jobs(self.uid, spec.queue)
        self.cond("ScheddReachable", True, "Reachable", schedd.name)
        self.status["schedd"] = schedd.name
        clusters = sorted({int(ad["ClusterId"]) for ad in ads})
        if self._abandon_cut_upload(schedd, ads):
            ads = []
            clusters = []
        if not ads:
            if self.status.get("jobId"):
                msg = f"the jobs of cluster {self.status['jobId']} are in neither the queue nor the history"
                self.status["message"] = msg
                log.error("htcjob %s: %s", self.key, msg)
                self.save()
                return self.ctx.poll * 6
            return self.submit(spec, schedd)
        if len(clusters) > 1:            # must never happen: say so loudly, follow the first
            log.error("htcjob %s: more than one cluster carries its uid: %s", self.key, clusters)
        cluster = clusters[0]
        mine = [ad for ad in ads if int(ad["ClusterId"]) == cluster]
        if self.status.get("jobId") != str(cluster):
            log.info("htcjob %s: adopted cluster %s found on %s", self.key, cluster, schedd.name)
            self.status["jobId"] = str(cluster)
        summary = jobstate.summarise(mine)
        out = self.status.setdefault("output", {})
        if summary.finished and not out.get("delivered"):
            self.deliver(spec, schedd, cluster, mine, summary)
        phase = jobstate.job_conditions(summary, self.status["conditions"], delivered=bool(out.get("delivered")),
                                        now=self.now, generation=self.generation)
        counts = summary.counts
        if phase != self.old_status.get("phase"):
            log.info("htcjob %s: cluster %s %s (%s)", self.key, cluster, phase,
                     ", ".join(f"{k} {v}" for k, v in counts.items() if v))
        self.status.update(counts, phase=phase, procs=[p.as_status() for p in summary.procs],
                           message=self._message(phase, summary))
        undelivered = next((c for c in self.status["conditions"]
                            if c["type"] == "OutputDelivered" and c["status"] == "False"), None)
        if undelivered is not None and not self.status["message"]:
            self.status["message"] = undelivered["message"]     # why the finished jobs are not Completed
        self.save()
        return None if phase in TERMINAL else self.ctx.poll

    @staticmethod
    def _message(phase: str, summary: jobstate.Summary) -> str:
        held = [p for p in summary.procs if p.state == "Held"]
        if held:
            return f"proc {held[0].proc} held: {held[0].hold_reason}"
        codes = [f"{p.proc}:{p.exit_code if p.exit_signal is None else 'signal ' + str(p.exit_signal)}"
                 for p in summary.procs if p.status == COMPLETED]
        return f"exit codes {' '.join(codes)}" if codes and phase in TERMINAL else ""

    def _abandon_cut_upload(self, schedd: Schedd, ads: list[dict[str, Any]]) -> bool:
        """A cluster whose input never arrived (held with code 16, never started, old enough)."""
        if not ads or any(ad.get("_source") != "queue" for ad in ads):
            return False
        if not all(ad.get("JobStatus") == HELD and ad.get("HoldReasonCode") == SPOOLING_INPUT
                   and not ad.get("NumJobStarts") for ad in ads):
            return False
        if self.now - max(float(ad.get("EnteredCurrentStatus") or 0) for ad in ads) < self.ctx.upload_grace:
            return False
        self.ensure_current()            # the resubmit that follows must be decided on a current read
        cluster = int(ads[0]["ClusterId"])
        log.warning("htcjob %s: cluster %s never got its input (upload cut); removing it and submitting again",
                    self.key, cluster)
        schedd.edit(f"ClusterId == {cluster}", submitdesc.ABANDONED_ATTR, "true")
        schedd.remove(f"ClusterId == {cluster}", "ce-k8s htcjob-operator: input upload was cut; submitted again")
        self.status.pop("jobId", None)
        return True

    # ------------------------------------------------------------------ acting
    def submit(self, spec: HTCJobSpec, schedd: Schedd) -> float:
        # The status says whether this resource ever submitted (jobId): a stale copy could say no
        # where the current one says yes (and the schedd has lost the jobs since). Read it first.
        self.ensure_current()
        inputs = self._write_inputs(spec)
        desc = submitdesc.describe(spec, uid=self.uid, name=self.name, namespace=self.ns, work=self.work,
                                   input_files=inputs)
        for proc in range(spec.queue):
            submitdesc.proc_dir(self.work, proc).mkdir(parents=True, exist_ok=True)
        cluster = schedd.submit(desc, spec.queue)
        shutil.rmtree(self.work / "in", ignore_errors=True)   # uploaded: the schedd's spool has it
        log.info("htcjob %s: submitted cluster %s (%d procs) to %s", self.key, cluster, spec.queue, schedd.name)
        self.status.update(jobId=str(cluster), schedd=schedd.name, phase="Submitted",
                           submitted=spec.queue, idle=spec.queue, message="")
        self.cond("Submitted", True, "Submitted", f"cluster {cluster} on {schedd.name}")
        self.save()
        return self.ctx.poll

    def _write_inputs(self, spec: HTCJobSpec) -> list[Path]:
        indir = self.work / "in"
        shutil.rmtree(indir, ignore_errors=True)
        indir.mkdir(parents=True, mode=0o700)
        files: list[Path] = []
        for item in spec.inputs:
            try:
                data = self.ctx.kube.read_data(item.kind, self.ns, item.name)
            except KeyError as exc:
                raise TargetError(f"input {item.kind} {item.name!r} not found in namespace {self.ns}") from exc
            keys = item.keys or tuple(sorted(data))
            for key in keys:
                if key not in data:
                    raise TargetError(f"input {item.kind} {item.name!r} has no key {key!r}")
                path = indir / key
                path.write_bytes(data[key])
                path.chmod(0o600)
                files.append(path)
        if spec.script is not None:
            script = indir / submitdesc.SCRIPT_NAME
            script.write_text(spec.script)
            script.chmod(0o700)
        return files

    def deliver(self, spec: HTCJobSpec, schedd: Schedd, cluster: int, ads: list[dict[str, Any]],
                summary: jobstate.Summary) -> None:
        """Retrieve the finished cluster's output and put it where the spec says.

        A spooled job stays in the queue after it completes until its output is retrieved, and
        leaves on its own once it has been (HTCondor's LeaveJobInQueue for spooled jobs tests
        StageOutFinish). A pass cut after the retrieve finds the jobs gone but the files in the
        work directory, and delivers those; only with neither is the output gone.
        """
        out = self.status["output"]
        waiting = [ad for ad in ads if ad.get("_source") == "queue" and ad.get("JobStatus") == COMPLETED]
        done = [p.proc for p in summary.procs if p.status == COMPLETED]
        outdir = self.work / "out"
        if waiting:
            for proc in done:
                submitdesc.proc_dir(self.work, proc).mkdir(parents=True, exist_ok=True)
            schedd.retrieve(cluster)
        elif done and not any(f.is_file() for f in outdir.glob("*/*")):
            out["delivered"] = True
            self.cond("OutputDelivered", False, "OutputGone",
                      "the jobs left the queue before their output was retrieved")
            return
        try:
            if spec.output.claim:
                where = output.to_claim(outdir, done, self.ctx.claims_root, spec.output.claim,
                                        spec.output.path, self.name)
                out.update(path=str(where), truncated=False)
            else:
                cm = output.to_configmap(outdir, done)
                cm_name = spec.output.config_map or f"{self.name}-output"
                self.ctx.kube.put_output(self.ns, cm_name, self.obj, cm.data, cm.binary)
                out.update(configMap=cm_name, truncated=cm.truncated)
        except output.OutputError as exc:
            self.cond("OutputDelivered", False, "OutputFailed", str(exc))
            self.status["message"] = str(exc)
            log.warning("htcjob %s: %s", self.key, exc)
            return
        out["delivered"] = True
        msg = str(out.get("configMap") or out.get("path"))
        if out.get("truncated"):
            msg += " (cut to its last bytes: too long)"
        self.cond("OutputDelivered", True, "Delivered", msg)
        shutil.rmtree(self.work, ignore_errors=True)
        log.info("htcjob %s: output of cluster %s delivered to %s", self.key, cluster, msg)

    def finalize(self, finalizers: list[str]) -> float | None:
        """The resource is being deleted: remove its jobs, then let it go."""
        try:
            spec = parse_spec(self.obj.get("spec"))
        except SpecError:
            spec = None                  # never submitted anything
        if self.old_status.get("phase") in TERMINAL:
            # Every job is done and out of the queue (or none was ever submitted): nothing to ask
            # the schedd, whose token Secret may already be gone with a namespace being deleted.
            spec = None
        if spec is not None:
            try:
                schedd = self.ctx.schedd_for(spec.target, self.ns)
                ads = [ad for ad in schedd.jobs(self.uid, 0) if ad.get("_source") == "queue"]
                live = [ad for ad in ads if ad.get("JobStatus") not in (COMPLETED, REMOVED)]
                if live:
                    constraint = f"{uid_constraint(self.uid)} && JobStatus != {COMPLETED} && JobStatus != {REMOVED}"
                    n = schedd.remove(constraint, f"HTCJob {self.key} was deleted")
                    log.info("htcjob %s: deleted; removing %d job(s) (%d acted on)", self.key, len(live), n)
                if any(ad.get("JobStatus") == COMPLETED for ad in ads):
                    # Completed, output never fetched: let them leave. They may have left already
                    # (a query is a moment old), which the edit reports as an error: the next pass looks.
                    with contextlib.suppress(ScheddUnreachable):
                        schedd.edit(f"{uid_constraint(self.uid)} && JobStatus == {COMPLETED}",
                                    "LeaveJobInQueue", "false")
                if ads:
                    return 1.0           # until the schedd has let them all go
            except (ScheddUnreachable, TargetError) as exc:
                self.cond("ScheddReachable", False, "ScheddUnreachable",
                          f"cannot remove the jobs before deletion: {exc}")
                log.warning("htcjob %s: deletion waits for the schedd: %s", self.key, exc)
                self.save()
                return max(self.ctx.poll, 5.0)
        shutil.rmtree(self.work, ignore_errors=True)
        self._written(self.ctx.kube.set_finalizers(self.ns, self.name, [f for f in finalizers if f != FINALIZER],
                                                   self._version()))
        log.info("htcjob %s: jobs gone; finalizer removed", self.key)
        return None


def reconcile(obj: dict[str, Any], ctx: Context, *, fresh: bool = False) -> float | None:
    """One pass over `obj` (see `Pass`); seconds until the next one is due, or None."""
    return Pass(obj, ctx, fresh=fresh).run()
