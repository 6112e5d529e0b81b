"""Where one real control plane lives: its state directory's files, its saved state, its names.

Every part of the bed (:mod:`ce_k8s.real.kube.kube` and the parts it is built of) and its readers
(the adapter :mod:`ce_k8s.real.kube.kubeserver`, the reaper, the tests) find the bed by its state
directory alone, so the paths are one class here and nothing else knows the layout.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

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


class RealKubeError(RuntimeError):
    """The control plane cannot be built or started; the message says what failed and where to look."""


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
    sysctls: dict[str, str] = field(default_factory=dict)  # the host's own, before any bed's kubelet
    sysctl_ledger: str = ""   # the machine's ledger this bed holds (ce_k8s.real.sysctls)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> State | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


class KubeLayout:
    """The files of one bed in its state directory (`up` writes them, everything else reads them)."""

    def __init__(self, state_dir: Path | str) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.state_file = self.state_dir / "state.json"

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

    def state(self) -> State | None:
        return State.load(self.state_file)

    def real_node_names(self) -> list[str]:
        st = self.state()
        return [n["name"] for n in st.real_nodes] if st else []

    def log_file(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def tail(self, name: str, lines: int = 15) -> str:
        """The last lines of a process's log, for an error that says why it did not start."""
        try:
            return "\n".join(self.log_file(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def token_file(self, user: str) -> Path:
        return self.state_dir / "pki" / (user.replace(":", "_") + ".token")

    def component_kubeconfig(self, component: str) -> Path:
        return self.state_dir / f"{component}.kubeconfig"

    def admin_token(self) -> str:
        return (self.state_dir / ADMIN_TOKEN_FILE).read_text().strip()
