"""The whole pilot path, embedded: emulated API + kubelet, the agent process, the router emulator.

Used by ``ce-k8s demo`` and by the end-to-end tests. Only the two boundaries are emulated (the
Kubernetes API with its kubelet, and HTCondor's router and schedd); everything between them is
the shipped code: the real hook launchers that ``ce-k8s agent --install-hooks`` writes, the real
``ce-k8s agent`` daemon as a separate process, the shipped routes and CE defaults.

A small "factory" closes the loop the way GlideinWMS does (htcondor-ce.md §6.4): a completed
pilot's output is staged out and the job leaves the CE queue; a held pilot is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ce_k8s.sim.condor.router import Router
from ce_k8s.sim.condor.schedd import Schedd, eval_str
from ce_k8s.sim.disruptions import GJID_ANNOTATION, Disruptions
from ce_k8s.sim.factoryside import BATCH_MARK, FactorySide, Outcome
from ce_k8s.sim.kubeseam import HandedInKubeServer
from ce_k8s.sim.outcomes import REMOVED
from ce_k8s.sim.pilots import Pilot, generate, spool_sandbox

log = logging.getLogger(__name__)

DEFAULT_NODES = ("cpu:40x64c256g,"
                 "gpu:2x32c256g4gpu:taint=nvidia.com/gpu:NoSchedule:label=nvidia.com/gpu.present=true,"
                 "wholenode:4x64c256g:label=ce-k8s.htcondor.org/pool=wholenode")
LABEL_MANAGED = "app.kubernetes.io/managed-by=ce-k8s"

# The demo's additions to the shipped configuration (docs/demo.md explains each line).
OVERLAY = """\
# ce-k8s demo overlay: hooks, agent socket and spool in a temporary directory.
JOB_ROUTER_HOOK_KEYWORD = CE_K8S
CE_K8S_HOOK_TRANSLATE_JOB = {hooks}/ce-k8s-translate
CE_K8S_HOOK_UPDATE_JOB_INFO = {hooks}/ce-k8s-update
CE_K8S_HOOK_JOB_FINALIZE = {hooks}/ce-k8s-finalize
CE_K8S_HOOK_JOB_CLEANUP = {hooks}/ce-k8s-cleanup
CE_K8S_SOCKET = {socket}
CE_K8S_SPOOL = {spool}
CE_K8S_KUBECONFIG = {kubeconfig}
CE_K8S_CE_NAME = demo-ce.example.org
CE_K8S_GC_GRACE = 30
# The emulated schedd lives in the test bed's process, where the agent's source probe (htcondor2)
# cannot ask it; every interrupted cleanup is then "unknown" and the pod is released, so a short
# grace keeps condor_rm prompt here. The real-HTCondor bed (ce_k8s/real/condor/condor.py) asks the real schedd.
CE_K8S_RELEASE_GRACE = 3
MAX_JOB_MIRROR_UPDATE_LAG = {mirror_lag}
# The emulator's kubelets answer the Summary API at the API server's node proxy only, so the demo's
# agent reads it there (docs/testbed.md); a real control plane's server says its own source below.
CE_K8S_USAGE_SOURCE = proxy
# The kubelet simulator plays each pilot's DemoScenario (ce_k8s.sim.pilots).
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES) DemoScenario
JOB_ROUTER_TRANSFORM_DemoScenario @=jrt
    REQUIREMENTS DemoScenario isnt undefined && TestBatchRoute =!= true
    SET K8sAnnotations [ 'sim.ce-k8s.io/scenario' = "$(MY.DemoScenario)" ]
@jrt
"""

# Mixed mode (`ce-k8s demo --batch-fraction`): a Slurm-style route tried first, for the pilots the
# test bed marks TestBatchRoute = true. The ce-k8s hooks must pass those jobs through (docs/routes.md
# "CEs with other backends"); nothing plays Slurm here, so they stay routed grid jobs in the queue.
BATCH_ROUTE = """\
JOB_ROUTER_ROUTE_Slurm @=jrt
    REQUIREMENTS TestBatchRoute =?= true
    UNIVERSE grid
    GridResource = "batch slurm"
@jrt
JOB_ROUTER_ROUTE_NAMES = Slurm $(JOB_ROUTER_ROUTE_NAMES)
"""


@dataclass
class PodTracker:
    """Counts pod creations per name and live pods per job from the store's own event stream
    (a server-side listener: fault injection cannot hide an event from it)."""

    created: Counter[str] = field(default_factory=Counter)
    live: dict[str, set[str]] = field(default_factory=dict)  # job -> pods not yet Succeeded/Failed
    max_live_per_job: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, resource: str, ev: Any) -> None:
        if resource != "pods":
            return
        meta = ev.obj.get("metadata", {})
        name = meta.get("name", "")
        job = (meta.get("annotations") or {}).get(GJID_ANNOTATION) or \
            (meta.get("labels") or {}).get("ce-k8s.htcondor.org/job", name)
        with self.lock:
            if ev.type == "ADDED":
                self.created[name] += 1
                pods = self.live.setdefault(job, set())
                pods.add(name)
                self.max_live_per_job[job] = max(self.max_live_per_job[job], len(pods))
            elif ev.type == "DELETED" or (ev.obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                self.live.get(job, set()).discard(name)

    @property
    def pods_created(self) -> int:
        return sum(self.created.values())

    @property
    def recreated(self) -> int:
        """Pods created again under a name that existed before (one attempt, two pods)."""
        with self.lock:
            return sum(n - 1 for n in self.created.values() if n > 1)

    @property
    def overlapping(self) -> int:
        """Pods that were live (not Succeeded/Failed) next to another live pod of the same job."""
        with self.lock:
            return sum(n - 1 for n in self.max_live_per_job.values() if n > 1)

    @property
    def duplicate_pods(self) -> int:
        return self.recreated + self.overlapping

    def as_dict(self) -> dict[str, int]:
        """The counts, for ``GET /_sim/stats`` of an emulator in its own process."""
        return {"pods_created": self.pods_created, "recreated": self.recreated, "overlapping": self.overlapping}


class RemoteTracker:
    """A :class:`PodTracker` that lives in the emulator's process, read over ``/_sim/stats``."""

    def __init__(self, server: RemoteApiServer) -> None:
        self._server = server

    def _get(self, key: str) -> int:
        return int(self._server.stats()["pods"][key])  # type: ignore[index]

    @property
    def pods_created(self) -> int:
        return self._get("pods_created")

    @property
    def recreated(self) -> int:
        return self._get("recreated")

    @property
    def overlapping(self) -> int:
        return self._get("overlapping")

    @property
    def duplicate_pods(self) -> int:
        return self.recreated + self.overlapping


def managed_count(store: Any, resource: str) -> int:
    """Objects of ``resource`` that carry ce-k8s's managed-by label (loop thread of the store)."""
    return sum(1 for obj in store.peek_list(resource)
               if (obj.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == "ce-k8s")


class RemoteApiServer:
    """``ce-k8s sim serve --stats`` as a child process, with the bits of :class:`ApiServer` the
    test bed uses: ``url``, ``calls``, ``reset_calls``, ``faults`` and ``pid``.

    Why: in one process the API emulator's event loop and the router emulator share a GIL; the
    pipeline benchmark measured the router waiting for it (docs/performance.md). Faults are not
    supported here (``faults`` is a local, disabled stand-in so the bed's bookkeeping works) and
    there is no direct store access: counters come from ``GET /_sim/stats``.
    """

    def __init__(self, nodes: str, time_scale: float, seed: int) -> None:
        from ce_k8s.sim.kube.faults import Faults

        self.nodes = nodes
        self.time_scale = time_scale
        self.seed = seed
        self.faults = Faults(seed=seed)
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self._base: Counter[tuple[str, str]] = Counter()
        self._tmp = tempfile.TemporaryDirectory(prefix="ce-k8s-sim-")
        self.kubeconfig_path = str(Path(self._tmp.name) / "kubeconfig")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "ce_k8s.cli", "sim", "serve", "--kubeconfig-out", self.kubeconfig_path,
               "--nodes", self.nodes, "--time-scale", str(self.time_scale), "--seed", str(self.seed), "--stats"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.stop()
                raise RuntimeError(f"ce-k8s sim serve did not print 'ready' within {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line.startswith("ready "):
            self.stop()
            raise RuntimeError(f"ce-k8s sim serve did not start: {line!r}")
        self.url = line.split()[1]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._tmp.cleanup()

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> str:
        shutil.copy(self.kubeconfig_path, path)
        os.chmod(path, 0o600)
        return str(path)

    def stats(self) -> dict[str, object]:
        """``GET /_sim/stats`` of the child (not counted as an API call)."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/_sim/stats", timeout=30) as resp:  # noqa: S310 - our own URL
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def _raw_calls(self) -> Counter[tuple[str, str]]:
        return Counter({(verb, res): n for verb, res, n in self.stats()["calls"]})  # type: ignore[attr-defined]

    @property
    def calls(self) -> Counter[tuple[str, str]]:
        """API calls by (verb, resource) since the last :meth:`reset_calls`."""
        now = self._raw_calls()
        now.subtract(self._base)
        return Counter({k: n for k, n in now.items() if n > 0})

    def reset_calls(self) -> None:
        self._base = self._raw_calls()

    @property
    def connections(self) -> int:
        """TCP connections the child's clients have opened so far."""
        return int(self.stats()["connections"])  # type: ignore[call-overload]


class TestBed:
    """Start with :meth:`start`, feed pilots with :meth:`submit`, drive with :meth:`tick`."""

    __test__ = False  # not a pytest class

    def __init__(self, config: str | None = None, nodes: str = DEFAULT_NODES, fault_rate: float = 0.0,
                 time_scale: float = 0.05, seed: int = 1, workdir: str | None = None,
                 max_running_hooks: int = 24, mirror_lag: int = 20, watch_cut_rate: float | None = None,
                 agent_log: bool = False, extra_config: str = "", spawn_threads: int = 0,
                 spawn_process: bool = False,
                 api_process: bool = False, batch_route: bool = False,
                 kube_server: HandedInKubeServer | None = None) -> None:
        self.config_path = config
        self.nodes = nodes
        self.fault_rate = fault_rate
        self.time_scale = time_scale
        self.seed = seed
        self.rng = random.Random(seed)  # noqa: S311 - reproducible demo
        self.max_running_hooks = max_running_hooks
        self.mirror_lag = mirror_lag
        self.watch_cut_rate = fault_rate / 5 if watch_cut_rate is None else watch_cut_rate
        self.agent_log = agent_log
        self.extra_config = extra_config + (BATCH_ROUTE if batch_route else "")
        # Benchmark options (defaults keep the demo, the soak and the tests as they were):
        # spawn_threads forks hooks off the router's polling thread (router_hooks), api_process
        # runs the API emulator and kubelet sim as `ce-k8s sim serve` (RemoteApiServer).
        self.spawn_threads = spawn_threads
        self.spawn_process = spawn_process
        self.api_process = api_process
        if api_process and fault_rate:
            raise ValueError("fault injection needs the in-process API emulator (api_process=False)")
        # kube_server: a real control plane instead of the emulator (ce_k8s.real.kube.kubeserver's
        # RealKubeServer, handed in by the caller: the test bed never imports the real room; what the
        # bed uses of it is ce_k8s.sim.kubeseam.HandedInKubeServer). The agent then runs with the
        # kubeconfig it writes (its ServiceAccount's token).
        if kube_server is not None and fault_rate:
            raise ValueError("fault injection needs the API emulator; a real API server injects none")
        self.kube_server = kube_server
        self.kube = "emulated" if kube_server is None else "real"
        self.evicted: set[str] = set()
        self._core: Any = None
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="ce-k8s-demo-")
        self.root = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.spool = self.root / "spool"
        self.hooks = self.root / "hooks"
        self.socket = self.root / "run" / "agent.sock"
        self.kubeconfig = self.root / "kubeconfig"
        self.confdir = self.root / "config"
        self.server: Any = None
        self.agent: subprocess.Popen[bytes] | None = None
        self.agent_restarts = 0
        self.router: Router | None = None
        self.schedd = Schedd(name="demo-ce.example.org")
        self.tracker: PodTracker | RemoteTracker = PodTracker()
        self.outcomes: dict[str, Outcome] = {}
        self.holds: dict[str, tuple[int | None, int | None, str | None]] = {}
        self.started = 0.0
        self.factory = FactorySide(self.schedd, lambda: self.router, self.outcomes, self.holds)
        self.disruptions = Disruptions(self.schedd, self.outcomes, self.evicted, lambda: self.server,
                                       lambda: self._core, lambda: self._evict_core)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> TestBed:
        from ce_k8s.agent.launchers import install_hooks
        from ce_k8s.condor.config import CondorConfig
        from ce_k8s.sim.kube.apiserver import ApiServer
        from ce_k8s.sim.kube.faults import Faults

        for d in (self.spool, self.socket.parent):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)
        if self.kube_server is not None:
            self.server = self.kube_server
            self.time_scale = self.server.time_scale     # kwok plays scenarios at the bed's scale
            self.server.write_kubeconfig(self.kubeconfig)
            self.server.start_tracking(self.tracker)
        elif self.api_process:
            self.server = RemoteApiServer(nodes=self.nodes, time_scale=self.time_scale, seed=self.seed)
            self.server.start()
            self.server.write_kubeconfig(self.kubeconfig)
            self.tracker = RemoteTracker(self.server)
        else:
            faults = Faults.from_rate(self.fault_rate, seed=self.seed)
            faults.configure(cut_rate=self.watch_cut_rate)
            self.server = ApiServer(nodes=self.nodes, faults=faults, time_scale=self.time_scale, seed=self.seed)
            self.server.start_thread()
            self.server.write_kubeconfig(self.kubeconfig)
            self.server.call(self.server.store.add_listener, self.tracker)
        self._write_config()
        cfg = CondorConfig.load(self.confdir)
        self._prepare_cluster(self._namespaces(cfg))
        install_hooks(str(self.hooks), str(self.socket), 20.0)
        from kubernetes import client
        from kubernetes.config import new_client_from_config

        self._api_client = new_client_from_config(config_file=str(self.kubeconfig))
        self._core = client.CoreV1Api(self._api_client)
        # Evictions are the cluster's doing (a drain, an admin), not the agent's: on a real API
        # server the agent's ServiceAccount may not create them, so the bed evicts as admin.
        self._evict_core = getattr(self.server, "admin_core", None) or self._core
        self.start_agent()
        self.router = Router(cfg, self.schedd, max_running_hooks=self.max_running_hooks, record_io=False,
                             hook_timeout=120.0, spawn_threads=self.spawn_threads,
                             spawn_process=self.spawn_process)
        self.started = time.monotonic()
        return self

    def close(self) -> None:
        if getattr(self, "_api_client", None) is not None:
            with contextlib.suppress(Exception):
                self._api_client.close()
        if self.router is not None:
            self.router.close()
        self.stop_agent()
        if isinstance(self.server, RemoteApiServer) or self.kube == "real":
            self.server.stop()
        elif self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop_thread()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> TestBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_config(self) -> None:
        from ce_k8s.condor.config import default_config_paths

        self.confdir.mkdir(parents=True, exist_ok=True)
        local_dirs_read = ""
        if self.config_path:
            src = Path(self.config_path)
            files = sorted(src.iterdir()) if src.is_dir() else [src]
            if src.is_file():
                # A CE's condor_config: its LOCAL_CONFIG_DIR files are read after everything in our
                # directory, overlay included; copy them in reading order and read them only once.
                from ce_k8s.condor.config import CondorConfig

                files = [Path(s) for s in CondorConfig.load(src).sources]
                local_dirs_read = "LOCAL_CONFIG_DIR =\n"
            for i, f in enumerate(files):
                if f.is_file():
                    shutil.copy(f, self.confdir / f"{i:03d}-{f.name}")
        else:
            n = 0
            for directory in default_config_paths():
                for f in sorted(directory.glob("*.conf")):
                    shutil.copy(f, self.confdir / f"{n:03d}-{f.name}")
                    n += 1
        (self.confdir / "999-demo.conf").write_text(OVERLAY.format(
            hooks=self.hooks, socket=self.socket, spool=self.spool, kubeconfig=self.kubeconfig,
            mirror_lag=self.mirror_lag) + getattr(self.server, "agent_config", "") + self.extra_config + "\n"
            + local_dirs_read)

    def _namespaces(self, cfg: Any) -> set[str]:
        """CE_K8S_NAMESPACE plus every K8sNamespace a route or transform sets for the demo's pilot
        shapes (routed in-process with the same engine), so the cluster has them."""
        from ce_k8s.condor.routing import RouterConfig
        from ce_k8s.settings import Settings
        from ce_k8s.sim.pilots import OWNERS, make_pilot

        names = {Settings.from_config(cfg).namespace}
        rc = RouterConfig.from_config(cfg)
        for index, shape in enumerate(OWNERS):
            probe = Schedd()
            job = probe.submit(make_pilot(index, shape).ad, owner=OWNERS[shape])
            ad = probe.get(job)
            route = rc.choose_route(ad)
            if route is None:
                continue
            routed = rc.route_job(ad, route).ad
            ns = eval_str(routed, "K8sNamespace")
            if ns:
                names.add(ns)
        return names

    def _prepare_cluster(self, namespaces: set[str]) -> None:
        """The namespaces the routes send pilots to (PriorityClasses are not served by the emulator,
        which, like an API server without the Priority admission plugin, does not check them)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException
        from kubernetes.config import new_client_from_config

        if self.kube == "real":     # as a site does: each pilot namespace with the shipped Role
            for ns in sorted(namespaces):
                self.server.prepare_namespace(ns)
            return
        api = new_client_from_config(config_file=str(self.kubeconfig))
        core = client.CoreV1Api(api)
        calls = [(core.create_namespace, {"metadata": {"name": ns}}) for ns in sorted(namespaces)]
        saved = self.server.faults.rate_429, self.server.faults.rate_500, self.server.faults.rate_timeout
        self.server.faults.configure(rate_429=0.0, rate_500=0.0, rate_timeout=0.0)
        try:
            for fn, body in calls:
                with contextlib.suppress(ApiException):
                    fn(body)
        finally:
            self.server.faults.configure(rate_429=saved[0], rate_500=saved[1], rate_timeout=saved[2])
            api.close()

    def start_agent(self) -> None:
        cmd = [sys.executable, "-m", "ce_k8s.cli", "agent", "--config", str(self.confdir),
               "--kubeconfig", str(self.kubeconfig), "--socket", str(self.socket), "--spool", str(self.spool)]
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        out = None if self.agent_log else subprocess.DEVNULL
        self.agent = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.agent.poll() is not None:
                raise RuntimeError(f"the agent exited with {self.agent.returncode} before listening")
            if time.monotonic() > deadline:
                raise RuntimeError("the agent did not create its socket within 30 s")
            time.sleep(0.05)

    def stop_agent(self, sig: int = signal.SIGTERM) -> None:
        if self.agent is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.agent.pid, sig)
        try:
            self.agent.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.agent.pid, signal.SIGKILL)
            self.agent.wait(10)
        self.agent = None

    def kill_agent_and_restart(self) -> None:
        """SIGKILL (no clean shutdown), then a fresh agent that must rebuild from a relist."""
        self.stop_agent(signal.SIGKILL)
        self.agent_restarts += 1
        self.start_agent()

    # ------------------------------------------------------------------ pilots
    def make_pilots(self, count: int, evict_fraction: float = 0.0, run_s: float = 20.0,
                    fail_fraction: float = 0.05, batch_fraction: float = 0.0) -> list[Pilot]:
        """``batch_fraction`` of them (rounded, chosen by the seed) get ``TestBatchRoute = true`` for
        the Slurm-style route of a bed made with ``batch_route=True``."""
        pilots = generate(count, seed=self.seed, evict_fraction=evict_fraction, run_s=run_s,
                          fail_fraction=fail_fraction)
        picked = random.Random(self.seed).sample(range(count), round(count * batch_fraction))  # noqa: S311
        for i in picked:
            pilots[i].ad[BATCH_MARK] = True
        return pilots

    def submit(self, pilots: list[Pilot]) -> list[str]:
        ids = []
        for pilot in pilots:
            job = self.schedd.submit(pilot.ad, owner=pilot.owner)
            # The CE schedd spools the input sandbox (Condor-C, htcondor-ce.md §6.2).
            self.schedd.set_attributes(job, spool_sandbox(self.spool, job), as_user=False)
            self.outcomes[job] = Outcome(pilot, job)
            ids.append(job)
        return ids

    # ------------------------------------------------------------------ driving
    def tick(self, poll_interval: float = 1.0) -> None:
        """One router poll, then hook results as they arrive, then the factory's turn."""
        assert self.router is not None
        self.router.poll()
        self.router.process_events(poll_interval)
        self.factory_turn()
        self.disruption_turn()

    def factory_turn(self) -> None:
        """GlideinWMS's side: stage out completed pilots, remove held ones (ce_k8s.sim.factoryside)."""
        self.factory.turn()

    def disruption_turn(self) -> None:
        """Evict the marked pilots' pods once they run (ce_k8s.sim.disruptions)."""
        self.disruptions.turn()

    def pending(self) -> int:
        return sum(1 for o in self.outcomes.values() if o.status == "queued")

    def run(self, timeout: float = 300.0, poll_interval: float = 1.0, restart_agent: bool = False,
            progress: Any = None) -> bool:
        """Tick until every pilot is completed, held, removed or lost; True if that happened in time."""
        next_kill = time.monotonic() + self.rng.uniform(3, 10)
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            self.tick(poll_interval)
            if restart_agent and time.monotonic() >= next_kill:
                self.kill_agent_and_restart()
                next_kill = time.monotonic() + self.rng.uniform(3, 10)
            if progress is not None:
                progress(self)
        return self.pending() == 0

    def drain(self, timeout: float = 60.0, poll_interval: float = 0.5) -> None:
        """Keep polling after the last pilot so cleanups and the agent's GC finish."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.pods_left() or self.secrets_left()):
            self.tick(poll_interval)

    # ------------------------------------------------------------------ measurements
    def _count(self, resource: str) -> int:
        if self.kube == "real":
            return self.server.managed_count(resource)
        if isinstance(self.server, RemoteApiServer):
            return int(self.server.stats()[f"{resource}_left"])  # type: ignore[call-overload]
        return int(self.server.call(managed_count, self.server.store, resource))

    def pods_left(self) -> int:
        return self._count("pods")

    def secrets_left(self) -> int:
        return self._count("secrets")

    def _batch_check(self) -> dict[str, Any]:
        """Mixed mode: batch pilots still routed to Slurm at the end (source and routed job both in
        the queue), and how many of those ce-k8s touched (a K8s* attribute on the routed ad, or a
        pod carrying the source job's GlobalJobId). The routed keys are left out of routed_jobs_left."""
        routed, touched, keys = 0, 0, set()
        for job, out in self.outcomes.items():
            if out.status != "batch":
                continue
            rj = self.router.jobs.get(job) if self.router else None
            source = self.schedd.get(job)
            dest = self.schedd.get(rj.dest_key) if rj is not None and rj.dest_key else None
            if source is None or dest is None:
                continue
            routed += 1
            keys.add(rj.dest_key)
            gjid = eval_str(source, "GlobalJobId")
            has_pod = isinstance(self.tracker, PodTracker) and gjid in self.tracker.live
            if has_pod or any(k.lower().startswith("k8s") for k in dest.keys()):
                touched += 1
        return {"routed": routed, "touched": touched, "routed_keys": keys}

    def summary(self) -> dict[str, object]:
        statuses = Counter(o.status for o in self.outcomes.values())
        wall = time.monotonic() - self.started
        batch = self._batch_check()
        routed_left = sum(1 for key, ad in self.schedd.items()
                          if eval_str(ad, "RoutedBy") is not None and key not in batch["routed_keys"])
        assert self.router is not None
        by_verb: Counter[str] = Counter()
        for (verb, _resource), n in self.server.calls.items():
            by_verb[verb] += n
        return {
            "pilots": len(self.outcomes),
            "completed": statuses["completed"],
            "held": statuses["held"],
            "removed": statuses[REMOVED],
            "lost": statuses["lost"] + statuses["queued"],
            "batch_routed": batch["routed"],
            "batch_touched": batch["touched"],
            "exit_nonzero": sum(1 for o in self.outcomes.values() if o.status == "completed" and o.exit_code),
            "pods_created": self.tracker.pods_created,
            "duplicate_pods": self.tracker.duplicate_pods,
            "duplicate_pods_recreated": self.tracker.recreated,
            "duplicate_pods_overlapping": self.tracker.overlapping,
            "pods_left": self.pods_left(),
            "secrets_left": self.secrets_left(),
            "routed_jobs_left": routed_left,
            "agent_restarts": self.agent_restarts,
            "wall_s": round(wall, 2),
            "pilots_per_s": round(len(self.outcomes) / wall, 2) if wall else 0.0,
            "api_calls": dict(by_verb),
            "api_calls_by_resource": {f"{v} {r}": n for (v, r), n in sorted(self.server.calls.items())},
            "faults_injected": dict(self.server.faults.injected),
            "hook_calls": dict(self.router.hook_counts),
            "hook_seconds": {k: round(v, 2) for k, v in self.router.hook_seconds.items()},
            "router_events": dict(self.router.events),
            "hold_reasons": dict(Counter(f"{c}/{sc}: {(r or '')[:80]}" for c, sc, r in self.holds.values())),
            "remove_reasons": dict(Counter(o.remove_reason for o in self.outcomes.values() if o.status == REMOVED)),
        }
