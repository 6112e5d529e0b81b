"""Pilots per second through the whole emulated path, and what each pilot costs.

    python bench/bench_pipeline.py [--pilots N] [--poll S] [--json]

Path: router emulator (shipped routes, real hook launchers, process per hook call) → hooks →
the real `ce-k8s agent` process → API emulator → kubelet sim (pods time-scaled: a pilot's
10-30 simulated seconds last 0.5-1.5 real seconds) → back up through the update hook → finalize
(pod logs into the job's Out/Err) → cleanup, with a GlideinWMS-like factory staging out and
removing finished pilots (`ce_k8s.sim.testbed.TestBed`, the engine of `ce-k8s demo`).

The factory (`Factory`) keeps `--depth` unfinished pilots at the CE (default 500) and tops the
queue up after every router poll, as a GlideinWMS factory keeps an entry under its glidein limits
instead of handing over its whole demand at once. `--depth 0` submits every pilot at the start
(one burst; `bench/run.py` reports that run's figures with the prefix `burst_`).

Figures:
* `pipeline_pilots_per_s`: pilots divided by the time from the first submission to the last
  pilot finishing (ramp-up and drain included: the conservative reading of "sustained").
* `pipeline_depth`, `pipeline_feed_end_s`: the factory's depth and when it submitted its last
  pilot (after that the queue only drains).
* `pipeline_sustained_pilots_per_s`, `pipeline_sustained_efficiency`: the same, counted only
  while the CE is fed and past its ramp (from a tenth of the pilots finished to the last
  submission, `sustained_rate`): what `--quick`'s shorter run can show as well as the full one.
* `hook_spawns_per_pilot`: hook processes the router started, per pilot.
* `api_calls_per_pilot`: API requests counted by the emulator after set-up, per pilot (every
  verb, including the agent's LIST/WATCH and the finalize hook's log reads);
  `api_calls_per_pilot_lifecycle` the same without the kubelet Summary reads accounting makes
  through `nodes/proxy` at each pod's end (issue 15).
* `python_bare_cpu_s` and `pipeline_efficiency` as defined in issue 7; the bare start's CPU is the
  mean of 100 starts just before and 100 just after the run (`_before`, `_after`), on the idle
  machine.
* CPU seconds per pilot by process group, to show where the machine's two cores went, and
  `pipeline_cpu_efficiency` (bare-start CPU / all CPU the pipeline used: the efficiency the run
  would have if no core sat idle and no other process shared the machine).
* `machine_cpu_cores_busy`: the whole machine's busy cores during the run (/proc/stat); minus
  `pipeline_cpu_cores_used` it is what other processes took from the two cores.

The router emulator's `max_running_hooks` is 64 here (the real router has no limit, hook-protocol.md §0; the
test bed's default of 24 is for the demo). By default the router emulator forks hooks from
`--spawn-threads` spawner threads instead of its polling thread, and the API emulator with the
kubelet sim runs as its own process (`ce-k8s sim serve --stats`, counters read over its
`/_sim/stats`), so the emulators do not serialise the pipeline on one thread and one GIL
(`--spawn-threads 0 --in-process-api` is the earlier arrangement). Their CPU is counted in
`cpu_ms_per_pilot_router_api_kubelet` either way.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BenchError,
    bare_python_cpu_s,
    children_cpu,
    cores,
    exit_on_sigterm,
    machine_cpu,
    proc_children_cpu_s,
    proc_cpu_s,
    progress,
    scaled,
    self_cpu,
)

SETUP_RESOURCES = frozenset({"namespaces", "serviceaccounts", "priorityclasses"})

# The agent's client-side API budget. The shipped CE_K8S_QPS = 20 caps a CE at 20 / (API calls
# per pilot) pilots per second whatever the software does, so the software is measured with the
# budget lifted and the cap is reported next to it (docs/performance.md).
BENCH_OVERLAY = """\
# bench/bench_pipeline.py: lift the client-side API budget so the software is what is measured.
CE_K8S_QPS = {qps}
CE_K8S_BURST = {burst}
"""


def bench_config(directory: Path, qps: float, burst: int) -> Path:
    """The shipped configuration (config.d/, routes/) plus the bench overlay, in `directory`."""
    import shutil

    from ce_k8s.condor.config import default_config_paths

    directory.mkdir(parents=True, exist_ok=True)
    n = 0
    for src in default_config_paths():
        for f in sorted(src.glob("*.conf")):
            shutil.copy(f, directory / f"{n:03d}-{f.name}")
            n += 1
    (directory / f"{n:03d}-bench.conf").write_text(BENCH_OVERLAY.format(qps=qps, burst=burst))
    return directory


class Stalled(BenchError):
    """No pilot finished for too long: the pipeline is stuck, not slow."""


def stuck_report(bed, limit: int = 8) -> str:
    """Why the unfinished pilots are unfinished: shape, router state, what the agent last said."""
    from ce_k8s.sim.condor.schedd import eval_int, eval_str

    by_kind: Counter[tuple] = Counter()
    for job, out in bed.outcomes.items():
        if out.status != "queued":
            continue
        rj = bed.router.jobs.get(job)
        routed = bed.schedd.get(rj.dest_key) if rj is not None and rj.dest_key else None
        src = bed.schedd.get(job)
        by_kind[(out.pilot.shape, rj.state.value if rj else "not managed",
                 eval_int(src, "JobStatus") if src is not None else None,
                 eval_str(routed, "K8sPodPhase") if routed is not None else None,
                 (eval_str(routed, "K8sPodReason") or "")[:120] if routed is not None else None)] += 1
    return "; ".join(f"{n} x {k}" for k, n in by_kind.most_common(limit))


class _Marks:
    """Progress callback for TestBed.run: completion marks and a line on stderr every few seconds."""

    def __init__(self, total: int, stall_s: float = 180.0) -> None:
        self.total = total
        self.t0 = time.monotonic()
        self.marks: dict[int, float] = {}
        self.last = 0.0
        self.stall_s = stall_s
        self.done = 0
        self.last_change = self.t0
        self.series: list[tuple[float, int]] = []      # (seconds since t0, pilots finished), every tick

    def __call__(self, bed) -> None:
        now = time.monotonic()
        done = sum(1 for o in bed.outcomes.values() if o.status != "queued")
        self.series.append((now - self.t0, done))
        if done != self.done:
            self.done, self.last_change = done, now
        elif done and now - self.last_change > self.stall_s:   # the first wave may take minutes
            raise Stalled(f"pipeline: no pilot finished for {self.stall_s:.0f} s at {done}/{self.total}: "
                          + stuck_report(bed))
        for pct in (10, 50, 90, 100):
            if pct not in self.marks and done * 100 >= pct * self.total:
                self.marks[pct] = now - self.t0
        if now - self.last >= 5:
            self.last = now
            hooks = sum(bed.router.hook_counts.values())
            progress(f"pipeline: {done}/{self.total} pilots done after {now - self.t0:.0f} s, "
                     f"{hooks} hook processes so far")


class Factory:
    """The submitting side: a GlideinWMS factory keeping an entry's pilots at the CE topped up.

    A factory does not hand a CE its whole demand at once: each cycle it submits only what keeps
    the entry under its limits (``per_entry glideins/idle``, ``max_submits`` per cycle;
    htcondor-ce.md §5). Here it keeps at most ``depth`` unfinished pilots in the CE's queue and
    refills after every router poll, so the CE sees a steady stream. ``depth`` 0 hands over every
    pilot at the start (one burst, the first rounds' arrangement).
    """

    def __init__(self, bed, work: list, depth: int) -> None:
        self.bed = bed
        self.work = work
        self.depth = depth if depth > 0 else len(work)
        self.next = 0
        self.feed_end_s: float | None = None
        self.t0 = time.monotonic()

    def top_up(self) -> None:
        room = min(self.depth - self.bed.pending(), len(self.work) - self.next)
        if room > 0:
            self.bed.submit(self.work[self.next:self.next + room])
            self.next += room
            if self.next == len(self.work):
                self.feed_end_s = time.monotonic() - self.t0

    def run(self, timeout: float, poll_interval: float, progress) -> bool:
        """Tick the test bed until every pilot is submitted and finished; False on timeout."""
        deadline = self.t0 + timeout
        self.top_up()
        while (self.bed.pending() or self.next < len(self.work)) and time.monotonic() < deadline:
            self.bed.tick(poll_interval)
            self.top_up()
            progress(self.bed)
        return not self.bed.pending() and self.next == len(self.work)


def sustained_rate(series: list[tuple[float, int]], pilots: int, feed_end_s: float | None,
                   min_window_s: float = 10.0) -> tuple[float, float, float] | None:
    """Pilots finished per second while the CE was fed and past its ramp: (rate, start, end).

    The window opens when a tenth of the pilots have finished (the first wave's pods have run
    their course and the pipeline is full) and closes when the factory submits its last pilot
    (after that the queue only drains). None when that window is shorter than `min_window_s`
    (a run too short, or a burst with no feed): then only the whole-run rate means anything.
    """
    if feed_end_s is None:
        return None
    start = next(((t, d) for t, d in series if d * 10 >= pilots), None)
    if start is None:
        return None
    before_end = [(t, d) for t, d in series if t <= feed_end_s]
    if not before_end:
        return None
    end = before_end[-1]
    if end[0] - start[0] < min_window_s:
        return None
    return (end[1] - start[1]) / (end[0] - start[0]), start[0], end[0]


def run(pilots: int, poll: float = 1.0, max_running_hooks: int = 64, timeout: float = 900.0,
        bare_samples: int = 100, qps: float = 1000.0, spawn_threads: int = 2,
        api_process: bool = True, spawn_process: bool = True, nodes: str | None = None,
        depth: int = 500, kube_server=None) -> dict[str, float]:
    """Run `pilots` pilots through a fresh test bed and return the figures (module docstring).

    `kube_server`: a real control plane (ce_k8s.real.kube.kubeserver.RealKubeServer) instead of the
    emulator (bench/bench_real_kube.py); its CPU is not in these figures (the caller reads it).
    """
    if kube_server is not None:
        api_process = False
    from ce_k8s.sim.testbed import TestBed

    progress(f"pipeline: measuring one bare python start ({bare_samples} samples now, as many after the run)")
    bare_before = bare_python_cpu_s(bare_samples)
    progress(f"pipeline: python -S -c pass costs {bare_before * 1e3:.2f} ms CPU; "
             f"starting the test bed, {pilots} pilots")
    from ce_k8s.sim import testbed

    # The demo overlay shortens the agent's GC grace to 30 s so `ce-k8s demo` ends tidy; with a
    # 2,000-pilot wave an update round takes longer than that, the GC deletes finished pods before
    # their cleanup hook does, and every such pilot costs two extra 404 deletes. The bench keeps
    # the shipped grace (CE_K8S_GC_GRACE, 600 s) so the API count is the protocol's, not the demo's.
    testbed.OVERLAY = testbed.OVERLAY.replace("CE_K8S_GC_GRACE = 30\n", "")
    if "CE_K8S_GC_GRACE" in testbed.OVERLAY:
        progress("pipeline: WARNING: the test bed overlay still sets CE_K8S_GC_GRACE; API counts may include GC")
    tmp = tempfile.TemporaryDirectory(prefix="ce-k8s-bench-")
    config = bench_config(Path(tmp.name) / "config", qps, int(max(qps, 1)))
    bed = TestBed(config=str(config), seed=3, max_running_hooks=max_running_hooks, spawn_threads=spawn_threads,
                  api_process=api_process, spawn_process=spawn_process, kube_server=kube_server,
                  **({"nodes": nodes} if nodes else {}))
    try:
        bed.start()
        work = bed.make_pilots(pilots)
        bed.server.reset_calls()
        connections0 = getattr(bed.server, "connections", 0)   # the real server counts none
        marks = _Marks(pilots)
        # The emulator process (api_process) is a child that is not reaped during the run, so its
        # CPU is read from /proc like the agent's and counted with the emulators.
        api_pid = bed.server.pid if api_process else None
        api_cpu0 = proc_cpu_s(api_pid) if api_pid else 0.0
        # A spawner process (spawn_process) forks the hooks: its own CPU counts with the router,
        # the CPU of the hooks it reaped with the hooks.
        spawner_pid = bed.router.runner.pid if spawn_process else None
        spawner0 = (proc_cpu_s(spawner_pid), proc_children_cpu_s(spawner_pid)) if spawner_pid else (0.0, 0.0)
        agent_cpu0, self_cpu0, child_cpu0 = proc_cpu_s(bed.agent.pid), self_cpu(), children_cpu()
        busy0, total0 = machine_cpu()
        factory = Factory(bed, work, depth)
        ok = factory.run(timeout=timeout, poll_interval=poll, progress=marks)
        marks(bed)
        wall = time.monotonic() - marks.t0
        agent_cpu = proc_cpu_s(bed.agent.pid) - agent_cpu0
        bench_cpu, hook_cpu = self_cpu() - self_cpu0, children_cpu() - child_cpu0
        api_cpu = proc_cpu_s(api_pid) - api_cpu0 if api_pid else 0.0
        if spawner_pid:
            bench_cpu += proc_cpu_s(spawner_pid) - spawner0[0]
            hook_cpu += proc_children_cpu_s(spawner_pid) - spawner0[1]
        router_cpu = bench_cpu
        bench_cpu += api_cpu
        busy1, total1 = machine_cpu()
        if not ok:
            raise BenchError(f"pipeline: {bed.pending()} of {pilots} pilots still queued and "
                             f"{pilots - factory.next} not yet submitted after {timeout:.0f} s")
        summary = bed.summary()
        calls = bed.server.calls
        connections = getattr(bed.server, "connections", 0) - connections0
        progress("pipeline: draining cleanups and the agent's GC")
        bed.drain(timeout=30)
    finally:
        bed.close()
        tmp.cleanup()
    # The machine's speed drifts by several per cent between minutes: the reference is the mean of
    # the idle machine just before and just after the run (both printed).
    bare_after = bare_python_cpu_s(bare_samples)
    bare_cpu = (bare_before + bare_after) / 2
    progress(f"pipeline: python -S -c pass costs {bare_after * 1e3:.2f} ms CPU after the run")
    statuses = Counter(o.status for o in bed.outcomes.values())
    if statuses["completed"] < pilots * 0.9:
        raise BenchError(f"pipeline: only {statuses['completed']} of {pilots} pilots completed: {dict(statuses)}")
    spawns = sum(summary["hook_calls"].values())
    api = sum(n for (verb, res), n in calls.items() if res not in SETUP_RESOURCES)
    rate = pilots / wall
    spawns_per_pilot = spawns / pilots
    limit = cores() / (spawns_per_pilot * bare_cpu)
    result: dict[str, float] = {
        "pipeline_pilots": pilots,
        "pipeline_pilots_per_s": round(pilots / wall, 2),
        "pipeline_wall_s": round(wall, 1),
        "pipeline_depth": factory.depth,
        "pipeline_feed_end_s": round(factory.feed_end_s or 0.0, 1),
        "pipeline_completed": statuses["completed"],
        "pipeline_held": statuses["held"],
        "pipeline_lost": statuses["lost"] + statuses["queued"],
        "pipeline_duplicate_pods": summary["duplicate_pods"],
        "api_calls_per_pilot": round(api / pilots, 2),
        # The pilot's own life (pod, Secret, log, delete, LIST/WATCH share) without the kubelet
        # Summary reads that accounting makes at each pod's end (issue 15, docs/accounting.md):
        # those are per node read, not per pilot object, and the issue-7 budget predates them.
        "api_calls_per_pilot_lifecycle": round(
            sum(n for (verb, res), n in calls.items() if res not in SETUP_RESOURCES and res != "nodes/proxy")
            / pilots, 2),
        # TCP connections opened to the API server (every client: agent, finalize reads, test bed).
        "api_connections_per_pilot": round(connections / pilots, 3),
        "hook_spawns_per_pilot": round(spawns_per_pilot, 2),
        "python_bare_cpu_s": round(bare_cpu, 5),
        "python_bare_cpu_s_before": round(bare_before, 5),
        "python_bare_cpu_s_after": round(bare_after, 5),
        "cores": cores(),
        "pipeline_limit_pilots_per_s": round(limit, 2),
        "pipeline_efficiency": round(rate / limit, 3),
        # What ce-k8s itself (hooks + agent) would allow if the router, API server and kubelet
        # were free: the emulators share these two cores, a real CE's router and API server do not.
        "pipeline_cek8s_limit_pilots_per_s": round(cores() / ((hook_cpu + agent_cpu) / pilots), 2),
        "pipeline_api_qps": qps,
        "pipeline_qps20_cap_pilots_per_s": round(20.0 / (api / pilots), 2),
        "pipeline_cpu_cores_used": round((hook_cpu + agent_cpu + bench_cpu) / wall, 2),
        # Load-independent companion of pipeline_efficiency: the share of all CPU the pipeline used
        # (hooks, agent, emulators) that went into bare interpreter starts.
        "pipeline_cpu_efficiency": round(spawns * bare_cpu / (hook_cpu + agent_cpu + bench_cpu), 3),
        "machine_cpu_cores_busy": round((busy1 - busy0) / (total1 - total0) * cores(), 2),
        "cpu_ms_per_pilot_hooks": round(hook_cpu / pilots * 1e3, 1),
        "cpu_ms_per_pilot_agent": round(agent_cpu / pilots * 1e3, 1),
        "cpu_ms_per_pilot_router_api_kubelet": round(bench_cpu / pilots * 1e3, 1),
    }
    if api_process:   # the split of the emulators' figure: this process (router, factory) and the other
        result["cpu_ms_per_pilot_router_process"] = round(router_cpu / pilots * 1e3, 1)
        result["cpu_ms_per_pilot_api_kubelet_process"] = round(api_cpu / pilots * 1e3, 1)
    window = sustained_rate(marks.series, pilots, factory.feed_end_s) if factory.depth < pilots else None
    if window is not None:
        sustained, w0, w1 = window
        result["pipeline_sustained_pilots_per_s"] = round(sustained, 2)
        result["pipeline_sustained_efficiency"] = round(sustained / limit, 3)
        result["pipeline_sustained_window_s"] = round(w1 - w0, 1)
        progress(f"pipeline: sustained {sustained:.2f} pilots/s from {w0:.0f} s to {w1:.0f} s "
                 f"(efficiency {sustained / limit:.3f})")
    for hook, n in sorted(summary["hook_calls"].items()):
        result[f"hook_spawns_per_pilot_{hook.lower()}"] = round(n / pilots, 2)
        result[f"hook_wall_ms_mean_{hook.lower()}"] = round(summary["hook_seconds"].get(hook, 0.0) / n * 1e3, 1)
    for (verb, res), n in sorted(calls.items()):
        if res not in SETUP_RESOURCES:
            result[f"api_calls_per_pilot_{verb}_{res.replace('/', '_')}"] = round(n / pilots, 3)
    progress(f"pipeline: {result['pipeline_pilots_per_s']} pilots/s, {spawns_per_pilot:.2f} hook spawns and "
             f"{api / pilots:.2f} API calls per pilot, "
             f"efficiency {result['pipeline_efficiency']}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pilots", type=int, default=None, help="pilots (default 2,000 x scale)")
    ap.add_argument("--poll", type=float, default=1.0, help="router polling period in real seconds (default 1)")
    ap.add_argument("--max-running-hooks", type=int, default=64,
                    help="hook processes at once, 0 = no limit like the real router (default 64)")
    ap.add_argument("--qps", type=float, default=1000.0, help="CE_K8S_QPS and _BURST for the run (default 1000)")
    ap.add_argument("--spawn-threads", type=int, default=2,
                    help="router emulator threads that fork hooks, 0 = fork in the polling thread (default 2)")
    ap.add_argument("--in-router-spawn", action="store_true",
                    help="fork and watch the hooks in the router emulator's own process, not a spawner process")
    ap.add_argument("--in-process-api", action="store_true",
                    help="run the API emulator and kubelet sim in this process (the earlier arrangement)")
    ap.add_argument("--depth", type=int, default=None,
                    help="unfinished pilots the factory keeps at the CE, 0 = all at once (default 500, "
                         "a quarter of the pilots when fewer than 2,000)")
    ap.add_argument("--nodes", default=None, help="emulated cluster (kubelet sim --nodes syntax)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    exit_on_sigterm()
    pilots = a.pilots or scaled(2000, 10)
    depth = a.depth if a.depth is not None else min(500, max(1, pilots // 4))
    result = run(pilots, poll=a.poll, max_running_hooks=a.max_running_hooks,
                 qps=a.qps, spawn_threads=a.spawn_threads, api_process=not a.in_process_api,
                 spawn_process=not a.in_router_spawn, nodes=a.nodes, depth=depth)
    print(json.dumps(result, sort_keys=True) if a.json else "\n".join(f"{k:48} {v}" for k, v in sorted(result.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
