"""How big the pilot's startd is: what Kubernetes gave the pod, read from inside it.

A glidein is told its size (GlideinWMS's `GLIDEIN_CPUS`, `GLIDEIN_MaxMemMBs`) or guesses it from
the worker node; a pod knows better, because its limits are enforced by its cgroup. So, for each
resource, the first of these that answers wins (docs/pilot.md, "Sizing"):

* **CPUs**: `CE_K8S_PILOT_CPUS` (whole CPUs, e.g. from the downward API); the cgroup's CPU quota
  (v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`), rounded *down* (a 1.5-CPU limit is a
  1-CPU slot: a slot must not promise what the quota throttles away); with no quota, the pod's CPU
  request as the kubelet wrote it into the cgroup's weight (v1 `cpu.shares / 1024`, v2
  `cpu.weight` mapped back to shares), rounded down; else the CPUs this process may run on
  (`sched_getaffinity`). Never below 1, never above the CPUs it may run on.
* **Memory** (MB, 2^20 bytes): `CE_K8S_PILOT_MEMORY_MB`; the cgroup's limit (v2 `memory.max`, v1
  `memory.limit_in_bytes`); with no limit, the machine's `MemTotal` (a pod without a memory limit
  may use the node's; ce-k8s's own pods always have one). Never above `MemTotal`.
* **GPUs**: `CE_K8S_PILOT_GPUS`; else `NVIDIA_VISIBLE_DEVICES` (what the NVIDIA device plugin sets:
  a list of indices or UUIDs; `all` counts `/dev/nvidiaN`; `none`/`void`/empty is 0); else 0.
  When the list is of UUIDs (`GPU-…`, `MIG-…`: the plugin's default), they are the startd's GPU
  IDs too, so a user's job is told the very device Kubernetes gave the pod (`AssignedGPUs`, and
  `CUDA_VISIBLE_DEVICES`, which takes UUIDs); an index is not, as a container renumbers its devices
  from 0.

The cgroup of the process is found under `/sys/fs/cgroup` at the path `/proc/self/cgroup` names
(a host without a cgroup namespace) or at the mount's top (a container's own cgroup, as runc
mounts it); the deepest one that exists is read.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

MB = 1 << 20
#: v1's "no limit" is the largest page-aligned 64-bit value; anything this big is no limit.
V1_UNLIMITED = 1 << 62
#: v1 `cpu.shares` per CPU of request, as the kubelet writes it (and the v1 default, 1024).
SHARES_PER_CPU = 1024
#: The v2 default weight: a cgroup nobody sized (no request to read from it).
V2_DEFAULT_WEIGHT = 100


class SizingError(ValueError):
    """An explicit size in the environment is not a number the pilot can use."""


@dataclass(frozen=True)
class Size:
    """The startd's resources and where each number came from (for the pilot's log)."""

    cpus: int
    memory_mb: int
    gpus: int
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    gpu_ids: tuple[str, ...] = ()       # the devices' UUIDs when NVIDIA_VISIBLE_DEVICES names them


@dataclass(frozen=True)
class Host:
    """Where sizing reads the machine from; tests point it at fake files."""

    cgroup_root: Path = Path("/sys/fs/cgroup")
    proc_self_cgroup: Path = Path("/proc/self/cgroup")
    meminfo: Path = Path("/proc/meminfo")
    dev: Path = Path("/dev")
    affinity: int | None = None      # None: os.sched_getaffinity(0)

    def usable_cpus(self) -> int:
        if self.affinity is not None:
            return self.affinity
        try:
            return len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_paths(host: Host) -> dict[str, str]:
    """controller -> path from /proc/self/cgroup ('' is the v2 unified hierarchy)."""
    found: dict[str, str] = {}
    for line in (_read(host.proc_self_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                found[controller] = parts[2]
    return found


def _dirs(host: Host, controller: str | None) -> list[Path]:
    """Candidate directories of this process's cgroup for `controller` (None: v2), deepest first."""
    paths = _cgroup_paths(host)
    if controller is None:
        base, own = host.cgroup_root, paths.get("", "/")
        candidates = [base / own.lstrip("/"), base]
    else:
        candidates = []
        for mount in (controller, "cpu,cpuacct", "cpuacct,cpu"):
            base = host.cgroup_root / mount
            if base.is_dir():
                candidates += [base / paths.get(controller, "/").lstrip("/"), base]
    seen: list[Path] = []
    for c in candidates:
        if c not in seen and c.is_dir():
            seen.append(c)
    return seen


def _v2(host: Host) -> bool:
    return (host.cgroup_root / "cgroup.controllers").is_file()


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def cgroup_cpu_quota(host: Host) -> float | None:
    """The CPU limit in CPUs (quota / period), or None when there is none."""
    if _v2(host):
        for d in _dirs(host, None):
            words = (_read(d / "cpu.max") or "").split()
            if len(words) == 2:
                quota, period = _int(words[0]), _int(words[1])
                if quota is None or not period:     # "max 100000": no limit here
                    return None
                return quota / period
        return None
    for d in _dirs(host, "cpu"):
        quota, period = _int(_read(d / "cpu.cfs_quota_us")), _int(_read(d / "cpu.cfs_period_us"))
        if quota is not None and period:
            return None if quota < 0 else quota / period
    return None


def cgroup_cpu_request(host: Host) -> float | None:
    """The CPU request the kubelet wrote as the cgroup's weight, in CPUs, or None if unsized."""
    if _v2(host):
        for d in _dirs(host, None):
            weight = _int(_read(d / "cpu.weight"))
            if weight is not None:
                if weight == V2_DEFAULT_WEIGHT:
                    return None
                # The kubelet's shares -> weight map, weight = 1 + (shares - 2) * 9999 // 262142,
                # inverted to the top of the range one weight covers (26 shares): the bottom would
                # read a 4-CPU request (weight 157) as 3.996 CPUs, and the floor below as 3.
                return (2 + weight * 262142 / 9999) / SHARES_PER_CPU
        return None
    for d in _dirs(host, "cpu"):
        shares = _int(_read(d / "cpu.shares"))
        if shares is not None:
            return shares / SHARES_PER_CPU
    return None


def cgroup_memory_limit(host: Host) -> int | None:
    """The memory limit in bytes, or None when there is none."""
    if _v2(host):
        for d in _dirs(host, None):
            text = _read(d / "memory.max")
            if text is not None:
                return None if text == "max" else _int(text)
        return None
    for d in _dirs(host, "memory"):
        limit = _int(_read(d / "memory.limit_in_bytes"))
        if limit is not None:
            return None if limit >= V1_UNLIMITED else limit
    return None


def mem_total(host: Host) -> int | None:
    """MemTotal of /proc/meminfo in bytes."""
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", _read(host.meminfo) or "", re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def visible_gpus(value: str | None, host: Host) -> int:
    """GPUs named by NVIDIA_VISIBLE_DEVICES."""
    value = (value or "").strip()
    if value in ("", "none", "void"):
        return 0
    if value == "all":
        return sum(1 for p in host.dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))
    return len([v for v in value.split(",") if v.strip()])


def gpu_uuids(value: str | None) -> tuple[str, ...]:
    """The device UUIDs NVIDIA_VISIBLE_DEVICES names, or () when it names anything else."""
    ids = tuple(v.strip() for v in (value or "").split(",") if v.strip())
    return ids if ids and all(re.fullmatch(r"(GPU|MIG)-[A-Za-z0-9_./-]+", v) for v in ids) else ()


def _explicit(env: dict[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise SizingError(f"{name}={raw!r} is not a whole number") from None
    if value < 0:
        raise SizingError(f"{name}={raw!r} is negative")
    return value


def size(env: dict[str, str], host: Host | None = None) -> Size:
    """The startd's size from the environment and the cgroup (module docstring for the order)."""
    host = host or Host()
    sources: dict[str, str] = {}
    usable = max(1, host.usable_cpus())

    cpus = _explicit(env, "CE_K8S_PILOT_CPUS")
    if cpus is not None:
        sources["cpus"] = "CE_K8S_PILOT_CPUS"
    elif (quota := cgroup_cpu_quota(host)) is not None:
        cpus, sources["cpus"] = math.floor(quota), f"cgroup CPU quota ({quota:g} CPUs)"
    elif (request := cgroup_cpu_request(host)) is not None:
        cpus, sources["cpus"] = math.floor(request), f"cgroup CPU weight ({request:g} CPUs requested)"
    else:
        cpus, sources["cpus"] = usable, "CPUs this process may run on"
    cpus = min(max(1, cpus), usable)

    total = mem_total(host)
    memory = _explicit(env, "CE_K8S_PILOT_MEMORY_MB")
    if memory is not None:
        sources["memory"] = "CE_K8S_PILOT_MEMORY_MB"
    elif (limit := cgroup_memory_limit(host)) is not None:
        memory, sources["memory"] = limit // MB, "cgroup memory limit"
    elif total is not None:
        memory, sources["memory"] = total // MB, "MemTotal (no memory limit)"
    else:
        raise SizingError("no memory limit, no CE_K8S_PILOT_MEMORY_MB and no /proc/meminfo: cannot size the startd")
    if total is not None:
        memory = min(memory, total // MB)
    if memory < 1:
        raise SizingError(f"{memory} MB of memory ({sources['memory']}): too small for a startd")

    gpus = _explicit(env, "CE_K8S_PILOT_GPUS")
    if gpus is not None:
        sources["gpus"] = "CE_K8S_PILOT_GPUS"
    else:
        gpus = visible_gpus(env.get("NVIDIA_VISIBLE_DEVICES"), host)
        sources["gpus"] = "NVIDIA_VISIBLE_DEVICES" if "NVIDIA_VISIBLE_DEVICES" in env else "none visible"
        ids = gpu_uuids(env.get("NVIDIA_VISIBLE_DEVICES"))
        if ids:
            return Size(cpus, memory, gpus, sources, ids)
    return Size(cpus, memory, gpus, sources)
