"""The real control plane's clients: kubeconfigs for each identity, kubectl, a site's manifests.

The bed acts as a site would: it applies the shipped `containers/k8s/base` with `kubectl apply -k`
and gives the agent only a TokenRequest token of its ServiceAccount; the admin's kubeconfig is the
bed's own hands (and the tests').
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

from ce_k8s.real.kube.kubelayout import (
    AGENT_NAMESPACE,
    AGENT_SA,
    COMPONENT_USERS,
    PILOT_NAMESPACE,
    KubeLayout,
    RealKubeError,
    State,
)
from ce_k8s.real.kube.kubeprocs import KubeProcesses
from ce_k8s.real.node import pki


class KubeClients:
    """kubectl and the kubeconfigs of the bed in `layout`'s state directory."""

    def __init__(self, layout: KubeLayout) -> None:
        self.layout = layout

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        st = self.layout.state()
        if st is None:
            raise RealKubeError("the real control plane is not up (`ce-k8s testbed real-kube up`)")
        proc = subprocess.run([str(Path(st.bin) / "kubectl"), "--kubeconfig",
                               str(kubeconfig or self.layout.admin_kubeconfig), *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RealKubeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def write_kubeconfig(self, path: Path, server: str, token: str, user: str = "admin") -> None:
        import yaml

        # The CA inline, so the file works wherever it is copied (the real-HTCondor bed's root).
        ca = base64.b64encode(self.layout.ca_file.read_bytes()).decode()
        conf = {"apiVersion": "v1", "kind": "Config", "current-context": "real-kube",
                "clusters": [{"name": "real-kube", "cluster": {"server": server,
                                                               "certificate-authority-data": ca}}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": "real-kube", "context": {"cluster": "real-kube", "user": user}}]}
        path.write_text(yaml.safe_dump(conf, sort_keys=False))
        os.chmod(path, 0o600)

    def write_control_plane_kubeconfigs(self, server: str, admin: str) -> None:
        """The admin's (the bed's, kwok's and the stub's) and each component's, with its own user."""
        self.write_kubeconfig(self.layout.admin_kubeconfig, server, token=admin)
        for component, user in COMPONENT_USERS.items():
            self.write_kubeconfig(self.layout.component_kubeconfig(component), server,
                                  token=self.layout.token_file(user).read_text().strip(), user=user)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path, duration: str = "2h") -> Path:
        """A kubeconfig holding a TokenRequest token of ServiceAccount `namespace/name`: exactly the
        rights a site's manifests give it (the HTCJob operator's tests run on one)."""
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration}").stdout.strip()
        state = self.layout.state()
        if state is None:
            raise RealKubeError(f"no control plane is up in {self.layout.state_dir}")
        self.write_kubeconfig(Path(path), state.server, token=token, user=f"system:serviceaccount:{namespace}:{name}")
        return Path(path)

    def write_agent_kubeconfig(self, server: str) -> None:
        proc = self.kubectl("create", "token", AGENT_SA, "-n", AGENT_NAMESPACE, "--duration=48h")
        self.write_kubeconfig(self.layout.kubeconfig, server, token=proc.stdout.strip(),
                              user=f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SA}")

    def apply_site(self, manifests: Path, state: State, processes: KubeProcesses) -> None:
        """`kubectl apply -k` of the site's manifests, then until the controller manager has made
        the pilot namespace's default ServiceAccount (pods cannot be admitted before)."""
        self.kubectl("apply", "-k", str(manifests))
        processes.wait("the default ServiceAccount of ce-k8s-pilots",
                       lambda: self.kubectl("get", "serviceaccount", "default", "-n", PILOT_NAMESPACE,
                                            check=False).returncode == 0, 60,
                       state.pids["kube-controller-manager"], "kube-controller-manager")

    def allow_apiserver_kubelet_client(self) -> None:
        """The API server's kubelet client may call every kubelet API (logs, exec, stats), as on
        a kubeadm cluster; the kubelets ask the API server (webhook) whether it may."""
        self.kubectl("create", "clusterrolebinding", "ce-k8s-bed:apiserver-kubelet-client",
                     "--clusterrole=system:kubelet-api-admin", f"--user={pki.APISERVER_KUBELET_CLIENT}")
