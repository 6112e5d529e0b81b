"""The real control plane's identities and certificates, and the API server flags that name them.

Each component gets the identity a cluster gives it (a token of the static token file, a
certificate of the node CA for the kubelets and the API server's kubelet client); the audit
policy records the agent's ServiceAccount only, which ce_k8s.real.kube.kubeserver counts.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ce_k8s.real.kube.kubelayout import (
    ADMIN_TOKEN_FILE,
    AGENT_NAMESPACE,
    AGENT_SA,
    COMPONENT_USERS,
    KubeLayout,
    State,
)
from ce_k8s.real.node import pki

# How long a lost node's pods keep running before the taint manager evicts them (the API server's
# DefaultTolerationSeconds admission adds these tolerations to every pod; 300 s by default).
TOLERATION_SECONDS = 10


@dataclass(frozen=True)
class Credentials:
    """What `issue` made: the admin's token, the API server's token file and ServiceAccount key."""

    admin: str
    tokens: Path
    sa_key: Path


def issue(layout: KubeLayout, node_names: list[str]) -> Credentials:
    """Tokens for the admin, the controller manager, the scheduler and each real kubelet; the
    ServiceAccount signing key; the node CA with the stub's, the API server's kubelet client and
    each real kubelet's certificates. Secrets 0600, in `<state>/pki`."""
    pkidir = layout.state_dir / "pki"
    admin = os.urandom(24).hex()
    (layout.state_dir / ADMIN_TOKEN_FILE).write_text(admin + "\n")
    os.chmod(layout.state_dir / ADMIN_TOKEN_FILE, 0o600)
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
        layout.token_file(user).write_text(token + "\n")
        os.chmod(layout.token_file(user), 0o600)
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
    return Credentials(admin, tokens, sa_key)


def extract_ca(layout: KubeLayout) -> None:
    """The API server's self-signed serving cert is `apiserver.crt` followed by its CA; keep the CA."""
    pem = (layout.state_dir / "apiserver" / "apiserver.crt").read_text()
    blocks = [b + "-----END CERTIFICATE-----\n" for b in pem.split("-----END CERTIFICATE-----") if "BEGIN" in b]
    layout.ca_file.write_text(blocks[-1].lstrip())


def audit_policy(layout: KubeLayout) -> Path:
    """Audit the agent's ServiceAccount only (ce_k8s.real.kube.kubeserver counts its calls from it)."""
    path = layout.state_dir / "pki" / "audit-policy.yaml"
    path.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n"
                    f"- level: Metadata\n  users: [\"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SA}\"]\n"
                    "- level: None\n")
    return path


def apiserver_args(layout: KubeLayout, state: State, tokens: Path, sa_key: Path) -> list[str]:
    """kube-apiserver's command line for the bed: loopback, these identities, audit of the agent."""
    port = state.server.rsplit(":", 1)[1]
    return [
        str(Path(state.bin) / "kube-apiserver"),
        f"--etcd-servers={state.etcd}", "--bind-address=127.0.0.1", f"--secure-port={port}",
        # A loopback advertise address is refused by the endpoint reconciler ("may not be in the
        # loopback range"): nothing in the bed reaches the API through the `kubernetes` Service.
        "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
        f"--cert-dir={layout.state_dir / 'apiserver'}",
        f"--token-auth-file={tokens}", "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
        "--service-cluster-ip-range=10.96.0.0/24",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        # The API server verifies each kubelet's serving certificate and presents its own
        # client certificate, both of the node CA (ce_k8s.real.node.pki).
        f"--kubelet-certificate-authority={layout.kubelet_ca}",
        f"--kubelet-client-certificate={layout.state_dir / 'pki' / (pki.APISERVER_KUBELET_CLIENT + '.crt')}",
        f"--kubelet-client-key={layout.state_dir / 'pki' / (pki.APISERVER_KUBELET_CLIENT + '.key')}",
        "--enable-admission-plugins=NodeRestriction",
        f"--default-not-ready-toleration-seconds={TOLERATION_SECONDS}",
        f"--default-unreachable-toleration-seconds={TOLERATION_SECONDS}",
        f"--audit-policy-file={audit_policy(layout)}", f"--audit-log-path={layout.state_dir / 'audit.log'}",
        "--audit-log-format=json", "--audit-log-mode=blocking",
        "--profiling=false", "--v=1"]
