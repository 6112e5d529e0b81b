"""The startd's size from fake cgroup trees (v1 and v2), the environment and /proc (ce_k8s.pilot.sizing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ce_k8s.pilot.sizing import MB, Host, SizingError, size

GIB = 1 << 30
MEMINFO = "MemTotal:       16384000 kB\nMemFree:         1000000 kB\n"      # 16000 MB


def tree(tmp_path: Path, files: dict[str, str], self_cgroup: str = "", affinity: int = 8) -> Host:
    """A fake /sys/fs/cgroup, /proc/self/cgroup, /proc/meminfo and /dev under tmp_path."""
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    (tmp_path / "self_cgroup").write_text(self_cgroup)
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "dev").mkdir()
    return Host(cgroup_root=root, proc_self_cgroup=tmp_path / "self_cgroup", meminfo=tmp_path / "meminfo",
                dev=tmp_path / "dev", affinity=affinity)


def v1(quota: int = -1, period: int = 100000, shares: int = 1024, memory: int = 9223372036854771712) -> dict[str, str]:
    return {"cpu,cpuacct/cpu.cfs_quota_us": str(quota), "cpu,cpuacct/cpu.cfs_period_us": str(period),
            "cpu,cpuacct/cpu.shares": str(shares), "memory/memory.limit_in_bytes": str(memory)}


def v2(cpu_max: str = "max 100000", weight: int = 100, memory: str = "max") -> dict[str, str]:
    return {"cgroup.controllers": "cpu memory", "cpu.max": cpu_max, "cpu.weight": str(weight),
            "memory.max": memory}


# ------------------------------------------------------------------ cgroup v1
def test_v1_quota_and_memory_limit(tmp_path):
    s = size({}, tree(tmp_path, v1(quota=400000, memory=6 * GIB)))
    assert (s.cpus, s.memory_mb, s.gpus) == (4, 6144, 0)
    assert s.sources["cpus"].startswith("cgroup CPU quota") and s.sources["memory"] == "cgroup memory limit"


def test_v1_fractional_quota_rounds_down_and_never_below_one(tmp_path):
    assert size({}, tree(tmp_path / "a", v1(quota=150000, memory=GIB))).cpus == 1    # 1.5 -> 1
    assert size({}, tree(tmp_path / "b", v1(quota=50000, memory=GIB))).cpus == 1     # 0.5 -> 1
    assert size({}, tree(tmp_path / "c", v1(quota=250000, memory=GIB))).cpus == 2    # 2.5 -> 2


def test_v1_no_quota_reads_the_request_from_the_shares(tmp_path):
    s = size({}, tree(tmp_path, v1(quota=-1, shares=3 * 1024, memory=GIB)))
    assert s.cpus == 3 and "weight" in s.sources["cpus"]


def test_v1_no_memory_limit_falls_back_to_memtotal(tmp_path):
    s = size({}, tree(tmp_path, v1(quota=200000)))
    assert s.memory_mb == 16384000 * 1024 // MB and s.sources["memory"] == "MemTotal (no memory limit)"


def test_v1_memory_limit_above_the_machine_is_capped(tmp_path):
    assert size({}, tree(tmp_path, v1(quota=100000, memory=64 * GIB))).memory_mb == 16000


def test_v1_the_process_own_cgroup_path_wins_over_the_mount_top(tmp_path):
    files = {**v1(quota=800000, memory=8 * GIB),
             "cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_quota_us": "200000",
             "cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_period_us": "100000",
             "memory/kubepods/pod1/c1/memory.limit_in_bytes": str(2 * GIB)}
    host = tree(tmp_path, files, self_cgroup="4:memory:/kubepods/pod1/c1\n2:cpu,cpuacct:/kubepods/pod1/c1\n")
    s = size({}, host)
    assert (s.cpus, s.memory_mb) == (2, 2048)


# ------------------------------------------------------------------ cgroup v2
def test_v2_cpu_max_and_memory_max(tmp_path):
    s = size({}, tree(tmp_path, v2(cpu_max="300000 100000", memory=str(3 * GIB))))
    assert (s.cpus, s.memory_mb) == (3, 3072)


def test_v2_no_cpu_limit_maps_the_kubelet_weight_back_to_the_request(tmp_path):
    # the kubelet writes weight = 1 + (shares - 2) * 9999 / 262142 for a 4-CPU request (4096 shares)
    for cpus in (1, 2, 4, 7):
        weight = 1 + (cpus * 1024 - 2) * 9999 // 262142
        s = size({}, tree(tmp_path / str(cpus), v2(weight=weight, memory=str(GIB))))
        assert s.cpus == cpus, (weight, s)
    # a request just under a whole CPU is not read as the CPU above it
    weight = 1 + (3 * 1024 - 100 - 2) * 9999 // 262142
    assert size({}, tree(tmp_path / "under", v2(weight=weight, memory=str(GIB)))).cpus == 2


def test_v2_unsized_cgroup_uses_the_cpus_it_may_run_on(tmp_path):
    s = size({}, tree(tmp_path, v2(memory=str(GIB)), affinity=6))
    assert s.cpus == 6 and s.sources["cpus"] == "CPUs this process may run on"


def test_v2_no_memory_limit_falls_back_to_memtotal(tmp_path):
    assert size({}, tree(tmp_path, v2(cpu_max="100000 100000"))).memory_mb == 16000


def test_no_cgroup_at_all(tmp_path):
    s = size({}, tree(tmp_path, {}, affinity=2))
    assert (s.cpus, s.memory_mb) == (2, 16000)


def test_never_more_cpus_than_it_may_run_on(tmp_path):
    assert size({}, tree(tmp_path, v1(quota=1600000, memory=GIB), affinity=4)).cpus == 4


# ------------------------------------------------------------------ the environment first
def test_explicit_environment_wins(tmp_path):
    host = tree(tmp_path, v1(quota=800000, memory=8 * GIB))
    s = size({"CE_K8S_PILOT_CPUS": "2", "CE_K8S_PILOT_MEMORY_MB": "3000", "CE_K8S_PILOT_GPUS": "1"}, host)
    assert (s.cpus, s.memory_mb, s.gpus) == (2, 3000, 1)
    assert s.sources == {"cpus": "CE_K8S_PILOT_CPUS", "memory": "CE_K8S_PILOT_MEMORY_MB", "gpus": "CE_K8S_PILOT_GPUS"}


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_a_bad_explicit_size_is_an_error(tmp_path, value):
    with pytest.raises(SizingError, match="CE_K8S_PILOT_CPUS"):
        size({"CE_K8S_PILOT_CPUS": value}, tree(tmp_path, v1(memory=GIB)))


def test_zero_memory_is_an_error(tmp_path):
    with pytest.raises(SizingError, match="too small"):
        size({"CE_K8S_PILOT_MEMORY_MB": "0"}, tree(tmp_path, v1(memory=GIB)))


# ------------------------------------------------------------------ GPUs
@pytest.mark.parametrize(("visible", "gpus"), [("0,1", 2), ("GPU-1b2c,GPU-3d4e,GPU-5f", 3), ("", 0),
                                               ("none", 0), ("void", 0)])
def test_gpus_from_nvidia_visible_devices(tmp_path, visible, gpus):
    s = size({"NVIDIA_VISIBLE_DEVICES": visible}, tree(tmp_path, v1(memory=GIB)))
    assert s.gpus == gpus and s.sources["gpus"] == "NVIDIA_VISIBLE_DEVICES"


@pytest.mark.parametrize(("visible", "ids"), [("GPU-1b2c,GPU-3d4e", ("GPU-1b2c", "GPU-3d4e")),
                                              ("MIG-9f/1/2", ("MIG-9f/1/2",)), ("0,1", ()), ("GPU-1b2c,1", ()),
                                              ("all", ()), ("", ())])
def test_uuids_are_the_gpu_ids_and_indices_are_not(tmp_path, visible, ids):
    """A UUID names one device inside the container as outside; an index does not (a container's
    devices are numbered from 0), so only UUIDs become the startd's GPU IDs."""
    assert size({"NVIDIA_VISIBLE_DEVICES": visible}, tree(tmp_path, v1(memory=GIB))).gpu_ids == ids


def test_an_explicit_gpu_count_names_no_device(tmp_path):
    s = size({"CE_K8S_PILOT_GPUS": "1", "NVIDIA_VISIBLE_DEVICES": "GPU-1b2c,GPU-3d4e"}, tree(tmp_path, v1(memory=GIB)))
    assert (s.gpus, s.gpu_ids) == (1, ())


def test_all_gpus_counts_the_device_nodes(tmp_path):
    host = tree(tmp_path, v1(memory=GIB))
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (host.dev / name).write_text("")
    assert size({"NVIDIA_VISIBLE_DEVICES": "all"}, host).gpus == 2


def test_no_gpu_variable_means_none(tmp_path):
    s = size({}, tree(tmp_path, v1(memory=GIB)))
    assert s.gpus == 0 and s.sources["gpus"] == "none visible"
