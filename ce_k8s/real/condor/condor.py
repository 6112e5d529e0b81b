"""A real HTCondor (Debian's `condor` package, 25.x or 23.9) in a chroot, running ce-k8s's hooks and agent.

    ce-k8s testbed real-condor up|down|status [--htcondor 25|23] [--batch] [--state DIR] [--root DIR] [--json]

Everything HTCondor does here is the real daemons' work: condor_master, a collector, the CE
schedd, condor_job_router, the gridmanager and BLAH, and a second schedd that plays a
GlideinWMS factory submitting over HTCondor-C. Only Kubernetes is emulated (`ce-k8s sim
serve`, outside the root). docs/real-condor.md describes the layout; in short:

* **The root** is built once per HTCondor version by `debootstrap --variant=minbase <suite>` plus
  `apt-get install condor python3` and cached: HTCondor 25 (the default, what HTCondor-CE 25 and
  `ce-k8s route` model) from Debian's sid, `/var/cache/ce-k8s/condor-sid`; HTCondor 23.9 from
  Debian 13 (trixie), `/var/cache/ce-k8s/condor-trixie`. The version is pinned (`VERSIONS`): a
  suite that no longer carries it is an error naming the suite and what it has. Rebuilt only when
  its marker file is missing. Needs root; installs Debian's `debootstrap` with apt when missing.
* **The state directory** (`/var/tmp/ce-k8s-real-condor`) is bind-mounted into the root at the
  same path, so every path in it means the same file inside and out: the CE spool (routed ads
  name sandbox files there), the agent's socket and output, the kubeconfig, logs and pid files.
* **Hooks** run on the root's own `/usr/bin/python3 -IS` with the `ce_k8s` package bind-mounted
  at `/opt/ce-k8s/lib/ce_k8s` (the hooks are stdlib only: nothing is copied, no venv needed).
* **The agent** runs under condor_master as a non-DaemonCore daemon, as on a CE, on this
  checkout's interpreter: its prefix and the venv are bind-mounted at their own paths (read-only).
* **BLAH in the worst case:** `/etc/blah.config` accepts the `k8s` and `slurm` LRMS and every
  `<lrms>_*.sh` script of both only records its call in `<state>/blah-calls.log`, so a gridmanager
  that ever acted on a Kubernetes-routed job would show there.

* **The batch pool, opt-in** (`RealCondor(batch=True)`, `up --batch`): a third schedd `batch@<host>`,
  a negotiator and a startd that runs only that schedd's jobs (never a CE source job: a pilot runs
  once, where the router sends it), reachable from outside the root with an IDTOKEN from
  `RealCondor.batch_token()` (`batch_config`; docs/real-condor.md, "The batch pool").

`down` stops the daemons by their own command (`condor_off -master`), then by pid, kills whatever
still runs inside the root, stops the emulator and undoes every mount. Nothing is left running.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ce_k8s.real.condor import ports
from ce_k8s.real.condor.condorcommands import CondorCommands
from ce_k8s.real.condor.condorconfig import (  # noqa: F401 - the bed's configuration, as its users import it
    BATCH_START,
    BLAH_RECORDER,
    LOCAL_TRUST,
    agent_and_demo_config,
    batch_config,
    testbed_config,
)
from ce_k8s.real.condor.condorlayout import (  # noqa: F401 - the bed's names, as its users import them
    BATCH_ACCOUNT,
    BATCH_SCHEDD,
    BATCH_SLOT_MEMORY,
    BATCH_SLOTS,
    CE_SCHEDD,
    COLLECTOR_PORT,
    FACTORY_SCHEDD,
    HOOK_DIR,
    RealCondorError,
)
from ce_k8s.real.processes import alive, terminate
from ce_k8s.real.processes import processes_in as _processes_in

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Flavour:
    """One HTCondor the bed can run: the Debian suite that carries it and the version it must be.

    The version is pinned because every finding in docs/real-condor.md is tied to one: a suite
    that moves on (sid does) must fail loudly, not silently test another HTCondor.
    """

    htcondor: str       # the `--htcondor` name: the major version
    suite: str          # Debian suite for debootstrap and apt
    version: str        # the upstream version the suite must carry (`condor_version`'s)
    root: Path          # where its root is cached


_CACHE = Path("/var/cache/ce-k8s")
VERSIONS: dict[str, Flavour] = {
    "25": Flavour("25", "sid", "25.14.1", _CACHE / "condor-sid"),
    "23": Flavour("23", "trixie", "23.9.6", _CACHE / "condor-trixie"),
}
DEFAULT_HTCONDOR = "25"   # HTCondor-CE 25 runs on HTCondor 25; `ce-k8s route` models 25.14.1
# CE_K8S_REAL_CONDOR_ROOT overrides the default version's root only (a path holds one version)
ROOT_CACHE = Path(os.environ.get("CE_K8S_REAL_CONDOR_ROOT", str(VERSIONS[DEFAULT_HTCONDOR].root)))
# /var/tmp: the state must outlive the `up` command; it is recreated root-owned 0755 on every `up`
STATE_DIR = Path(os.environ.get("CE_K8S_REAL_CONDOR_STATE", "/var/tmp/ce-k8s-real-condor"))  # noqa: S108
PACKAGES = ("condor", "python3")
# sid's Release file on a snapshot mirror is past its Valid-Until date (sid's files are valid for a
# week only); apt refuses such a file unless told. debootstrap checks the signature, not the date.
APT_OPTIONS = ("-o", "Acquire::Check-Valid-Until=false")
MARKER = ".ce-k8s-root"             # written last: a root without it is rebuilt
PKG_MOUNT = "/opt/ce-k8s/lib"        # the hooks' sys.path entry inside the root
CONFIG_DIR = "/etc/condor/config.d"
AGENT_LOG = "/var/log/condor/CeK8sAgentLog"
DEBIAN_CONFIG = frozenset({"00-htcondor-9.0.config"})   # what the condor package puts there
# The pilot accounts of ce_k8s.sim.pilots.OWNERS, the factory's account, one user of the Slurm route,
# and the batch pool's user.
ACCOUNTS = {"osg01": 47001, "cmspilot": 47002, "osggpu": 47003, "atlaspilot": 47004, "gfactory": 47010,
            "slurmuser": 47020, BATCH_ACCOUNT: 47030}
BLAH_LRMS = ("k8s", "slurm")
BLAH_SCRIPTS = ("submit", "status", "cancel", "hold", "resume", "ping")
DEFAULT_NODES = ("cpu:8x64c256g,"
                 "gpu:2x32c256g4gpu:taint=nvidia.com/gpu:NoSchedule:label=nvidia.com/gpu.present=true,"
                 "wholenode:2x64c256g:label=ce-k8s.htcondor.org/pool=wholenode")


# ---------------------------------------------------------------------------------- the root
def _run(cmd: list[str], *, timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    log.debug("run %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        raise RealCondorError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}): "
                              f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc


def require_root() -> None:
    if os.geteuid() != 0:
        raise RealCondorError("the real-HTCondor test bed needs root (debootstrap, chroot, mounts); "
                              "run it as root, e.g. `sudo ce-k8s testbed real-condor up`")


def flavour(htcondor: str) -> Flavour:
    """The Flavour for `--htcondor` (``25``, ``23``; a full version such as ``25.14.1`` also names one)."""
    for f in VERSIONS.values():
        if htcondor in (f.htcondor, f.version):
            return f
    raise RealCondorError(f"no HTCondor {htcondor!r} in the test bed: choose one of {', '.join(VERSIONS)}")


def default_root(htcondor: str = DEFAULT_HTCONDOR) -> Path:
    """Where the root of `htcondor` is cached (CE_K8S_REAL_CONDOR_ROOT moves the default one)."""
    f = flavour(htcondor)
    return ROOT_CACHE if f.htcondor == DEFAULT_HTCONDOR else f.root


def root_marker(path: Path) -> dict[str, object] | None:
    """What a built root holds (suite, condor_version line, upstream version), or None if unbuilt."""
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _upstream(debian_version: str) -> str:
    """`25.14.1+dfsg-1` → `25.14.1`: Debian's revision and repack suffix are not HTCondor's."""
    version = debian_version.split(":", 1)[-1]
    return version.split("-", 1)[0].split("+", 1)[0].split("~", 1)[0]


def _candidate(root: Path, env: dict[str, str]) -> str:
    """The `condor` version apt in the root would install (apt-cache policy's Candidate)."""
    out = _run(["chroot", str(root), "apt-cache", *APT_OPTIONS, "policy", "condor"], env=env).stdout
    for line in out.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "Candidate":
            return value.strip()
    return "(none)"


def build_root(path: Path | None = None, progress=print, htcondor: str = DEFAULT_HTCONDOR) -> Path:
    """The cached Debian root with HTCondor `htcondor`, built once (idempotent; about a minute, 600 MB).

    The suite's `condor` must be the pinned upstream version (`VERSIONS`): the apt candidate is
    checked before installing and `condor_version` after, so a suite that moved on is an error that
    names the suite and the version it now has, never a silent test of another HTCondor.
    """
    require_root()
    f = flavour(htcondor)
    path = Path(path) if path is not None else default_root(f.htcondor)
    marker = root_marker(path)
    if marker is not None:
        if marker.get("version") not in (None, f.version) or marker.get("suite") != f.suite:
            raise RealCondorError(f"{path} holds HTCondor {marker.get('version') or marker.get('condor')} "
                                  f"from {marker.get('suite')}, not {f.version} from {f.suite}: give another "
                                  f"--root, or remove {path} to rebuild it")
        return path
    if shutil.which("debootstrap") is None:
        progress("installing Debian's debootstrap with apt-get")
        _run(["apt-get", "update", "-qq"])
        _run(["apt-get", "install", "-y", "-qq", "debootstrap"],
             env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    tmp = path.with_name(path.name + ".building")
    if tmp.exists():
        _unmount_below(tmp)
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    progress(f"debootstrap --variant=minbase {f.suite} {tmp}")
    _run(["debootstrap", "--variant=minbase", f.suite, str(tmp)], timeout=1200)
    shutil.copy("/etc/resolv.conf", tmp / "etc/resolv.conf")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C"}
    _run(["chroot", str(tmp), "apt-get", *APT_OPTIONS, "update", "-qq"], env=env, timeout=600)
    candidate = _candidate(tmp, env)
    if _upstream(candidate) != f.version:
        raise RealCondorError(f"Debian's {f.suite} now has condor {candidate}, not the HTCondor {f.version} "
                              f"the test bed pins for --htcondor {f.htcondor} (VERSIONS in "
                              "ce_k8s/real/condor/condor.py): re-run the real-HTCondor tests on the new version "
                              "and update the pin and docs/real-condor.md")
    progress(f"apt-get install condor={candidate} python3 (in the root)")
    # sid's maintainer scripts run systemd-tmpfiles (cryptsetup-bin, a dependency of condor 25's
    # package), which refuses to run without /proc; trixie's do not need it
    proc_dir = tmp / "proc"
    _run(["mount", "-t", "proc", "proc", str(proc_dir)])
    try:
        _run(["chroot", str(tmp), "apt-get", *APT_OPTIONS, "install", "-y", "-qq", "--no-install-recommends",
              f"condor={candidate}", *PACKAGES[1:]], env=env, timeout=1200)
    finally:
        _unmount_below(tmp)
    line = _run(["chroot", str(tmp), "condor_version"], env=env).stdout.split("\n")[0]
    found = line.split()[1] if len(line.split()) > 1 else line
    if found != f.version:
        raise RealCondorError(f"condor_version in the {f.suite} root says {line!r}, not {f.version}")
    (tmp / MARKER).write_text(json.dumps({"suite": f.suite, "packages": PACKAGES, "condor": line,
                                          "version": f.version, "debian": candidate,
                                          "build_s": round(time.monotonic() - started, 1)}) + "\n")
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


# ---------------------------------------------------------------------------------- mounts
def _mounts() -> list[str]:
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return [line.split()[1].replace("\\040", " ") for line in fh]


def _unmount_below(root: Path) -> list[str]:
    """Unmount everything at or below `root`, deepest first; returns what was unmounted."""
    prefix = str(root).rstrip("/") + "/"
    done = []
    for point in sorted((m for m in _mounts() if m.startswith(prefix)), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        done.append(point)
    return done


def _bind(src: str | Path, root: Path, dest: str | None = None, readonly: bool = False) -> str:
    target = root / str(dest or src).lstrip("/")
    if str(target) in _mounts():
        return str(target)
    if Path(src).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    _run(["mount", "--bind", str(src), str(target)])
    if readonly:
        _run(["mount", "-o", "remount,bind,ro", str(target)])
    return str(target)


@dataclass
class State:
    """What `up` started, kept in `<state>/state.json` so `down` and `status` find it."""

    root: str
    state: str
    mounts: list[str]
    sim_pid: int
    api_url: str
    master_pid: int
    poll: int
    started: float
    batch: bool = False       # the batch pool is up (RealCondor(batch=True))
    ce_config: str = "bed"    # the CE's configuration: the bed's ("bed") or HTCondor-CE's ("stock")
    reaper_pid: int = 0       # ce_k8s.real.reaper, when `up` was given an owner
    port_ledger: str = ""     # the machine's ledger of reserved ports (ce_k8s.real.condor.ports), once held
    reserved_ports: str = ""  # net.ipv4.ip_local_reserved_ports as this bed found it

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> State | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


class RealCondor(CondorCommands):
    """One real-HTCondor environment: `up()`, `down()`, `status()`, and helpers to drive it.

    In layers, each of which the CE's own configuration (ce_k8s.real.condor.stockce.StockCE)
    overrides in places: the names and paths (ce_k8s.real.condor.condorlayout.CondorLayout), the
    commands in the root and what the daemons answer (ce_k8s.real.condor.condorcommands), and here
    the lifecycle: the root laid out and configured (its text in ce_k8s.real.condor.condorconfig),
    the daemons started, waited for and stopped.
    """

    #: The CE's configuration: this bed's own test configuration (ce_k8s.real.condor.stockce has HTCondor-CE's).
    ce_config = "bed"
    #: The loopback ports the bed's daemons listen on, reserved while it is up (ce_k8s.real.condor.ports).
    fixed_ports: tuple[int, ...] = (COLLECTOR_PORT,)
    #: The machine's ledger of those reservations; a test may give its bed one of its own.
    port_ledger: Path = ports.PORT_LEDGER

    def __init__(self, state_dir: Path | str = STATE_DIR, root: Path | str | None = None,
                 htcondor: str = DEFAULT_HTCONDOR, kube_server=None, batch: bool = False) -> None:
        # kube_server: a real control plane (ce_k8s.real.kube.kubeserver.RealKubeServer, handed in so
        # this room never imports the real one) instead of `ce-k8s sim serve`; the agent then runs
        # with the kubeconfig it writes (its ServiceAccount's token) and nothing is emulated.
        # batch: the batch pool as well (a schedd, a negotiator and a startd that runs that schedd's
        # jobs only, reachable with an IDTOKEN from outside the root; `batch_config`), opt-in because
        # a negotiator in the pool is a change to what the CE's own tests run against.
        self.flavour = flavour(htcondor)
        super().__init__(state_dir, root if root is not None else default_root(self.flavour.htcondor), batch=batch)
        self.kube_server = kube_server

    def core_api(self):
        """A kubernetes CoreV1Api on the emulator (the test bed's view of the cluster)."""
        from kubernetes import client
        from kubernetes.config import new_client_from_config

        if self.kube_server is not None:     # the site's hands (evictions), not the agent's token
            return self.kube_server.admin_core
        return client.CoreV1Api(new_client_from_config(config_file=str(self.kubeconfig)))

    # -------------------------------------------------------------------------- lifecycle
    def up(self, poll: int = 2, nodes: str = DEFAULT_NODES, time_scale: float = 0.05, progress=print,
           split_logs: bool = True, owner_pid: int | None = None) -> State:
        """Build (or reuse) the root, lay the CE configuration, start the emulator and condor_master.

        With `owner_pid`, a reaper (ce_k8s.real.reaper) takes the bed down when that process
        dies without doing it: a test run killed with its bed up leaves nothing running or mounted."""
        require_root()
        current = State.load(self.state_file)
        if current is not None and alive(current.master_pid):
            raise RealCondorError(f"already up (condor_master pid {current.master_pid}); "
                                  f"`ce-k8s testbed real-condor down --state {self.state_dir}` first")
        if current is not None:
            self.down(progress=progress)
        ports.refuse_listeners(self.fixed_ports)
        others = _processes_in(self.root)
        if others:
            raise RealCondorError(f"{len(others)} processes already run in {self.root} (a bed of another state "
                                  "directory is up?): one bed per root, `ce-k8s testbed real-condor down` it first")
        build_root(self.root, progress=progress, htcondor=self.flavour.htcondor)
        self._fresh_state_dir()
        mounts: list[str] = []
        state = State(str(self.root), str(self.state_dir), mounts, 0, "", 0, poll, time.time(), self.batch,
                      self.ce_config)
        state.save(self.state_file)
        try:
            if owner_pid is not None:
                state.reaper_pid = self._start_reaper(owner_pid)
                state.save(self.state_file)
            self._reserve_ports(state, progress)
            mounts += self._mount_all()
            state.save(self.state_file)
            self._accounts()
            if self.kube_server is not None:
                self.kube_server.write_kubeconfig(self.kubeconfig)
                state.api_url = self.kube_server.url
            else:
                state.sim_pid, state.api_url = self._start_sim(nodes, time_scale, split_logs)
            state.save(self.state_file)
            self._prepare_cluster()
            self._write_config(poll)
            if self.batch:
                self._signing_key()
            self._install_hooks()
            self._blah_worst_case()
            state.master_pid = self._start_master()
            state.save(self.state_file)
            self.wait_ready(progress=progress)
        except BaseException:
            with contextlib.suppress(Exception):
                self.down(progress=progress)
            raise
        progress(f"real HTCondor up: root {self.root}, state {self.state_dir}, API {state.api_url}")
        return state

    def _reserve_ports(self, state: State, progress) -> None:
        """Keep the daemons' ports from being any connection's local port until `down`, then wait
        for the connections that took one before (ce_k8s.real.condor.ports). The state names the
        ledger before the bed holds it, so a start that fails from here on gives it back."""
        state.port_ledger = str(self.port_ledger)
        state.save(self.state_file)
        state.reserved_ports = ports.reserve(str(self.state_file), self.fixed_ports, self.port_ledger)
        state.save(self.state_file)
        for port in self.fixed_ports:
            ports.wait_free(port, progress=progress)

    def _release_ports(self, state: State, progress) -> None:
        if not state.port_ledger:
            return
        others = ports.release(str(self.state_file), state.reserved_ports, Path(state.port_ledger))
        progress(f"real HTCondor down: ports {', '.join(map(str, self.fixed_ports))} "
                 + (f"still reserved for {len(others)} other bed(s)" if others else "no longer reserved"))

    def _start_reaper(self, owner_pid: int) -> int:
        with open(self.state_dir / "reaper.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "ce_k8s.real.reaper", "--bed", "condor",
                                     "--state", str(self.state_dir), "--pid", str(owner_pid)],
                                    stdout=log, stderr=log, start_new_session=True)
        return proc.pid

    def _fresh_state_dir(self) -> None:
        """A new state directory each `up`: old spools and logs would confuse the next run."""
        if self.state_dir.exists():
            _unmount_below(self.root)       # nothing of ours may still hold it
            shutil.rmtree(self.state_dir)
        spools = ["spool", "factory-spool"] + ([self.batch_spool.name] if self.batch else [])
        for sub, mode in (("", 0o755), ("run", 0o755), ("output", 0o700), ("submit", 0o755),
                          *((s, 0o755) for s in spools)):
            d = self.state_dir / sub
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(mode)
        condor = self._root_uid("condor")
        for sub in spools:
            os.chown(self.state_dir / sub, condor, condor)
        self.blah_log.touch()
        self.blah_log.chmod(0o666)  # BLAH's recorders run as the job owners
        for name in os.listdir(self.root / "var/log/condor"):
            (self.root / "var/log/condor" / name).unlink()

    def _mount_all(self) -> list[str]:
        from ce_k8s.agent.launchers import package_root

        root = self.root
        points = []
        if str(root / "proc") not in _mounts():
            _run(["mount", "-t", "proc", "proc", str(root / "proc")])
        points.append(str(root / "proc"))
        points.append(_bind("/dev", root))
        points.append(_bind(self.state_dir, root))
        # the hooks' package (stdlib-only modules): one path that every account can traverse
        points.append(_bind(Path(package_root()) / "ce_k8s", root, f"{PKG_MOUNT}/ce_k8s"))
        # the agent's interpreter and environment, at their own paths, read-only
        prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), package_root()}
        for prefix in sorted(prefixes, key=len):
            if prefix in ("/", "/usr", "/usr/local") or prefix.startswith(("/usr/", "/etc", "/var/")):
                raise RealCondorError(f"the agent's Python lives in {prefix}, which the root has too; "
                                      "use a Python installed elsewhere (a venv of a pyenv or "
                                      "/opt Python)")
            if any(prefix.startswith(p.rstrip("/") + "/") for p in prefixes if p != prefix):
                continue   # already inside another bound prefix
            points.append(_bind(prefix, root, readonly=True))
        return points

    def _accounts(self) -> None:
        for name, uid in ACCOUNTS.items():
            if self.run(["id", "-u", name], check=False).returncode != 0:
                self.run(["groupadd", "-g", str(uid), name])
                self.run(["useradd", "-m", "-u", str(uid), "-g", str(uid), "-s", "/bin/sh", name])
        hostname = os.uname().nodename
        hosts = (self.root / "etc/hosts").read_text() if (self.root / "etc/hosts").exists() else ""
        if f" {hostname}\n" not in hosts:
            # HTCondor-C from the factory schedd to the CE schedd resolves the host's own name
            (self.root / "etc/hosts").write_text(hosts + f"127.0.0.1 {hostname}\n")

    def _start_sim(self, nodes: str, time_scale: float, split_logs: bool) -> tuple[int, str]:
        out = self.state_dir / "sim.out"
        cmd = [sys.executable, "-m", "ce_k8s.cli", "sim", "serve", "--kubeconfig-out", str(self.kubeconfig),
               "--nodes", nodes, "--time-scale", str(time_scale), "--stats"]
        if split_logs and _serve_accepts("--split-logs"):
            cmd.append("--split-logs")
        with open(out, "w") as stdout, open(self.state_dir / "sim.log", "w") as stderr:
            proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = out.read_text()
            if text.startswith("ready "):
                break
            if proc.poll() is not None:
                raise RealCondorError(f"ce-k8s sim serve exited: {(self.state_dir / 'sim.log').read_text()[-800:]}")
            time.sleep(0.1)
        else:
            raise RealCondorError("ce-k8s sim serve did not print 'ready' within 60 s")
        self.kubeconfig.chmod(0o600)
        return proc.pid, text.split()[1]

    def _prepare_cluster(self) -> None:
        from kubernetes.client.rest import ApiException

        from ce_k8s.condor.config import CondorConfig
        from ce_k8s.settings import Settings

        core = self.core_api()
        namespaces = {Settings.from_config(CondorConfig.load(None)).namespace}
        if self.kube_server is not None:       # as a site does: the shipped Role in each namespace
            for ns in sorted(namespaces):
                self.kube_server.prepare_namespace(ns)
            return
        for ns in sorted(namespaces):
            try:
                core.create_namespace({"metadata": {"name": ns}})
            except ApiException as exc:
                if exc.status != 409:
                    raise

    def _write_config(self, poll: int) -> None:
        """Our shipped files as `ce-k8s` installs them, then the test bed's layer (sorted last)."""
        from ce_k8s.condor.config import default_config_paths

        confdir = self.root / CONFIG_DIR.lstrip("/")
        for old in confdir.iterdir():
            if old.name not in DEBIAN_CONFIG:
                old.unlink()
        for src in default_config_paths():
            for f in sorted(src.glob("*.conf")) if src.is_dir() else [src]:
                # routes/ after config.d's 20-ce-k8s-routing.conf, which starts JOB_ROUTER_ROUTE_NAMES
                name = f.name if f.parent.name == "config.d" else f"80-route-{f.name}"
                shutil.copy(f, confdir / name)
        prefix = os.path.realpath(sys.prefix)
        (confdir / "99-ce-k8s-testbed.conf").write_text(testbed_config(self.state_dir, poll, prefix,
                                                                       batch=self.batch) + self._kube_usage_config())

    def _kube_usage_config(self) -> str:
        """On a real control plane: the agent reads usage from the kubelets themselves (nodes/stats,
        which its Role grants; the bed's `proxy` default is for the emulator, and the agent may not
        get nodes/proxy), trusting the kubelets' CA, copied into the state directory (the agent runs
        in the root, where only the state directory is mounted). Read every 5 s: the bed's pilots
        live a minute or two. Empty on the emulator."""
        if self.kube_server is None:
            return ""
        ca = self.state_dir / "kubelet-ca.crt"
        shutil.copy(self.kube_server.env.kubelet_ca, ca)
        ca.chmod(0o644)
        return f"CE_K8S_USAGE_SOURCE = kubelet\nCE_K8S_KUBELET_CA = {ca}\nCE_K8S_USAGE_INTERVAL = 5\n"

    def _signing_key(self) -> None:
        """A fresh random IDTOKENS signing key, `/etc/condor/passwords.d/POOL` (SEC_TOKEN_POOL_SIGNING_KEY_FILE's
        default), root's and 0600 as HTCondor wants it. New on every `up`, so a token from an earlier
        bed never works on this one; the daemons verify with it and `batch_token` signs with it."""
        keydir = self.root / "etc/condor/passwords.d"
        keydir.mkdir(mode=0o700, exist_ok=True)
        key = keydir / "POOL"
        key.write_text(base64.b64encode(os.urandom(48)).decode() + "\n")
        os.chown(key, 0, 0)
        key.chmod(0o600)

    def _install_hooks(self) -> None:
        from ce_k8s.agent.launchers import HOOK_MODULE_FILES, install_hooks

        hook_dir = self.root / HOOK_DIR.lstrip("/")
        install_hooks(str(hook_dir), str(self.socket), 30.0, python="/usr/bin/python3",
                      spool=str(self.spool), package_dir=PKG_MOUNT)
        # the agent's log: a non-DaemonCore daemon's stderr goes nowhere, so the wrapper keeps it
        wrapper = hook_dir / "ce-k8s-agent-testbed"
        wrapper.write_text(f"#!/bin/sh\nexec {os.path.realpath(sys.prefix)}/bin/ce-k8s \"$@\" "
                           f"2>>{AGENT_LOG}\n")
        wrapper.chmod(0o755)
        # .pyc for the root's Python: the hooks run as pilot accounts and cannot write them
        files = [f"{PKG_MOUNT}/{rel}" for rel in HOOK_MODULE_FILES]
        self.run(["/usr/bin/python3", "-m", "py_compile", *files], check=False)

    def _blah_worst_case(self) -> None:
        conf = self.root / "etc/blah.config"
        text = conf.read_text() if conf.exists() else ""
        lines = [ln for ln in text.splitlines() if not ln.startswith("supported_lrms=")]
        lines.append("supported_lrms=" + ",".join(("pbs", "lsf", "sge", "condor", *BLAH_LRMS)))
        conf.write_text("\n".join(lines) + "\n")
        blahp = self.root / "usr/libexec/blahp"
        blahp.mkdir(parents=True, exist_ok=True)
        for lrms in BLAH_LRMS:
            for script in BLAH_SCRIPTS:
                path = blahp / f"{lrms}_{script}.sh"
                path.write_text(BLAH_RECORDER.format(log=self.blah_log))
                path.chmod(0o755)

    def _start_master(self) -> int:
        # the master writes its pid file as the condor account
        piddir = self.state_dir / "pid"
        piddir.mkdir(exist_ok=True)
        condor = self._root_uid("condor")
        os.chown(piddir, condor, condor)
        pidfile = piddir / "master.pid"
        self.run(["/usr/sbin/condor_master", "-pidfile", str(pidfile)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                pid_in_root = int(pidfile.read_text().split()[0])
                return pid_in_root   # chroot shares the pid namespace: the same pid outside
            time.sleep(0.1)
        raise RealCondorError(f"condor_master wrote no pid file: {self.log_path('MasterLog')}")

    def down(self, progress=print) -> dict[str, object]:
        """Stop everything `up` started and undo its mounts; safe to call twice.

        Without a state file this state directory has nothing up, and `down` touches nothing: what
        runs in the root then belongs to a bed of another state directory (a `down` with the default
        `--state` once killed and unmounted a test run's bed in the same root).
        """
        require_root()
        state = State.load(self.state_file)
        self._follow(state)
        report: dict[str, object] = {"condor_off": False, "killed": 0, "unmounted": 0}
        if state is None:
            others = len(_processes_in(self.root))
            if others:
                report["other_bed_processes"] = others
            progress(f"real HTCondor down: nothing is up for {self.state_dir}"
                     + (f"; {others} processes run in {self.root} for another state directory, left alone"
                        if others else ""))
            return report
        if state is not None and alive(state.master_pid):
            off = self.run(["condor_off", "-master"], check=False, timeout=30)
            report["condor_off"] = off.returncode == 0
            if off.returncode != 0:
                # Refused (HTCondor-CE's ALLOW_ADMINISTRATOR does not admit root here): SIGTERM is
                # the master's own graceful shutdown, and waiting for a command that never came cost 40 s.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state.master_pid, signal.SIGTERM)
            deadline = time.monotonic() + 40
            while alive(state.master_pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if alive(state.master_pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state.master_pid, signal.SIGQUIT)
        deadline = time.monotonic() + 10
        while (left := _processes_in(self.root)) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM if time.monotonic() < deadline - 5 else signal.SIGKILL)
            report["killed"] = int(report["killed"]) + len(left)  # type: ignore[call-overload]
            time.sleep(0.3)
        if state is not None and alive(state.sim_pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(state.sim_pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while alive(state.sim_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(state.sim_pid, signal.SIGKILL)
        report["unmounted"] = len(_unmount_below(self.root))
        if state is not None:
            self._release_ports(state, progress)
            with contextlib.suppress(OSError):
                self.state_file.unlink()
            if state.reaper_pid and state.reaper_pid != os.getpid():
                terminate(state.reaper_pid, timeout=5)     # the owner took it down: nothing left to reap
        progress(f"real HTCondor down: {report}")
        return report

    def _follow(self, state: State | None) -> None:
        """`down`/`status` act on the root that `up` used, whatever `--htcondor` says now: the
        state directory knows which one it mounted."""
        if state is not None and state.root and Path(state.root) != self.root:
            self.root = Path(state.root)

    def status(self) -> dict[str, object]:
        state = State.load(self.state_file)
        self._follow(state)
        built = (self.root / MARKER).exists()
        out: dict[str, object] = {"root": str(self.root), "built": built, "state": str(self.state_dir),
                                  "up": False}
        if built:
            marker = root_marker(self.root) or {}
            out["condor"] = marker.get("condor")
            out["suite"] = marker.get("suite")
        if state is None:
            return out
        out.update(up=alive(state.master_pid), master_pid=state.master_pid, sim=alive(state.sim_pid),
                   ce_config=state.ce_config, batch=state.batch,
                   **({"batch_schedd": self.batch_name, "collector": self.collector_address}
                                         if state.batch else {}),
                   api_url=state.api_url, reserved_ports=ports.reserved(),
                   mounts=[m for m in _mounts() if m.startswith(str(self.root) + "/")],
                   processes_in_root=len(_processes_in(self.root)))
        if out["up"]:
            with contextlib.suppress(RealCondorError, ValueError, subprocess.TimeoutExpired):
                jobs = self.query(attrs=("JobStatus",))
                counts: dict[str, int] = {}
                for job in jobs:
                    key = str(job.get("JobStatus"))
                    counts[key] = counts.get(key, 0) + 1
                out["ce_jobs_by_status"] = counts
        return out


def _serve_accepts(flag: str) -> bool:
    """Whether `ce-k8s sim serve` knows `flag` (the split-logs option is newer than the serve command)."""
    import argparse

    from ce_k8s.sim import serve
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return any(flag in action.option_strings for action in parser._actions)
