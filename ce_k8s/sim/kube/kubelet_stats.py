"""What the simulated containers use, and the kubelet Summary API that reports it.

Why: ce-k8s accounts every pilot attempt's CPU and memory from the kubelet's Summary API
(`GET /api/v1/nodes/{node}/proxy/stats/summary`, docs/accounting.md), so the emulator must answer it
the way a kubelet does, with numbers that follow the pod's life: a container accrues CPU time from
the moment the kubelet starts it until its terminated state is written, at a steady rate, and holds
a steady memory footprint. The document has the shape of the kubelet's stats/v1alpha1 `Summary`
type (k8s.io/kubelet/pkg/apis/stats/v1alpha1/types.go): `node` (`NodeStats`) and `pods[]`
(`PodStats`: `podRef`, `startTime`, `containers[]` of `ContainerStats` with `cpu.usageNanoCores`,
`cpu.usageCoreNanoSeconds`, `memory.usageBytes`, `memory.workingSetBytes`, `memory.rssBytes`, ...,
and the pod-level `cpu`/`memory` sums). Like the real kubelet it reports the pods bound to the node
whose containers it still knows: once the API server has deleted a pod, its stats are gone.

Usage per container: pod annotation ``sim.ce-k8s.io/usage: "cpu=0.8 rss=1Gi"`` (cores, bytes), else
85 % of the container's CPU request (0.1 core without one) and half of its memory limit or request
(128 MiB without one). Times are the emulator's wall clock (the pod's `startedAt`/`finishedAt`).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ce_k8s.quantity import decode_quantity

USAGE_ANNOTATION = "sim.ce-k8s.io/usage"
DEFAULT_CPU_FRACTION = 0.85
DEFAULT_CORES = 0.1
DEFAULT_RSS = 128 * 1024 * 1024
Key = tuple[str, str]


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerUsage:
    """One running (or finished) container's meter."""

    name: str
    started: float                 # time.time() when the kubelet started it
    cores: float                   # steady CPU use, in cores
    rss: int                       # resident bytes
    ended: float | None = None     # time.time() when its terminated state was written

    def cpu_ns(self, now: float) -> int:
        """Cumulative CPU time (usageCoreNanoSeconds) up to `now`, or to its end."""
        end = self.ended if self.ended is not None else now
        return int(max(end - self.started, 0.0) * self.cores * 1e9)

    def stats(self, now: float) -> dict[str, Any]:
        """A `ContainerStats` object."""
        ws = int(self.rss * 1.1)
        running = self.ended is None
        return {
            "name": self.name,
            "startTime": _rfc3339(self.started),
            "cpu": {"time": _rfc3339(now), "usageNanoCores": int(self.cores * 1e9) if running else 0,
                    "usageCoreNanoSeconds": self.cpu_ns(now)},
            "memory": {"time": _rfc3339(now), "usageBytes": int(ws * 1.05), "workingSetBytes": ws,
                       "rssBytes": self.rss, "pageFaults": 1000, "majorPageFaults": 0},
            "rootfs": {"time": _rfc3339(now), "usedBytes": 4096, "inodesUsed": 8},
            "logs": {"time": _rfc3339(now), "usedBytes": 1024, "inodesUsed": 1},
        }


def _words(text: str) -> dict[str, str]:
    out = {}
    for word in text.split():
        key, _, value = word.partition("=")
        out[key] = value
    return out


def planned_usage(pod: Mapping[str, Any], container: Mapping[str, Any]) -> tuple[float, int]:
    """(cores, rss bytes) one container of `pod` will use (module docstring)."""
    meta = pod.get("metadata") or {}
    words = _words(str((meta.get("annotations") or {}).get(USAGE_ANNOTATION) or ""))
    res = container.get("resources") or {}
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    try:
        cores = float(decode_quantity(words["cpu"])) if "cpu" in words else (
            float(decode_quantity(str(req["cpu"]))) * DEFAULT_CPU_FRACTION if "cpu" in req else DEFAULT_CORES)
    except (ValueError, KeyError):
        cores = DEFAULT_CORES
    try:
        if "rss" in words:
            rss = int(decode_quantity(words["rss"]))
        elif "memory" in lim or "memory" in req:
            rss = int(decode_quantity(str(lim.get("memory") or req["memory"])) / 2)
        else:
            rss = DEFAULT_RSS
    except (ValueError, KeyError):
        rss = DEFAULT_RSS
    return max(cores, 0.0), max(rss, 0)


class UsageMeter:
    """The meters of every container the simulated kubelets run, by pod key and uid."""

    def __init__(self) -> None:
        self._pods: dict[Key, tuple[str, str, dict[str, ContainerUsage]]] = {}   # key -> (uid, node, meters)
        self.denied = False        # switch: answer 403 to every summary request (a site without the grant)

    def start(self, key: Key, uid: str, node: str, pod: Mapping[str, Any], now: float | None = None) -> None:
        """The kubelet started the pod's containers: their meters begin."""
        now = time.time() if now is None else now
        meters = {}
        for c in (pod.get("spec") or {}).get("containers") or []:
            cores, rss = planned_usage(pod, c)
            meters[str(c.get("name"))] = ContainerUsage(str(c.get("name")), now, cores, rss)
        self._pods[key] = (uid, node, meters)

    def sync(self, key: Key, pod: Mapping[str, Any] | None, now: float | None = None) -> None:
        """After a status write: stop the meter of every container now shown terminated."""
        entry = self._pods.get(key)
        if entry is None or pod is None:
            return
        now = time.time() if now is None else now
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            meter = entry[2].get(str(cs.get("name")))
            if meter is not None and meter.ended is None and "terminated" in (cs.get("state") or {}):
                meter.ended = now

    def forget(self, key: Key, uid: str) -> None:
        """The pod is gone from the API server: so are its stats."""
        entry = self._pods.get(key)
        if entry is not None and entry[0] == uid:
            del self._pods[key]

    def meters(self, key: Key) -> dict[str, ContainerUsage]:
        """The meters of one pod (tests compare the agent's numbers with them)."""
        entry = self._pods.get(key)
        return dict(entry[2]) if entry else {}

    def summary(self, node: str, pods: Iterable[Mapping[str, Any]], node_started: float,
                now: float | None = None) -> dict[str, Any]:
        """The kubelet's `Summary` of `node`: every pod bound to it whose containers have meters."""
        now = time.time() if now is None else now
        out_pods = []
        cores_now = 0
        cpu_total = 0
        mem_total = 0
        for pod in pods:
            meta = pod.get("metadata") or {}
            key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            entry = self._pods.get(key)
            if entry is None or entry[0] != str(meta.get("uid")) or entry[1] != node:
                continue
            containers = [m.stats(now) for m in entry[2].values()]
            pod_ns = sum(c["cpu"]["usageCoreNanoSeconds"] for c in containers)
            pod_rate = sum(c["cpu"]["usageNanoCores"] for c in containers)
            pod_ws = sum(c["memory"]["workingSetBytes"] for c in containers)
            pod_rss = sum(c["memory"]["rssBytes"] for c in containers)
            cores_now += pod_rate
            cpu_total += pod_ns
            mem_total += pod_ws
            out_pods.append({
                "podRef": {"name": key[1], "namespace": key[0], "uid": entry[0]},
                "startTime": (pod.get("status") or {}).get("startTime") or _rfc3339(now),
                "containers": containers,
                "cpu": {"time": _rfc3339(now), "usageNanoCores": pod_rate, "usageCoreNanoSeconds": pod_ns},
                "memory": {"time": _rfc3339(now), "usageBytes": int(pod_ws * 1.05), "workingSetBytes": pod_ws,
                           "rssBytes": pod_rss, "pageFaults": 1000 * len(containers), "majorPageFaults": 0},
                "volume": [],
                "ephemeral-storage": {"time": _rfc3339(now), "usedBytes": 5120 * len(containers)},
                "process_stats": {"process_count": len(containers)},
            })
        return {
            "node": {
                "nodeName": node, "startTime": _rfc3339(node_started),
                "cpu": {"time": _rfc3339(now), "usageNanoCores": cores_now, "usageCoreNanoSeconds": cpu_total},
                "memory": {"time": _rfc3339(now), "usageBytes": mem_total, "workingSetBytes": mem_total,
                           "rssBytes": mem_total, "pageFaults": 0, "majorPageFaults": 0},
                "systemContainers": [],
            },
            "pods": out_pods,
        }
