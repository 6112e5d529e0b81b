"""The information provider on a big cluster: `ce-k8s info --cluster-snapshot` at 5,000 nodes.

    python bench/bench_info.py [--nodes N] [--pods N] [--json]

A `kubectl get nodes,pods,resourcequotas -A -o json`-shaped dump is generated (seeded): CPU
workers of three sizes, GPU nodes with the usual taint, a few cordoned or NotReady nodes; one
daemonset pod per node, our pilots (labelled for this CE), other tenants' pods, finished pods
(which must not count), a few pending pods, and ResourceQuotas in our namespace.

* `info_ms`: median of `--repeat` (3) in-process `ce_k8s.info.provider.compute()` calls (configuration, routes,
  reading and summarising the dump, capacity, the ad), after one warm-up call;
* `info_snapshot_load_ms`: the share of reading the file (typed decoding and the pods read from
  it, `ce_k8s/info/listschema.py`); `info_json_decode_ms`: the stdlib `json.loads` of the same file
  alone, for reference (what decoding it into dicts costs); both with the cyclic GC paused, as
  `compute()` pauses it;
* `info_subprocess_ms`: one `ce-k8s info --cluster-snapshot FILE` process, start to exit
  (interpreter, imports, everything), as the schedd cron would run it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PYTHON, BenchError, progress, scaled

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _node(i: int, rng: random.Random) -> dict:
    kind = "gpu" if i % 10 == 0 else "cpu"
    cpu, mem = rng.choice([(32, 128), (64, 256), (128, 512)]) if kind == "cpu" else (64, 512)
    alloc = {"cpu": f"{cpu * 1000 - 500}m", "memory": f"{mem - 4}Gi", "pods": "110", "ephemeral-storage": "400Gi"}
    spec: dict = {}
    if kind == "gpu":
        alloc["nvidia.com/gpu"] = "4"
        spec["taints"] = [dict(GPU_TAINT)]
    ready = "True"
    if i % 500 == 7:
        spec["unschedulable"] = True
        spec.setdefault("taints", []).append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    if i % 1000 == 13:
        ready = "Unknown"
    name = f"{kind}-{i:05d}"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": kind}},
        "spec": spec,
        "status": {"allocatable": alloc, "capacity": dict(alloc),
                   "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady"}]},
    }


def _pod(ns: str, name: str, node: str | None, phase: str, cpu: str, mem: str, labels: dict,
         gpus: int = 0) -> dict:
    requests = {"cpu": cpu, "memory": mem}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    spec: dict = {"containers": [{"name": "main", "image": "example/img:1",
                                  "resources": {"requests": requests, "limits": dict(requests)}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": spec, "status": {"phase": phase}}


def generate(path: Path, nodes: int, pods: int, ce_label: str, namespace: str, seed: int = 5) -> dict[str, int]:
    """Write the dump to `path`; returns counts by kind of pod."""
    rng = random.Random(seed)
    items = [_node(i, rng) for i in range(nodes)]
    names = [n["metadata"]["name"] for n in items]
    cpu_nodes = [n for n in names if n.startswith("cpu")]
    gpu_nodes = [n for n in names if n.startswith("gpu")]
    ours = {"app.kubernetes.io/managed-by": "ce-k8s", "ce-k8s.htcondor.org/ce": ce_label}
    counts = {"daemonset": 0, "pilot": 0, "tenant": 0, "finished": 0, "pending": 0}
    for node in names[: min(nodes, pods)]:
        items.append(_pod("kube-system", f"node-exporter-{node}", node, "Running", "100m", "128Mi",
                          {"app": "node-exporter"}))
        counts["daemonset"] += 1
    left = pods - counts["daemonset"]
    for i in range(left):
        r = rng.random()
        if r < 0.40:
            if gpu_nodes and rng.random() < 0.05:
                items.append(_pod(namespace, f"pilot-g{i}", rng.choice(gpu_nodes), "Running", "4", "16000Mi",
                                  dict(ours), gpus=1))
            else:
                items.append(_pod(namespace, f"pilot-{i}", rng.choice(cpu_nodes), "Running",
                                  rng.choice(["1", "8"]), rng.choice(["2500Mi", "16000Mi"]), dict(ours)))
            counts["pilot"] += 1
        elif r < 0.90:
            items.append(_pod(f"tenant-{i % 40}", f"work-{i}", rng.choice(names), "Running",
                              rng.choice(["250m", "500m", "2", "4"]), rng.choice(["512Mi", "1Gi", "8Gi"]),
                              {"app": f"svc-{i % 200}"}))
            counts["tenant"] += 1
        elif r < 0.98:
            items.append(_pod(f"tenant-{i % 40}", f"done-{i}", rng.choice(names),
                              rng.choice(["Succeeded", "Failed"]), "2", "4Gi", {"job": f"j{i}"}))
            counts["finished"] += 1
        else:
            items.append(_pod(namespace, f"pilot-p{i}", None, "Pending", "8", "16000Mi", dict(ours)))
            counts["pending"] += 1
    items.append({"apiVersion": "v1", "kind": "ResourceQuota",
                  "metadata": {"name": "pilots", "namespace": namespace},
                  "spec": {"hard": {"requests.cpu": "400000", "pods": "60000", "requests.nvidia.com/gpu": "2000"}},
                  "status": {"hard": {"requests.cpu": "400000", "pods": "60000", "requests.nvidia.com/gpu": "2000"},
                             "used": {"requests.cpu": "150000", "pods": str(counts["pilot"] + counts["pending"]),
                                      "requests.nvidia.com/gpu": "400"}}})
    # msgspec writes the same compact JSON as json.dump(separators=(",", ":")), several times faster
    path.write_bytes(msgspec.json.encode({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}))
    return counts


def run(nodes: int, pods: int, repeat: int = 3) -> dict[str, float]:
    """Generate the dump, time the information provider in-process and as a process."""
    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.info import provider as info
    from ce_k8s.pods.names import label_value
    from ce_k8s.settings import Settings

    settings = Settings.from_config(CondorConfig.load(None))
    with tempfile.TemporaryDirectory(prefix="ce-k8s-bench-info-") as tmp:
        path = Path(tmp) / "cluster.json"
        t0 = time.perf_counter()
        counts = generate(path, nodes, pods, label_value(settings.ce_name), settings.namespace)
        progress(f"info bench: wrote a {nodes}-node, {pods}-pod dump ({path.stat().st_size / 1e6:.0f} MB) "
                 f"in {time.perf_counter() - t0:.1f} s: {counts}")
        args = argparse.Namespace(config=None, kubeconfig=None, cluster_snapshot=str(path), now=None)
        text, code = info.compute(args)                       # warm-up (imports, page cache)
        if code != 0 or "OSG_ResourceCatalog" not in text:
            raise BenchError(f"ce-k8s info failed (exit {code}): {text[:500]}")
        times = []
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            info.compute(args)
            times.append(time.perf_counter() - t0)
        from ce_k8s.info.snapshot import load_snapshot_file

        # the shares, with the cyclic GC paused as compute() pauses it while it loads a cluster
        with info._cyclic_gc_paused():
            t0 = time.perf_counter()
            load_snapshot_file(path)
            load_ms = (time.perf_counter() - t0) * 1e3
            data = path.read_bytes()
            t0 = time.perf_counter()
            json.loads(data)
            decode_ms = (time.perf_counter() - t0) * 1e3
            del data
        console = Path(PYTHON).parent / "ce-k8s"
        argv = [str(console)] if console.exists() else [PYTHON, "-m", "ce_k8s.cli"]
        t0 = time.perf_counter()
        proc = subprocess.run([*argv, "info", "--cluster-snapshot", str(path)], capture_output=True,
                              env=dict(os.environ), check=False)
        sub_ms = (time.perf_counter() - t0) * 1e3
        if proc.returncode != 0:
            raise BenchError(f"ce-k8s info exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    result = {
        "info_nodes": nodes,
        "info_pods": pods,
        "info_ms": round(statistics.median(times) * 1e3, 1),
        "info_snapshot_load_ms": round(load_ms, 1),
        "info_json_decode_ms": round(decode_ms, 1),
        "info_subprocess_ms": round(sub_ms, 1),
    }
    progress(f"info bench: compute {result['info_ms']} ms (reading the dump {result['info_snapshot_load_ms']} ms; "
             f"json.loads alone {result['info_json_decode_ms']} ms), as a process {result['info_subprocess_ms']} ms")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=None, help="nodes (default 5,000 x scale)")
    ap.add_argument("--pods", type=int, default=None, help="pods (default 100,000 x scale)")
    ap.add_argument("--repeat", type=int, default=3, help="timed in-process runs, median reported (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    result = run(a.nodes or scaled(5000, 10), a.pods or scaled(100_000, 50), a.repeat)
    print(json.dumps(result, sort_keys=True) if a.json else "\n".join(f"{k:32} {v}" for k, v in sorted(result.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
