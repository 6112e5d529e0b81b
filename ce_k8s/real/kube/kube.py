"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok nodes and a kubelet stub, with the shipped manifests applied as a site would.

    ce-k8s testbed real-kube up|down|status [--kubernetes 1.37|1.36] [--nodes SPEC] [--state DIR]

Everything Kubernetes decides here is the real binaries' work, built from the Go module proxy by
:mod:`ce_k8s.real.kube.kubebuild`: admission (PodSecurity, LimitRanger, ResourceQuota, Priority,
ServiceAccount, DefaultTolerationSeconds, ...), RBAC, scheduling, garbage collection by owner
reference, the Eviction API, watch caches and their 410s. Only the kubelet is not real: kwok
(a kubernetes-sigs tool) plays each node and the pod lifecycle from the Stages of
:mod:`ce_k8s.real.kube.kwokstages`, and :mod:`ce_k8s.real.kube.kubeletstub` answers the two kubelet
endpoints kwok does not serve as ce-k8s needs them (`/stats/summary`, and `/containerLogs` with
each pod's own output). docs/real-kubernetes.md has the layout and what it confirmed.

* **Identities.** A static token file: `admin` (system:masters) for the bed itself, the
  controller manager, the scheduler, kwok and the stub. **The agent never gets it:** `up` applies
  `containers/k8s/base` (namespaces with their PodSecurity labels, RBAC, quota, LimitRange,
  PriorityClass) with `kubectl apply -k`, then asks the TokenRequest API for a token of the
  ServiceAccount `ce-k8s-system/ce-k8s-agent` and writes `<state>/kubeconfig` with that token only.
  `<state>/admin.kubeconfig` is the admin's.
* **TLS.** The API server writes its own serving certificate (`--cert-dir`) signed by a CA it
  makes; both kubeconfigs trust that CA. The kubelet stub's certificate is self-signed (the API
  server does not verify kubelets without `--kubelet-certificate-authority`, as on most clusters);
  the agent's direct Summary reads trust it as `CE_K8S_KUBELET_CA` (`<state>/pki/kubelet.crt`), and
  the stub authorises them as a webhook-mode kubelet does (TokenReview, then SubjectAccessReview
  for get nodes/stats).
* **State** lives in `<state>` (default /var/tmp/ce-k8s-real-kube): logs, pids, `state.json`.
  `down` stops every process it started and removes nothing else.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ce_k8s.real.kube import kubebuild, kubepki
from ce_k8s.real.kube.kubeclients import KubeClients
from ce_k8s.real.kube.kubelayout import (  # noqa: F401 - the bed's names, as its users import them
    ADMIN_TOKEN_FILE,
    AGENT_NAMESPACE,
    AGENT_SA,
    COMPONENT_USERS,
    DEFAULT_NODES,
    PILOT_NAMESPACE,
    KubeLayout,
    RealKubeError,
    State,
)
from ce_k8s.real.kube.kubenodes import NODE_LEASE_SECONDS, SPARE, SPARE_NODE, KubeNodes, free_port  # noqa: F401
from ce_k8s.real.kube.kubepki import TOLERATION_SECONDS  # noqa: F401
from ce_k8s.real.kube.kubeprocs import KubeProcesses
from ce_k8s.real.node.node import node_ip
from ce_k8s.real.processes import alive, terminate
from ce_k8s.real.sysctls import LEDGER

STATE_DIR = Path(os.environ.get("CE_K8S_REAL_KUBE_STATE", "/var/tmp/ce-k8s-real-kube"))  # noqa: S108
REPO = Path(__file__).resolve().parents[3]


def base_manifests() -> Path:
    """The shipped `containers/k8s/base`: from the source tree, else as installed in sys.prefix/share."""
    tree = REPO / "containers" / "k8s" / "base"
    if (REPO / "pyproject.toml").is_file() and tree.is_dir():
        return tree
    return Path(sys.prefix) / "share" / "ce-k8s" / "containers" / "k8s" / "base"


BASE_MANIFESTS = base_manifests()
NODE_MONITOR_GRACE = "8s"
# The order `down` stops the control plane in: what depends on the API server first, etcd last.
STOP_ORDER = ["kwok", "kwok-spare", "kubelet-stub", "kube-scheduler", "kube-controller-manager",
              "kube-apiserver", "etcd"]


def bed_salt(state_dir: Path) -> int:
    """A number of the bed's own (its state directory's), so two beds' real nodes never share a
    name, an address or a cgroup."""
    return int(hashlib.sha256(str(Path(state_dir).absolute()).encode()).hexdigest()[:6], 16)


class RealKube(KubeLayout):
    """One real control plane: `up()`, `down()`, `status()`, and what tests need to drive it.

    Its paths are the layout's (ce_k8s.real.kube.kubelayout); the work is done by parts given the
    layout: `processes` (start, wait, restart, stop), `clients` (kubectl, kubeconfigs, the site's
    manifests), `nodes` (the stub, kwok, the real nodes); the identities are ce_k8s.real.kube.kubepki's.
    """

    def __init__(self, state_dir: Path | str = STATE_DIR, minor: str = kubebuild.DEFAULT_MINOR,
                 sysctl_ledger: Path | str = LEDGER) -> None:
        """`sysctl_ledger`: the machine's (ce_k8s.real.sysctls) unless a test gives its bed a
        ledger of its own; `up` records it in the state, so `down` and the reaper use the same."""
        super().__init__(state_dir)
        self.minor = minor
        self.processes = KubeProcesses(self)
        self.clients = KubeClients(self)
        self.nodes = KubeNodes(self, self.clients, self.processes, sysctl_ledger)

    # ------------------------------------------------------------------ what tests and tools call
    def kubectl(self, *args: str, check: bool = True, timeout: float = 120,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        return self.clients.kubectl(*args, check=check, timeout=timeout, kubeconfig=kubeconfig)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path, duration: str = "2h") -> Path:
        """A kubeconfig with a TokenRequest token of ServiceAccount `namespace/name` (KubeClients')."""
        return self.clients.service_account_kubeconfig(namespace, name, path, duration)

    def apiserver_args(self, state: State, tokens: Path, sa_key: Path) -> list[str]:
        return kubepki.apiserver_args(self, state, tokens, sa_key)

    def register_nodes(self, specs, ports: dict[str, int]) -> None:
        """Create the Node objects kwok will manage, as a kubelet registers itself."""
        self.nodes.register(specs, ports)

    def lose_spare_node(self) -> None:
        """The spare node stops reporting, as when its kubelet or network dies: its kwok is stopped
        (SIGSTOP), so its lease and status are no longer renewed and its pods stay as they are.
        (Relabelling a node out of kwok's selection does not do it: kwok keeps heartbeating it.)"""
        self.nodes.lose_spare()

    def return_spare_node(self) -> None:
        """The spare node comes back: its kwok runs again (Ready, and it finishes deletions)."""
        self.nodes.return_spare()

    # ------------------------------------------------------------------ up
    def up(self, nodes: str = DEFAULT_NODES, time_scale: float = 0.05,
           progress: Callable[[str], None] = print, real_nodes: int = 0, owner_pid: int | None = None) -> State:
        """Build (cached) and start everything; idempotent when it is already up.

        `real_nodes` real kubelets (ce_k8s.real.node.node) join the kwok nodes: tainted
        `ce-k8s.test/real-node`, so only pods that tolerate it land there. With `owner_pid`, a
        reaper (ce_k8s.real.reaper) takes the bed down when that process dies without doing it."""
        current = self.state()
        if current is not None and self.processes.healthy(current) and len(current.real_nodes) == real_nodes:
            progress(f"already up: {current.server} (Kubernetes {current.version})")
            return current
        if current is not None:
            self.down(progress=progress)
        started = time.monotonic()
        bins = kubebuild.build(self.minor, progress=progress)
        runtime = None
        if real_nodes:
            from ce_k8s.real.node import noderuntime
            runtime = noderuntime.build(bins.version, progress=progress)
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)
        for sub in ("logs", "etcd", "apiserver", "pki"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o755)  # noqa: S103 - others read logs; tokens are 0600
        salt = bed_salt(self.state_dir)
        node_names = [node_ip(i + 1, salt) for i in range(real_nodes)]
        creds = kubepki.issue(self, node_names)

        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        kwok_ports = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        server = f"https://127.0.0.1:{api_port}"
        state = State(version=bins.version, bin=str(bins.bin), server=server, etcd=etcd_url, nodes=nodes,
                      time_scale=time_scale, started=time.time())
        state.save(self.state_file)
        try:
            if owner_pid is not None:
                state.pids["reaper"] = self.processes.start("reaper", [
                    sys.executable, "-m", "ce_k8s.real.reaper", "--bed", "kube", "--state", str(self.state_dir),
                    "--pid", str(owner_pid)])
            self._start_control_plane(state, bins, creds, etcd_peer, progress)
            progress("applying containers/k8s/base as a site would (kubectl apply -k)")
            self.clients.apply_site(BASE_MANIFESTS, state, self.processes)
            self.nodes.start_kwok(state, bins["kwok"], nodes, time_scale, kwok_ports, progress)
            if real_nodes:
                assert runtime is not None
                self.nodes.start_real(state, runtime, node_names, salt, progress)

            progress("issuing the agent's ServiceAccount token (TokenRequest)")
            self.clients.write_agent_kubeconfig(server)
        except Exception:
            progress("start failed; stopping what was started")
            self.down(progress=progress)
            raise
        progress(f"up in {time.monotonic() - started:.1f} s: {server}, agent kubeconfig {self.kubeconfig}")
        return state

    def _start_control_plane(self, state: State, bins: kubebuild.Binaries, creds: kubepki.Credentials,
                             etcd_peer: int, progress: Callable[[str], None]) -> None:
        """etcd, kube-apiserver, the controller manager and the scheduler, each waited for."""
        start = self.processes.start
        progress(f"starting etcd on {state.etcd}")
        state.pids["etcd"] = start("etcd", [
            bins["etcd"], "--name", "n0", "--data-dir", str(self.state_dir / "etcd"),
            "--listen-client-urls", state.etcd, "--advertise-client-urls", state.etcd,
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"n0=http://127.0.0.1:{etcd_peer}", "--unsafe-no-fsync",
            "--log-level", "warn"])
        state.save(self.state_file)
        self.processes.wait_etcd(state, 60)

        progress(f"starting kube-apiserver {bins.version} on {state.server}")
        state.pids["kube-apiserver"] = start("kube-apiserver", self.apiserver_args(state, creds.tokens, creds.sa_key))
        state.save(self.state_file)
        self.processes.wait_apiserver(state, 120)
        self.clients.write_control_plane_kubeconfigs(state.server, creds.admin)

        progress("starting kube-controller-manager and kube-scheduler")
        # --use-service-account-credentials: each controller acts as its own ServiceAccount
        # in kube-system, as kubeadm runs it, so RBAC judges each.
        state.pids["kube-controller-manager"] = start("kube-controller-manager", [
            bins["kube-controller-manager"], f"--kubeconfig={self.component_kubeconfig('kube-controller-manager')}",
            "--leader-elect=false", "--use-service-account-credentials",
            "--bind-address=127.0.0.1", "--secure-port=0", f"--service-account-private-key-file={creds.sa_key}",
            f"--root-ca-file={self.ca_file}", f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
            "--node-monitor-period=2s", "--controllers=*"])
        state.pids["kube-scheduler"] = start("kube-scheduler", [
            bins["kube-scheduler"], f"--kubeconfig={self.component_kubeconfig('kube-scheduler')}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"])
        state.save(self.state_file)

    # ------------------------------------------------------------------ restarts (tests)
    def restart(self, name: str, progress: Callable[[str], None] = print,
                while_stopped: Callable[[], None] | None = None) -> None:
        """Stop one component (SIGTERM, then SIGKILL) and start it again with the same arguments;
        `while_stopped` runs in between (bench/bench_real_kube.py compacts etcd there)."""
        self.processes.restart(name, progress, while_stopped)

    def stop_process(self, name: str) -> None:
        self.processes.stop(name)

    # ------------------------------------------------------------------ down / status
    def down(self, progress: Callable[[str], None] = print, reaper: bool = True) -> None:
        """Stop everything the bed started; the real nodes first, undone (ce_k8s.real.node.node).
        `reaper=False` when the reaper itself calls it (it must not stop itself half-way)."""
        st = self.state()
        if st is None:
            progress("nothing to stop")
            return
        if reaper and "reaper" in st.pids:
            terminate(st.pids["reaper"])          # the owner takes it down: nothing left to reap
        left = self.nodes.stop_real(st, progress)
        for name in sorted((n for n in st.pids if n != "reaper"),
                           key=lambda n: STOP_ORDER.index(n) if n in STOP_ORDER else -1):
            terminate(st.pids[name])
        self.state_file.unlink(missing_ok=True)
        progress(f"stopped {', '.join(st.pids) or 'nothing'}")
        if left:
            raise RealKubeError(f"down left behind: {', '.join(left)}")

    def status(self) -> dict[str, object]:
        st = self.state()
        if st is None:
            return {"up": False, "state": str(self.state_dir)}
        out: dict[str, object] = {"up": self.processes.healthy(st), "state": str(self.state_dir),
                                  "server": st.server, "kubernetes": st.version,
                                  "processes": {name: alive(pid) for name, pid in st.pids.items()},
                                  "kubeconfig": str(self.kubeconfig), "admin_kubeconfig": str(self.admin_kubeconfig)}
        if out["up"]:
            proc = self.kubectl("get", "nodes", "--no-headers", check=False)
            out["nodes"] = len(proc.stdout.splitlines())
        out["kwok_stage_errors"] = self.kwok_stage_errors()
        return out

    def kwok_stage_errors(self) -> int:
        """How often kwok could not apply a Stage (a template or expression error in ours)."""
        try:
            lines = self.log_file("kwok").read_text(errors="replace").splitlines()
        except OSError:
            return 0
        # A delete that finds the pod gone already (the API server removes a finished pod at once)
        # is a race kwok reports, not an error of our Stages.
        return sum(1 for line in lines if "failed to apply stage" in line and "not found" not in line)
