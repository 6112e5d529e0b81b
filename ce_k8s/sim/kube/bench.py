"""Throughput of the API emulator with the official client: ``python -m ce_k8s.sim.kube.bench``.

The issue asks for ≥ 500 creates/s with 20,000 pods stored, on the project's 2-core machine. The
server runs in its own process (``ce-k8s sim serve``), as it would for the agent, so the client's
deserialisation does not share the server's GIL. Prints one line per phase.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _pod(i: int) -> dict[str, object]:
    return {
        "metadata": {"name": f"bench-{i:06d}", "labels": {"app.kubernetes.io/managed-by": "ce-k8s",
                                                          "ce-k8s.htcondor.org/job": f"{i}.0"},
                     "annotations": {"ce-k8s.htcondor.org/global-job-id": f"ce#{i}.0#1700000000"}},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "pilot", "image": "opensciencegrid/osgvo-docker-pilot:latest",
                                 "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]},
    }


def main(argv: list[str] | None = None) -> int:
    """Start a server, fill it, measure creates/s, lists and watches; print the figures."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", type=int, default=20_000, help="pods stored before measuring")
    ap.add_argument("--measure", type=int, default=2000, help="creates per measured phase")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--kubelet", action="store_true", help="run the kubelet sim (pods get scheduled)")
    a = ap.parse_args(argv)

    from kubernetes import client, config

    with tempfile.TemporaryDirectory() as tmp:
        kcfg = Path(tmp) / "kubeconfig"
        cmd = [sys.executable, "-m", "ce_k8s.cli", "sim", "serve", "--kubeconfig-out", str(kcfg)]
        if not a.kubelet:
            cmd.append("--no-kubelet")
        else:
            cmd += ["--nodes", "cpu:3x16c64g", "--scenario", "run=forever"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            if not line.startswith("ready "):
                print("server did not start", file=sys.stderr)
                return 1
            conf = client.Configuration()
            config.load_kube_config(config_file=str(kcfg), client_configuration=conf)
            conf.connection_pool_maxsize = a.threads * 2
            api = client.ApiClient(conf)
            v1 = client.CoreV1Api(api)

            def create(i: int) -> None:
                v1.create_namespaced_pod("default", _pod(i))

            t0 = time.perf_counter()
            with ThreadPoolExecutor(a.threads) as ex:
                list(ex.map(create, range(a.pods)))
            fill = time.perf_counter() - t0
            print(f"fill 0→{a.pods} with {a.threads} threads: {a.pods / fill:.0f} creates/s ({fill:.1f} s)")
            base = a.pods
            t0 = time.perf_counter()
            for i in range(base, base + a.measure):
                create(i)
            dt = time.perf_counter() - t0
            print(f"create {base}→{base + a.measure}, 1 thread: {a.measure / dt:.0f} creates/s")
            base += a.measure
            t0 = time.perf_counter()
            with ThreadPoolExecutor(a.threads) as ex:
                list(ex.map(create, range(base, base + a.measure)))
            dt = time.perf_counter() - t0
            print(f"create {base}→{base + a.measure}, {a.threads} threads: {a.measure / dt:.0f} creates/s")
            total = base + a.measure
            t0 = time.perf_counter()
            resp = v1.list_namespaced_pod("default", _preload_content=False)
            raw = resp.data
            dt = time.perf_counter() - t0
            print(f"list {total} pods raw: {dt * 1000:.0f} ms ({len(raw) / 1e6:.1f} MB)")
            t0 = time.perf_counter()
            v1.list_namespaced_pod("default", label_selector="ce-k8s.htcondor.org/job=5.0")
            print(f"list with a label selector (1 match of {total}): {(time.perf_counter() - t0) * 1000:.0f} ms")
            t0 = time.perf_counter()
            for i in range(200):
                v1.read_namespaced_pod(f"bench-{i:06d}", "default")
            print(f"get at {total}: {(time.perf_counter() - t0) / 200 * 1000:.2f} ms")
            t0 = time.perf_counter()
            for i in range(500):
                v1.patch_namespaced_pod_status(f"bench-{i:06d}", "default", {"status": {"phase": "Running"}})
            print(f"patch status at {total}, 1 thread: {500 / (time.perf_counter() - t0):.0f}/s")
            t0 = time.perf_counter()
            for i in range(500):
                v1.delete_namespaced_pod(f"bench-{i + 1000:06d}", "default", grace_period_seconds=0)
            print(f"delete at {total}, 1 thread: {500 / (time.perf_counter() - t0):.0f}/s")
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
