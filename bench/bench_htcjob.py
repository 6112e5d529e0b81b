"""The HTCJob operator's Kubernetes side at size, on the real control plane, against its floor.

    python bench/bench_htcjob.py [--htcjobs N] [--state DIR] [--workers W] [--json]

One run, as root, on a control plane it finds up at `--state` (or brings up and down):

1. **floor** (the reference, same run): for N HTCJobs, exactly the API writes a pass makes for a
   one-proc job from create to Completed (finalizer patch, status Submitted, output ConfigMap,
   status Completed), done by a plain sequential loop with the admin client: `floor_s`.
2. **operator**: N more HTCJobs created at once; the operator (in-process, on its ServiceAccount's
   token, `--poll` 0.5 s, its default workers unless `--workers`) takes each to Completed through a
   schedd that completes every job the moment it is submitted (`InstantSchedd`: the schedd is not
   what is measured): `operator_s` (first create to the API server's answer to the last Completed
   status write; one LIST after it checks that all are Completed there: `completed`), `passes`,
   `reads` (the passes' GETs of an HTCJob; the rest read the watch copy), `operator_rss_mb` (VmRSS
   of this process, the operator's whole footprint here).

`ratio` = operator_s / floor_s: what the watch, the queue and the passes cost over the writes
themselves.

3. **floor with the operator's statuses** (after the operator, same run): the floor's loop again,
   its two status patches carrying the very bodies the operator wrote (its first Submitted and
   Completed status: eight conditions, the procs, the output) instead of `{"phase": ...}`:
   `floor_status_s`, and `ratio_status` = operator_s / floor_status_s. The API server's cost of a
   write grows with the resource it writes (measured: about 1.5 ms of its CPU for a bare HTCJob,
   about 5 ms for one carrying a full status), so the bare floor is cheaper than the writes the
   operator has to make; this is the reference with the same bodies.

Figures go to docs/performance.md ("HTCJob operator").
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ce_k8s.htcjob.jobstate import COMPLETED  # noqa: E402
from ce_k8s.htcjob.operator import Operator  # noqa: E402
from ce_k8s.htcjob.reconcile import FINALIZER, GROUP, PLURAL, VERSION  # noqa: E402
from ce_k8s.htcjob.spec import Target  # noqa: E402
from ce_k8s.htcjob.submitdesc import STDOUT, UID_ATTR  # noqa: E402
from ce_k8s.real.kube.kube import RealKube  # noqa: E402

MANIFESTS = ROOT / "containers" / "k8s" / "htcjob"


class InstantSchedd:
    """Every submitted job is completed at once with exit code 0 and one line of output."""

    name = "instant@bench"

    def __init__(self) -> None:
        self.jobs_by_uid: dict[str, list[dict[str, Any]]] = {}
        self.dirs: dict[int, str] = {}
        self.cluster = 0
        self.lock = threading.Lock()

    def jobs(self, uid: str, expected: int) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(ad) for ad in self.jobs_by_uid.get(uid, [])]

    def submit(self, description: dict[str, str], count: int) -> int:
        with self.lock:
            self.cluster += 1
            uid = description[f"MY.{UID_ATTR}"].strip('"')
            self.jobs_by_uid[uid] = [{"ClusterId": self.cluster, "ProcId": p, "JobStatus": COMPLETED, "ExitCode": 0,
                                      "_source": "queue"} for p in range(count)]
            self.dirs[self.cluster] = description["initialdir"]
            return self.cluster

    def retrieve(self, cluster: int) -> None:
        iwd = Path(self.dirs[cluster].replace("$(ProcId)", "0"))
        (iwd / STDOUT).write_text(f"cluster {cluster}\n")
        with self.lock:
            for ads in self.jobs_by_uid.values():
                for ad in ads:
                    if ad["ClusterId"] == cluster:
                        ad["_source"] = "history"

    def remove(self, constraint: str, reason: str) -> int:
        return 0

    def edit(self, constraint: str, attr: str, value: str) -> None:
        return None


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _body(name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HTCJob", "metadata": {"name": name},
            "spec": {"script": {"source": "#!/bin/sh\necho hi\n"}}}


def floor(custom, core, ns: str, n: int, statuses: dict[str, dict[str, Any]] | None = None) -> float:
    """The writes a pass makes for one job, done by a plain loop: the API's own cost. `statuses`:
    the bodies of the two status patches by phase (default: the phase alone)."""
    submitted = (statuses or {}).get("Submitted") or {"phase": "Submitted"}
    completed = (statuses or {}).get("Completed") or {"phase": "Completed"}
    t0 = time.monotonic()
    for i in range(n):
        obj = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _body(f"floor-{i}"))
        name, rv = obj["metadata"]["name"], obj["metadata"]["resourceVersion"]
        custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name,
                                              {"metadata": {"finalizers": [FINALIZER], "resourceVersion": rv}})
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name,
                                                     {"status": {**submitted, "jobId": str(i)}})
        core.create_namespaced_config_map(ns, {"metadata": {"name": f"{name}-output"}, "data": {"0.stdout": "x"}})
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name,
                                                     {"status": completed})
    return time.monotonic() - t0


class Recorder:
    """The operator's status writes, seen from its Kube's patch_status (wrapped): the first body it
    writes for each phase (the bodies of `floor_status_s`), and when the API server answered each
    write of phase Completed. The last answer is when the last HTCJob was Completed in the API
    server: the bench need not poll for it (a LIST of 200 HTCJobs every 0.5 s was load on the
    server and on this process, and rounded the end up to the poll)."""

    def __init__(self, op: Operator) -> None:
        self.sent: dict[str, dict[str, Any]] = {}
        self.completed: dict[str, float] = {}
        self.all_done = threading.Event()
        self.expected = 0
        self._lock = threading.Lock()
        patch = op.kube.patch_status

        def recording(namespace: str, name: str, status: dict[str, Any], resource_version: str):
            self.sent.setdefault(status.get("phase", ""), copy.deepcopy(status))
            written = patch(namespace, name, status, resource_version)
            if status.get("phase") == "Completed":
                with self._lock:
                    self.completed.setdefault(name, time.monotonic())
                    if len(self.completed) >= self.expected:
                        self.all_done.set()
            return written

        op.kube.patch_status = recording


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--htcjobs", type=int, default=200)
    ap.add_argument("--state", default="/var/tmp/ce-k8s-bench-htcjob-kube")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workers", type=int, default=None,
                    help="the operator's workers (default: the operator's own default)")
    args = ap.parse_args()
    from kubernetes import client
    from kubernetes.config import new_client_from_config

    kube = RealKube(args.state)
    own = not kube.status().get("up")
    if own:
        kube.up(progress=lambda m: print(f"kube: {m}", file=sys.stderr))
    work = Path(tempfile.mkdtemp(prefix="bench-htcjob-"))
    ns = f"bench-htcjob-{os.urandom(3).hex()}"
    floor_ns = f"{ns}-floor"            # the operator watches `ns` only
    floor_status_ns = f"{ns}-floor-status"
    result: dict[str, Any] = {"htcjobs": args.htcjobs}
    try:
        for name in ("crd.yaml", "namespace.yaml", "rbac.yaml"):
            kube.kubectl("apply", "--server-side", "-f", str(MANIFESTS / name))
        kube.kubectl("wait", "--for=condition=Established", "crd/htcjobs.ce-k8s.io", "--timeout=60s")
        kube.kubectl("create", "namespace", ns)
        kube.kubectl("create", "namespace", floor_ns)
        kube.kubectl("create", "namespace", floor_status_ns)
        kube.kubectl("create", "rolebinding", "ce-k8s-htcjob-operator", "-n", ns,
                     "--clusterrole=ce-k8s-htcjob-operator-namespace",
                     "--serviceaccount=ce-k8s-system:ce-k8s-htcjob-operator")
        admin = new_client_from_config(config_file=str(kube.admin_kubeconfig))
        custom, core = client.CustomObjectsApi(admin), client.CoreV1Api(admin)
        result["floor_s"] = round(floor(custom, core, floor_ns, args.htcjobs), 2)
        schedd = InstantSchedd()
        op_api = new_client_from_config(config_file=str(kube.service_account_kubeconfig(
            "ce-k8s-system", "ce-k8s-htcjob-operator", work / "operator.kubeconfig")))
        op = Operator(op_api, namespace=ns, default_target=Target(schedd="bench"), default_token=None,
                      work_root=work / "work", claims_root=work / "claims", poll=0.5,
                      schedd_factory=lambda *key: schedd,
                      **({"workers": args.workers} if args.workers else {}))
        result["workers"] = op.workers
        recorder = Recorder(op)
        recorder.expected = args.htcjobs
        rss0 = _rss_mb()
        t0 = time.monotonic()
        for i in range(args.htcjobs):
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _body(f"op-{i}"))
        thread = threading.Thread(target=op.run, daemon=True)
        thread.start()
        recorder.all_done.wait(timeout=900)
        ends = sorted(recorder.completed.values())
        result["operator_s"] = round((ends[-1] if ends else time.monotonic()) - t0, 2)
        # The API server's word, once: every HTCJob Completed there (not just written by us).
        items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
        result["completed"] = sum(1 for o in items if o["metadata"]["name"].startswith("op-")
                                  and (o.get("status") or {}).get("phase") == "Completed")
        result["passes"] = op.passes
        result["reads"] = op.reads          # GETs of an HTCJob (the rest is read from the watch)
        result["operator_rss_mb"] = round(_rss_mb(), 1)
        result["operator_rss_growth_mb"] = round(_rss_mb() - rss0, 1)
        result["ratio"] = round(result["operator_s"] / result["floor_s"], 2)
        op.stop.set()
        thread.join(timeout=15)
        result["floor_status_s"] = round(floor(custom, core, floor_status_ns, args.htcjobs, recorder.sent), 2)
        result["ratio_status"] = round(result["operator_s"] / result["floor_status_s"], 2)
    finally:
        for name in (ns, floor_ns, floor_status_ns):
            listed = json.loads(kube.kubectl("get", "htcjobs", "-n", name, "-o", "json", check=False).stdout or "{}")
            for item in listed.get("items", []):        # the floor's finalizers have no operator
                kube.kubectl("patch", "htcjob", item["metadata"]["name"], "-n", name, "--type=merge",
                             "-p", '{"metadata":{"finalizers":null}}', check=False)
            kube.kubectl("delete", "namespace", name, "--wait=false", check=False)
        shutil.rmtree(work, ignore_errors=True)
        if own:
            kube.down(progress=lambda m: print(f"kube: {m}", file=sys.stderr))
    print(json.dumps(result, indent=None if args.json else 1))
    return 0 if result.get("completed") == args.htcjobs else 1


if __name__ == "__main__":
    raise SystemExit(main())
