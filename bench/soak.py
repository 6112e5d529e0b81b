"""Load and faults: N pilots through the emulated path while everything around the agent misbehaves.

    python bench/soak.py --pilots 10000 --json > soak.json      # progress on stderr
    python bench/soak.py --pilots 500                          # the estimate run

Issue 9, "Load and faults". The path is `ce_k8s.sim.testbed.TestBed` (the engine of
`ce-k8s demo`): the router emulator spawning the real hook launchers, the real `ce-k8s agent`
process, the API emulator with its kubelet simulator, and a GlideinWMS-like factory. On top of it
this script adds what a bad day looks like, all seeded so a run can be repeated:

* **API faults**: 429 (with Retry-After), 500, writes that are applied and then never answered
  (the connection is closed at once, or it hangs for `--hang-seconds` first: a stall), added
  latency with jitter, and watch streams cut at random and after `--watch-cut-after` seconds.
* **Agent SIGKILLs** at random moments (uniform between `--kill-min` and `--kill-max` seconds),
  each followed by a fresh agent that must rebuild everything from a relist. Kills stop once
  `--kill-until` of the pilots have finished, so the last part of the run has one agent living
  long enough to show whether its memory grows with the pilots it has handled.
* **Disruptions**: a fraction of pilots has its first pod evicted through the API, and every
  `--node-loss-every` seconds a CPU node stops reporting (its pods freeze, then fail `NodeLost`
  after their unreachable toleration) and comes back later.
* **Paced submission**: the factory submits cluster-sized bursts (one cluster per entry, as
  GlideinWMS does) while fewer than `--max-in-flight` pilots are unfinished, because the router's
  process-per-hook design costs ~10 ms of CPU per hook call and the machine has two cores.

What is counted, and where from (never from the agent's own word):

* `duplicate_attempts`: more than one pod created for the same (job, attempt), from a listener
  inside the API emulator's store (every ADDED event, which fault injection cannot hide);
  `overlapping_live_pods`: a pod live next to another live pod of the same job (TestBed's tracker).
* `pods_left` / `secrets_left`: pods and Secrets in the store at the end that were not there
  before the run, whatever their labels.
* `lost`: pilots neither completed nor held (still queued at the end, or gone from the queue
  without completing); `held_by_code`: holds by their docs/holds.md code; `undocumented_holds`:
  holds whose (HoldReasonCode, HoldReasonSubCode) is not in `ce_k8s.holds.HOLDS`.
* `agent_rss`: VmRSS of the agent process sampled every `--rss-every` seconds, with the number of
  pilots in flight and finished at that moment; the trend is fitted per agent lifetime.

Exit status 0 when every invariant holds, 1 otherwise, 2 on a set-up error.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger("bench.soak")

LABEL_PREFIX = "ce-k8s.htcondor.org/"
MANAGED_BY = "app.kubernetes.io/managed-by"
GJID_ANNOTATION = LABEL_PREFIX + "global-job-id"
ATTEMPT_LABEL = LABEL_PREFIX + "attempt"
UNREACHABLE_TOLERATION_S = 300.0          # the API server's default for the unreachable taint


class SoakError(RuntimeError):
    """The soak could not run (bad option, set-up failure); distinct from a failed invariant."""


@dataclass
class SoakConfig:
    """Everything a soak run depends on; the JSON report repeats it so a figure carries its settings."""

    pilots: int = 500
    seed: int = 1
    # pacing: the factory submits clusters of `burst` pilots while fewer than `max_in_flight` are unfinished
    burst: int = 50
    max_in_flight: int = 300
    # API faults (probabilities per request; timeouts only on writes)
    rate_429: float = 0.02
    rate_500: float = 0.02
    rate_timeout: float = 0.02
    hang_share: float = 0.5                 # share of time the lost answers hang before the abort (stalls)
    hang_seconds: float = 3.0
    latency: float = 0.002
    jitter: float = 0.01
    watch_cut_rate: float = 0.01            # per watch event sent
    watch_cut_after: float | None = 30.0    # every watch is cut after this many seconds
    # agent kills
    kill_min: float = 5.0
    kill_max: float = 40.0
    kill_until: float = 0.6                 # stop killing once this fraction of pilots has finished
    # disruptions
    evict_fraction: float = 0.05
    evict_run_real_s: float = 30.0          # pilots to be evicted run this long (real s), so they get evicted
    node_loss_every: float = 60.0           # 0 = never
    fail_fraction: float = 0.05
    # pace of the emulated world
    run_s: float = 10.0                     # simulated pilot run time
    time_scale: float = 0.05                # real seconds per simulated second
    poll: float = 1.0                       # router polling period, real seconds
    max_running_hooks: int = 24
    qps: float = 100.0                      # CE_K8S_QPS for the agent (the shipped 20 caps ~4 pilots/s)
    qps_burst: int = 200
    # bounds and reporting
    timeout: float = 3600.0
    stall_timeout: float = 300.0            # all submitted and none finished for this long: stop, report
    drain_timeout: float = 120.0
    rss_every: float = 2.0
    rss_limit_mb: float = 400.0
    progress_every: float = 10.0
    agent_log: bool = False                 # let the agent's stderr through (debugging)

    def validate(self) -> None:
        """Refuse settings that would make the run meaningless, with the option's name."""
        checks: list[tuple[bool, str]] = [
            (self.pilots >= 1, "--pilots must be at least 1"),
            (self.burst >= 1, "--burst must be at least 1"),
            (self.max_in_flight >= self.burst, "--max-in-flight must be at least --burst"),
            (0 < self.kill_min <= self.kill_max, "--kill-min must be > 0 and <= --kill-max"),
            (0.0 <= self.kill_until <= 1.0, "--kill-until must be in [0, 1]"),
            (self.poll > 0 and self.time_scale > 0, "--poll and --time-scale must be > 0"),
            (self.node_loss_every >= 0, "--node-loss-every must be >= 0"),
        ]
        for rate, name in ((self.rate_429, "429"), (self.rate_500, "500"), (self.rate_timeout, "timeout"),
                           (self.hang_share, "hang-share"), (self.watch_cut_rate, "watch-cut"),
                           (self.evict_fraction, "evict-fraction"), (self.fail_fraction, "fail-fraction")):
            checks.append((0.0 <= rate <= 1.0, f"--{name} rate must be in [0, 1]"))
        checks.append((self.rate_429 + self.rate_500 + self.rate_timeout < 1.0,
                       "--429 + --500 + --timeout-rate must sum below 1"))
        for ok, message in checks:
            if not ok:
                raise SoakError(message)


# --------------------------------------------------------------------------------------- evidence
class AttemptLedger:
    """Every pod and Secret the API emulator's store created, keyed by (job, attempt).

    Runs as a store listener on the server's loop thread (`store.add_listener`), so it sees each
    write exactly once whatever happened to the HTTP answer: an applied-then-lost create still
    counts. That is why duplicates are judged here and not from the agent's metrics. It also keeps
    a short history per attempt (creation, phase changes, disruption, deletion) so a duplicate
    comes with its own evidence.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.t0 = clock()
        self.pods_by_attempt: dict[tuple[str, str], list[str]] = defaultdict(list)   # -> pod uids
        self.history: dict[tuple[str, str], list[tuple[object, ...]]] = defaultdict(list)
        self._last_phase: dict[str, str] = {}
        self.pods_created = 0
        self.secrets_created = 0
        self.unlabelled_pods = 0

    def __call__(self, resource: str, ev: Any) -> None:
        if resource == "secrets":
            self.secrets_created += ev.type == "ADDED"
            return
        if resource != "pods":
            return
        meta = ev.obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(MANAGED_BY) != "ce-k8s":
            self.unlabelled_pods += ev.type == "ADDED"
            return
        gjid = (meta.get("annotations") or {}).get(GJID_ANNOTATION) or labels.get(LABEL_PREFIX + "job", "?")
        key = (gjid, labels.get(ATTEMPT_LABEL, "?"))
        uid = str(meta.get("uid"))
        status = ev.obj.get("status") or {}
        phase = str(status.get("phase"))
        if ev.type == "ADDED":
            self.pods_created += 1
            self.pods_by_attempt[key].append(uid)
        elif ev.type == "MODIFIED" and self._last_phase.get(uid) == phase:
            return                                  # only creations, phase changes and deletions are kept
        if ev.type == "DELETED":
            self._last_phase.pop(uid, None)
        else:
            self._last_phase[uid] = phase
        disruption = next((c.get("reason") for c in status.get("conditions") or []
                           if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None)
        self.history[key].append((round(self.clock() - self.t0, 2), ev.type, str(meta.get("name")), uid[:8], phase,
                                  status.get("reason"), disruption, (ev.obj.get("spec") or {}).get("nodeName")))

    def duplicates(self) -> dict[str, list[str]]:
        """(job, attempt) → pod uids, for every attempt that got more than one pod."""
        return {f"{job}#attempt{attempt}": list(uids)
                for (job, attempt), uids in list(self.pods_by_attempt.items()) if len(uids) > 1}

    def duplicate_keys(self) -> list[tuple[str, str]]:
        return [key for key, uids in list(self.pods_by_attempt.items()) if len(uids) > 1]

    def classify(self, key: tuple[str, str], kills: Sequence[float]) -> str:
        """`recreated-after-vanish`: every later pod of the attempt was created after all earlier
        ones were DELETED, with an agent SIGKILL between the two creations (docs/reliability.md,
        finding F1); `overlapping`: a pod was created while an earlier one of the same attempt
        still existed; `other`: recreated after a deletion without a kill in between."""
        live: set[str] = set()
        last_added: float | None = None
        verdict = "recreated-after-vanish"
        for t, event, _name, uid, *_rest in self.history.get(key, []):
            if event == "ADDED":
                if live:
                    return "overlapping"
                if last_added is not None and not any(last_added - 2.0 <= k <= float(t) for k in kills):
                    verdict = "other"
                last_added = float(t)
                live.add(str(uid))
            elif event == "DELETED":
                live.discard(str(uid))
        return verdict

    @property
    def attempts(self) -> int:
        return len(self.pods_by_attempt)


@dataclass
class RssSample:
    t: float
    rss_mb: float
    in_flight: int
    finished: int
    generation: int


def read_rss_mb(pid: int) -> float | None:
    """VmRSS of a live process in MiB, or None if it is gone (killed between two samples)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope and Pearson r of ys on xs; (0, 0) when xs do not vary."""
    n = len(xs)
    if n < 2:
        return 0.0, 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    if sxx == 0:
        return 0.0, 0.0
    r = sxy / math.sqrt(sxx * syy) if syy else 0.0
    return sxy / sxx, r


def memory_report(samples: list[RssSample], keep: int = 120) -> dict[str, object]:
    """Max RSS, RSS against pilots in flight, and per agent lifetime RSS against pilots finished.

    Why per lifetime: every SIGKILL resets the agent's memory, so a leak only shows as growth
    within one process's life; the longest life (the kill-free tail of the run) is the real test.
    """
    if not samples:
        return {"samples": 0}
    slope_flight, r_flight = fit([s.in_flight for s in samples], [s.rss_mb for s in samples])
    lives: dict[int, list[RssSample]] = defaultdict(list)
    for s in samples:
        lives[s.generation].append(s)
    per_life = []
    for gen, ss in sorted(lives.items()):
        slope, r = fit([s.finished for s in ss], [s.rss_mb for s in ss])
        per_life.append({"generation": gen, "seconds": round(ss[-1].t - ss[0].t, 1), "samples": len(ss),
                         "pilots_finished": ss[-1].finished - ss[0].finished,
                         "rss_first_mb": round(ss[0].rss_mb, 1), "rss_max_mb": round(max(s.rss_mb for s in ss), 1),
                         "rss_last_mb": round(ss[-1].rss_mb, 1),
                         "mb_per_1000_pilots": round(slope * 1000, 2), "r": round(r, 3)})
    longest = max(per_life, key=lambda life: life["pilots_finished"])
    step = max(1, math.ceil(len(samples) / keep))
    return {
        "samples": len(samples),
        "rss_max_mb": round(max(s.rss_mb for s in samples), 1),
        "rss_median_mb": round(sorted(s.rss_mb for s in samples)[len(samples) // 2], 1),
        "mb_per_100_in_flight": round(slope_flight * 100, 2),
        "r_in_flight": round(r_flight, 3),
        "longest_life": longest,
        "lives": per_life,
        "series": [[round(s.t, 1), round(s.rss_mb, 1), s.in_flight, s.finished, s.generation]
                   for s in samples[::step]],
        "series_columns": ["t_s", "rss_mb", "in_flight", "finished", "agent_generation"],
    }


# --------------------------------------------------------------------------------------- the run
def _testbed_class() -> type:
    """TestBed plus cluster-sized submission (imported lazily: the sim pulls in aiohttp, kubernetes)."""
    from ce_k8s.sim.pilots import spool_sandbox
    from ce_k8s.sim.testbed import Outcome, TestBed

    class SoakBed(TestBed):
        """A TestBed whose factory submits one cluster per pilot owner (GlideinWMS submits per entry).

        (Its evictions used to be its own too, keyed on the pod's phase rather than on the source
        job's RUNNING, which under load came after short pods had finished; TestBed does that now.)
        """

        def submit_burst(self, pilots: list[Any]) -> list[str]:
            by_owner: dict[str, list[Any]] = defaultdict(list)
            for pilot in pilots:
                by_owner[pilot.owner].append(pilot)
            ids: list[str] = []
            for owner, group in by_owner.items():
                jobs = self.schedd.submit_cluster([p.ad for p in group], owner=owner)
                for job, pilot in zip(jobs, group, strict=True):
                    self.schedd.set_attributes(job, spool_sandbox(self.spool, job), as_user=False)
                    self.outcomes[job] = Outcome(pilot, job)
                ids.extend(jobs)
            return ids

    return SoakBed


class Soak:
    """One soak run: build the test bed, drive it, and report. `run()` returns the report dict."""

    def __init__(self, cfg: SoakConfig, progress: TextIO | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.progress = progress
        self.rng = random.Random(cfg.seed * 7919 + 1)  # reproducible schedule, not security
        self.ledger = AttemptLedger()
        self.samples: list[RssSample] = []
        self.kills: list[float] = []
        self.node_losses: list[dict[str, object]] = []
        self.bed: Any = None
        self.t0 = 0.0
        self._baseline: dict[str, set[tuple[str, str]]] = {}
        self._lost_node: tuple[str, float] | None = None
        self.interrupted = False

    # -- set-up ---------------------------------------------------------------------------------
    def _extra_config(self) -> str:
        return (f"# bench/soak.py: the agent's API budget (the shipped 20 QPS caps a CE near 4 pilots/s)\n"
                f"CE_K8S_QPS = {self.cfg.qps:g}\nCE_K8S_BURST = {self.cfg.qps_burst}\n")

    def start(self) -> None:
        cfg = self.cfg
        bed_cls = _testbed_class()
        self.bed = bed_cls(fault_rate=0.0, watch_cut_rate=0.0, time_scale=cfg.time_scale, seed=cfg.seed,
                           max_running_hooks=cfg.max_running_hooks, extra_config=self._extra_config(),
                           agent_log=cfg.agent_log)
        self.bed.start()
        srv = self.bed.server
        srv.call(srv.store.add_listener, self.ledger)
        self._baseline = {res: self._keys(res) for res in ("pods", "secrets")}
        # Faults start only now: set-up (namespaces, priority classes) is not what is measured.
        srv.faults.configure(rate_429=cfg.rate_429, rate_500=cfg.rate_500, rate_timeout=cfg.rate_timeout,
                             latency=cfg.latency, jitter=cfg.jitter, cut_rate=cfg.watch_cut_rate,
                             cut_after=cfg.watch_cut_after, hang_seconds=cfg.hang_seconds, seed=cfg.seed)
        self.t0 = self.ledger.t0 = time.monotonic()

    def _keys(self, resource: str) -> set[tuple[str, str]]:
        """(namespace, name) of every object of `resource` in the store, whatever its labels."""
        def keys() -> set[tuple[str, str]]:
            return {(str(o.get("metadata", {}).get("namespace")), str(o.get("metadata", {}).get("name")))
                    for o in self.bed.server.store.peek_list(resource)}
        return set(self.bed.server.call(keys))

    def close(self) -> None:
        if self.bed is not None:
            self.bed.close()

    # -- the schedule ---------------------------------------------------------------------------
    def _finished(self) -> int:
        return sum(1 for o in self.bed.outcomes.values() if o.status != "queued")

    def _busiest_cpu_node(self) -> tuple[str, int]:
        """The CPU node with the most live pods (ties broken at random) and that count: losing an
        empty node would test nothing."""
        def counts() -> dict[str, int]:
            live: Counter[str] = Counter({str(n["metadata"]["name"]): 0
                                          for n in self.bed.server.store.peek_list("nodes")
                                          if str(n["metadata"]["name"]).startswith("cpu-")})
            for p in self.bed.server.store.peek_list("pods"):
                node = (p.get("spec") or {}).get("nodeName")
                if node in live and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    live[node] += 1
            return dict(live)
        live = self.bed.server.call(counts)
        top = max(live.values())
        node = self.rng.choice(sorted(n for n, c in live.items() if c == top))
        return node, top

    def _node_turn(self, now: float, next_loss: float) -> float:
        """Lose the busiest CPU node, one at a time; bring it back after 0.5-2 × the pods' unreachable toleration
        (so some of its pods resume and some fail NodeLost)."""
        cfg = self.cfg
        kubelet = self.bed.server.kubelet
        if self._lost_node is not None and now >= self._lost_node[1]:
            kubelet.restore_node(self._lost_node[0])
            self._lost_node = None
        if not cfg.node_loss_every or self._lost_node is not None or now < next_loss:
            return next_loss
        node, pods = self._busiest_cpu_node()
        if not pods:
            # no pod runs on any CPU node right now (the pipeline is between waves, or slowed by
            # faults): a loss would test nothing, so try again shortly
            return now + 0.25
        toleration_real = UNREACHABLE_TOLERATION_S * cfg.time_scale
        down_for = self.rng.uniform(0.5, 2.0) * toleration_real
        kubelet.lose_node(node)
        self._lost_node = (node, now + down_for)
        self.node_losses.append({"node": node, "at_s": round(now - self.t0, 1), "down_s": round(down_for, 1),
                                 "live_pods": pods})
        log.info("node %s lost for %.1f s with %d live pods", node, down_for, pods)
        return now + self.rng.uniform(0.5, 1.5) * cfg.node_loss_every

    def _sample(self, now: float) -> None:
        agent = self.bed.agent
        if agent is None:
            return
        rss = read_rss_mb(agent.pid)
        if rss is None:
            return
        finished = self._finished()
        self.samples.append(RssSample(now - self.t0, rss, len(self.bed.outcomes) - finished, finished,
                                      self.bed.agent_restarts))

    def _show(self, now: float) -> None:
        if self.progress is None:
            return
        states = Counter(o.status for o in self.bed.outcomes.values())
        rss = self.samples[-1].rss_mb if self.samples else 0.0
        faults = self.bed.server.faults.injected
        self.progress.write(
            f"[soak {now - self.t0:7.1f}s] submitted {len(self.bed.outcomes)}/{self.cfg.pilots}  "
            f"in flight {states['queued']}  completed {states['completed']}  held {states['held']}  "
            f"lost {states['lost']}  pods {self.ledger.pods_created}  dup {len(self.ledger.duplicates())}  "
            f"kills {len(self.kills)}  nodes lost {len(self.node_losses)}  agent {rss:.0f} MB  "
            f"faults {sum(faults.values())}\n")
        self.progress.flush()

    def drive(self) -> bool:
        """Submit, tick, disrupt and sample until every pilot finished or the timeout; True if all did."""
        cfg, bed = self.cfg, self.bed
        pilots = bed.make_pilots(cfg.pilots, evict_fraction=cfg.evict_fraction, run_s=cfg.run_s,
                                 fail_fraction=cfg.fail_fraction)
        long_run = f"run={self.cfg.evict_run_real_s / cfg.time_scale:g}s"
        for pilot in pilots:
            if pilot.evicted:                       # its pod must still run when the eviction comes
                pilot.ad["DemoScenario"] = re.sub(r"^run=\S+", long_run, str(pilot.ad["DemoScenario"]))
        pilots.reverse()                           # pop() from the end keeps submission order
        deadline = self.t0 + cfg.timeout
        next_kill = self.t0 + self.rng.uniform(cfg.kill_min, cfg.kill_max)
        next_loss = self.t0 + self.rng.uniform(0.5, 1.5) * cfg.node_loss_every
        next_sample = next_show = self.t0
        last_finished, last_progress = -1, self.t0
        while True:
            now = time.monotonic()
            finished = self._finished()
            in_flight = len(bed.outcomes) - finished
            if not pilots and in_flight == 0:
                return True
            if now >= deadline or self.interrupted:
                return False
            if finished != last_finished:
                last_finished, last_progress = finished, now
            elif not pilots and now - last_progress >= cfg.stall_timeout:
                # Every pilot is submitted and none has finished for a long while: the rest are stuck
                # (reported as lost, with their evidence), not slow.
                log.warning("no pilot finished for %.0f s; %d stuck", now - last_progress, in_flight)
                return False
            while pilots and in_flight + cfg.burst <= cfg.max_in_flight:
                burst = [pilots.pop() for _ in range(min(cfg.burst, len(pilots)))]
                bed.submit_burst(burst)
                in_flight += len(burst)
            # A stall is an applied write whose answer hangs before the connection drops.
            bed.server.faults.configure(timeout_mode="hang" if self.rng.random() < cfg.hang_share else "close")
            bed.tick(cfg.poll)
            now = time.monotonic()
            if now >= next_kill and finished < cfg.kill_until * cfg.pilots:
                self._sample(now)
                bed.kill_agent_and_restart()
                self.kills.append(round(now - self.t0, 1))
                next_kill = time.monotonic() + self.rng.uniform(cfg.kill_min, cfg.kill_max)
            next_loss = self._node_turn(now, next_loss)
            if now >= next_sample:
                self._sample(now)
                next_sample = now + cfg.rss_every
            if now >= next_show:
                self._show(now)
                next_show = now + cfg.progress_every

    def finish(self) -> None:
        """Bring back a lost node and let cleanups and the agent's GC finish (faults stay on)."""
        if self._lost_node is not None:
            self.bed.server.kubelet.restore_node(self._lost_node[0])
            self._lost_node = None
        self.bed.drain(timeout=self.cfg.drain_timeout, poll_interval=min(self.cfg.poll, 0.5))
        self._sample(time.monotonic())

    # -- the report -----------------------------------------------------------------------------
    def explain_duplicate(self, key: tuple[str, str]) -> dict[str, object]:
        """Evidence for one duplicated attempt (see `explain_job`)."""
        gjid, attempt = key
        job = gjid.split("#")[1] if gjid.count("#") >= 2 else ""
        detail = self.explain_job(job, gjid)
        detail["duplicated_attempt"] = attempt
        return detail

    def explain_job(self, job: str, gjid: str | None = None) -> dict[str, object]:
        """The pod history of every attempt of one pilot (from the store listener), the agent kills,
        the node losses, the hold if any, and where the pilot stands."""
        if gjid is None:
            gjid = next((j for (j, _a) in list(self.ledger.history) if j.split("#")[1:2] == [job]), "")
        events = {f"attempt{a}": list(h) for (j, a), h in list(self.ledger.history.items()) if j == gjid}
        detail: dict[str, object] = {"job": job, "global_job_id": gjid, "hold": self.bed.holds.get(job),
                                     "history_columns": ["t_s", "event", "pod", "uid", "phase", "reason",
                                                         "disruption", "node"],
                                     "history": events, "agent_kills_s": self.kills,
                                     "node_losses": self.node_losses}
        if job in self.bed.outcomes:
            detail["pilot"] = self.explain(job)
        return detail

    def explain(self, job: str) -> dict[str, object]:
        """Where an unfinished pilot is stuck: source and routed job, router state, its pods in the API.

        Why: a lost pilot is a finding for someone else's code, and the report must carry the
        evidence (docs/reliability.md, "Findings of the first run"), not just a count.
        """
        from ce_k8s.sim.condor.schedd import eval_int, eval_str

        bed = self.bed
        out = bed.outcomes[job]
        info: dict[str, object] = {"job": job, "status": out.status, "shape": out.pilot.shape,
                                   "marked_for_eviction": out.pilot.evicted, "evicted_through_api": job in bed.evicted}
        src = bed.schedd.get(job)
        info["source_JobStatus"] = eval_int(src, "JobStatus") if src is not None else None
        rj = bed.router.jobs.get(job) if bed.router is not None else None
        gjid = None
        if rj is not None:
            info["router_state"] = getattr(rj.state, "value", str(rj.state))
            info["routed_job"] = rj.dest_key
            dest = bed.schedd.get(rj.dest_key) if rj.dest_key else None
            if dest is not None:
                for attr in ("JobStatus", "GridJobStatus", "K8sPodName", "K8sAttempt", "K8sPodPhase", "K8sPodReason",
                             "HoldReason"):
                    value = eval_int(dest, attr) if attr in ("JobStatus", "K8sAttempt") else eval_str(dest, attr)
                    if value is not None:
                        info[attr] = value
                gjid = eval_str(dest, "K8sSourceGlobalJobId")

        def pods() -> list[dict[str, object]]:
            found = []
            for pod in self.bed.server.store.peek_list("pods"):
                meta = pod.get("metadata") or {}
                if gjid is None or (meta.get("annotations") or {}).get(GJID_ANNOTATION) != gjid:
                    continue
                status = pod.get("status") or {}
                found.append({"name": meta.get("name"), "phase": status.get("phase"), "reason": status.get("reason"),
                              "node": (pod.get("spec") or {}).get("nodeName"),
                              "deleting": bool(meta.get("deletionTimestamp")),
                              "conditions": [c.get("type") for c in status.get("conditions") or []
                                             if c.get("status") == "True"]})
            return found
        info["pods"] = self.bed.server.call(pods)
        info["attempts_created"] = sorted(a for (j, a) in self.ledger.pods_by_attempt if j == gjid)
        return info

    def report(self, all_finished: bool, wall_s: float) -> dict[str, object]:
        from ce_k8s.holds import HOLDS

        bed = self.bed
        documented = {(h.code, h.subcode): name for name, h in HOLDS.items()}
        held_by_code: Counter[str] = Counter()
        undocumented: list[dict[str, object]] = []
        for job, (code, subcode, reason) in sorted(bed.holds.items()):
            name = documented.get((code, subcode))
            if name is None or not (reason or "").startswith("ce-k8s: "):
                undocumented.append({"job": job, "code": code, "subcode": subcode, "reason": reason})
                held_by_code[f"undocumented {code}/{subcode}"] += 1
            else:
                held_by_code[name] += 1
        states = Counter(o.status for o in bed.outcomes.values())
        lost_jobs = sorted(j for j, o in bed.outcomes.items() if o.status in ("lost", "queued"))
        pods_left = sorted(f"{ns}/{n}" for ns, n in self._keys("pods") - self._baseline.get("pods", set()))
        secrets_left = sorted(f"{ns}/{n}" for ns, n in self._keys("secrets") - self._baseline.get("secrets", set()))
        duplicates = self.ledger.duplicates()
        summary = bed.summary()
        memory = memory_report(self.samples)
        rss_max = float(memory.get("rss_max_mb", 0.0))  # type: ignore[arg-type]
        report: dict[str, object] = {
            "config": asdict(self.cfg),
            "pilots": len(bed.outcomes),
            "all_finished_in_time": all_finished,
            "interrupted": self.interrupted,
            "wall_s": round(wall_s, 1),
            "pilots_per_s": round(len(bed.outcomes) / wall_s, 2) if wall_s else 0.0,
            "completed": states["completed"],
            "exit_nonzero": summary["exit_nonzero"],
            "held": states["held"],
            "held_by_code": dict(held_by_code),
            "undocumented_holds": undocumented,
            "held_details": [self.explain_job(job) for job in sorted(bed.holds)[:20]],
            "lost": len(lost_jobs),
            "lost_jobs": lost_jobs[:50],
            "lost_details": [self.explain_job(job) for job in lost_jobs[:20]],
            "pods_created": self.ledger.pods_created,
            "attempts": self.ledger.attempts,
            "secrets_created": self.ledger.secrets_created,
            "pod_create_requests": int(bed.server.calls.get(("create", "pods"), 0)),
            "duplicate_attempts": len(duplicates),
            "duplicate_classes": dict(Counter(self.ledger.classify(key, self.kills)
                                              for key in self.ledger.duplicate_keys())),
            "duplicate_examples": dict(list(duplicates.items())[:10]),
            "duplicate_details": [self.explain_duplicate(key) for key in self.ledger.duplicate_keys()[:10]],
            "overlapping_live_pods": bed.tracker.overlapping,
            "pods_left": len(pods_left),
            "secrets_left": len(secrets_left),
            "leaked_examples": (pods_left + secrets_left)[:20],
            "evicted_through_api": len(bed.evicted),
            "node_losses": self.node_losses,
            "agent_kills": len(self.kills),
            "agent_kill_times_s": self.kills,
            "agent_rss": memory,
            "faults_injected": dict(bed.server.faults.injected),
            "api_calls_by_resource": summary["api_calls_by_resource"],
            "hook_calls": summary["hook_calls"],
            "router_events": summary["router_events"],
            "routed_jobs_left": summary["routed_jobs_left"],
        }
        invariants = {
            "no_lost_pilot": not lost_jobs,
            "every_pilot_completed_or_held":
                states["completed"] + states["held"] == len(bed.outcomes) == self.cfg.pilots,
            "holds_documented": not undocumented,
            "no_duplicate_pod": not duplicates,
            "no_leaked_pod": not pods_left,
            "no_leaked_secret": not secrets_left,
            "agent_rss_bounded": 0 < rss_max <= self.cfg.rss_limit_mb,
        }
        report["invariants"] = invariants
        report["ok"] = all(invariants.values())
        return report

    def interrupt(self) -> None:
        """Stop driving at the next tick and report what happened so far (SIGTERM/SIGINT)."""
        self.interrupted = True

    def run(self) -> dict[str, object]:
        """Start, drive, drain, report; the test bed is always closed."""
        try:
            self.start()
            all_finished = self.drive()
            if self.interrupted:
                self.cfg.drain_timeout = min(self.cfg.drain_timeout, 10.0)
            self.finish()
            return self.report(all_finished, time.monotonic() - self.t0)
        finally:
            self.close()


# --------------------------------------------------------------------------------------- command line
_OPTIONS: tuple[tuple[str, str, Callable[[str], Any], str], ...] = (
    ("--pilots", "pilots", int, "pilots to run (10,000 for the recorded run)"),
    ("--seed", "seed", int, "seed of the pilot mix, faults, kills and node losses"),
    ("--burst", "burst", int, "pilots per factory submission (one cluster per owner)"),
    ("--max-in-flight", "max_in_flight", int, "submit only while fewer pilots than this are unfinished"),
    ("--429", "rate_429", float, "share of API requests answered 429 Too Many Requests"),
    ("--500", "rate_500", float, "share of API requests answered 500"),
    ("--timeout-rate", "rate_timeout", float, "share of writes applied and then never answered"),
    ("--hang-share", "hang_share", float, "share of polls during which lost answers hang first (stalls)"),
    ("--hang-seconds", "hang_seconds", float, "how long a stalled answer hangs before the connection drops"),
    ("--latency", "latency", float, "seconds added to every API request"),
    ("--jitter", "jitter", float, "plus uniform(0, jitter) seconds"),
    ("--watch-cut", "watch_cut_rate", float, "probability of cutting a watch after each event"),
    ("--watch-cut-after", "watch_cut_after", float, "cut every watch after this many seconds"),
    ("--kill-min", "kill_min", float, "shortest time between agent SIGKILLs (s)"),
    ("--kill-max", "kill_max", float, "longest time between agent SIGKILLs (s)"),
    ("--kill-until", "kill_until", float, "stop the kills once this fraction of pilots has finished"),
    ("--evict-fraction", "evict_fraction", float, "fraction of pilots whose first pod is evicted"),
    ("--evict-run", "evict_run_real_s", float, "real seconds the pods of to-be-evicted pilots run"),
    ("--node-loss-every", "node_loss_every", float, "seconds between node losses (0 = none)"),
    ("--fail-fraction", "fail_fraction", float, "fraction of pilots that exit 1"),
    ("--run-seconds", "run_s", float, "simulated pilot run time"),
    ("--time-scale", "time_scale", float, "real seconds per simulated second in the kubelet"),
    ("--poll", "poll", float, "router polling period, real seconds"),
    ("--max-running-hooks", "max_running_hooks", int, "cap on live hook processes in the router emulator"),
    ("--qps", "qps", float, "CE_K8S_QPS given to the agent"),
    ("--qps-burst", "qps_burst", int, "CE_K8S_BURST given to the agent"),
    ("--timeout", "timeout", float, "give up after this many seconds"),
    ("--stall-timeout", "stall_timeout", float, "stop when all are submitted and none finished for this long"),
    ("--drain-timeout", "drain_timeout", float, "seconds allowed for cleanups after the last pilot"),
    ("--rss-every", "rss_every", float, "seconds between agent VmRSS samples"),
    ("--rss-limit-mb", "rss_limit_mb", float, "the agent's RSS bound asserted by the run"),
    ("--progress-every", "progress_every", float, "seconds between progress lines on stderr"),
)


def parse_args(argv: Sequence[str] | None = None) -> tuple[SoakConfig, argparse.Namespace]:
    defaults = SoakConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for flag, dest, kind, text in _OPTIONS:
        parser.add_argument(flag, dest=dest, type=kind, default=getattr(defaults, dest), help=text)
    parser.add_argument("--json", action="store_true", help="print the whole report as one JSON object")
    parser.add_argument("--verbose", action="store_true", help="log the harness's own events on stderr")
    parser.add_argument("--agent-log", action="store_true", help="let the agent's own stderr through")
    args = parser.parse_args(argv)
    cfg = SoakConfig(**{dest: getattr(args, dest) for _, dest, _, _ in _OPTIONS}, agent_log=args.agent_log)
    if cfg.watch_cut_after is not None and cfg.watch_cut_after <= 0:
        cfg.watch_cut_after = None
    return cfg, args


def _text(report: dict[str, Any]) -> str:
    mem = report["agent_rss"]
    lines = [
        f"{report['pilots']} pilots in {report['wall_s']} s ({report['pilots_per_s']}/s): "
        f"{report['completed']} completed ({report['exit_nonzero']} exit != 0), {report['held']} held, "
        f"{report['lost']} lost",
        f"held by code: {report['held_by_code'] or '-'}",
        f"pods created {report['pods_created']} for {report['attempts']} attempts "
        f"({report['pod_create_requests']} create requests); duplicates {report['duplicate_attempts']}, "
        f"overlapping live {report['overlapping_live_pods']}; left: {report['pods_left']} pods, "
        f"{report['secrets_left']} Secrets",
        f"agent kills {report['agent_kills']}, node losses {len(report['node_losses'])}, "
        f"API evictions {report['evicted_through_api']}, faults {report['faults_injected']}",
        f"agent RSS max {mem.get('rss_max_mb')} MB, median {mem.get('rss_median_mb')} MB, "
        f"{mem.get('mb_per_100_in_flight')} MB per 100 in flight; longest life {mem.get('longest_life')}",
        "invariants: " + ", ".join(f"{k}={'ok' if v else 'FAILED'}" for k, v in report["invariants"].items()),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg, args = parse_args(argv)
        cfg.validate()
    except SoakError as exc:
        sys.stderr.write(f"soak: {exc}\n")
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.verbose:
        # Hook stderr and retried cleanups are expected under injected faults; the report counts them.
        logging.getLogger("ce_k8s.sim.condor.router").setLevel(logging.CRITICAL)
    sys.stderr.write(f"soak: {cfg.pilots} pilots, seed {cfg.seed}, in flight <= {cfg.max_in_flight}\n")
    soak = Soak(cfg, progress=sys.stderr)
    # SIGTERM/SIGINT end the run early but still drain briefly, report, and close the test bed,
    # so no agent process is left behind and the figures so far are not lost.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: soak.interrupt())
    try:
        report = soak.run()
    except (SoakError, RuntimeError) as exc:
        sys.stderr.write(f"soak: {exc}\n")
        return 2
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(_text(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
