"""The real control plane's nodes: kwok's (with the kubelet stub) and the real kubelets.

kwok plays the node pools and a spare node a test can lose (a kwok of its own, stopped with
SIGSTOP); the stub answers their kubelet endpoints; real nodes (ce_k8s.real.node.node) join them,
tainted, for the tests that need a real kubelet.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable
from pathlib import Path

from ce_k8s.real.kube import kwokstages
from ce_k8s.real.kube.kubeclients import KubeClients
from ce_k8s.real.kube.kubelayout import KubeLayout, RealKubeError, State
from ce_k8s.real.kube.kubeprocs import KubeProcesses, http_get
from ce_k8s.real.node.node import (
    REAL_NODE_LABEL,
    NodeState,
    RealNodes,
    make_cgroup_root,
    node_state_dict,
)
from ce_k8s.real.sysctls import LEDGER, SysctlLedger

# kwok renews a node's lease every quarter of its duration: 12 s renews every 3 s, well inside the
# grace period. With 40 s (a renewal every 10 s, the status heartbeat every 10 s) the node controller
# saw up to 8 s between signs of life, and on the loaded 2-core machine every node went NotReady for
# a moment (tainted, its pods unplaceable) several times a minute.
NODE_LEASE_SECONDS = 12
# A node no pilot is scheduled to (its taint), played by a kwok of its own, that tests can lose.
SPARE = "spare"
SPARE_NODE = f"{SPARE}:1x16c64g:taint=ce-k8s.test/spare:NoSchedule"


#: The real-HTCondor bed's fixed ports (`fixed_ports` in ce_k8s.real.condor; tests/real/condor/test_ports.py
#: keeps the two equal). These machines' ephemeral range covers them, so a `bind` to port 0 may give
#: one while no condor bed has it reserved, and a component of ours listening there would keep a
#: condor bed from coming up beside this one for the bed's whole life.
CONDOR_BED_PORTS = frozenset({19618, 9619, 19643})


def free_port(host: str = "127.0.0.1") -> int:
    """A port for a component to listen on: the kernel's choice, never a condor bed's (one it gives
    stays bound until another comes, so it cannot be given again)."""
    refused: list[socket.socket] = []
    try:
        while True:
            s = socket.socket()
            s.bind((host, 0))
            port = s.getsockname()[1]
            if port not in CONDOR_BED_PORTS:
                s.close()
                return port
            refused.append(s)
    finally:
        for s in refused:
            s.close()


class KubeNodes:
    """Starts, registers, loses and stops the nodes of the bed in `layout`'s state directory."""

    def __init__(self, layout: KubeLayout, clients: KubeClients, processes: KubeProcesses,
                 sysctl_ledger: Path | str = LEDGER) -> None:
        self.layout = layout
        self.clients = clients
        self.processes = processes
        self.sysctl_ledger = Path(sysctl_ledger)

    def start_kwok(self, state: State, kwok: str, nodes: str, time_scale: float, ports: tuple[int, int],
                   progress: Callable[[str], None]) -> None:
        """The kubelet stub, both kwoks and the Node objects they manage, until all are Ready."""
        from ce_k8s.sim.kube.cluster import parse_nodes

        specs = parse_nodes(nodes) + parse_nodes(SPARE_NODE)
        state.node_ports = {spec.name: free_port() for spec in specs}
        state.save(self.layout.state_file)
        progress(f"starting the kubelet stub for {len(specs)} nodes")
        state.pids["kubelet-stub"] = self.processes.start("kubelet-stub", [
            sys.executable, "-m", "ce_k8s.real.kube.kubeletstub", "--state", str(self.layout.state_dir)])
        state.save(self.layout.state_file)
        stub_ctx = ssl._create_unverified_context()  # noqa: S323 - the stub's self-signed certificate
        first = next(iter(state.node_ports.values()))
        self.processes.wait("kubelet-stub", lambda: http_get(f"https://127.0.0.1:{first}/healthz", stub_ctx)[0] == 200,
                            30, state.pids["kubelet-stub"])

        progress("starting kwok and registering nodes")
        stages = self.layout.state_dir / "kwok.yaml"
        stages.write_text(kwokstages.stages(time_scale))
        kubeconfig = self.layout.admin_kubeconfig     # kwok's and the stub's (they play kubelets)
        # Two kwok processes: one plays the pools, the other only the spare node a test can
        # lose (its kwok stopped: the node's kubelet gone, as far as the cluster can tell).
        for name, manages, port in (("kwok", "true", ports[0]), ("kwok-spare", "spare", ports[1])):
            state.pids[name] = self.processes.start(name, [
                kwok, f"--kubeconfig={kubeconfig}", f"--config={stages}",
                f"--manage-nodes-with-label-selector={kwokstages.MANAGED_LABEL}={manages}",
                "--node-ip=127.0.0.1", f"--node-port={port}", f"--server-address=127.0.0.1:{port}",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}"])
        state.save(self.layout.state_file)
        self.register(specs, state.node_ports)
        self.processes.wait("kwok", lambda: self.ready(len(specs)), 90, state.pids["kwok"])

    def register(self, specs, ports: dict[str, int]) -> None:
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
        path = self.layout.state_dir / "nodes.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
        self.clients.kubectl("create", "-f", str(path))

    def ready(self, count: int) -> bool:
        """Whether at least `count` nodes are Ready."""
        proc = self.clients.kubectl("get", "nodes", "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        ready = 0
        for node in json.loads(proc.stdout).get("items", []):
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            ready += conds.get("Ready") == "True"
        return ready >= count

    def named_ready(self, names: list[str]) -> bool:
        """Whether every node of `names` is Ready."""
        proc = self.clients.kubectl("get", "nodes", *names, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        doc = json.loads(proc.stdout)
        items = doc.get("items", [doc])          # one name gives the object itself, not a List
        ready = [n for n in items for c in n.get("status", {}).get("conditions", [])
                 if c["type"] == "Ready" and c["status"] == "True"]
        return len(ready) == len(names)

    def lose_spare(self) -> None:
        """The spare node stops reporting: its kwok is stopped (SIGSTOP)."""
        st = self.layout.state()
        assert st is not None
        os.kill(st.pids["kwok-spare"], signal.SIGSTOP)

    def return_spare(self) -> None:
        """The spare node comes back: its kwok runs again (SIGCONT)."""
        st = self.layout.state()
        assert st is not None
        os.kill(st.pids["kwok-spare"], signal.SIGCONT)

    def start_real(self, state: State, runtime, names: list[str], salt: int,
                   progress: Callable[[str], None]) -> None:
        """Start each real node (ce_k8s.real.node.node) and wait until the API server has it Ready."""

        self.clients.allow_apiserver_kubelet_client()
        if not state.sysctl_ledger:
            # Named in the state before the hold, so a `down` after any failure releases it.
            state.sysctl_ledger = str(self.sysctl_ledger)
            state.save(self.layout.state_file)
            state.sysctls = SysctlLedger(self.sysctl_ledger).hold(str(self.layout.state_file))
            state.save(self.layout.state_file)
        nodes = RealNodes(self.layout.state_dir, Path(state.bin), self.processes.start, progress)
        for index, name in enumerate(names, start=1):
            st = nodes.prepare(index, salt, free_port(name), runtime)
            state.real_nodes.append(node_state_dict(st))

            def save(st=st) -> None:      # after each step, so a failed start can be undone
                state.real_nodes[-1] = node_state_dict(st)
                state.save(self.layout.state_file)

            st.cgroup_made = make_cgroup_root(st.cgroup_root)
            save()
            progress(f"starting real node {name}: containerd 2 + runc in namespaces of its own, then the kubelet")
            nodes.start_holder(st)
            save()
            nodes.start_containerd(st, runtime)
            save()
            user = f"system:node:{name}"
            self.clients.write_kubeconfig(Path(st.dir) / "kubelet.kubeconfig", state.server,
                                          token=self.layout.token_file(user).read_text().strip(), user=user)
            self._start_kubelet(nodes, st)
            save()
        self.processes.wait("the real nodes", lambda: self.named_ready(names), 120,
                            state.real_nodes[-1]["pids"]["kubelet"], f"node-{len(names)}-kubelet")

    def _start_kubelet(self, nodes: RealNodes, st: NodeState) -> None:
        pkidir = self.layout.state_dir / "pki"
        nodes.start_kubelet(st, Path(st.dir) / "kubelet.kubeconfig", self.layout.kubelet_ca,
                            pkidir / f"kubelet-{st.name}.crt", pkidir / f"kubelet-{st.name}.key",
                            {REAL_NODE_LABEL: "true"})

    def _state_with_real_node(self, index: int) -> State:
        state = self.layout.state()
        if state is None or not 1 <= index <= len(state.real_nodes):
            have = 0 if state is None else len(state.real_nodes)
            raise RealKubeError(f"the bed in {self.layout.state_dir} has no real node {index} (it has {have})")
        return state

    def lose_real(self, index: int = 1, progress: Callable[[str], None] = print) -> None:
        """Real node `index` is lost outright: its kubelet, containerd, shims and containers
        SIGKILLed at once (ce_k8s.real.node.node.RealNodes.crash); the API server hears nothing."""

        state = self._state_with_real_node(index)
        st = NodeState(**state.real_nodes[index - 1])
        killed = RealNodes(self.layout.state_dir, Path(state.bin), self.processes.start, progress).crash(st)
        state.real_nodes[index - 1] = node_state_dict(st)
        state.save(self.layout.state_file)
        progress(f"real node {st.name} lost: {killed} processes SIGKILLed (kubelet, containerd, shims, containers)")

    def return_real(self, index: int = 1, progress: Callable[[str], None] = print) -> None:
        """Real node `index` comes back, as after a reboot: containerd on its old root (the dead
        containers are still in its store, exited), then the kubelet, until the API server has it Ready."""
        from ce_k8s.real.node import noderuntime

        state = self._state_with_real_node(index)
        st = NodeState(**state.real_nodes[index - 1])
        nodes = RealNodes(self.layout.state_dir, Path(state.bin), self.processes.start, progress)
        runtime = noderuntime.build(state.version, progress=progress)      # warm: a stat
        try:
            nodes.start_containerd(st, runtime)
            self._start_kubelet(nodes, st)
        finally:
            state.real_nodes[index - 1] = node_state_dict(st)
            state.save(self.layout.state_file)
        self.processes.wait(f"real node {st.name} back", lambda: self.named_ready([st.name]), 120,
                            st.pids["kubelet"], f"node-{index}-kubelet")
        progress(f"real node {st.name} is back and Ready")

    def import_image(self, image: str, archive: Path, progress: Callable[[str], None] = print) -> dict[str, float]:
        """Import one more OCI archive into every real node's containerd, on demand: an image only
        some tests use (the pilot's, ce_k8s.real.node.pilotimage) costs the beds that never run it
        nothing. Pods name it with `imagePullPolicy: Never` (or IfNotPresent): never a pull.
        Returns the seconds each node's import took."""
        from ce_k8s.real.node import noderuntime

        st = self.layout.state()
        if st is None or not st.real_nodes:
            raise RealKubeError(f"the bed in {self.layout.state_dir} has no real node to import {image} into")
        runtime = noderuntime.build(st.version, progress=progress)      # warm: a stat
        nodes = RealNodes(self.layout.state_dir, Path(st.bin), self.processes.start, progress)
        seconds = {}
        for raw in st.real_nodes:
            node = NodeState(**raw)
            seconds[node.name] = nodes.import_image(node, runtime, image, archive)
            progress(f"imported {image} into real node {node.name} in {seconds[node.name]:.1f} s")
        return seconds

    def stop_real(self, st: State, progress: Callable[[str], None]) -> list[str]:
        """Stop every real node, then release the machine's sysctl ledger (also after a failed
        start: the hold comes before the first kubelet runs); the last bed to release it gives
        the host its own values back. Returns what was left."""
        if not st.real_nodes and not st.sysctl_ledger and not st.sysctls:
            return []

        nodes = RealNodes(self.layout.state_dir, Path(st.bin), self.processes.start, progress)
        left: list[str] = []
        for raw in st.real_nodes:
            left += nodes.stop(NodeState(**raw))
        # A bed started before the ledger has its own values only: the machine's ledger releases
        # it as a bed it does not know (it writes them back unless another bed's kubelet runs).
        others = SysctlLedger(st.sysctl_ledger or self.sysctl_ledger).release(str(self.layout.state_file), st.sysctls)
        if others:
            progress(f"stopped {len(st.real_nodes)} real node(s); host sysctls left as the kubelets set "
                     f"them: {len(others)} other bed(s) still run one ({', '.join(others)})")
        else:
            progress(f"stopped {len(st.real_nodes)} real node(s); host sysctls restored")
        return left
