"""A bed with a real node leaves the machine as it found it: after a failed start, and after its
owner dies, when its reaper runs the bed's `down` (ce_k8s.real.node.node, ce_k8s.real.reaper).

Each test brings up a bed of its own (the binaries and the node runtime are cached: about 10 s)
beside the session's, with a pod running on its real node so that a shim, a container, its cgroups,
mounts and network namespace exist, and then checks what is left: processes, cgroups, mounts,
namespaces, the host paths a kubelet or containerd would use by default, and the sysctls the
kubelet rewrites at start: the failed start with the machine's sysctl ledger, which the session's
bed holds too (a nested bed's release leaves the session's hold alone), the killed owner with a
ledger of its own bed's (it is the last to release it: the host's values are written back).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ce_k8s.real.kube.kube import RealKube, RealKubeError, bed_salt
from ce_k8s.real.node import node as realnode
from ce_k8s.real.node.node import v1_hierarchies
from ce_k8s.real.sysctls import KUBELET_SYSCTLS, SysctlLedger, read_sysctls, write_sysctls

from .conftest import wait_for
from .test_real_node import pod_manifest

pytestmark = pytest.mark.slow

# Where a kubelet, containerd, runc or the CNI plugins write when not told otherwise.
HOST_PATHS = ("/run/containerd", "/var/run/containerd", "/var/lib/containerd", "/var/lib/kubelet", "/etc/cni",
              "/opt/cni", "/var/lib/cni", "/var/log/pods", "/var/log/containers", "/etc/kubernetes",
              "/usr/libexec/kubernetes", "/opt/containerd", "/run/runc", "/run/netns", "/var/run/netns")
SMALL_NODES = "cpu:1x8c32g"


def host_paths() -> list[str]:
    return [p for p in HOST_PATHS if os.path.lexists(p)]


# Taken when the module is collected, before any bed of the run is up: the session's bed runs a real
# node all through these tests, and what it writes to the host must be judged too (it once left
# /var/lib/kubelet/device-plugins/kubelet.sock, /var/lib/cni and /var/log/containers behind).
HOST_PATHS_BEFORE_ANY_BED = host_paths()


def namespaces() -> set[str]:
    """Every mount and network namespace some process is in."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            for kind in ("mnt", "net"):
                try:
                    out.add(os.readlink(entry / "ns" / kind))
                except OSError:
                    pass
    return out


def cgroup_of(pid: int, controller: str = "memory") -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.rstrip("/") + "/"
    return "/"


def processes_naming(text: str) -> list[str]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                out.append(f"{entry.name}: {cmd[:160]}")
    return out


def footprint(state_dir: Path, cgroup_root: str | None) -> dict[str, object]:
    """What a bed in `state_dir` could have left on the machine."""
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(state_dir) in line]
    cgroups = [str(h / cgroup_root.strip("/")) for h in v1_hierarchies()
               if cgroup_root and (h / cgroup_root.strip("/")).exists()]
    return {"processes": processes_naming(str(state_dir)), "mounts": mounts, "cgroups": cgroups,
            "host paths": host_paths()}


# What the kubelet writes at start, and the kernel's defaults for the same keys.
KUBELET_WRITES = {"vm.overcommit_memory": "1", "kernel.panic": "10", "kernel.panic_on_oops": "1"}
KERNEL_DEFAULTS = {"vm.overcommit_memory": "0", "kernel.panic": "0", "kernel.panic_on_oops": "0"}


@pytest.fixture
def original_sysctls(real_kube):
    """Host values that differ from what the kubelet writes, set for the test, so that `down`
    restoring them is seen: the host's own (the session bed saved them before its kubelet ran),
    or the kernel's default for a key another bed's kubelet had already rewritten. The values of
    the session are put back after."""
    saved = dict((real_kube.state().sysctls if real_kube.state() else {}) or read_sysctls())
    for key, value in KUBELET_WRITES.items():
        if saved.get(key) == value:
            saved[key] = KERNEL_DEFAULTS[key]
    during_session = read_sysctls()
    write_sysctls(saved)
    yield saved
    write_sysctls(during_session)


def own_bed(tmp_state: Path, **kwargs) -> RealKube:
    return RealKube(tmp_state, **kwargs)


def own_ledger(state: Path) -> Path:
    """A sysctl ledger of the bed in `state` alone, beside its state directory (own_state removes it)."""
    return state.with_name(state.name + "-sysctls.json")


def run_a_pod(env: RealKube) -> None:
    from kubernetes import client
    from kubernetes.config import new_client_from_config

    api = client.CoreV1Api(new_client_from_config(config_file=str(env.admin_kubeconfig)))
    ns = "cleanup-check"
    api.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: api.list_namespaced_service_account(ns).items, 60, what="the default ServiceAccount")
    api.create_namespaced_pod(ns, pod_manifest("running", "echo up; sleep 600"))
    wait_for(lambda: api.read_namespaced_pod("running", ns).status.phase == "Running", 60, what="the pod running")
    api.api_client.close()


def node_of(env: RealKube) -> dict:
    st = env.state()
    assert st is not None and st.real_nodes
    return st.real_nodes[0]


def assert_clean(before_ns: set[str], state_dir: Path, cgroup_root: str, original: dict[str, str],
                 before_paths: list) -> None:
    left = footprint(state_dir, cgroup_root)
    assert left["processes"] == [] and left["mounts"] == [] and left["cgroups"] == [], left
    assert left["host paths"] == before_paths
    assert namespaces() <= before_ns, "a namespace the bed made is still held"
    assert read_sysctls() == original


@pytest.fixture
def own_state(request) -> Path:
    """The state directory of the test's own bed, under /var/tmp (as a site's). Gone after the
    test, also after a failed one: its bed taken down, what still names it killed."""
    state = Path("/var/tmp") / f"ce-k8s-cleanup-{os.getpid()}-{request.node.originalname.rsplit('_', 1)[-1]}"
    yield state
    if RealKube(state).state_file.exists():
        RealKube(state).down(progress=lambda m: None)
    for line in processes_naming(str(state)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
    shutil.rmtree(state, ignore_errors=True)
    own_ledger(state).unlink(missing_ok=True)


def test_a_failed_start_is_undone(real_kube, own_state, original_sysctls, monkeypatch):
    """The kubelet cannot start (a configuration it refuses): `up` fails, naming its log, and
    leaves nothing behind, the sysctls included. The bed held the machine's sysctl ledger beside
    the session's bed before its kubelet ran, and its failed start released it: the session's bed
    holds it alone again, with the host's own values."""
    state = own_state
    before_ns, before_paths = namespaces(), HOST_PATHS_BEFORE_ANY_BED
    machine = SysctlLedger()
    before_holders = machine.holders()
    assert str(real_kube.state_file) in before_holders, before_holders
    real_config = realnode.kubelet_config
    holders_at_kubelet_start: list[list[str]] = []

    def refused(*args, **kwargs) -> str:
        holders_at_kubelet_start.append(machine.holders())
        return real_config(*args, **kwargs).replace('"failCgroupV1": false', '"failCgroupV1": true')
    monkeypatch.setattr(realnode, "kubelet_config", refused)
    env = own_bed(state)
    with pytest.raises(RealKubeError, match=r"node-1-kubelet\.log"):
        env.up(nodes=SMALL_NODES, progress=lambda m: None, real_nodes=1)
    assert env.state() is None
    assert holders_at_kubelet_start == [[*before_holders, str(env.state_file)]]
    assert machine.holders() == before_holders
    cgroup_root = f"{realnode.own_cgroup().rstrip('/')}/ce-k8s-node-{bed_salt(state)}-1"
    assert_clean(before_ns, state, cgroup_root, original_sysctls, before_paths)
    shutil.rmtree(state, ignore_errors=True)


def test_a_bed_whose_owner_is_killed_is_taken_down_by_its_reaper(own_state, original_sysctls):
    """The worst case of `down`: a test run killed with its bed up (a pod running on the real node).
    The reaper runs the bed's own `down`, the one `ce-k8s testbed real-kube down` and every test
    fixture run, and nothing is left: processes, mounts, cgroups, namespaces, host paths, sysctls;
    nor what a test started in the node's network namespace without telling the bed (the VO pool's
    SciTokens issuer, its own session, its command line naming the bed's state directory)."""
    state = own_state
    before_ns, before_paths = namespaces(), HOST_PATHS_BEFORE_ANY_BED
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time
        from ce_k8s.real.condor.issuer import TestIssuer
        from ce_k8s.real.kube.kube import RealKube
        env = RealKube({str(state)!r}, sysctl_ledger={str(own_ledger(state))!r})
        env.up(nodes={SMALL_NODES!r}, progress=lambda m: None, real_nodes=1, owner_pid=os.getpid())
        # as the VO pool's fixture does: a SciTokens issuer in the node's network namespace
        issuer = TestIssuer(env.state_dir / "vo-issuer", 9643)
        issuer.create({{}})
        issuer.start(netns_pid=env.state().real_nodes[0]["pids"]["holder"])
        print("up", flush=True)
        time.sleep(3600)
        """)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert owner.stdout.readline().strip() == "up"
        env = RealKube(state)
        node = node_of(env)
        run_a_pod(env)
        assert read_sysctls() != original_sysctls       # the kubelet did rewrite them
        assert SysctlLedger(own_ledger(state)).holders() == [str(env.state_file)]
        assert footprint(state, node["cgroup_root"])["cgroups"], "the node's cgroups exist while up"
        # two real nodes (this bed's and the session's) with pods, and the host's paths untouched
        assert host_paths() == before_paths
        assert (Path(node["dir"]) / "host" / "var-lib" / "kubelet" / "device-plugins" / "kubelet.sock").exists()
        holder_ns = realnode.mount_ns(node["pids"]["holder"])
        assert holder_ns not in before_ns
        issuer_pid = int((state / "vo-issuer" / "issuer.pid").read_text())
        net = {pid: os.readlink(f"/proc/{pid}/ns/net") for pid in (issuer_pid, node["pids"]["holder"], os.getpid())}
        assert net[issuer_pid] == net[node["pids"]["holder"]] != net[os.getpid()], net
        assert str(state) in Path(f"/proc/{issuer_pid}/cmdline").read_text()
        # Every process of the node (kubelet, containerd, shims in its mount namespace; the pod's
        # containers below its cgroupRoot) stays inside the memory cgroup the bed was started in.
        own = realnode.own_cgroup().rstrip("/") + "/"
        pods = realnode.cgroup_pids(Path("/sys/fs/cgroup/memory") / node["cgroup_root"].strip("/"))
        assert pods, "no container below the node's cgroupRoot"
        for pid in {*realnode.pids_in_mount_ns(holder_ns), *pods}:
            assert cgroup_of(pid).startswith(own), (pid, cgroup_of(pid), own)
    except BaseException:
        owner.kill()
        RealKube(state).down(progress=lambda m: None)
        raise
    owner.send_signal(signal.SIGKILL)        # the test run dies without a word
    owner.wait()
    wait_for(lambda: not RealKube(state).state_file.exists() and not processes_naming(str(state)), 90,
             what="the reaper to take the bed down")
    assert_clean(before_ns, state, node["cgroup_root"], original_sysctls, before_paths)
    assert set(KUBELET_SYSCTLS) == set(original_sysctls)
    assert not own_ledger(state).exists(), "the last release removes the ledger"
    shutil.rmtree(state, ignore_errors=True)
