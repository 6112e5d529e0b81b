"""The agent and the pipeline on the real control plane, beside the same figures on the emulator.

    python bench/bench_real_kube.py [--pods N] [--pilots N] [--state DIR] [--nodes SPEC] [--keep] [--json]

Issue 25, item 7. One run measures, in this order:

1. **emulator, agent** (`bench/bench_agent.py --pods N` in its own process, as `bench/run.py` runs it):
   `emu_agent_relist_s`, `emu_agent_relist_410_s`, `emu_agent_rss_mb`, `emu_agent_rss_peak_mb`,
   `emu_agent_update_us_p99`, `emu_hook_update_ms_p99`.
2. **emulator, pipeline** (`bench/bench_pipeline.py --pilots P` in its own process): `emu_pipeline_pilots_per_s`.
3. **real, pipeline**: `bench_pipeline.run(kube_server=RealKubeServer)` on the real kube-apiserver,
   etcd, controller manager, scheduler and kwok (ce_k8s.real.kube.kube) of a bed brought up here:
   `real_pipeline_pilots_per_s`.
4. **real, agent**: `bench_agent.WarmAgent` with the real server behind the test bed
   (`RealWarmAgent` overrides only where the pods come from and how history is cut): one pilot
   per shape routed until kwok runs its pod, then N clones of those pods created through the API
   (admin client, `--threads` threads, bound round-robin to the bed's nodes, so the scheduler is
   not what is measured), then a fresh agent lists them all (`real_agent_relist_s`), the update
   rounds and hooks (`real_agent_update_us_p99`, `real_hook_update_ms_p99`), `real_agent_rss_mb`,
   and a **real 410**: kube-apiserver stopped, one key written to etcd and etcd compacted at its
   current revision through its JSON gateway (`/v3/kv/put`, `/v3/kv/range` for the revision,
   `/v3/kv/compaction` physical), kube-apiserver started again, so the agent's watch resumes
   from a version neither the new watch cache nor etcd has
   (`real_agent_relist_410_s`, from the compaction to the end of the agent's LIST: the restart,
   the agent's retry back-off and the LIST; `real_apiserver_restart_s` is the restart alone);
   then `real_agent_rss_peak_mb` (VmHWM).

The control plane shares the two cores with us: for every real phase `cp_cpu_s_<phase>_<process>`
is the utime+stime (/proc/<pid>/stat) of etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok over the phase, and `cp_rss_mb_<process>` their VmRSS at the end.
`real_pods_created_per_s` is how fast the clones went in. The bed is brought up (`--state`,
`--nodes`; its start time is `real_bed_up_s`) and down again at the end unless `--keep`.
Every wait is bounded (creation by `--create-timeout`, each relist by 300 s, the pipeline by 900 s).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_agent
import bench_pipeline
from common import PYTHON, BenchError, bench_env, exit_now, exit_on_sigterm, proc_cpu_s, proc_rss_mb, progress

from ce_k8s.real.kube.kube import DEFAULT_NODES

HERE = Path(__file__).resolve().parent
STATE = "/var/tmp/ce-k8s-real-kube-bench"
# The demo's pools (every route's pilot has a node), the CPU pool widened: 25,000 pods of room.
NODES = "cpu:50x256c1024g:pods=500," + DEFAULT_NODES.split(",", 1)[1]
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Metadata the API server owns: a created clone must not carry the template's.
SERVER_META = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "selfLink")


class ControlPlaneCpu:
    """utime+stime of the control plane's processes over a phase; a restarted one counts both lives."""

    def __init__(self, env) -> None:
        self.env = env
        self.phases: dict[str, float] = {}
        self._start: dict[str, tuple[int, float]] = {}
        self._carry: dict[str, float] = {}

    def _now(self) -> dict[str, tuple[int, float]]:
        st = self.env.state()
        out = {}
        for name in CONTROL_PLANE:
            pid = st.pids.get(name) if st else None
            if pid:
                with contextlib.suppress(OSError, ValueError):
                    out[name] = (pid, proc_cpu_s(pid))
        return out

    def begin(self) -> None:
        self._start = self._now()
        self._carry = {}

    def before_restart(self, name: str) -> None:
        """The process `name` is about to be stopped: keep what it used since `begin`."""
        now = self._now().get(name)
        if now is not None and name in self._start:
            self._carry[name] = self._carry.get(name, 0.0) + now[1] - self._start[name][1]
            self._start[name] = (-1, 0.0)

    def end(self, phase: str) -> dict[str, float]:
        now = self._now()
        out = {}
        for name, (pid, cpu) in now.items():
            pid0, cpu0 = self._start.get(name, (pid, cpu))
            used = cpu - (cpu0 if pid0 == pid else 0.0) + self._carry.get(name, 0.0)
            out[f"cp_cpu_s_{phase}_{name.replace('-', '_')}"] = round(used, 1)
        out[f"cp_cpu_s_{phase}_total"] = round(sum(out.values()), 1)
        progress(f"real kube bench: control plane CPU over {phase}: "
                 + ", ".join(f"{k.rsplit('_' + phase + '_', 1)[1]} {v} s" for k, v in out.items()))
        return out

    def rss(self) -> dict[str, float]:
        return {f"cp_rss_mb_{name.replace('-', '_')}": round(proc_rss_mb(pid), 1)
                for name, (pid, _cpu) in self._now().items()}


def etcd_post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


class RealWarmAgent(bench_agent.WarmAgent):
    """`bench_agent.WarmAgent` on the real control plane: the pods go in through the API server."""

    kube_label = "real control plane, kwok"

    def __init__(self, pods: int, env, cpu: ControlPlaneCpu, threads: int = 8,
                 create_timeout: float = 900.0) -> None:
        super().__init__(pods)
        self.env = env
        self.cpu = cpu
        self.threads = threads
        self.create_deadline = 0.0
        self.create_timeout = create_timeout
        self.server = None
        self.nodes: list[str] = []
        self.created = 0
        self.restart_s = 0.0

    def _new_bed(self, bed_class):
        from ce_k8s.real.kube.kubeserver import RealKubeServer

        self.server = RealKubeServer(self.env)
        return bed_class(seed=self.seed, max_running_hooks=8, kube_server=self.server)

    def _hold_still(self) -> None:
        """The bed's own mirror of every managed pod (its duplicate count) is not what is measured:
        stopped. The pilots' quota is the example's (2,000 pods): a site holding 20,000 raises it."""
        self.server.watch.stop()
        core = self.server.admin_core
        for quota in core.list_resource_quota_for_all_namespaces(_request_timeout=30).items:
            hard = {k: "10000Ti" if "memory" in k or "storage" in k else "1000000" for k in quota.spec.hard}
            core.patch_namespaced_resource_quota(quota.metadata.name, quota.metadata.namespace,
                                                 {"spec": {"hard": hard}}, _request_timeout=30)
        self.nodes = [n.metadata.name for n in core.list_node(_request_timeout=30).items
                      if not n.spec.taints and n.metadata.name.startswith("cpu-")]
        if not self.nodes:
            raise BenchError("no untainted cpu-* node in the bed (--nodes)")
        self.create_deadline = time.monotonic() + self.create_timeout

    def _template_pod(self, ns: str, name: str) -> dict | None:
        resp = self.server.admin_core.read_namespaced_pod(name, ns, _preload_content=False, _request_timeout=30)
        return json.loads(resp.data)

    def _put(self, pods: list[dict]) -> None:
        """Create `pods` through the API server from `self.threads` threads; each ad gets its pod's uid."""
        core = self.server.admin_core
        base = len(self.ads) - len(pods)
        lock = threading.Lock()
        work = list(enumerate(pods))
        errors: list[str] = []

        def worker() -> None:
            while time.monotonic() < self.create_deadline:
                with lock:
                    if not work or errors:
                        return
                    i, pod = work.pop()
                meta = pod["metadata"]
                old_uid = meta["uid"]
                for key in SERVER_META:
                    meta.pop(key, None)
                pod.pop("status", None)
                pod["spec"]["nodeName"] = self.nodes[(base + i) % len(self.nodes)]
                try:
                    resp = core.create_namespaced_pod(meta["namespace"], pod, _preload_content=False,
                                                      _request_timeout=60)
                except Exception as exc:
                    with lock:
                        errors.append(f"{meta['name']}: {str(exc)[:300]}")
                    return
                uid = json.loads(resp.data)["metadata"]["uid"]
                with lock:
                    self.ads[base + i] = self.ads[base + i].replace(old_uid.encode(), uid.encode())
                    self.created += 1

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(self.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(1.0, self.create_deadline - time.monotonic() + 5))
        if errors:
            raise BenchError(f"creating pods: {errors[0]}")
        if work or any(t.is_alive() for t in threads):
            raise BenchError(f"only {self.created} of {self.target} pods created in {self.create_timeout:.0f} s")
        progress(f"real kube bench: {self.created} pods created")

    def _stored(self) -> int:
        """The clones created and the templates (the agent's LIST counts them all again)."""
        return self.created + len(self.templates)

    def cut(self) -> int:
        """A real 410: kube-apiserver stopped, etcd's revision moved on and compacted, the API server
        started again. The agent's watch resumes from a version older than anything the new watch
        cache or etcd still has. (Compacting while the old API server still runs is not enough:
        during its shutdown the agent's watch goes on receiving kwok's status writes, its version
        passes the compaction and the new server resumes it without a 410; seen at 20,000 pods.)"""
        st = self.env.state()
        got: dict[str, int] = {}

        def compact() -> None:
            key = base64.b64encode(b"/ce-k8s-bench/bump").decode()
            etcd_post(f"{st.etcd}/v3/kv/put", {"key": key, "value": base64.b64encode(b"1").decode()})
            rev = int(etcd_post(f"{st.etcd}/v3/kv/range", {"key": "AA=="})["header"]["revision"])
            etcd_post(f"{st.etcd}/v3/kv/compaction", {"revision": rev, "physical": True})
            got["rev"] = rev

        self.cpu.before_restart("kube-apiserver")
        t0 = time.monotonic()
        self.env.restart("kube-apiserver", progress=progress, while_stopped=compact)
        self.restart_s = time.monotonic() - t0
        progress(f"real kube bench: kube-apiserver stopped, etcd compacted at revision {got['rev']}, "
                 f"the API server back in {self.restart_s:.1f} s")
        return 1


def run_emulated(name: str, args: list[str], timeout: float = 1200) -> dict[str, float]:
    """One bench script in its own process (as bench/run.py runs them); its JSON figures."""
    argv = [PYTHON, str(HERE / name), *args, "--json"]
    progress(f"real kube bench: {' '.join(argv[1:])}")
    proc = subprocess.run(argv, stdout=subprocess.PIPE, env=bench_env(), timeout=timeout, check=False)
    if proc.returncode != 0:
        raise BenchError(f"{name} exited {proc.returncode}")
    return json.loads(proc.stdout)


AGENT_KEYS = ("agent_relist_s", "agent_relist_410_s", "agent_relist_410_list_s", "agent_rss_mb", "agent_rss_peak_mb",
              "agent_update_us_p50", "agent_update_us_p99", "agent_roundtrip_us_p99",
              "hook_update_ms_p50", "hook_update_ms_p99", "python_bare_ms_p50")


def real_agent(env, cpu: ControlPlaneCpu, pods: int, hooks: int, threads: int, create_timeout: float) -> dict:
    out: dict[str, float] = {}
    cpu.begin()
    with RealWarmAgent(pods, env, cpu, threads=threads, create_timeout=create_timeout) as warm:
        # start() ran the templates, the creation and the agent's first LIST
        out["real_pods_created"] = warm.created
        out["real_pods_create_s"] = round(warm.preload_s, 1)
        out["real_pods_created_per_s"] = round(warm.created / warm.preload_s, 1)
        out["agent_relist_s"] = round(warm.relist_s, 2)
        out.update(cpu.end("create_and_start"))
        out.update({f"{k}_after_create": v for k, v in cpu.rss().items()})
        cpu.begin()
        rounds = bench_agent.agent_rounds(warm, 1)
        out.update({k: rounds[k] for k in ("agent_update_us_p50", "agent_update_us_p99", "agent_roundtrip_us_p99")})
        out["agent_rss_mb"] = round(proc_rss_mb(warm.agent_pid), 1)
        if hooks:
            got = bench_agent.hook_samples(warm, hooks)
            out.update({k: got[k] for k in ("hook_update_ms_p50", "hook_update_ms_p99", "python_bare_ms_p50")})
        out.update(cpu.end("updates"))
        cpu.begin()
        out.update(bench_agent.relist_after_gone(warm, timeout=300))
        out["apiserver_restart_s"] = round(warm.restart_s, 1)
        out["agent_rss_peak_mb"] = round(proc_rss_mb(warm.agent_pid, "VmHWM"), 1)
        out.update(cpu.end("relist_410"))
        out.update(cpu.rss())
    return out


def real_pipeline(env, cpu: ControlPlaneCpu, pilots: int, depth: int) -> dict:
    from ce_k8s.real.kube.kubeserver import RealKubeServer

    cpu.begin()
    got = bench_pipeline.run(pilots, depth=depth, kube_server=RealKubeServer(env), bare_samples=30)
    out = {k: got[k] for k in ("pipeline_pilots_per_s", "pipeline_wall_s", "pipeline_completed", "pipeline_held",
                               "pipeline_lost",
                               "pipeline_duplicate_pods", "api_calls_per_pilot", "machine_cpu_cores_busy")}
    out.update(cpu.end("pipeline"))
    return out


def run(a: argparse.Namespace) -> dict[str, float]:
    from ce_k8s.real.kube.kube import RealKube

    result: dict[str, float] = {"pods": a.pods, "pilots": a.pilots}
    emu = run_emulated("bench_agent.py", ["--pods", str(a.pods), "--hook-samples", str(a.hook_samples),
                                          "--agent-rounds", "1"])
    result.update({f"emu_{k}": emu[k] for k in AGENT_KEYS if k in emu})
    emu = run_emulated("bench_pipeline.py", ["--pilots", str(a.pilots), "--depth", str(a.depth)])
    result["emu_pipeline_pilots_per_s"] = emu["pipeline_pilots_per_s"]
    result["emu_pipeline_wall_s"] = emu["pipeline_wall_s"]

    env = RealKube(a.state)
    t0 = time.monotonic()
    env.up(nodes=a.nodes, progress=progress)
    result["real_bed_up_s"] = round(time.monotonic() - t0, 1)
    cpu = ControlPlaneCpu(env)
    try:
        got = real_pipeline(env, cpu, a.pilots, a.depth)
        result.update({k if k.startswith("cp_") else f"real_{k}": v for k, v in got.items()})
        got = real_agent(env, cpu, a.pods, a.hook_samples, a.threads, a.create_timeout)
        result.update({k if k.startswith(("cp_", "real_")) else f"real_{k}": v for k, v in got.items()})
    finally:
        if not a.keep:
            env.down(progress=progress)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=20_000, help="pods the agent holds (default 20,000)")
    ap.add_argument("--pilots", type=int, default=200, help="pilots through each pipeline (default 200)")
    ap.add_argument("--depth", type=int, default=100, help="the factory's depth (default 100)")
    ap.add_argument("--hook-samples", type=int, default=50, help="update hook / bare python pairs (default 50)")
    ap.add_argument("--threads", type=int, default=16, help="threads creating the pods (default 16)")
    ap.add_argument("--create-timeout", type=float, default=900.0, help="bound on the creation, s (default 900)")
    ap.add_argument("--state", default=STATE, help=f"the bed's state directory (default {STATE})")
    ap.add_argument("--nodes", default=NODES, help=f"kwok node pools (default {NODES})")
    ap.add_argument("--keep", action="store_true", help="leave the bed up at the end")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    exit_on_sigterm()
    result = run(a)
    print(json.dumps(result, sort_keys=True) if a.json else "\n".join(f"{k:48} {v}" for k, v in sorted(result.items())))
    return 0


if __name__ == "__main__":
    exit_now(main())
