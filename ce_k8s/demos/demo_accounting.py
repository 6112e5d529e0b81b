"""`ce-k8s demo --history-dir`: the agent's per-job history files, checked against the emulator.

Why in the demo: accounting is only right if every attempt that ran left exactly one complete
record whose numbers agree with what happened. The emulator knows both sides: each pod's life (its
pilot container's `startedAt`/`finishedAt`, as the kubelet simulator wrote them) and what the
kubelet's Summary API reported for it (the simulated usage meters). `AttemptWitness` records them
from the store's own event stream (a server-side listener: injected faults cannot hide an event),
and `check()` reads the history files the way HTCondor-CE's APEL script does (`condor_q -job FILE
-format ...` projections, `ce_k8s.ops.accounting.apel_fields`) and compares.

`check_invariants()` is the part that needs no witness: what every record must keep on its own
(docs/accounting.md "Wall time and the CPU bound"). An attempt that ran never has a zero wall time,
and never more CPU time than wall time × cores. Both rules are checked on the values the file
holds and on the integers APEL's script makes of them (`%lld`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ce_k8s.agent.podinfo import parse_time

WALL_TOLERANCE = 1.0      # the containers' timestamps have whole seconds


@dataclass
class Attempt:
    """One pod's life as the emulator saw it."""

    name: str
    started: int | None = None
    finished: int | None = None
    cpu_ns: int = 0            # the largest cumulative CPU time the kubelet simulator's meter showed


class AttemptWitness:
    """Store listener: each of our pods' container start/end and its simulated usage."""

    def __init__(self, kubelet: Any) -> None:
        self.kubelet = kubelet
        self.attempts: dict[str, Attempt] = {}       # pod uid -> attempt
        self.lock = threading.Lock()

    def __call__(self, resource: str, ev: Any) -> None:
        if resource != "pods":
            return
        meta = ev.obj.get("metadata") or {}
        if (meta.get("labels") or {}).get("app.kubernetes.io/managed-by") != "ce-k8s":
            return
        uid = str(meta.get("uid") or "")
        statuses = (ev.obj.get("status") or {}).get("containerStatuses") or []
        with self.lock:
            a = self.attempts.get(uid)
            for cs in statuses:
                if cs.get("name") != "pilot":
                    continue
                state = cs.get("state") or {}
                run = state.get("running") or state.get("terminated") or {}
                started = parse_time(run.get("startedAt"))
                if started is None:
                    continue
                if a is None:
                    a = self.attempts[uid] = Attempt(str(meta.get("name")))
                a.started = started
                a.finished = parse_time((state.get("terminated") or {}).get("finishedAt")) or a.finished
            if a is not None and self.kubelet is not None:
                key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
                meter = self.kubelet.usage.meters(key).get("pilot")
                if meter is not None:
                    a.cpu_ns = max(a.cpu_ns, meter.cpu_ns(time.time()))
            if a is not None and ev.type == "DELETED" and a.finished is None:
                a.finished = int(time.time())

    def ran(self) -> dict[str, Attempt]:
        with self.lock:
            return {uid: a for uid, a in self.attempts.items() if a.started is not None}


def wait_for_files(directory: Path, expected: int, timeout: float = 20.0) -> int:
    """Wait until the agent has written `expected` history files (it settles evicted attempts on its
    own thread, shortly after the pod is gone); the number found."""
    deadline = time.monotonic() + timeout
    while True:
        found = len([p for p in directory.iterdir() if p.is_file()])
        if found >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def check_invariants(directory: Path, records: list | None = None) -> dict[str, object]:
    """The rules each history file keeps on its own (module docstring), whatever cluster ran the
    attempt: complete for APEL (`incomplete`), a wall time of at least one second (`wall_zero`;
    only attempts that ran have a file), CPU at most wall × `RequestCpus` (`cpu_over_wall`). Also
    counted: which rule gave each wall time (`wall_sources`) and how many CPU times were capped
    (`cpu_capped`). The keys that only a witness can fill (`check`) are None. `records`: the
    directory's files, already read."""
    from ce_k8s.ops.accounting import apel_fields, read_history

    records = read_history(directory) if records is None else records
    incomplete, wall_zero, cpu_over_wall, capped = [], [], [], []
    sources: Counter[str] = Counter()
    for rec in records:
        ad = rec.ad
        wall, cpu, cores = (_number(ad.get(k)) for k in ("RemoteWallClockTime", "RemoteUserCpu", "RequestCpus"))
        sources[str(ad.get("K8sWallClockSource") or "unnamed")] += 1
        if ad.get("K8sCpuCapped") is True:
            capped.append(rec.path.name)
        apel = apel_fields(ad)
        if apel is None:
            incomplete.append(rec.path.name)
            apel_wall = apel_cpu = apel_cores = None
        else:        # what APEL's batch record holds: `%lld` of each
            apel_wall, apel_cpu, apel_cores = (int(apel[k]) for k in ("RemoteWallClockTime", "RemoteUserCpu",
                                                                      "RequestCpus"))
        if wall <= 0 or (apel_wall is not None and apel_wall < 1):
            wall_zero.append(rec.path.name)
        if ad.get("K8sCpuUsageKnown") is True and (
                cpu > wall * max(cores, 1) + 1e-3
                or (apel_wall is not None and apel_cpu > apel_wall * max(apel_cores, 1))):
            cpu_over_wall.append(rec.path.name)
    return {
        "dir": str(directory), "files": len(records), "incomplete": len(incomplete), "wall_zero": len(wall_zero),
        "cpu_over_wall": len(cpu_over_wall), "cpu_capped": len(capped), "wall_sources": dict(sorted(sources.items())),
        "attempts_ran": None, "missing": None, "duplicates": None, "wall_mismatch": None,
        "cpu_over_reported": None, "cpu_unknown": None,
        "ok": not (incomplete or wall_zero or cpu_over_wall),
    }


def check(directory: Path, witness: AttemptWitness) -> dict[str, object]:
    """Every attempt that ran has one history file that keeps the invariants (`check_invariants`),
    whose wall time matches its life on the emulator (±1 s) and whose CPU time is at most what the
    kubelet simulator reported."""
    from ce_k8s.ops.accounting import read_history

    ran = witness.ran()
    records = read_history(directory)
    invariants = check_invariants(directory, records)
    by_uid: dict[str, list] = {}
    for rec in records:
        by_uid.setdefault(str(rec.ad.get("K8sPodUid") or ""), []).append(rec)
    missing = [a.name for uid, a in ran.items() if uid not in by_uid]
    duplicates = [recs[0].path.name for recs in by_uid.values() if len(recs) > 1]
    wall_off, cpu_over, cpu_unknown = [], [], []
    for uid, recs in by_uid.items():
        a = ran.get(uid)
        if a is None:
            continue
        ad = recs[0].ad
        life = float((a.finished or a.started or 0) - (a.started or 0))
        if abs(float(ad.get("RemoteWallClockTime") or 0.0) - life) > WALL_TOLERANCE:
            wall_off.append(recs[0].path.name)
        if ad.get("K8sCpuUsageKnown") is not True:
            cpu_unknown.append(recs[0].path.name)
        elif float(ad.get("RemoteUserCpu") or 0.0) > a.cpu_ns / 1e9 + 1e-3:
            cpu_over.append(recs[0].path.name)
    return {
        **invariants, "attempts_ran": len(ran), "files": len(records), "missing": len(missing),
        "duplicates": len(duplicates), "wall_mismatch": len(wall_off),
        "cpu_over_reported": len(cpu_over), "cpu_unknown": len(cpu_unknown),
        "ok": (bool(invariants["ok"]) and not (missing or duplicates or wall_off or cpu_over)
               and len(records) == len(ran)),
    }
