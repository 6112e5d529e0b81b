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

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ce_k8s.real.condor.condor import _alive
from ce_k8s.real.kube import kubebuild, kwokstages
from ce_k8s.real.node import pki
from ce_k8s.real.node.node import REAL_NODE_LABEL, node_ip

log = logging.getLogger(__name__)

STATE_DIR = Path(os.environ.get("CE_K8S_REAL_KUBE_STATE", "/var/tmp/ce-k8s-real-kube"))  # noqa: S108
REPO = Path(__file__).resolve().parents[3]


def base_manifests() -> Path:
    """The shipped `containers/k8s/base`: from the source tree, else as installed in sys.prefix/share."""
    tree = REPO / "containers" / "k8s" / "base"
    if (REPO / "pyproject.toml").is_file() and tree.is_dir():
        return tree
    return Path(sys.prefix) / "share" / "ce-k8s" / "containers" / "k8s" / "base"


BASE_MANIFESTS = base_manifests()
# The demo's pools (ce_k8s.real.condor.condor.DEFAULT_NODES): CPU, GPU with its taint, whole-node.
DEFAULT_NODES = ("cpu:8x64c256g,"
                 "gpu:2x32c256g4gpu:taint=nvidia.com/gpu:NoSchedule:label=nvidia.com/gpu.present=true,"
                 "wholenode:2x64c256g:label=ce-k8s.htcondor.org/pool=wholenode")
ADMIN_TOKEN_FILE = "admin.token"  # noqa: S105 - a file name, not a secret
# The users the bootstrap RBAC policy binds for the control plane's components.
COMPONENT_USERS = {"kube-controller-manager": "system:kube-controller-manager",
                   "kube-scheduler": "system:kube-scheduler"}
AGENT_NAMESPACE = "ce-k8s-system"
AGENT_SA = "ce-k8s-agent"
PILOT_NAMESPACE = "ce-k8s-pilots"
# How long a lost node's pods keep running before the taint manager evicts them (the API server's
# DefaultTolerationSeconds admission adds these tolerations to every pod; 300 s by default).
TOLERATION_SECONDS = 10
NODE_MONITOR_GRACE = "8s"
# kwok renews a node's lease every quarter of its duration: 12 s renews every 3 s, well inside the
# grace period. With 40 s (a renewal every 10 s, the status heartbeat every 10 s) the node controller
# saw up to 8 s between signs of life, and on the loaded 2-core machine every node went NotReady for
# a moment (tainted, its pods unplaceable) several times a minute.
NODE_LEASE_SECONDS = 12
# A node no pilot is scheduled to (its taint), played by a kwok of its own, that tests can lose.
SPARE = "spare"
SPARE_NODE = f"{SPARE}:1x16c64g:taint=ce-k8s.test/spare:NoSchedule"


class RealKubeError(RuntimeError):
    """The control plane cannot be built or started; the message says what failed and where to look."""


def bed_salt(state_dir: Path) -> int:
    """A number of the bed's own (its state directory's), so two beds' real nodes never share a
    name, an address or a cgroup."""
    return int(hashlib.sha256(str(Path(state_dir).absolute()).encode()).hexdigest()[:6], 16)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class State:
    """What `up` started, kept in `<state>/state.json` so `down`, `status` and tests find it."""

    version: str
    bin: str
    server: str
    etcd: str
    pids: dict[str, int] = field(default_factory=dict)
    node_ports: dict[str, int] = field(default_factory=dict)
    nodes: str = DEFAULT_NODES
    time_scale: float = 0.05     # real seconds per simulated second of a scenario's `run=`
    started: float = 0.0
    real_nodes: list[dict] = field(default_factory=list)   # ce_k8s.real.node.node.NodeState of each real node
    sysctls: dict[str, str] = field(default_factory=dict)  # host values before the first kubelet, restored at down

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> State | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


class RealKube:
    """One real control plane: `up()`, `down()`, `status()`, and what tests need to drive it."""

    def __init__(self, state_dir: Path | str = STATE_DIR, minor: str = kubebuild.DEFAULT_MINOR) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.minor = minor
        self.state_file = self.state_dir / "state.json"

    # ------------------------------------------------------------------ paths
    @property
    def kubeconfig(self) -> Path:
        """The agent's kubeconfig: its ServiceAccount's token, nothing more."""
        return self.state_dir / "kubeconfig"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "apiserver" / "ca.crt"

    @property
    def kubelet_ca(self) -> Path:
        """The node CA (ce_k8s.real.node.pki): it signs the stub's and every real kubelet's serving
        certificate, so it is the agent's CE_K8S_KUBELET_CA here."""
        return self.state_dir / "pki" / "node-ca.crt"

    def real_node_names(self) -> list[str]:
        st = self.state()
        return [n["name"] for n in st.real_nodes] if st else []

    def state(self) -> State | None:
        return State.load(self.state_file)

    def log_file(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    # ------------------------------------------------------------------ processes
    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start one process of the bed in a session of its own, its output to <state>/logs/<name>.log."""
        logf = self.log_file(name)
        logf.parent.mkdir(parents=True, exist_ok=True)
        with open(logf, "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env={**os.environ, **(env or {})},
                                    cwd=self.state_dir)
        log.debug("started %s pid %d: %s", name, proc.pid, " ".join(argv))
        return proc.pid

    def _wait(self, what: str, check: Callable[[], bool], timeout: float, pid: int | None = None,
              name: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if pid is not None and not _alive(pid):
                tail = self._tail(name or what)
                raise RealKubeError(f"{what} exited while starting; last lines of {self.log_file(name or what)}:\n"
                                    f"{tail}")
            time.sleep(0.2)
        raise RealKubeError(f"{what} not ready after {timeout:.0f} s; see {self.log_file(name or what)}:\n"
                            f"{self._tail(name or what)}")

    def _tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _get(self, url: str, ctx: ssl.SSLContext | None = None, token: str | None = None,
             timeout: float = 3) -> tuple[int, bytes]:
        req = urllib.request.Request(url)  # noqa: S310 - loopback URLs we built
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:  # noqa: S310
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (OSError, urllib.error.URLError):
            return 0, b""

    def admin_token(self) -> str:
        return (self.state_dir / ADMIN_TOKEN_FILE).read_text().strip()

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        st = self.state()
        if st is None:
            raise RealKubeError("the real control plane is not up (`ce-k8s testbed real-kube up`)")
        proc = subprocess.run([str(Path(st.bin) / "kubectl"), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig),
                               *args], capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RealKubeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    # ------------------------------------------------------------------ up
    def up(self, nodes: str = DEFAULT_NODES, time_scale: float = 0.05,
           progress: Callable[[str], None] = print, real_nodes: int = 0, owner_pid: int | None = None) -> State:
        """Build (cached) and start everything; idempotent when it is already up.

        `real_nodes` real kubelets (ce_k8s.real.node.node) join the kwok nodes: tainted
        `ce-k8s.test/real-node`, so only pods that tolerate it land there. With `owner_pid`, a
        reaper (ce_k8s.real.kube.reaper) takes the bed down when that process dies without doing it."""
        current = self.state()
        if current is not None and self._healthy(current) and len(current.real_nodes) == real_nodes:
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
        admin = os.urandom(24).hex()
        (self.state_dir / ADMIN_TOKEN_FILE).write_text(admin + "\n")
        os.chmod(self.state_dir / ADMIN_TOKEN_FILE, 0o600)
        pkidir = self.state_dir / "pki"
        salt = bed_salt(self.state_dir)
        node_names = [node_ip(i + 1, salt) for i in range(real_nodes)]
        # Each component with the identity a cluster gives it: the controller manager and the
        # scheduler as the users the bootstrap RBAC binds, each real kubelet as system:node:<name>
        # in system:nodes (the Node authorizer and NodeRestriction judge it). The admin token is
        # the bed's own hands and the emulators' (kwok, the stub).
        identities = {"admin": ("admin", '"system:masters"'),
                      COMPONENT_USERS["kube-controller-manager"]: (COMPONENT_USERS["kube-controller-manager"], ""),
                      COMPONENT_USERS["kube-scheduler"]: (COMPONENT_USERS["kube-scheduler"], ""),
                      **{f"system:node:{n}": (f"system:node:{n}", '"system:nodes"') for n in node_names}}
        lines = [f"{admin},admin,admin,\"system:masters\""]
        for user, (_, groups) in identities.items():
            if user == "admin":
                continue
            token = os.urandom(24).hex()
            lines.append(f"{token},{user},{user},{groups}")
            self._token_file(user).write_text(token + "\n")
            os.chmod(self._token_file(user), 0o600)
        tokens = pkidir / "tokens.csv"
        tokens.write_text("\n".join(lines) + "\n")
        os.chmod(tokens, 0o600)
        sa_key = pkidir / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], capture_output=True, check=True)
        node_ca = pki.make_ca(pkidir, "node-ca")
        pki.issue(node_ca, pkidir, "kubelet", "ce-k8s-kubelet-stub", ips=("127.0.0.1",))
        pki.issue(node_ca, pkidir, pki.APISERVER_KUBELET_CLIENT, pki.APISERVER_KUBELET_CLIENT, client=True)
        for name in node_names:
            pki.issue(node_ca, pkidir, f"kubelet-{name}", f"system:node:{name}", org="system:nodes", ips=(name,))

        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        kwok_port, spare_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        server = f"https://127.0.0.1:{api_port}"
        state = State(version=bins.version, bin=str(bins.bin), server=server, etcd=etcd_url, nodes=nodes,
                      time_scale=time_scale, started=time.time())
        state.save(self.state_file)
        try:
            if owner_pid is not None:
                state.pids["reaper"] = self._start("reaper", [
                    sys.executable, "-m", "ce_k8s.real.kube.reaper", "--state", str(self.state_dir),
                    "--pid", str(owner_pid)])
            progress(f"starting etcd on {etcd_url}")
            state.pids["etcd"] = self._start("etcd", [
                bins["etcd"], "--name", "n0", "--data-dir", str(self.state_dir / "etcd"),
                "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                "--initial-cluster", f"n0=http://127.0.0.1:{etcd_peer}", "--unsafe-no-fsync",
                "--log-level", "warn"])
            state.save(self.state_file)
            self._wait("etcd", lambda: self._get(f"{etcd_url}/health")[0] == 200, 60, state.pids["etcd"])

            progress(f"starting kube-apiserver {bins.version} on {server}")
            state.pids["kube-apiserver"] = self._start("kube-apiserver", self.apiserver_args(state, tokens, sa_key))
            state.save(self.state_file)
            self._wait_apiserver(state, 120)
            self._write_kubeconfig(self.admin_kubeconfig, server, token=admin)
            kcm = self.state_dir / "admin.kubeconfig"     # kwok's and the stub's (they play kubelets)
            for component, user in COMPONENT_USERS.items():
                self._write_kubeconfig(self.component_kubeconfig(component), server,
                                       token=self._token_file(user).read_text().strip(), user=user)

            progress("starting kube-controller-manager and kube-scheduler")
            # --use-service-account-credentials: each controller acts as its own ServiceAccount
            # in kube-system, as kubeadm runs it, so RBAC judges each.
            state.pids["kube-controller-manager"] = self._start("kube-controller-manager", [
                bins["kube-controller-manager"], f"--kubeconfig={self.component_kubeconfig('kube-controller-manager')}",
                "--leader-elect=false", "--use-service-account-credentials",
                "--bind-address=127.0.0.1", "--secure-port=0", f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={self.ca_file}", f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                "--node-monitor-period=2s", "--controllers=*"])
            state.pids["kube-scheduler"] = self._start("kube-scheduler", [
                bins["kube-scheduler"], f"--kubeconfig={self.component_kubeconfig('kube-scheduler')}",
                "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"])
            state.save(self.state_file)

            progress("applying containers/k8s/base as a site would (kubectl apply -k)")
            self.kubectl("apply", "-k", str(BASE_MANIFESTS))
            self._wait("the default ServiceAccount of ce-k8s-pilots",
                       lambda: self.kubectl("get", "serviceaccount", "default", "-n", PILOT_NAMESPACE,
                                            check=False).returncode == 0, 60,
                       state.pids["kube-controller-manager"], "kube-controller-manager")

            from ce_k8s.sim.kube.cluster import parse_nodes

            specs = parse_nodes(nodes) + parse_nodes(SPARE_NODE)
            state.node_ports = {spec.name: free_port() for spec in specs}
            state.save(self.state_file)
            progress(f"starting the kubelet stub for {len(specs)} nodes")
            state.pids["kubelet-stub"] = self._start("kubelet-stub", [
                sys.executable, "-m", "ce_k8s.real.kube.kubeletstub", "--state", str(self.state_dir)])
            state.save(self.state_file)
            stub_ctx = ssl._create_unverified_context()  # noqa: S323 - the stub's self-signed certificate
            first = next(iter(state.node_ports.values()))
            self._wait("kubelet-stub", lambda: self._get(f"https://127.0.0.1:{first}/healthz", stub_ctx)[0] == 200,
                       30, state.pids["kubelet-stub"])

            progress("starting kwok and registering nodes")
            stages = self.state_dir / "kwok.yaml"
            stages.write_text(kwokstages.stages(time_scale))
            # Two kwok processes: one plays the pools, the other only the spare node a test can
            # lose (its kwok stopped: the node's kubelet gone, as far as the cluster can tell).
            for name, manages, port in (("kwok", "true", kwok_port), ("kwok-spare", "spare", spare_port)):
                state.pids[name] = self._start(name, [
                    bins["kwok"], f"--kubeconfig={kcm}", f"--config={stages}",
                    f"--manage-nodes-with-label-selector={kwokstages.MANAGED_LABEL}={manages}",
                    "--node-ip=127.0.0.1", f"--node-port={port}", f"--server-address=127.0.0.1:{port}",
                    f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}"])
            state.save(self.state_file)
            self.register_nodes(specs, state.node_ports)
            self._wait("kwok", lambda: self._nodes_ready(len(specs)), 90, state.pids["kwok"])
            if real_nodes:
                assert runtime is not None
                self._start_real_nodes(state, runtime, node_names, salt, progress)

            progress("issuing the agent's ServiceAccount token (TokenRequest)")
            self._write_agent_kubeconfig(server)
        except Exception:
            progress("start failed; stopping what was started")
            self.down(progress=progress)
            raise
        progress(f"up in {time.monotonic() - started:.1f} s: {server}, agent kubeconfig {self.kubeconfig}")
        return state

    def apiserver_args(self, state: State, tokens: Path, sa_key: Path) -> list[str]:
        port = state.server.rsplit(":", 1)[1]
        return [
            str(Path(state.bin) / "kube-apiserver"),
            f"--etcd-servers={state.etcd}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            # A loopback advertise address is refused by the endpoint reconciler ("may not be in the
            # loopback range"): nothing in the bed reaches the API through the `kubernetes` Service.
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--cert-dir={self.state_dir / 'apiserver'}",
            f"--token-auth-file={tokens}", "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            # The API server verifies each kubelet's serving certificate and presents its own
            # client certificate, both of the node CA (ce_k8s.real.node.pki).
            f"--kubelet-certificate-authority={self.kubelet_ca}",
            f"--kubelet-client-certificate={self.state_dir / 'pki' / (pki.APISERVER_KUBELET_CLIENT + '.crt')}",
            f"--kubelet-client-key={self.state_dir / 'pki' / (pki.APISERVER_KUBELET_CLIENT + '.key')}",
            "--enable-admission-plugins=NodeRestriction",
            f"--default-not-ready-toleration-seconds={TOLERATION_SECONDS}",
            f"--default-unreachable-toleration-seconds={TOLERATION_SECONDS}",
            f"--audit-policy-file={self._audit_policy()}", f"--audit-log-path={self.state_dir / 'audit.log'}",
            "--audit-log-format=json", "--audit-log-mode=blocking",
            "--profiling=false", "--v=1"]

    def _token_file(self, user: str) -> Path:
        return self.state_dir / "pki" / (user.replace(":", "_") + ".token")

    def component_kubeconfig(self, component: str) -> Path:
        return self.state_dir / f"{component}.kubeconfig"

    def _start_real_nodes(self, state: State, runtime, names: list[str], salt: int,
                          progress: Callable[[str], None]) -> None:
        """Start each real node (ce_k8s.real.node.node) and wait until the API server has it Ready."""
        from ce_k8s.real.node.node import RealNodes, make_cgroup_root, node_state_dict, read_sysctls

        # The API server's kubelet client may call every kubelet API (logs, exec, stats), as on
        # a kubeadm cluster; the kubelets ask the API server (webhook) whether it may.
        self.kubectl("create", "clusterrolebinding", "ce-k8s-bed:apiserver-kubelet-client",
                     "--clusterrole=system:kubelet-api-admin", f"--user={pki.APISERVER_KUBELET_CLIENT}")
        if not state.sysctls:
            state.sysctls = read_sysctls()
            state.save(self.state_file)
        nodes = RealNodes(self.state_dir, Path(state.bin), self._start, progress)
        for index, name in enumerate(names, start=1):
            st = nodes.prepare(index, salt, free_port(name), runtime)
            state.real_nodes.append(node_state_dict(st))

            def save(st=st) -> None:      # after each step, so a failed start can be undone
                state.real_nodes[-1] = node_state_dict(st)
                state.save(self.state_file)

            st.cgroup_made = make_cgroup_root(st.cgroup_root)
            save()
            progress(f"starting real node {name}: containerd 2 + runc in namespaces of its own, then the kubelet")
            nodes.start_holder(st)
            save()
            nodes.start_containerd(st, runtime)
            save()
            user = f"system:node:{name}"
            kubeconfig = Path(st.dir) / "kubelet.kubeconfig"
            self._write_kubeconfig(kubeconfig, state.server, token=self._token_file(user).read_text().strip(),
                                   user=user)
            pkidir = self.state_dir / "pki"
            nodes.start_kubelet(st, kubeconfig, self.kubelet_ca, pkidir / f"kubelet-{name}.crt",
                                pkidir / f"kubelet-{name}.key", {REAL_NODE_LABEL: "true"})
            save()
        self._wait("the real nodes", lambda: self._named_nodes_ready(names), 120,
                   state.real_nodes[-1]["pids"]["kubelet"], f"node-{len(names)}-kubelet")

    def _named_nodes_ready(self, names: list[str]) -> bool:
        proc = self.kubectl("get", "nodes", *names, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        doc = json.loads(proc.stdout)
        items = doc.get("items", [doc])          # one name gives the object itself, not a List
        ready = [n for n in items for c in n.get("status", {}).get("conditions", [])
                 if c["type"] == "Ready" and c["status"] == "True"]
        return len(ready) == len(names)

    def _audit_policy(self) -> Path:
        """Audit the agent's ServiceAccount only (ce_k8s.real.kube.kubeserver counts its calls from it)."""
        path = self.state_dir / "pki" / "audit-policy.yaml"
        path.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n"
                        f"- level: Metadata\n  users: [\"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SA}\"]\n"
                        "- level: None\n")
        return path

    def _wait_apiserver(self, state: State, timeout: float) -> None:
        def ready() -> bool:
            ctx = ssl._create_unverified_context()  # noqa: S323 - before the CA file exists
            return self._get(f"{state.server}/readyz", ctx, token=self.admin_token())[0] == 200
        self._wait("kube-apiserver", ready, timeout, state.pids["kube-apiserver"])
        if not self.ca_file.exists():
            self._extract_ca()

    def _extract_ca(self) -> None:
        """The API server's self-signed serving cert is `apiserver.crt` followed by its CA; keep the CA."""
        pem = (self.state_dir / "apiserver" / "apiserver.crt").read_text()
        blocks = [b + "-----END CERTIFICATE-----\n" for b in pem.split("-----END CERTIFICATE-----") if "BEGIN" in b]
        self.ca_file.write_text(blocks[-1].lstrip())

    def _write_kubeconfig(self, path: Path, server: str, token: str, user: str = "admin") -> None:
        import base64

        import yaml

        # The CA inline, so the file works wherever it is copied (the real-HTCondor bed's root).
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        conf = {"apiVersion": "v1", "kind": "Config", "current-context": "real-kube",
                "clusters": [{"name": "real-kube", "cluster": {"server": server,
                                                               "certificate-authority-data": ca}}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": "real-kube", "context": {"cluster": "real-kube", "user": user}}]}
        path.write_text(yaml.safe_dump(conf, sort_keys=False))
        os.chmod(path, 0o600)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path, duration: str = "2h") -> Path:
        """A kubeconfig holding a TokenRequest token of ServiceAccount `namespace/name`: exactly the
        rights a site's manifests give it (the HTCJob operator's tests run on one)."""
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration}").stdout.strip()
        state = self.state()
        if state is None:
            raise RealKubeError(f"no control plane is up in {self.state_dir}")
        self._write_kubeconfig(Path(path), state.server, token=token, user=f"system:serviceaccount:{namespace}:{name}")
        return Path(path)

    def _write_agent_kubeconfig(self, server: str) -> None:
        proc = self.kubectl("create", "token", AGENT_SA, "-n", AGENT_NAMESPACE, "--duration=48h")
        self._write_kubeconfig(self.kubeconfig, server, token=proc.stdout.strip(),
                               user=f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SA}")

    def register_nodes(self, specs, ports: dict[str, int]) -> None:
        """Create the Node objects kwok will manage, as a kubelet registers itself."""
        docs = []
        for spec in specs:
            node = spec.manifest()
            meta = node.setdefault("metadata", {})
            meta.setdefault("annotations", {}).update({
                kwokstages.KUBELET_PORT: str(ports[spec.name]), "node.alpha.kubernetes.io/ttl": "0"})
            spare = spec.name.startswith("spare-")
            meta.setdefault("labels", {}).update({"type": "kwok",
                                                  kwokstages.MANAGED_LABEL: "spare" if spare else "true"})
            node.pop("status", None)
            node["status"] = {"capacity": spec.capacity(), "allocatable": spec.capacity()}
            docs.append(node)
        path = self.state_dir / "nodes.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
        self.kubectl("create", "-f", str(path))

    def _nodes_ready(self, count: int) -> bool:
        proc = self.kubectl("get", "nodes", "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        ready = 0
        for node in json.loads(proc.stdout).get("items", []):
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            ready += conds.get("Ready") == "True"
        return ready >= count

    def _healthy(self, st: State) -> bool:
        if not all(_alive(pid) for pid in st.pids.values()):
            return False
        ctx = ssl._create_unverified_context()  # noqa: S323 - a health probe of our own server
        try:
            token = self.admin_token()
        except OSError:
            return False
        return self._get(f"{st.server}/readyz", ctx, token=token)[0] == 200

    # ------------------------------------------------------------------ restarts (tests)
    def restart(self, name: str, progress: Callable[[str], None] = print,
                while_stopped: Callable[[], None] | None = None) -> None:
        """Stop one component (SIGTERM, then SIGKILL) and start it again with the same arguments;
        `while_stopped` runs in between (bench/bench_real_kube.py compacts etcd there)."""
        st = self.state()
        if st is None or name not in st.pids:
            raise RealKubeError(f"{name} is not running in this bed")
        argv = Path(f"/proc/{st.pids[name]}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        self.stop_process(name)
        if while_stopped is not None:
            while_stopped()
        st.pids[name] = self._start(name, [a.decode() for a in argv])
        st.save(self.state_file)
        if name == "etcd":
            self._wait("etcd", lambda: self._get(f"{st.etcd}/health")[0] == 200, 60, st.pids["etcd"])
        elif name == "kube-apiserver":
            self._wait_apiserver(st, 120)
        progress(f"restarted {name} (pid {st.pids[name]})")

    def lose_spare_node(self) -> None:
        """The spare node stops reporting, as when its kubelet or network dies: its kwok is stopped
        (SIGSTOP), so its lease and status are no longer renewed and its pods stay as they are.
        (Relabelling a node out of kwok's selection does not do it: kwok keeps heartbeating it.)"""
        st = self.state()
        assert st is not None
        os.kill(st.pids["kwok-spare"], signal.SIGSTOP)

    def return_spare_node(self) -> None:
        """The spare node comes back: its kwok runs again (Ready, and it finishes deletions)."""
        st = self.state()
        assert st is not None
        os.kill(st.pids["kwok-spare"], signal.SIGCONT)

    def stop_process(self, name: str) -> None:
        st = self.state()
        if st is None or name not in st.pids:
            return
        _terminate(st.pids[name])

    # ------------------------------------------------------------------ down / status
    def down(self, progress: Callable[[str], None] = print, reaper: bool = True) -> None:
        """Stop everything the bed started; the real nodes first, undone (ce_k8s.real.node.node).
        `reaper=False` when the reaper itself calls it (it must not stop itself half-way)."""
        st = self.state()
        if st is None:
            progress("nothing to stop")
            return
        if reaper and "reaper" in st.pids:
            _terminate(st.pids["reaper"])          # the owner takes it down: nothing left to reap
        left = self._stop_real_nodes(st, progress)
        order = ["kwok", "kwok-spare", "kubelet-stub", "kube-scheduler", "kube-controller-manager",
                 "kube-apiserver", "etcd"]
        for name in sorted((n for n in st.pids if n != "reaper"), key=lambda n: order.index(n) if n in order else -1):
            _terminate(st.pids[name])
        self.state_file.unlink(missing_ok=True)
        progress(f"stopped {', '.join(st.pids) or 'nothing'}")
        if left:
            raise RealKubeError(f"down left behind: {', '.join(left)}")

    def _stop_real_nodes(self, st: State, progress: Callable[[str], None]) -> list[str]:
        """Stop every real node, then give the host its sysctls back (every time, also after a
        failed start: they are saved before the first kubelet runs)."""
        if not st.real_nodes and not st.sysctls:
            return []
        from ce_k8s.real.node.node import NodeState, RealNodes, write_sysctls

        nodes = RealNodes(self.state_dir, Path(st.bin), self._start, progress)
        left: list[str] = []
        for raw in st.real_nodes:
            left += nodes.stop(NodeState(**raw))
        if st.sysctls:
            write_sysctls(st.sysctls)
        progress(f"stopped {len(st.real_nodes)} real node(s); host sysctls restored")
        return left

    def status(self) -> dict[str, object]:
        st = self.state()
        if st is None:
            return {"up": False, "state": str(self.state_dir)}
        alive = {name: _alive(pid) for name, pid in st.pids.items()}
        out: dict[str, object] = {"up": self._healthy(st), "state": str(self.state_dir), "server": st.server,
                                  "kubernetes": st.version, "processes": alive,
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


def _terminate(pid: int, timeout: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        os.killpg(pid, signal.SIGCONT)      # a stopped process (a lost node's kwok) must see it
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
