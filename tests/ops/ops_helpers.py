"""An emulated CE host for the operations tests: config, hooks, spool, agent, API emulator.

Helpers only (the fixtures are in conftest.py; a unique module name keeps imports unambiguous).

The pieces are the real ones: the shipped `config.d/` and `routes/` (installed the way the CE image
installs them, routes as `70-ce-k8s-route-*.conf`), hook launchers written by
`ce-k8s agent --install-hooks`, the agent on its Unix socket, and the API emulator with the
kubelet simulator. Pilots reach the cluster the way the router sends them: update-hook requests
to the agent carrying a routed ad.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import classad2
from kubernetes import config as kconfig
from polling import wait_for

from ce_k8s import cli
from ce_k8s.agent.agent import Agent
from ce_k8s.agent.launchers import install_hooks
from ce_k8s.agent.sourceprobe import GONE, FixedProbe
from ce_k8s.condor import wire
from ce_k8s.ops.status import load_config_and_settings
from ce_k8s.pods.names import pod_name
from ce_k8s.sim.kube.apiserver import ApiServer

REPO = Path(__file__).resolve().parents[2]
CE_NAME = "ce.example.org"
NAMESPACE = "ce-k8s-pilots"


def run_cli(*argv: str) -> tuple[int, str]:
    """`ce-k8s ARGV` in-process: (exit code, stdout)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


def gjid(cluster: int) -> str:
    return f"{CE_NAME}#{cluster}.0#1760000000"


@dataclass
class CEHost:
    """Paths and processes of one emulated CE host."""

    root: Path
    server: ApiServer
    config_dir: Path
    hook_dir: Path
    socket: Path
    spool: Path
    agent: Agent | None = None
    ads: dict[int, classad2.ClassAd] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> str:
        return self.server.kubeconfig_path

    def write_local(self, text: str, name: str = "98-test-override.conf") -> None:
        """Add a config file after the others (a site's local change)."""
        (self.config_dir / name).write_text(text)

    def start_agent(self) -> Agent:
        _cfg, settings = load_config_and_settings(str(self.config_dir))
        api = kconfig.new_client_from_config(config_file=self.kubeconfig)
        # the source probe answers "gone": these tests run without a schedd to ask (sourceprobe.py)
        self.agent = Agent(settings, api, request_timeout=3.0, watch_timeout=5, source_probe=FixedProbe(GONE)).start()
        return self.agent

    def stop_agent(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None

    def routed_ad(self, cluster: int, image: str, route: str, owner: str) -> classad2.ClassAd:
        """A routed job as the router leaves it (translate output + VanillaToGrid + route SETs)."""
        iwd = self.spool / str(cluster % 10000) / "0" / f"cluster{cluster}.proc0.subproc0"
        iwd.mkdir(parents=True, exist_ok=True)
        (iwd / "glidein_startup.sh").write_text("#!/bin/sh\necho pilot\n")
        (iwd / "x509up").write_text("PROXY")
        ad = classad2.ClassAd()
        for k, v in {
            "ClusterId": cluster + 1000, "ProcId": 0, "JobUniverse": 9, "JobStatus": 1, "Owner": owner,
            "Cmd": "glidein_startup.sh", "Iwd": str(iwd), "x509userproxy": str(iwd / "x509up"),
            "Out": "_condor_stdout", "Err": "_condor_stderr", "RequestCpus": 1, "RequestMemory": 1024,
            "RoutedFromJobId": f"{cluster}.0", "RouteName": route, "RoutedBy": "htcondor-ce",
            "Managed": "ScheddDone", "ManagedManager": "ce-k8s", "K8sAttempt": 0,
            "K8sPodName": pod_name(gjid(cluster), 0), "K8sSourceGlobalJobId": gjid(cluster), "K8sImage": image,
            "K8sNamespace": NAMESPACE, "GridResource": "batch k8s",
        }.items():
            ad[k] = v
        return ad

    def update(self, cluster: int) -> classad2.ClassAd:
        """One update-hook call for the pilot; the reply is applied to its routed ad (hook-protocol.md §2.3)."""
        assert self.agent is not None
        ad = self.ads[cluster]
        status, parts = self.agent.handle("update", wire.sprint_ad(ad).encode(), os.getuid())
        assert status == "ok", parts
        out = wire.parse_hook_output(parts[0].decode())
        for k in out.keys():
            ad[k] = out.lookup(k)
        return ad

    def submit(self, cluster: int, image: str = "pilot:forever", route: str = "Pilots", owner: str = "cmspilot",
               until: str | None = "Running") -> classad2.ClassAd:
        """Route a pilot to the agent and poll it (as the router would) until its pod is in `until`."""
        self.ads[cluster] = self.routed_ad(cluster, image, route, owner)
        if until is None:
            return self.update(cluster)
        return self.update_until(cluster, lambda ad: ad.get("K8sPodPhase") == until,
                                 f"pilot {cluster} to reach {until}")

    def update_until(self, cluster: int, predicate, what: str, timeout: float = 10.0) -> classad2.ClassAd:
        """Poll the pilot (as the router would) until its routed ad satisfies `predicate`; a timeout
        shows the pod's phase and the job's status as they stand."""
        def step() -> bool:
            return predicate(self.update(cluster))
        ad = self.ads[cluster]
        wait_for(step, timeout=timeout, interval=0.05, what=what,
                 on_timeout=lambda: f"its pod phase: {ad.get('K8sPodPhase')}, JobStatus: {ad.get('JobStatus')}")
        return ad

    def pod(self, cluster: int, attempt: int = 0) -> dict | None:
        try:
            return self.server.store.get("pods", NAMESPACE, pod_name(gjid(cluster), attempt))
        except Exception:
            return None


def make_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="ce-k8s-ops-", dir="/tmp"))
    os.chmod(root, 0o755)  # the hooks' directory's parent must not be world-writable (hook-protocol.md §1.1); /tmp is
    return root


def shipped_config(conf: Path) -> Path:
    """The shipped configuration in `conf`, laid out as the CE image lays it out: config.d, then
    each route as `70-ce-k8s-route-<name>.conf` (tests/real/test_user_namespaces.py edits one)."""
    conf.mkdir()
    for f in sorted((REPO / "config.d").glob("*.conf")):
        shutil.copy(f, conf / f.name)
    for f in sorted((REPO / "routes").glob("*.conf")):
        shutil.copy(f, conf / f"70-ce-k8s-route-{f.stem}.conf")
    return conf


def install_config(root: Path, server: ApiServer) -> Path:
    """The shipped configuration, laid out as the CE image lays it out, plus this host's settings."""
    conf = shipped_config(root / "config")
    (conf / "99-local.conf").write_text(
        f"CE_K8S_CE_NAME = {CE_NAME}\n"
        f"CE_K8S_NAMESPACE = {NAMESPACE}\n"
        f"CE_K8S_SOCKET = {root}/run/agent.sock\n"
        f"CE_K8S_SPOOL = {root}/spool\n"
        f"CE_K8S_HOOK_DIR = {root}/libexec\n"
        f"CE_K8S_KUBECONFIG = {server.kubeconfig_path}\n"
        "CE_K8S_IMAGE_PULL_TIMEOUT = 1\n"
        "CE_K8S_QPS = 1000\nCE_K8S_BURST = 1000\n"
    )
    return conf


@contextlib.contextmanager
def ce_host(**server_kwargs):
    """An emulated CE host with its cluster (the agent is not started: see `CEHost.start_agent`)."""
    root = make_root()
    server_kwargs.setdefault("time_scale", 0.01)
    server_kwargs.setdefault("nodes", "cpu:3x8c32g")
    server_kwargs.setdefault("bookmark_interval", 0.2)
    try:
        with ApiServer.running(**server_kwargs) as srv:
            srv.call(srv.api.create, "namespaces", None, {"metadata": {"name": NAMESPACE}})
            conf = install_config(root, srv)
            (root / "spool").mkdir()
            install_hooks(str(root / "libexec"), str(root / "run" / "agent.sock"), 5.0)
            host = CEHost(root=root, server=srv, config_dir=conf, hook_dir=root / "libexec",
                          socket=root / "run" / "agent.sock", spool=root / "spool")
            try:
                yield host
            finally:
                host.stop_agent()
    finally:
        shutil.rmtree(root, ignore_errors=True)
