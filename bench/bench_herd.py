"""Thundering herd: the CE's router and the agent restart at once with N routed pilots (issue 17).

    python bench/bench_herd.py [--jobs N] [--stale-fraction F] [--json]

A CE restart makes the router re-adopt every routed job (AdoptOrphans, docs/hook-protocol.md
§2.3) and fork one update hook per job in its first poll, while a restarted agent is still
listing its pods. Set-up, real code between the emulated boundaries:

1. `ce_k8s.sim.testbed.TestBed` (API emulator, kubelet sim, the real agent process, the
   hook launchers, the router emulator with the shipped routes) routes one long-running pilot
   per shape until its pod runs: the templates.
2. The router and the agent are stopped, the kubelet sim too (nothing moves on its own), and
   the CE's queue and the cluster are filled with N clones: for each, a source job
   (`Managed = "External"`, as the router leaves a routed job), its routed job and its running
   pod, all naming each other as the real path would. A fraction `--stale-fraction` of the
   routed jobs still shows what they showed before their pod started (`JobStatus = 1`,
   `K8sPodPhase = "Pending"`): their pods started while the CE was down.
3. At the same moment a new router (re-adopting every routed job in its first poll) and a new
   agent start. The router's first poll forks every job's update hook (as many at once as
   `--max-running-hooks`, 64 as in the pipeline benchmark; the real router has no limit).

Figures:
* `herd_jobs`, `herd_first_poll_s`: wall time until every hook of the first poll has exited.
* `herd_no_sync`: update hooks that got "no sync" (the agent was still listing).
* `herd_recover_s`, `herd_recover_polls`: from the restart until every routed job shows its
  pod's true status, in seconds and in shipped polling periods (60 s). The router emulator polls
  every 60 s of real time, as the shipped `JOB_ROUTER_POLLING_PERIOD`: a job whose hook got "no
  sync" is asked again at the next poll, behind what is still queued of the first.
* `herd_cek8s_cpu_s`, `herd_cek8s_recover_polls`: the CPU the hooks and the agent used until then,
  and the polling periods it would take on these cores if the router were free (the emulator is
  Python, a real router is not; hooks run until recovery counted, including later polls').
* `herd_agent_rss_peak_mb`: the agent's VmHWM; `herd_pods_created`, `herd_pods_deleted`,
  `herd_jobs_lost`: the proof that nothing was lost or duplicated (all must be 0).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import uuid
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BenchError,
    cores,
    exit_now,
    exit_on_sigterm,
    proc_children_cpu_s,
    proc_cpu_s,
    proc_rss_mb,
    progress,
    scaled,
)

POLL_S = 60.0                    # the shipped JOB_ROUTER_POLLING_PERIOD
TEMPLATE_RUN_S = 100_000.0       # simulated seconds: the template pods keep running


class Herd:
    """A test bed whose CE holds `jobs` routed, running pilots, its router and agent stopped."""

    def __init__(self, jobs: int, stale_fraction: float, max_running_hooks: int, seed: int = 9) -> None:
        self.jobs = jobs
        self.stale_fraction = stale_fraction
        self.max_running_hooks = max_running_hooks
        self.seed = seed
        self.bed = None
        self.templates: list[tuple[object, object, dict]] = []   # (source ad, routed ad, pod)
        self.routed: list[str] = []                               # routed job ids (the clones)
        self.stale: set[str] = set()

    def __enter__(self) -> Herd:
        from ce_k8s.sim.testbed import TestBed

        progress(f"herd bench: starting the test bed, {self.jobs} routed pilots to clone")
        # Hooks forked by a spawner process with two threads, as in the pipeline benchmark, so the
        # router emulator's own thread is not the limit; the API emulator stays in this process
        # (the clones are written straight into its store).
        self.bed = TestBed(time_scale=0.05, seed=self.seed, max_running_hooks=self.max_running_hooks,
                           spawn_threads=2, spawn_process=True)
        try:
            self.bed.start()
            self._route_templates()
            self.bed.router.close()
            self.bed.stop_agent()
            self.bed.server.call(self.bed.server.kubelet.stop)
            gc.disable()          # the clones are long-lived: no cyclic GC walks while they are made
            try:
                self._clone()
            finally:
                gc.enable()
        except BaseException:
            self.bed.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bed is not None:
            self.bed.close()

    def _route_templates(self) -> None:
        from bench_agent import route_until_running

        from ce_k8s.sim.condor.schedd import copy_ad, eval_str
        from ce_k8s.sim.pilots import SHAPES, make_pilot

        bed = self.bed
        pilots = [make_pilot(i, shape, run_s=TEMPLATE_RUN_S) for i, (shape, _w) in enumerate(SHAPES)]
        for job in route_until_running(bed, pilots):
            rj = bed.router.jobs[job]
            dest = bed.schedd.get(rj.dest_key)
            pod = bed.server.store.get("pods", eval_str(dest, "K8sPodNamespace"), eval_str(dest, "K8sPodName"))
            if pod is None:
                raise BenchError(f"the template pod of {job} vanished")
            self.templates.append((copy_ad(bed.schedd.get(job)), copy_ad(dest), pod))

    def _clone(self) -> None:
        """Source job, routed job and pod for every clone, naming each other as the real path does."""
        from ce_k8s.agent.podinfo import ANN_GLOBAL_JOB_ID, ANN_ROUTED_FROM, LABEL_JOB
        from ce_k8s.pods.names import pod_name, secret_name
        from ce_k8s.sim.condor.schedd import copy_ad
        from ce_k8s.sim.pilots import SHAPES

        rng = random.Random(self.seed)
        schedd, store = self.bed.schedd, self.bed.server.store
        picks = rng.choices(range(len(self.templates)), [w for _s, w in SHAPES], k=self.jobs)
        pod_json = [json.dumps(p) for _s, _d, p in self.templates]
        pods: list[dict] = []
        t0 = time.perf_counter()
        for i, t in enumerate(picks):
            src_t, dest_t, _pod = self.templates[t]
            src = schedd.get(schedd.submit(copy_ad(src_t)))
            job = f"{src['ClusterId']}.{src['ProcId']}"
            gjid = str(src["GlobalJobId"])
            name = pod_name(gjid, 0)
            uid = str(uuid.UUID(int=rng.getrandbits(128)))
            dest = copy_ad(dest_t)
            for key, value in (("RoutedFromJobId", job), ("K8sPodName", name), ("K8sSourceGlobalJobId", gjid),
                               ("K8sPodUid", uid), ("GridJobId", f"kubernetes {dest_t['K8sPodNamespace']}/{name}")):
                dest[key] = value
            if rng.random() < self.stale_fraction:   # its pod started while the CE was down
                dest["JobStatus"] = 1
                dest["K8sPodPhase"] = "Pending"
                dest["GridJobStatus"] = "PENDING"
            routed = schedd.submit_routed(dest)
            self.routed.append(routed)
            if dest["K8sPodPhase"] == "Pending":
                self.stale.add(routed)
            pod = msgspec.json.decode(pod_json[t])
            meta = pod["metadata"]
            old = meta["name"]
            meta.update(name=name, uid=uid)
            meta.pop("resourceVersion", None)
            meta.setdefault("labels", {})[LABEL_JOB] = job
            meta.setdefault("annotations", {}).update({ANN_GLOBAL_JOB_ID: gjid, ANN_ROUTED_FROM: job})
            for vol in pod.get("spec", {}).get("volumes") or ():
                sec = vol.get("secret")
                if sec and sec.get("secretName") == secret_name(old):
                    sec["secretName"] = secret_name(name)
            pods.append(pod)
            if len(pods) >= 2000 or i == len(picks) - 1:
                self.bed.server.call(lambda batch=pods: [store.put("pods", p, "ADDED") for p in batch],
                                     timeout=120)
                pods = []
        progress(f"herd bench: {self.jobs} source jobs, routed jobs and pods in {time.perf_counter() - t0:.1f} s "
                 f"({len(self.stale)} routed jobs stale)")

    def true_status(self, only: set[str] | None = None) -> tuple[int, int]:
        """(routed jobs showing their running pod, routed jobs still in the queue), of `only` or all."""
        from ce_k8s.sim.condor.schedd import eval_int, eval_str

        right = present = 0
        for job in self.routed if only is None else only:
            ad = self.bed.schedd.get(job)
            if ad is None:
                continue
            present += 1
            right += eval_int(ad, "JobStatus") == 2 and eval_str(ad, "K8sPodPhase") == "Running"
        return right, present

    def still_stale(self, waiting: set[str]) -> set[str]:
        """The jobs of `waiting` not yet showing their running pod (gone ones count as stale)."""
        from ce_k8s.sim.condor.schedd import eval_int, eval_str

        out = set()
        for job in waiting:
            ad = self.bed.schedd.get(job)
            if ad is None or eval_int(ad, "JobStatus") != 2 or eval_str(ad, "K8sPodPhase") != "Running":
                out.add(job)
        return out


def run(jobs: int, stale_fraction: float, max_running_hooks: int) -> dict[str, float]:
    with Herd(jobs, stale_fraction, max_running_hooks) as herd:
        bed = herd.bed
        gc.freeze()               # the emulator's store and the queue: long-lived, out of the GC's walk
        calls0 = bed.server.calls
        right, present = herd.true_status()
        if present != jobs or right != jobs - len(herd.stale):
            raise BenchError(f"herd: before the restart {right} of {present} routed jobs are true, "
                             f"{jobs - len(herd.stale)} expected")
        progress("herd bench: restarting the router and the agent at the same moment")
        t0 = time.monotonic()
        bed.router = bed.router.restart()
        bed.start_agent()
        spawner = bed.router.runner.pid
        cpu0 = (proc_children_cpu_s(spawner), proc_cpu_s(bed.agent.pid))
        waiting = set(herd.stale)
        # The router polls every 60 s of real time, as the shipped JOB_ROUTER_POLLING_PERIOD: a
        # job whose hook got "no sync" is asked again at the next poll, behind whatever of the
        # first poll's hooks is still queued; a job with a hook outstanding is not asked twice.
        next_poll, polls, first_poll_s, last_check = t0, 0, None, 0.0
        recovered_s = None
        while True:
            now = time.monotonic()
            if now >= next_poll:
                bed.router.poll()
                polls += 1
                next_poll += POLL_S
            bed.router.process_events(max(0.05, min(1.0, next_poll - time.monotonic())))
            now = time.monotonic()
            if first_poll_s is None and polls == 1 and not bed.router.runner.inflight:
                first_poll_s = now - t0
            if now - last_check >= 2.0 or not bed.router.runner.inflight:
                last_check = now
                waiting = herd.still_stale(waiting)
                if not waiting:
                    recovered_s = now - t0
                    hooks_cpu = proc_children_cpu_s(spawner) - cpu0[0]
                    agent_cpu = proc_cpu_s(bed.agent.pid) - cpu0[1]
                    break
                progress(f"herd bench: {now - t0:.0f} s, poll {polls}: {len(waiting)} routed jobs still stale, "
                         f"{bed.router.events.get('update_failed', 0)} hooks got no sync, "
                         f"{bed.router.runner.inflight} hooks running or queued")
            if now - t0 > 4 * POLL_S:
                raise BenchError(f"herd: routed jobs still not true after {now - t0:.0f} s")
        no_sync = bed.router.events.get("update_failed", 0)
        rss_peak = proc_rss_mb(bed.agent.pid, "VmHWM")
        calls = bed.server.calls
        created = calls[("create", "pods")] - calls0[("create", "pods")]
        deleted = calls[("delete", "pods")] - calls0[("delete", "pods")]
        right, present = herd.true_status()
        lost = jobs - present
        if right != present:
            raise BenchError(f"herd: {present - right} routed jobs went wrong while the stale ones recovered")
        hook_runs = sum(bed.router.hook_counts.values())
        pods_now = bed.server.call(lambda: bed.server.store.count("pods"))
        progress(f"herd bench: every routed job true after {recovered_s:.1f} s ({recovered_s / POLL_S:.2f} polls, "
                 f"{polls} poll(s) started); {no_sync} update hooks got no sync")
    result = {
        "herd_jobs": jobs, "herd_stale_jobs": len(herd.stale),
        "herd_first_poll_s": round(first_poll_s if first_poll_s is not None else recovered_s, 1),
        "herd_polls_started": polls, "herd_no_sync": no_sync, "herd_recover_s": round(recovered_s, 1),
        "herd_recover_polls": round(recovered_s / POLL_S, 2), "herd_agent_rss_peak_mb": round(rss_peak, 1),
        "herd_pods_created": created, "herd_pods_deleted": deleted, "herd_jobs_lost": lost,
        "herd_pods_in_cluster": pods_now, "herd_hooks_run": hook_runs,
        # What the recovery would take if the router and the spawner were free (a real router is
        # C++; the emulator is Python on the same two cores): the CPU of the hooks and the agent
        # spread over the cores, in polling periods.
        "herd_cek8s_cpu_s": round(hooks_cpu + agent_cpu, 1),
        "herd_cek8s_recover_polls": round((hooks_cpu + agent_cpu) / cores() / POLL_S, 2),
    }
    if created or deleted or lost or pods_now != jobs + len(herd.templates):
        raise BenchError(f"herd: something was lost or duplicated: {result}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=None, help="routed pilots (default 20,000 x scale)")
    ap.add_argument("--stale-fraction", type=float, default=0.2,
                    help="routed jobs whose pod started while the CE was down (default 0.2)")
    ap.add_argument("--max-running-hooks", type=int, default=64, help="hook processes at once (default 64)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    exit_on_sigterm()
    result = run(a.jobs or scaled(20_000, 20), a.stale_fraction, a.max_running_hooks)
    print(json.dumps(result, sort_keys=True) if a.json else "\n".join(f"{k:32} {v}" for k, v in sorted(result.items())))
    return 0


if __name__ == "__main__":
    exit_now(main())
