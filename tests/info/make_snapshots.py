"""Regenerate the hand-made cluster snapshots in tests/info/snapshots/ (run by hand, not a test).

The files are what `kubectl get nodes,pods,resourcequotas -A -o json` prints (a `List` whose
items carry `kind`), trimmed to the fields a real dump always has and capacity reads. They are
generated so the cluster story stays readable here, and committed so tests never depend on this
script: `python tests/info/make_snapshots.py` rewrites them.

The "mixed" cluster (the sample in docs/information-provider.md):
  cpu-1..3   32-core/128Gi CPU workers (pool=cpu); cpu-1 runs our 8-core pilots
  cpu-4      cordoned by an admin (spec.unschedulable + the unschedulable taint)
  cpu-5      handed over to Slurm: drained (cordoned) and its kubelet stopped (Ready=Unknown,
             unreachable taints) -- the BeBiDa prolog pattern
  gpu-1..2   64-core/512Gi, 4 GPUs, tainted nvidia.com/gpu=present:NoSchedule (pool=gpu);
             gpu-1 runs another tenant's training job holding 3 GPUs
  control-1  control plane (NoSchedule taint)
  pods       a daemonset pod on every node, other tenants (namespace ml, batch), finished pods
             (do not count), one pilot still Pending (unbound)
  quota      ce-k8s namespace: requests.cpu 96, pods 40, requests.nvidia.com/gpu 2
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent / "snapshots"
OURS = {"app.kubernetes.io/managed-by": "ce-k8s", "ce-k8s.htcondor.org/ce": "ce01.example.edu"}


def node(name, cpu, mem, labels, gpus=0, taints=(), unschedulable=False, ready="True", pods="110"):
    alloc = {"cpu": cpu, "memory": mem, "pods": pods, "ephemeral-storage": "95Gi"}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    spec = {"taints": list(taints)} if taints else {}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": spec,
        "status": {
            "allocatable": alloc,
            "capacity": dict(alloc),
            "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady"}],
        },
    }


def pod(ns, name, node_name, phase, requests, labels=None, limits=None, init=None, deadline=None):
    container = {"name": "main", "image": "example/img:1", "resources": {"requests": requests}}
    if limits:
        container["resources"]["limits"] = limits
    spec = {"containers": [container]}
    if node_name:
        spec["nodeName"] = node_name
    if init:
        spec["initContainers"] = init
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": spec,
        "status": {"phase": phase},
    }


def pilot(name, route, node_name, phase, cpu="8", mem="16000Mi", gpu=None):
    req = {"cpu": cpu, "memory": mem}
    if gpu:
        req["nvidia.com/gpu"] = str(gpu)
    labels = {**OURS, "ce-k8s.htcondor.org/route": route}
    return pod("ce-k8s", name, node_name, phase, req, labels, limits=dict(req), deadline=172800)


def quota(ns, name, hard, used=None, scopes=None):
    q = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": ns},
         "spec": {"hard": hard}}
    if scopes:
        q["spec"]["scopes"] = scopes
    if used is not None:
        q["status"] = {"hard": hard, "used": used}
    return q


UNSCHED = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def mixed() -> dict:
    nodes = [
        node("cpu-1", "31850m", "126Gi", {"pool": "cpu"}),
        node("cpu-2", "31850m", "126Gi", {"pool": "cpu"}),
        node("cpu-3", "31850m", "126Gi", {"pool": "cpu"}),
        node("cpu-4", "31850m", "126Gi", {"pool": "cpu"}, taints=[UNSCHED], unschedulable=True),
        node("cpu-5", "31850m", "126Gi", {"pool": "cpu"}, unschedulable=True, ready="Unknown", taints=[
            UNSCHED,
            {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        ]),
        node("gpu-1", "63800m", "500Gi", {"pool": "gpu"}, gpus=4, taints=[GPU_TAINT]),
        node("gpu-2", "63800m", "500Gi", {"pool": "gpu"}, gpus=4, taints=[GPU_TAINT]),
        node("control-1", "3800m", "14Gi", {"node-role.kubernetes.io/control-plane": ""},
             taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]),
    ]
    pods = []
    for n in nodes:  # a logging daemonset pod everywhere (tolerates everything)
        pods.append(pod("kube-system", f"fluent-bit-{n['metadata']['name']}", n["metadata"]["name"], "Running",
                        {"cpu": "100m", "memory": "128Mi"}))
    pods += [
        pilot("ce-1-0-a0-0000000001", "cpu8", "cpu-1", "Running"),
        pilot("ce-2-0-a0-0000000002", "cpu8", "cpu-1", "Running"),
        pilot("ce-3-0-a0-0000000003", "cpu8", "cpu-1", "Running"),
        pilot("ce-4-0-a0-0000000004", "cpu8", None, "Pending"),
        pilot("ce-5-0-a0-0000000005", "cpu8", "cpu-1", "Succeeded"),  # finished: frees its share
        pilot("ce-6-0-a0-0000000006", "gpu", "gpu-2", "Running", cpu="4", mem="32000Mi", gpu=1),
        # other tenants
        pod("ml", "trainer-0", "gpu-1", "Running", {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "3"}),
        pod("batch", "etl-7", "cpu-2", "Running", {"cpu": "20", "memory": "40Gi"}),
        pod("batch", "etl-old", "cpu-3", "Failed", {"cpu": "30", "memory": "100Gi"}),
        # init containers: the peak (6 cores) exceeds the app container (2 cores)
        pod("batch", "with-init", "cpu-3", "Running", {"cpu": "2", "memory": "1Gi"},
            init=[{"name": "setup", "image": "x", "resources": {"requests": {"cpu": "6", "memory": "512Mi"}}}]),
        # a pod still running on the cordoned node: counts for that node only (which is excluded)
        pod("batch", "leftover", "cpu-4", "Running", {"cpu": "1", "memory": "1Gi"}),
    ]
    quotas = [
        quota("ce-k8s", "pilots", {"requests.cpu": "96", "pods": "40", "requests.nvidia.com/gpu": "2"},
              used={"requests.cpu": "36", "pods": "5", "requests.nvidia.com/gpu": "1"}),
        quota("ml", "ml-quota", {"requests.nvidia.com/gpu": "3"}, used={"requests.nvidia.com/gpu": "3"}),
    ]
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
            "items": nodes + pods + quotas}


def handover() -> dict:
    """Slurm took cpu-1..2 (drained + kubelet stopped); only cpu-3 is left for pilots."""
    doc = mixed()
    for item in doc["items"]:
        if item["kind"] == "Node" and item["metadata"]["name"] in ("cpu-1", "cpu-2"):
            item["spec"] = {"unschedulable": True, "taints": [
                UNSCHED, {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}
            item["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]
    # the pilots that were on cpu-1 were evicted by the drain
    doc["items"] = [i for i in doc["items"]
                    if not (i["kind"] == "Pod" and i["spec"].get("nodeName") in ("cpu-1", "cpu-2")
                            and i["metadata"]["namespace"] != "kube-system")]
    return doc


def empty() -> dict:
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": []}


def main() -> None:
    HERE.mkdir(exist_ok=True)
    for name, fn in (("mixed", mixed), ("handover", handover), ("empty", empty)):
        (HERE / f"{name}.json").write_text(json.dumps(fn(), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
