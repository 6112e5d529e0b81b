"""The update path at CE scale: one warm agent holding 20,000 pods, asked by hooks and by a client.

    python bench/bench_agent.py [--pods N] [--hook-samples N] [--agent-rounds N] [--json]

`bench/run.py` runs it three times: at 20,000 pods with every figure, at 50,000 with one round and
no hook samples (`agent_relist_50k_s`, `agent_relist_410_50k_s`, `agent_rss_50k_mb`, ...), and at
5,000 with the update hooks of a poll over 2,000 of its jobs; each run adds the steady-state figures of its size
(`--steady`, bench/steady.py: `steady_cost_ratio_5k/_20k/_50k`).

Set-up, all real code between the two emulated boundaries:

1. `ce_k8s.sim.testbed.TestBed`: API emulator + kubelet sim, the real `ce-k8s agent`
   process, the hook launchers `ce-k8s agent --install-hooks` writes, the router emulator with
   the shipped routes. One long-running pilot per shape (cpu8, cpu1, cms, gpu, wholenode) is
   routed until its pod runs, so we hold the *real* routed ads (update-hook stdin) and the
   *real* pods the agent created and the kubelet sim ran.
2. The agent is stopped, the kubelet sim is stopped (so nothing moves), and the store is
   filled with clones of those pods up to `--pods` (each with its own name, uid, job label and
   global-job-id annotation) -- direct store writes, because the emulator's create path is not
   what is measured here.
3. A fresh agent (`bench/agent_timed.py`: the real agent, its handler timed) lists all of them
   (a restart at full size: `agent_relist_s`).

Then:
* `agent_roundtrip_us_p50/_p99`: every clone's routed ad sent as an `update` request from one
  client over the Unix socket, one connection per request, as a hook does; timed in the client
  from connect to the last reply byte, **nothing subtracted** (socket, framing, the agent's
  asyncio loop, its handler, and the scheduling of two processes on a shared machine). Two
  rounds: the first touches every job once (the agent creates its per-job record), the
  reported one is the steady state after that.
* `agent_rss_mb`: VmRSS of the agent process after those rounds.
* `agent_relist_410_s`: the history compacted and the watch ended: time until the agent, told
  410 Gone on resuming, holds a complete fresh LIST (`relist_after_gone`); then
  `agent_rss_peak_mb`, the agent's VmHWM, which that relist sets (old and new cache at once).
* `agent_update_us_p50/_p99`: the agent-side time of those same requests, measured **inside
  the request handler** of that agent process: `bench/agent_timed.py` runs `ce-k8s agent` with
  `Agent.handle` (the whole request path without the socket) wrapped in `perf_counter()`.
* `hook_update_ms_p50/_p99`: the installed `ce-k8s-update` launcher, start to exit, stdin = a
  clone's routed ad, interleaved one-for-one with `python -S -c pass` (`python_bare_ms_p50`)
  so both see the same machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    PYTHON,
    BenchError,
    bare_python_argv,
    children_cpu,
    exit_now,
    exit_on_sigterm,
    percentile,
    proc_cpu_s,
    proc_rss_mb,
    progress,
    run_wall,
    scaled,
)

# One pilot per shape routed for real; clones follow the pilot mix of ce_k8s.sim.pilots.SHAPES.
TEMPLATE_RUN_S = 100_000.0       # simulated seconds: the template pods keep running
CLONE_JOB_BASE = 500_000


def _rewrite(ad_text: str, values: dict[str, str]) -> str:
    """Replace `Name = value` lines (case-insensitive names) in sPrintAd text; add missing ones.

    sPrintAd writes one attribute per line (docs/hook-protocol.md §2.2), so a line edit is an
    attribute edit. The result stays sorted enough for the agent, which scans by name.
    """
    wanted = {k.lower(): (k, v) for k, v in values.items()}
    out = []
    for line in ad_text.split("\n"):
        name = line.partition(" = ")[0].strip().lower()
        if name in wanted:
            key, value = wanted.pop(name)
            out.append(f"{key} = {value}")
        elif line:
            out.append(line)
    out.extend(f"{k} = {v}" for k, v in wanted.values())
    return "\n".join(out) + "\n"


def _timed_testbed(base):
    """A TestBed whose agent is `bench/agent_timed.py` (the real agent, its handler timed)."""

    class TimedTestBed(base):
        timings_path: Path

        def start_agent(self) -> None:
            import contextlib
            import subprocess

            self.timings_path = self.root / "handler-timings.json"
            cmd = [PYTHON, str(Path(__file__).resolve().parent / "agent_timed.py"), "--config", str(self.confdir),
                   "--kubeconfig", str(self.kubeconfig), "--socket", str(self.socket), "--spool", str(self.spool)]
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
            env = dict(os.environ, CE_K8S_BENCH_TIMINGS=str(self.timings_path))
            self.agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True, env=env)
            deadline = time.monotonic() + 60
            while not self.socket.exists():
                if self.agent.poll() is not None:
                    raise BenchError(f"the agent exited with {self.agent.returncode} before listening")
                if time.monotonic() > deadline:
                    raise BenchError("the agent did not create its socket within 60 s")
                time.sleep(0.05)

    return TimedTestBed


def route_until_running(bed, pilots: list, timeout: float = 90.0) -> list[str]:
    """Submit `pilots`, tick the test bed until every one's routed job shows a running pod, then
    three more polls so each routed ad carries what the agent reported for it; their job ids."""
    from ce_k8s.sim.condor.schedd import eval_str

    jobs = bed.submit(pilots)
    deadline = time.monotonic() + timeout
    while True:
        bed.tick(0.3)
        done = [j for j in jobs if (rj := bed.router.jobs.get(j)) is not None and rj.dest_key
                and eval_str(bed.schedd.get(rj.dest_key), "K8sPodPhase") == "Running"]
        if len(done) == len(jobs):
            break
        if time.monotonic() > deadline:
            raise BenchError(f"only {len(done)} of {len(jobs)} template pilots reached Running in {timeout:.0f} s")
    for _ in range(3):
        bed.tick(0.3)
    return jobs


class WarmAgent:
    """A TestBed whose agent holds `pods` pods; see the module docstring for how it is built."""

    def __init__(self, pods: int, seed: int = 7) -> None:
        self.target = pods
        self.seed = seed
        self.bed = None
        self.templates: list[tuple[str, str, dict]] = []   # (shape, routed ad text, pod)
        self.ads: list[bytes] = []                          # one update-hook stdin per clone
        self.relist_s = 0.0
        self.preload_s = 0.0

    # -- set-up ------------------------------------------------------------------------------------
    def start(self) -> WarmAgent:
        from ce_k8s.sim.testbed import TestBed

        progress(f"agent bench: starting the test bed ({self.kube_label}, agent, router), {self.target} pods")
        self.bed = self._new_bed(_timed_testbed(TestBed))
        self.bed.start()
        self._route_templates()
        self.bed.stop_agent()
        self._hold_still()
        # The clones are millions of long-lived dicts and lists: without this, the cyclic GC walks
        # the growing store over and over while it fills (most of the set-up time at 50,000).
        gc.disable()
        try:
            self._preload()
        finally:
            gc.enable()
        # The emulator's store (every pod a dict tree that never changes once stored) and the
        # routed ads are this process's long-lived heap: out of the cyclic GC's reach, a full
        # collection no longer pauses the emulator for a second in the middle of a LIST it
        # serves (a Go API server has no such pause to model).
        gc.freeze()
        progress("agent bench: restarting the agent; it lists every pod")
        t0 = time.perf_counter()
        self.bed.start_agent()
        self._wait_ready(timeout=300)
        self.relist_s = time.perf_counter() - t0
        progress(f"agent bench: agent ready after {self.relist_s:.1f} s (pid {self.agent_pid})")
        return self

    # -- what differs on another Kubernetes (bench/bench_real_kube.py overrides these) ----------------
    kube_label = "emulator, kubelet sim"

    def _new_bed(self, bed_class):
        return bed_class(time_scale=0.05, seed=self.seed, max_running_hooks=8)

    def _hold_still(self) -> None:
        """Nothing moves from now on: the kubelet sim stops."""
        self.bed.server.call(self.bed.server.kubelet.stop)

    def _template_pod(self, ns: str, name: str) -> dict | None:
        return self.bed.server.store.get("pods", ns, name)

    def _put(self, pods: list[dict]) -> None:
        """Store `pods` (the last len(pods) of self.ads are their ads): direct store writes."""
        store = self.bed.server.store

        def put_all(objs: list[dict]) -> None:
            for obj in objs:
                store.put("pods", obj, "ADDED")

        self.bed.server.call(put_all, pods, timeout=120)

    def _stored(self) -> int:
        return self.bed.server.store.count("pods")

    def cut(self) -> int:
        """Compact the pods' history and end the open watches; how many watches ended."""
        store = self.bed.server.store

        def cut() -> int:
            store.compact("pods")
            return store.end_watches("pods")

        return self.bed.server.call(cut)

    def close(self) -> None:
        if self.bed is not None:
            self.bed.close()
            self.bed = None

    def __enter__(self) -> WarmAgent:
        try:
            return self.start()
        except BaseException:
            self.close()          # the agent runs in its own session: never leave it behind
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def agent_pid(self) -> int:
        return self.bed.agent.pid

    @property
    def socket(self) -> str:
        return str(self.bed.socket)

    @property
    def update_hook(self) -> str:
        return str(self.bed.hooks / "ce-k8s-update")

    def _route_templates(self) -> None:
        """Route one pilot per shape until its pod runs; keep its routed ad and its pod."""
        from ce_k8s.condor import wire
        from ce_k8s.sim.condor.schedd import eval_str
        from ce_k8s.sim.pilots import SHAPES, make_pilot

        bed = self.bed
        pilots = [make_pilot(i, shape, run_s=TEMPLATE_RUN_S) for i, (shape, _w) in enumerate(SHAPES)]
        jobs = route_until_running(bed, pilots)
        for job, pilot in zip(jobs, pilots, strict=True):
            rj = bed.router.jobs[job]
            ad = bed.schedd.get(rj.dest_key)
            name = eval_str(ad, "K8sPodName")
            ns = eval_str(ad, "K8sPodNamespace")
            pod = self._template_pod(ns, name)
            if pod is None:
                raise BenchError(f"template pod {ns}/{name} vanished")
            self.templates.append((pilot.shape, wire.sprint_ad(ad), pod))
        progress(f"agent bench: {len(self.templates)} template pilots running: "
                 + ", ".join(f"{s} ({len(t)} B ad, {len(json.dumps(p))} B pod)" for s, t, p in self.templates))

    def _clone(self, i: int, shape_index: int) -> tuple[dict, bytes]:
        from ce_k8s.agent.podinfo import ANN_GLOBAL_JOB_ID, LABEL_JOB
        from ce_k8s.pods.names import pod_name, secret_name

        _shape, ad_text, pod_json = self._template_json[shape_index]
        pod = msgspec.json.decode(pod_json)
        meta = pod["metadata"]
        old_name = meta["name"]
        cluster = CLONE_JOB_BASE + i
        gjid = f"bench-ce.example.org#{cluster}.0#1700000000"
        name = pod_name(gjid, 0)
        uid = str(uuid.UUID(int=random.getrandbits(128)))
        meta.update(name=name, uid=uid)
        meta.pop("resourceVersion", None)
        meta.setdefault("labels", {})[LABEL_JOB] = f"{cluster}.0"
        meta.setdefault("annotations", {})[ANN_GLOBAL_JOB_ID] = gjid
        for vol in pod.get("spec", {}).get("volumes") or ():
            sec = vol.get("secret")
            if sec and sec.get("secretName") == secret_name(old_name):
                sec["secretName"] = secret_name(name)
        ns = meta["namespace"]
        text = _rewrite(ad_text, {
            "ClusterId": str(cluster), "ProcId": "0",
            "K8sPodName": f'"{name}"', "K8sSourceGlobalJobId": f'"{gjid}"', "K8sPodUid": f'"{uid}"',
            "GridJobId": f'"kubernetes {ns}/{name}"',
        })
        return pod, text.encode()

    def _preload(self) -> None:
        """Fill the store with clones up to the target count, in loop-thread batches."""
        from ce_k8s.sim.pilots import SHAPES

        random.seed(self.seed)
        self._template_json = [(s, t, json.dumps(p)) for s, t, p in self.templates]
        weights = [w for _s, w in SHAPES]
        picks = random.choices(range(len(self.templates)), weights, k=self.target)
        t0 = time.perf_counter()
        batch: list[dict] = []
        for i, shape_index in enumerate(picks):
            pod, text = self._clone(i, shape_index)
            batch.append(pod)
            self.ads.append(text)
            if len(batch) >= 2000:
                self._put(batch)
                batch = []
        if batch:
            self._put(batch)
        self.preload_s = time.perf_counter() - t0
        progress(f"agent bench: stored {len(picks)} cloned pods in {self.preload_s:.1f} s "
                 f"(store holds {self._stored()} pods)")

    def handler_timings(self, timeout: float = 30.0) -> list[float]:
        """Update-handler durations the agent recorded since the last call (see agent_timed.py)."""
        import signal

        path = self.bed.timings_path
        path.unlink(missing_ok=True)
        os.kill(self.agent_pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise BenchError("the agent did not write its handler timings")
            time.sleep(0.02)
        return json.loads(path.read_text())

    def _wait_ready(self, timeout: float) -> None:
        from ce_k8s import protocol

        deadline = time.monotonic() + timeout
        status = "no answer"
        while time.monotonic() < deadline:
            try:
                status = protocol.ask(self.socket, protocol.VERB_UPDATE, self.ads[0], 10).status
                if status == protocol.STATUS_OK:
                    return
            except (OSError, protocol.ProtocolError) as exc:
                status = str(exc)
            time.sleep(0.1)
        raise BenchError(f"agent not ready within {timeout:.0f} s (last answer: {status})")


def agent_rounds(warm: WarmAgent, rounds: int) -> dict[str, float]:
    """Time every clone's update over the socket, `rounds` times; the last round is reported."""
    from ce_k8s import protocol

    per_round: list[list[float]] = []
    nonempty = 0
    handler: list[float] = []
    warm.handler_timings()                      # forget the readiness probes
    cpu0 = proc_cpu_s(warm.agent_pid)
    for r in range(rounds):
        samples = []
        for payload in warm.ads:
            t0 = time.perf_counter()
            answer = protocol.ask(warm.socket, protocol.VERB_UPDATE, payload, 10)
            samples.append(time.perf_counter() - t0)
            parts = answer.parts
            if answer.status != protocol.STATUS_OK:
                raise BenchError(f"agent answered {answer.status}: {parts[:1]}")
            if r == rounds - 1 and parts[0]:
                nonempty += 1
        per_round.append(samples)
        handler = warm.handler_timings()
        if len(handler) != len(samples):
            raise BenchError(f"the agent timed {len(handler)} updates, the client sent {len(samples)}")
        progress(f"agent bench: round {r + 1}/{rounds}: {len(samples)} updates; round trip p50 "
                 f"{percentile(samples, 50) * 1e6:.0f} µs, p99 {percentile(samples, 99) * 1e6:.0f} µs; handler "
                 f"p50 {percentile(handler, 50) * 1e6:.0f} µs, p99 {percentile(handler, 99) * 1e6:.0f} µs")
    agent_cpu = proc_cpu_s(warm.agent_pid) - cpu0
    last = per_round[-1]
    first = per_round[0]
    return {
        "agent_roundtrip_us_p50": round(percentile(last, 50) * 1e6, 1),
        "agent_roundtrip_us_p99": round(percentile(last, 99) * 1e6, 1),
        "agent_roundtrip_first_us_p50": round(percentile(first, 50) * 1e6, 1),
        "agent_roundtrip_first_us_p99": round(percentile(first, 99) * 1e6, 1),
        "agent_roundtrip_cpu_us": round(agent_cpu / (rounds * len(warm.ads)) * 1e6, 1),
        "agent_roundtrip_nonempty_replies": nonempty,
        "agent_update_us_p50": round(percentile(handler, 50) * 1e6, 1),
        "agent_update_us_p99": round(percentile(handler, 99) * 1e6, 1),
        "agent_update_us_max": round(max(handler) * 1e6, 1),
    }


def hook_samples(warm: WarmAgent, samples: int) -> dict[str, float]:
    """Interleave `python -S -c pass` and one update-hook process; ratio of medians."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CE_K8S_")}
    bare_argv = bare_python_argv()
    hook_argv = [warm.update_hook]
    rng = random.Random(11)
    for _ in range(3):                                   # warm-up: page cache, agent connection path
        run_wall(bare_argv, env=env)
        run_wall(hook_argv, rng.choice(warm.ads), env=env)
    bare, hook = [], []
    hook_cpu = bare_cpu = 0.0
    failures = 0
    for _ in range(samples):
        c0 = children_cpu()
        dt, _rc, _out = run_wall(bare_argv, env=env)
        c1 = children_cpu()
        bare.append(dt)
        bare_cpu += c1 - c0
        dt, rc, _out = run_wall(hook_argv, rng.choice(warm.ads), env=env)
        hook_cpu += children_cpu() - c1
        hook.append(dt)
        failures += rc != 0
    if failures > samples // 10:
        raise BenchError(f"{failures} of {samples} update hooks exited non-zero")
    # The pip console script (site + `import re`), the fallback the shipped config mentions.
    console = str(Path(PYTHON).parent / "ce-k8s-update")
    console_env = dict(env, CE_K8S_SOCKET=warm.socket)
    console_samples = [run_wall([console], rng.choice(warm.ads), env=console_env)[0]
                       for _ in range(max(5, samples // 4))] if os.path.exists(console) else []
    bare_p50 = percentile(bare, 50)
    hook_p50 = percentile(hook, 50)
    out = {
        "python_bare_ms_p50": round(bare_p50 * 1e3, 2),
        "hook_update_ms_p50": round(hook_p50 * 1e3, 2),
        "hook_update_ms_p99": round(percentile(hook, 99) * 1e3, 2),
        "hook_overhead_ratio": round(hook_p50 / bare_p50, 3),
        "hook_update_cpu_ms": round(hook_cpu / samples * 1e3, 2),
        "python_bare_cpu_ms": round(bare_cpu / samples * 1e3, 2),
        "hook_update_failures": failures,
    }
    if console_samples:
        out["hook_update_console_script_ms_p50"] = round(percentile(console_samples, 50) * 1e3, 2)
    progress(f"hook bench: {samples} pairs: bare {out['python_bare_ms_p50']} ms, hook {out['hook_update_ms_p50']} ms "
             f"(p99 {out['hook_update_ms_p99']}), ratio {out['hook_overhead_ratio']}")
    return out


def relist_after_gone(warm: WarmAgent, timeout: float = 120.0) -> dict[str, float]:
    """The agent's watch answered 410 Gone: time from the cut to a complete cache again.

    The emulator compacts the pods' history (`Store.compact`, every version the agent holds is
    now too old) and ends the open watches cleanly (`Store.end_watches`, as an API server
    restart does); the agent resumes from its version, is told 410 Gone and relists. The agent
    keeps answering from its previous cache meanwhile (docs/agent.md), so this is how long its
    answers may be stale, not how long it is blind. Timed from just before the cut to the end of
    the LIST, as `bench/agent_timed.py` records it (both `time.monotonic()`, one clock).
    """
    relists_path = Path(str(warm.bed.timings_path) + ".relists")
    before = len(json.loads(relists_path.read_text())) if relists_path.exists() else 0
    t0 = time.monotonic()
    ended = warm.cut()
    deadline = t0 + timeout
    while True:
        done = json.loads(relists_path.read_text()) if relists_path.exists() else []
        if len(done) > before:
            last = done[-1]
            break
        if time.monotonic() > deadline:
            raise BenchError(f"the agent did not relist within {timeout:.0f} s of a 410 Gone")
        time.sleep(0.02)
    if last["pods"] < warm.target:
        raise BenchError(f"the relist after 410 found {last['pods']} pods, {warm.target} expected")
    took = last["end"] - t0
    progress(f"agent bench: {ended} watch(es) ended on a compacted history; relisted {last['pods']} pods "
             f"{took:.2f} s after the cut (LIST itself {last['end'] - last['start']:.2f} s)")
    return {"agent_relist_410_s": round(took, 2), "agent_relist_410_list_s": round(last["end"] - last["start"], 2)}


def run(pods: int, hook_n: int, rounds: int, steady_pairs: int = 0, poll_jobs: int = 0) -> dict[str, float]:
    """All figures of this module from one warm agent."""
    with WarmAgent(pods) as warm:
        result: dict[str, float] = {"agent_pods": pods, "agent_relist_s": round(warm.relist_s, 2)}
        result.update(agent_rounds(warm, rounds))
        result["agent_rss_mb"] = round(proc_rss_mb(warm.agent_pid), 1)
        progress(f"agent bench: agent RSS {result['agent_rss_mb']} MB at {pods} pods")
        result.update(relist_after_gone(warm))
        result["agent_rss_peak_mb"] = round(proc_rss_mb(warm.agent_pid, "VmHWM"), 1)
        progress(f"agent bench: agent peak RSS {result['agent_rss_peak_mb']} MB (two caches during that relist)")
        if hook_n:
            result.update(hook_samples(warm, hook_n))
        if steady_pairs:
            import steady

            label = f"{pods // 1000}k" if pods % 1000 == 0 else str(pods)
            got = steady.measure(warm, pods, pairs=steady_pairs, updates=5000, idle_s=3.0, poll_jobs=poll_jobs)
            result.update({f"{k}_{label}": v for k, v in got.items()})
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=None, help="pods the agent holds (default 20,000 x scale)")
    ap.add_argument("--hook-samples", type=int, default=None,
                    help="hook/bare pairs (default 300 x scale; 0: no hook figures)")
    ap.add_argument("--agent-rounds", type=int, default=2, help="update rounds over every pod (default 2)")
    ap.add_argument("--steady", type=int, default=0, metavar="PAIRS",
                    help="also the steady-state figures (bench/steady.py), from PAIRS hook/bare pairs")
    ap.add_argument("--poll-check", type=int, default=0, metavar="JOBS",
                    help="with --steady: run the update hooks of a poll over JOBS jobs and check the formula on it")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    exit_on_sigterm()
    hooks = scaled(300, 10) if a.hook_samples is None else max(0, a.hook_samples)
    result = run(a.pods or scaled(20_000, 20), hooks, max(1, a.agent_rounds), max(0, a.steady), a.poll_check)
    print(json.dumps(result, sort_keys=True) if a.json else "\n".join(f"{k:40} {v}" for k, v in sorted(result.items())))
    return 0


if __name__ == "__main__":
    exit_now(main())
