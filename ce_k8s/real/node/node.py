"""Real Kubernetes nodes in the real-Kubernetes bed: the real kubelet on containerd 2 and runc.

kwok plays the bed's many nodes (:mod:`ce_k8s.real.kube.kube`); a real node is the judge of what
happens *on* a node: exit codes, OOM kills, deadlines, image and Secret failures, logs, CPU in the
Summary API, SIGTERM and the grace period. Each real node is a kubelet of the control plane's own
release (:mod:`ce_k8s.real.kube.kubebuild`) on containerd, runc and the CNI bridge fetched by
:mod:`ce_k8s.real.node.noderuntime`. docs/real-kubernetes.md "Real nodes" has the layout.

**The machine is shared**, so a node is built to leave it as it found it:

* **Namespaces.** A holder process (`unshare --mount --propagation private --net`) owns a private
  mount namespace with a fresh tmpfs on `/run` (containerd's shim sockets, runc's state and the
  fifos live there, hard-coded under `/run/containerd`), the node's own directories bound over
  `/var/lib` and `/var/log` (the kubelet's device-plugin socket and container-log links, and the CNI
  cache and leases, are fixed paths there: `HIDDEN_HOST_DIRS`), and a network namespace holding only
  `lo` and the CNI bridge. containerd, its shims and the pods run in both; the kubelet runs in the mount
  namespace only, so it reaches the API server on loopback and the API server reaches it on the
  node's loopback IP. Every mount the node makes dies with the namespace.
* **No traffic beyond loopback and that namespace:** the node's name is a loopback IP (a host name
  would make the kubelet ask DNS), every registry is pointed at a dead loopback port
  (`hosts.toml` for `_default`), images are imported from local OCI archives and pods name them
  with `IfNotPresent` or `Never`, `clusterDNS` is empty and `resolv.conf` names only loopback.
* **cgroups.** The kubelet's `cgroupRoot` is a cgroup below the one the bed was started in, made
  in every v1 hierarchy; pods and their containers live there. `down` kills what is in them and
  removes them.
* **sysctls.** At start the kubelet sets `vm.overcommit_memory`, `vm.panic_on_oom`, `kernel.panic`,
  `kernel.panic_on_oops` and the root key quotas, machine-wide; the machine's ledger
  (:mod:`ce_k8s.real.sysctls`) keeps the values from before the first kubelet of any bed and
  writes them back when the last bed holding them goes down, in whatever order beds come and go.
* **CAP_SYS_RESOURCE is missing** in these VMs: containerd runs with `restrict_oom_score_adj` and
  the kubelet with `oomScoreAdj: 0`, so nothing asks for a negative OOM score.
* **cgroup v1 only** here: `failCgroupV1: false`, `cgroupDriver: cgroupfs`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ce_k8s.real.node import noderuntime
from ce_k8s.real.processes import alive, terminate

log = logging.getLogger(__name__)

REAL_NODE_TAINT = "ce-k8s.test/real-node"
REAL_NODE_LABEL = "ce-k8s.test/real-node"
DEAD_REGISTRY = "http://127.0.0.1:9"     # discard port: nothing listens, a pull is refused at once
POD_CIDR_BASE = "10.244"                  # inside the node's own network namespace only
CGROUP_FS = Path("/sys/fs/cgroup")
# Host directories a kubelet, containerd or the CNI plugins write to whatever they are told: the
# kubelet's device-plugin socket (/var/lib/kubelet/device-plugins, a constant of its device manager),
# its container-log links (/var/log/containers, another constant), and the CNI result cache and
# host-local leases (/var/lib/cni, libcni's default). In the node's mount namespace each parent is a
# bind of a directory of the node's own, so the host's /var/lib and /var/log get nothing and every
# node has its own kubelet.sock.
HIDDEN_HOST_DIRS = {"/var/lib": "host/var-lib", "/var/log": "host/var-log"}


class RealNodeError(RuntimeError):
    """A real node could not be started or stopped; the message says which step and where to look."""


@dataclass
class NodeState:
    """What one real node is, kept in the bed's state.json so any later `down` can undo it."""

    name: str                      # a loopback IP: the node's name and address
    index: int
    dir: str
    port: int
    cgroup_root: str               # the kubelet's cgroupRoot (the same path in every hierarchy)
    cgroup_made: list[str] = field(default_factory=list)   # directories we created, deepest last
    pids: dict[str, int] = field(default_factory=dict)


def node_ip(index: int, salt: int) -> str:
    """A loopback address per node and bed: 127.<salt>.<index>.2 (never 127.0.0.1, the control plane's)."""
    return f"127.{salt % 250 + 1}.{index}.2"


def own_cgroup(controller: str = "memory") -> str:
    """This process's cgroup in one v1 hierarchy (the bed's processes stay below it)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return "/"


def v1_hierarchies() -> list[Path]:
    """Every mounted cgroup v1 hierarchy (named ones included); the v2 mount is not one."""
    out = []
    for entry in sorted(CGROUP_FS.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and (entry / "cgroup.procs").exists() \
                and not (entry / "cgroup.controllers").exists():
            out.append(entry)
    return out


def make_cgroup_root(path: str) -> list[str]:
    """Make `path` in every v1 hierarchy (cpuset gets its parent's CPUs and memory nodes, as a
    cpuset cgroup is unusable without them); returns the directories made, for removal."""
    made: list[str] = []
    for hierarchy in v1_hierarchies():
        current = hierarchy
        for part in path.strip("/").split("/"):
            parent, current = current, current / part
            if current.exists():
                continue
            current.mkdir()
            made.append(str(current))
            if (current / "cpuset.cpus").exists():
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (current / knob).write_text((parent / knob).read_text())
    return made


def cgroup_pids(root: Path) -> set[int]:
    pids: set[int] = set()
    if not root.exists():
        return pids
    for procs in root.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in procs.read_text().split())
    return pids


def remove_cgroups(cgroup_root: str, made: list[str], timeout: float = 20.0) -> list[str]:
    """Kill every process below `cgroup_root` (any hierarchy), remove every cgroup below it, then
    the directories the node made; returns what could not be removed."""
    roots = [h / cgroup_root.strip("/") for h in v1_hierarchies()]
    deadline = time.monotonic() + timeout
    left: list[str] = []
    while True:
        pids = set().union(*(cgroup_pids(r) for r in roots))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        left = []
        for root in roots:
            if not root.exists():
                continue
            for d in [*sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), root]:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(str(d))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    # The parents the node made (`process_api/<id>` in hierarchies where the bed sits at the
    # root) may hold another bed's node by now: one that is busy is not ours to report.
    for d in sorted(made, key=lambda p: -len(Path(p).parts)):
        with contextlib.suppress(OSError):
            Path(d).rmdir()
    return left


def mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def net_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def pids_in_ns(ns: str, kind: str = "mnt") -> list[int]:
    """Every process (but this one) whose namespace of `kind` ("mnt", "net") is `ns`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / kind) == ns:
                    out.append(int(entry.name))
    return out


def pids_in_mount_ns(ns: str) -> list[int]:
    return pids_in_ns(ns, "mnt")


# ------------------------------------------------------------------ configuration files
def containerd_config(runtime: noderuntime.NodeRuntime, d: Path) -> str:
    """containerd 2.x (config version 3): everything under the node's directory or /run (a private
    tmpfs), runc the one built from the module proxy (1.3: idmapped mounts, so the CRI reports
    user-namespace support), registries dead, OOM scores never lowered, plugins that would reach
    outside (NRI, tracing, the image verifier) off."""
    return f"""version = 3
root = '{d}/containerd/root'
state = '/run/containerd'
oom_score = 0
disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.tracing.processor.v1.otlp',
                    'io.containerd.internal.v1.tracing']

[grpc]
  address = '{d}/containerd.sock'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{noderuntime.PAUSE_IMAGE}'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{d}/certs.d'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '{runtime.runc}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{runtime.cni_bin}']
      conf_dir = '{d}/cni'

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  [plugins.'io.containerd.internal.v1.opt']
    path = '{d}/containerd/opt'

  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '{d}/containerd/image-verifiers'
"""


def cni_config(index: int) -> str:
    return json.dumps({
        "cniVersion": "1.0.0", "name": "ce-k8s-node", "plugins": [
            {"type": "bridge", "bridge": "cek8s0", "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": f"{POD_CIDR_BASE}.{index}.0/24"}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "loopback"}]}, indent=1)


def kubelet_config(st: NodeState, ca: Path, cert: Path, key: Path) -> str:
    d = Path(st.dir)
    return json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": st.cgroup_root,
        "containerRuntimeEndpoint": f"unix://{d}/containerd.sock",
        "address": st.name, "port": st.port, "healthzBindAddress": st.name, "healthzPort": 0,
        "readOnlyPort": 0, "tlsCertFile": str(cert), "tlsPrivateKeyFile": str(key),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True, "cacheTTL": "1s"},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "1s",
                                                         "cacheUnauthorizedTTL": "1s"}},
        "nodeLeaseDurationSeconds": 12, "nodeStatusUpdateFrequency": "4s", "nodeStatusReportFrequency": "10s",
        "registerWithTaints": [{"key": REAL_NODE_TAINT, "effect": "NoSchedule"}],
        "clusterDNS": [], "resolvConf": str(d / "resolv.conf"),
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%", "nodefs.inodesFree": "0%",
                         "imagefs.available": "0%"},
        "evictionPressureTransitionPeriod": "5s",
        "oomScoreAdj": 0, "failSwapOn": False, "protectKernelDefaults": False,
        "podLogsDir": str(d / "pod-logs"), "volumePluginDir": str(d / "volume-plugins"),
        "serializeImagePulls": False, "maxPods": 20, "podPidsLimit": 1024,
        "syncFrequency": "5s", "fileCheckFrequency": "20s", "shutdownGracePeriod": "0s",
        "localStorageCapacityIsolation": True, "enableServer": True, "enableDebuggingHandlers": True,
        "containerLogMaxSize": "10Mi", "containerLogMaxFiles": 2,
    }, indent=1)


def hosts_toml() -> str:
    """Every registry a pull could name goes to a dead loopback port: a pull fails at once."""
    return f'server = "{DEAD_REGISTRY}"\n\n[host."{DEAD_REGISTRY}"]\n  capabilities = ["pull", "resolve"]\n'


# ------------------------------------------------------------------ one node
class RealNodes:
    """The real nodes of one bed: start after the control plane, stop before it."""

    def __init__(self, state_dir: Path, bin_dir: Path, start: Callable[..., int],
                 progress: Callable[[str], None] = print) -> None:
        self.state_dir = state_dir
        self.bin_dir = bin_dir
        self._start = start
        self.progress = progress

    def node_dir(self, name: str) -> Path:
        return self.state_dir / "nodes" / name

    def prepare(self, index: int, salt: int, port: int, runtime: noderuntime.NodeRuntime) -> NodeState:
        name = node_ip(index, salt)
        d = self.node_dir(name)
        for sub in ("containerd/root", "containerd/opt", "cni", "certs.d/_default", "kubelet", "pod-logs",
                    "volume-plugins", "pki"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        cgroup_root = f"{own_cgroup().rstrip('/')}/ce-k8s-node-{salt}-{index}"
        st = NodeState(name=name, index=index, dir=str(d), port=port, cgroup_root=cgroup_root)
        (d / "containerd.toml").write_text(containerd_config(runtime, d))
        (d / "cni" / "10-ce-k8s.conflist").write_text(cni_config(index))
        (d / "certs.d" / "_default" / "hosts.toml").write_text(hosts_toml())
        (d / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        return st

    def start_holder(self, st: NodeState) -> None:
        """The namespaces' owner: a private mount namespace with a fresh /run, and a network
        namespace with only `lo` up."""
        d = Path(st.dir)
        binds = []
        for host_dir, sub in HIDDEN_HOST_DIRS.items():
            (d / sub).mkdir(parents=True, exist_ok=True)
            binds.append(f"mount --bind {d / sub} {host_dir}")
        script = " && ".join(["mount -t tmpfs -o mode=0755,size=64m ce-k8s-node /run", *binds,
                              "ip link set lo up", "exec sleep infinity"])
        st.pids["holder"] = self._start(f"node-{st.index}-holder", [
            "unshare", "--mount", "--propagation", "private", "--net", "--", "sh", "-c", script])
        ns_before = mount_ns(os.getpid())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ns = mount_ns(st.pids["holder"])
            if ns and ns != ns_before and Path(f"/proc/{st.pids['holder']}/comm").read_text().strip() == "sleep":
                return
            time.sleep(0.05)
        raise RealNodeError(f"the namespace holder of node {st.name} did not come up; see {d}")

    def in_namespaces(self, st: NodeState, *, net: bool) -> list[str]:
        holder = st.pids["holder"]
        return ["nsenter", f"--target={holder}", "--mount", *(["--net"] if net else []), "--"]

    @staticmethod
    def runtime_env(runtime: noderuntime.NodeRuntime) -> dict[str, str]:
        return {"PATH": f"{runtime.root / 'usr' / 'bin'}:{runtime.root / 'usr' / 'sbin'}:/usr/sbin:/usr/bin:/sbin:/bin"}

    def start_containerd(self, st: NodeState, runtime: noderuntime.NodeRuntime) -> None:
        d = Path(st.dir)
        st.pids["containerd"] = self._start(f"node-{st.index}-containerd", [
            *self.in_namespaces(st, net=True), str(runtime.containerd), "--config", str(d / "containerd.toml"),
            "--log-level", "warn"], env=self.runtime_env(runtime))
        sock = d / "containerd.sock"
        deadline = time.monotonic() + 30
        while not sock.exists():
            if time.monotonic() > deadline:
                raise RealNodeError(f"containerd of node {st.name} did not open {sock}")
            time.sleep(0.05)
        for image, archive in runtime.images.items():
            self.import_image(st, runtime, image, archive, timeout=120)

    def import_image(self, st: NodeState, runtime: noderuntime.NodeRuntime, image: str, archive: Path,
                     timeout: float = 300) -> float:
        """`ctr images import --local` of one OCI archive into the node's containerd (its `k8s.io`
        namespace, the CRI's), inside the node's namespaces: no registry is asked. At start for the
        images every pod needs; later, on demand, for an image only some tests use (the pilot's:
        `KubeNodes.import_image`). Returns the seconds the import took."""
        started = time.monotonic()
        proc = subprocess.run([*self.in_namespaces(st, net=True), str(runtime.ctr), "--address",
                               str(Path(st.dir) / "containerd.sock"), "-n", "k8s.io", "images", "import", "--local",
                               str(archive)], capture_output=True, text=True, check=False, timeout=timeout,
                              env={**os.environ, **self.runtime_env(runtime)})
        if proc.returncode != 0:
            raise RealNodeError(f"importing {image} into node {st.name} failed: {proc.stderr.strip()}")
        return time.monotonic() - started

    def start_kubelet(self, st: NodeState, kubeconfig: Path, ca: Path, cert: Path, key: Path,
                      labels: dict[str, str]) -> None:
        d = Path(st.dir)
        (d / "kubelet.yaml").write_text(kubelet_config(st, ca, cert, key))
        label_arg = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        st.pids["kubelet"] = self._start(f"node-{st.index}-kubelet", [
            *self.in_namespaces(st, net=False), str(self.bin_dir / "kubelet"), f"--config={d / 'kubelet.yaml'}",
            f"--kubeconfig={kubeconfig}", f"--hostname-override={st.name}", f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'pki'}", f"--node-labels={label_arg}", "--v=1"])

    def crash(self, st: NodeState, timeout: float = 20.0) -> int:
        """The node lost outright, as in a power cut of its software: the kubelet, containerd, the
        shims and every container SIGKILLed at once, no SIGTERM anywhere, nothing told. The holder
        stays (the node's network namespace, and the pods' own, mounted under its /run: their
        addresses answer with a reset, as a rebooting machine's would), so the node can come back
        (`KubeNodes.return_real`). Returns how many processes were killed."""
        holder = st.pids["holder"]
        ns = mount_ns(holder)
        victims = {st.pids.get("kubelet"), st.pids.get("containerd"),
                   *(pids_in_mount_ns(ns) if ns else []),
                   *cgroup_pids(CGROUP_FS / "memory" / st.cgroup_root.strip("/"))} - {None, holder}
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for pid in victims:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0 if pid in (st.pids.get("kubelet"), st.pids.get("containerd")) else os.WNOHANG)
            while alive(pid):
                if time.monotonic() > deadline:
                    raise RealNodeError(f"pid {pid} of node {st.name} outlived SIGKILL for {timeout:.0f} s")
                time.sleep(0.05)
        for name in ("kubelet", "containerd"):
            st.pids.pop(name, None)
        (Path(st.dir) / "containerd.sock").unlink(missing_ok=True)    # so a restart waits for the new one
        return len(victims)

    def stop(self, st: NodeState) -> list[str]:
        """Stop one node and undo it: kubelet, containerd, shims and containers killed, cgroups
        removed, the namespaces gone with their holder. Returns what was left (empty: clean)."""
        ns = mount_ns(st.pids["holder"]) if "holder" in st.pids else None
        net = net_ns(st.pids["holder"]) if "holder" in st.pids else None
        for name in ("kubelet", "containerd"):
            if name in st.pids:
                terminate(st.pids[name], timeout=5)
        left = remove_cgroups(st.cgroup_root, st.cgroup_made)
        # What runs in the node's namespaces without being the node's: anything a bed started
        # there by nsenter (the VO pool and its SciTokens issuer live in the node's network
        # namespace, in mount namespaces of their own), which nobody else stops when the
        # owner of the bed was killed and its reaper runs this.
        strays = [*(pids_in_ns(ns, "mnt") if ns is not None and ns != mount_ns(os.getpid()) else []),
                  *(pids_in_ns(net, "net") if net is not None and net != net_ns(os.getpid()) else [])]
        for pid in strays:
            if pid != st.pids.get("holder"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if "holder" in st.pids:
            terminate(st.pids["holder"], timeout=5)
        shutil.rmtree(Path(st.dir) / "containerd", ignore_errors=True)
        shutil.rmtree(Path(st.dir) / "host", ignore_errors=True)
        return left


def node_state_dict(st: NodeState) -> dict[str, object]:
    return asdict(st)
