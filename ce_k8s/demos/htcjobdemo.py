"""`ce-k8s demo htcjob`: one HTCJob through the real control plane, the operator and the real schedd.

Batch direction (default): the HTCJob goes to the batch pool's schedd, whose real startd runs each
proc's script as the account the operator's token maps to; exit codes and output are the job's own.

Both directions (`--to-ce`): the same HTCJob goes to the site's CE schedd; the CE's job router
takes each job on its Kubernetes route (ce-k8s's hooks and agent), so the job becomes a pod on the
same real control plane, and its exit code and log come back through the CE into the HTCJob's
status and output. The CE's routes, policy and accounting apply to a Kubernetes user's job as to a
grid pilot. kwok plays the pod (nothing executes on a kwok node): the exit code and log lines come
from the job's `DemoScenario`, as in every demo on this bed (docs/testbed.md).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ce_k8s.demos import statedirs
from ce_k8s.real.condor.condor import RealCondor, RealCondorError, _processes_in
from ce_k8s.real.htcjobbed import HTCJobBed, phase_is
from ce_k8s.real.kube.kube import RealKube, RealKubeError

# Root-owned state directories, as the other beds' (ce_k8s.real.kube.kube.STATE_DIR).
KUBE_STATE = Path("/var/tmp/ce-k8s-htcjob-demo-kube")  # noqa: S108
CONDOR_STATE = Path("/var/tmp/ce-k8s-htcjob-demo-condor")  # noqa: S108
WORK = Path("/var/tmp/ce-k8s-htcjob-demo-work")  # noqa: S108

SCRIPT = """#!/bin/sh
# An HTCJob proc: its index is $1 (and $HTCJOB_INDEX).
echo "proc $1 ran as $(id -un) on $(hostname), HTCJOB_INDEX=$HTCJOB_INDEX"
echo "a line on stderr from proc $1" >&2
echo "result of proc $1" > result.txt
exit 0
"""


class DemoError(RuntimeError):
    """The demo could not run (a bed would not come up); the message says which and why."""


def demo_spec(queue: int, to_ce: bool, ce_schedd: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": queue, "script": {"source": SCRIPT},
                            "resources": {"cpus": 1, "memory": "256Mi", "disk": "100Mi"}, "wallTimeSeconds": 600}
    if to_ce:
        spec["target"] = {"schedd": ce_schedd}
        # kwok plays the pod: the scenario says how long it runs, its exit code and its log lines.
        spec["submit"] = {"+DemoScenario": "\"run=2s exit=0 stdout='proc $(ProcId) ran in a Kubernetes pod'\""}
    return spec


def run_demo(queue: int = 3, to_ce: bool = False, htcondor: str = "25", kube_state: str | None = None,
             timeout: float = 300.0, progress: Callable[[str], None] = print) -> dict[str, Any]:
    from ce_k8s.real.kube.kubeserver import RealKubeServer

    started = time.monotonic()
    kube = RealKube(kube_state or KUBE_STATE)
    own_kube = not kube.status().get("up")
    kube_made_here = not kube.state_dir.exists()
    ok = False
    condor: RealCondor | None = None
    server = None
    bed = None
    try:
        if own_kube:
            progress("bringing up the real control plane")
            kube.up(progress=lambda m: progress(f"kube: {m}"), owner_pid=os.getpid())
        server = RealKubeServer(kube)
        condor = RealCondor(CONDOR_STATE, htcondor=htcondor, kube_server=server, batch=True)
        if _processes_in(condor.root):
            raise DemoError(f"a real-HTCondor bed is already up in {condor.root}; `ce-k8s testbed real-condor down` "
                            "it first (one at a time on a machine)")
        progress(f"bringing up the real HTCondor {htcondor} with its batch pool")
        condor.up(poll=2, progress=lambda m: progress(f"condor: {m}"), owner_pid=os.getpid())
        shutil.rmtree(WORK, ignore_errors=True)
        bed = HTCJobBed(kube, condor, WORK)
        bed.prepare()
        bed.start_operator()
        # A demo of an earlier run on a control plane that stayed up: let it go first (its jobs
        # were on a bed that is gone, so the operator finds none and drops its finalizer).
        kube.kubectl("delete", "htcjob", "demo", "-n", bed.namespace, "--ignore-not-found", "--timeout=60s")
        target = condor.ce_name if to_ce else condor.batch_name
        progress(f"HTCJob demo (queue: {queue}) to {target}; the operator runs as its ServiceAccount")
        obj = bed.apply("demo", demo_spec(queue, to_ce, condor.ce_name))
        uid = obj["metadata"]["uid"]
        t0 = time.monotonic()
        header = kube.kubectl("get", "htcjob", "demo", "-n", bed.namespace).stdout.splitlines()[0]
        progress(f"       {header}")
        obj = bed.wait("demo", phase_is("Completed", "Failed", "Invalid"), timeout, "the HTCJob to finish",
                       on_row=lambda row: progress(f"+{time.monotonic() - t0:.1f}s  {row}"))
        status = obj["status"]
        output = bed.output("demo")
        everything = bed.jobs(uid, condor.ce_name if to_ce else None)
        jobs = [j for j in everything if not j.get("RoutedFromJobId")]     # not a router's copies
        clusters = sorted({j["ClusterId"] for j in jobs})
        for p in status.get("procs", []):
            progress(f"proc {p['proc']}: {p['state']}, exit code {p.get('exitCode')}")
            for stream in ("stdout", "stderr"):
                text = output.get(f"{p['proc']}.{stream}", "").strip()
                if text:
                    progress(f"  {stream}: {text}")
        result: dict[str, Any] = {
            "phase": status.get("phase"), "queue": queue, "to_ce": to_ce, "htcondor": htcondor,
            "schedd": status.get("schedd"), "job_id": status.get("jobId"),
            "exit_codes": {str(p["proc"]): p.get("exitCode") for p in status.get("procs", [])},
            "output_keys": sorted(output), "clusters_with_uid": clusters,
            "owners": sorted({j.get("Owner") for j in jobs if j.get("Owner")}),
            "seconds_to_finish": round(time.monotonic() - t0, 1),
        }
        if to_ce:
            result["routed"] = sum(1 for j in jobs if j.get("RoutedToJobId"))
            result["routed_copies"] = sum(1 for j in everything if j.get("RoutedFromJobId"))
        result["ok"] = (status.get("phase") == "Completed" and len(clusters) == 1
                        and (not to_ce or result["routed"] == queue)
                        and all(result["exit_codes"].get(str(i)) == 0 for i in range(queue))
                        and all(f"{i}.stdout" in output for i in range(queue)))
        ok = result["ok"]
        return result
    except (RealCondorError, RealKubeError) as exc:
        raise DemoError(str(exc)) from exc
    finally:
        if bed is not None:
            bed.stop_operator()
        if condor is not None and condor.status().get("up"):
            condor.down(progress=lambda m: progress(f"condor: {m}"))
        statedirs.tidy(WORK, True, ok, progress)              # the demo's own directories, whoever made them
        statedirs.tidy(CONDOR_STATE, True, ok, progress)
        if server is not None:
            server.stop()
        if own_kube:
            kube.down(progress=lambda m: progress(f"kube: {m}"))
            statedirs.tidy(kube.state_dir, kube_made_here, ok, progress)
        progress(f"done in {time.monotonic() - started:.0f} s")
