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
HOOK_DIR = "/usr/libexec/ce-k8s"     # the launchers, inside the root (0755: the router refuses
                                     # a hook in a world-writable directory)
CONFIG_DIR = "/etc/condor/config.d"
AGENT_LOG = "/var/log/condor/CeK8sAgentLog"
DEBIAN_CONFIG = frozenset({"00-htcondor-9.0.config"})   # what the condor package puts there
COLLECTOR_PORT = 19618
CE_SCHEDD = "ce"
FACTORY_SCHEDD = "factory"
#: The batch pool's schedd (`RealCondor(batch=True)`; docs/real-condor.md, "The batch pool").
BATCH_SCHEDD = "batch"
#: The account the batch pool's token maps to (`RealCondor.batch_token`): its jobs run as this uid.
BATCH_ACCOUNT = "htcuser"
#: The batch startd's static slots, whatever the machine has (2 cores here): enough for a few jobs at once.
BATCH_SLOTS = 4
BATCH_SLOT_MEMORY = 1024           # MB per slot; MEMORY = BATCH_SLOTS * this
# The pilot accounts of ce_k8s.sim.pilots.OWNERS, the factory's account, one user of the Slurm route,
# and the batch pool's user.
ACCOUNTS = {"osg01": 47001, "cmspilot": 47002, "osggpu": 47003, "atlaspilot": 47004, "gfactory": 47010,
            "slurmuser": 47020, BATCH_ACCOUNT: 47030}
BLAH_LRMS = ("k8s", "slurm")
BLAH_SCRIPTS = ("submit", "status", "cancel", "hold", "resume", "ping")
DEFAULT_NODES = ("cpu:8x64c256g,"
                 "gpu:2x32c256g4gpu:taint=nvidia.com/gpu:NoSchedule:label=nvidia.com/gpu.present=true,"
                 "wholenode:2x64c256g:label=ce-k8s.htcondor.org/pool=wholenode")


class RealCondorError(RuntimeError):
    """The environment cannot be built or started; the message says what to do."""


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


def _processes_in(root: Path) -> list[int]:
    """Pids whose root directory is `root` (what a chroot started and what they started)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/root") == str(root):
                pids.append(int(entry))
    return pids


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return fh.read().split(") ")[-1][:1] != "Z"
    return True


# ---------------------------------------------------------------------------------- configuration
#: Authentication and authorization among the test accounts of one root (loopback only): the
#: default bed's whole CE and the stock mode's factory host (ce_k8s.real.condor.stockce), never its CE.
LOCAL_TRUST = """\
SEC_DEFAULT_AUTHENTICATION_METHODS = FS, CLAIMTOBE
SEC_CLIENT_AUTHENTICATION_METHODS = FS, CLAIMTOBE
ALLOW_READ = *
ALLOW_WRITE = *
ALLOW_NEGOTIATOR = *
ALLOW_ADMINISTRATOR = *
ALLOW_DAEMON = *
ALLOW_OWNER = *
QUEUE_SUPER_USERS = root, condor
"""


def agent_and_demo_config(state: Path) -> str:
    """The agent's files in the state directory, and the DemoScenario transform: the same on the
    default bed and on the CE's own configuration (ce_k8s.real.condor.stockce)."""
    return f"""\
CE_K8S_HOOK_DIR = {HOOK_DIR}
CE_K8S_SOCKET = {state}/run/agent.sock
CE_K8S_SPOOL = {state}/spool
CE_K8S_OUTPUT_DIR = {state}/output
CE_K8S_KUBECONFIG = {state}/kubeconfig
CE_K8S_CE_NAME = real-condor-testbed
CE_K8S_METRICS_ADDRESS =
# the wrapper already appends the agent's stderr to $(LOG)/CeK8sAgentLog: no second writer
CE_K8S_AGENT_LOG = none
CE_K8S_GC_GRACE = 30
CE_K8S_HOOK_TIMEOUT = 30
# The emulator's kubelets answer the Summary API at the API server's node proxy only (docs/testbed.md).
CE_K8S_USAGE_SOURCE = proxy

# The kubelet simulator plays each pilot's DemoScenario (ce_k8s.sim.pilots).
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES) DemoScenario
JOB_ROUTER_TRANSFORM_DemoScenario @=jrt
    REQUIREMENTS DemoScenario isnt undefined
    SET K8sAnnotations [ 'sim.ce-k8s.io/scenario' = "$(MY.DemoScenario)" ]
@jrt

# A pilot the demo sends to a real node (ce_k8s.real.node.node) runs its own glidein script in busybox,
# the one image the node has; only pods that select and tolerate the real node land there.
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES) DemoRealNode
JOB_ROUTER_TRANSFORM_DemoRealNode @=jrt
    REQUIREMENTS DemoRealNode is true
    SET K8sImage "ce-k8s.invalid/busybox:1.35"
    SET K8sNodeSelector [ 'ce-k8s.test/real-node' = "true" ]
    SET K8sTolerations {{ [ key = "ce-k8s.test/real-node"; operator = "Exists"; effect = "NoSchedule" ] }}
@jrt
"""


def testbed_config(state: Path, poll: int, python_prefix: str, batch: bool = False) -> str:
    """The test bed's own layer over the shipped ce-k8s files (sorted last: `99-`); with `batch`, the
    batch pool's layer (`batch_config`) at its end, so that it overrides what it must."""
    return f"""\
# ce-k8s real-HTCondor test bed (ce_k8s/real/condor/condor.py; docs/real-condor.md).
CONDOR_HOST = 127.0.0.1
NETWORK_INTERFACE = 127.0.0.1
USE_SHARED_PORT = False
COLLECTOR_HOST = 127.0.0.1:{COLLECTOR_PORT}
DAEMON_LIST = MASTER, COLLECTOR, SCHEDD, JOB_ROUTER, FACTORY_SCHEDD, CE_K8S_AGENT
SCHEDD_NAME = {CE_SCHEDD}
SPOOL = {state}/spool
# Loopback only; every user on this root is a test account.
{LOCAL_TRUST}SCHEDD_INTERVAL = 5
SCHEDD_MIN_INTERVAL = 1
JOB_ROUTER_POLLING_PERIOD = {poll}
JOB_ROUTER_SCHEDD1_SPOOL = $(SPOOL)
# A completed routed job leaves the queue by the schedd's periodic-expression pass (it is
# "ScheddDone", schedd.cpp PeriodicExprEval); the router must not forget a retired job sooner
# (MAX_JOB_MIRROR_UPDATE_LAG, default 600 s), or it adopts the finished job again.
PERIODIC_EXPR_INTERVAL = 5
# so that `condor_restart -daemon job_router` finds the router (it advertises no ad)
JOB_ROUTER_ADDRESS_FILE = $(LOG)/.job_router_address
JOB_ROUTER_DEBUG = D_FULLDEBUG
GRIDMANAGER_JOB_PROBE_INTERVAL = 5
C_GAHP_CONTACT_SCHEDD_DELAY = 2
GRIDMANAGER_MAX_SUBMITTED_JOBS_PER_RESOURCE = 1000
MASTER_NEW_BINARY_RESTARTS = NEVER
MASTER_BACKOFF_CONSTANT = 1
MASTER_BACKOFF_CEILING = 5

# The factory: a second schedd that submits pilots to the CE over HTCondor-C, as GlideinWMS does.
FACTORY_SCHEDD = $(SCHEDD)
FACTORY_SCHEDD_ARGS = -local-name {FACTORY_SCHEDD}
{FACTORY_SCHEDD}.SCHEDD_NAME = {FACTORY_SCHEDD}
{FACTORY_SCHEDD}.SPOOL = {state}/factory-spool
{FACTORY_SCHEDD}.SCHEDD_LOG = $(LOG)/SchedLog.{FACTORY_SCHEDD}
{FACTORY_SCHEDD}.SCHEDD_ADDRESS_FILE = {state}/factory-spool/.schedd_address
{FACTORY_SCHEDD}.JOB_QUEUE_LOG = {state}/factory-spool/job_queue.log
{FACTORY_SCHEDD}.SCHEDD_DAEMON_AD_FILE = {state}/factory-spool/.schedd_classad
DC_DAEMON_LIST = + FACTORY_SCHEDD

# ce-k8s: the agent under condor_master (non-DaemonCore) and the information provider in the
# CE schedd's cron, both on this checkout's interpreter.
CE_K8S_INFO_EXECUTABLE = {python_prefix}/bin/ce-k8s
CE_K8S_INFO_CONFIG = /etc/condor/condor_config
{FACTORY_SCHEDD}.SCHEDD_CRON_CEK8SINFO_EXECUTABLE = /bin/true
CE_K8S_AGENT = {HOOK_DIR}/ce-k8s-agent-testbed
CE_K8S_AGENT_ARGS = agent --verbose --config /etc/condor/condor_config
CE_K8S_AGENT_ENVIRONMENT = "CONDOR_CONFIG=/etc/condor/condor_config PYTHONUNBUFFERED=1"
{agent_and_demo_config(state)}
# A batch route next to ours, as on a mixed CE (HTCondor-CE's own Slurm route shape). It takes
# only jobs that ask for it, and it is tried first.
JOB_ROUTER_ROUTE_Slurm_Cluster @=jrt
    REQUIREMENTS TestBatchRoute =?= true
    UNIVERSE 9
    GridResource = "batch slurm"
@jrt
JOB_ROUTER_ROUTE_NAMES = Slurm_Cluster $(JOB_ROUTER_ROUTE_NAMES)
""" + (batch_config(state) if batch else "")


#: The batch startd's START: only jobs whose GlobalJobId the batch schedd wrote. Each schedd sets
#: GlobalJobId itself at submit (`<Name>#<cluster>.<proc>#<qdate>`, the batch schedd's Name being
#: `batch@<host>`), overwriting a `+GlobalJobId` of the submit file; a job attribute of the
#: submitter's choosing (`+BatchJob = true`) could not keep a CE job off the slots. But a job's
#: owner may `condor_qedit` GlobalJobId afterwards (seen: a CE job edited to `batch@...` was
#: claimed and started within seconds), so batch mode also makes it a PROTECTED_JOB_ATTRS
#: (only the queue super users, root and condor, may change it).
BATCH_START = f'regexp("^{BATCH_SCHEDD}@", TARGET.GlobalJobId ?: "")'


def batch_config(state: Path) -> str:
    """The batch pool (`RealCondor(batch=True)`): a third schedd, a negotiator and a startd under the
    same master and collector, and IDTOKENS beside FS/CLAIMTOBE (docs/real-condor.md, "The batch pool").

    Why each part:

    * **The START rule.** With a negotiator and a startd in the pool, the CE schedd's idle vanilla
      source jobs are candidates for a match like any job. A pilot must run once, where the router
      sends it (a Kubernetes pod), never also on a local slot; so the startd takes only jobs whose
      GlobalJobId the batch schedd wrote (`BATCH_START`), and GlobalJobId is protected from its
      owner's `condor_qedit`.
    * **Short intervals**, so that a batch job starts within seconds instead of HTCondor's minute:
      negotiation every 2 s, and NEGOTIATOR_CYCLE_DELAY (the negotiator's own floor between two
      cycles, 20 s by default and in no param table; with it, cycles ran 20 s apart whatever
      NEGOTIATOR_INTERVAL said) at 1 s. The CE schedd keeps the bed's SCHEDD_INTERVAL of 5 s.
    * **Static slots** (`BATCH_SLOTS` of `BATCH_SLOT_MEMORY` MB): a fixed pool on any machine; no
      benchmarks at start (the first slot sat in Benchmarking).
    * **MOUNT_UNDER_SCRATCH empty**: the starter gives a job a private /tmp and /var/tmp with
      unshare(CLONE_NEWNS), which a chrooted process is refused ("Failed to unshare the mount
      namespace", errno 22: every job was held before exec).
    * **IDTOKENS, required authentication.** A client outside the root (the host's `htcondor2`)
      cannot use FS (the server looks for the client's file in its own /tmp) and must not use
      CLAIMTOBE (it could be anyone), so it presents an IDTOKEN signed with the root's POOL key
      (`RealCondor.batch_token`). Authentication is REQUIRED: without it a client whose methods
      all failed went on unauthenticated, and ALLOW_WRITE = * let it in (`htcondor2.ping` said
      `unauthenticated@unmapped`, WRITE authorized). READ too: Debian's 23.9 package makes it
      optional (`security:recommended_v9_0`, which its 25 package no longer ships), and a host
      client without a token then read the batch queue on 23.9 only. The bed's own accounts in the
      root are unaffected: their client list stays FS, CLAIMTOBE, and CLAIMTOBE always authenticates.
    """
    spool = f"{state}/{BATCH_SCHEDD}-spool"
    return f"""
# ---- The batch pool (RealCondor(batch=True); docs/real-condor.md, "The batch pool").
DAEMON_LIST = $(DAEMON_LIST), BATCH_SCHEDD, NEGOTIATOR, STARTD
BATCH_SCHEDD = $(SCHEDD)
BATCH_SCHEDD_ARGS = -local-name {BATCH_SCHEDD}
{BATCH_SCHEDD}.SCHEDD_NAME = {BATCH_SCHEDD}
{BATCH_SCHEDD}.SPOOL = {spool}
{BATCH_SCHEDD}.SCHEDD_LOG = $(LOG)/SchedLog.{BATCH_SCHEDD}
{BATCH_SCHEDD}.SCHEDD_ADDRESS_FILE = {spool}/.schedd_address
{BATCH_SCHEDD}.JOB_QUEUE_LOG = {spool}/job_queue.log
{BATCH_SCHEDD}.SCHEDD_DAEMON_AD_FILE = {spool}/.schedd_classad
{BATCH_SCHEDD}.SCHEDD_CRON_CEK8SINFO_EXECUTABLE = /bin/true
{BATCH_SCHEDD}.SCHEDD_INTERVAL = 2
DC_DAEMON_LIST = $(DC_DAEMON_LIST), BATCH_SCHEDD

# Negotiation within seconds (NEGOTIATOR_CYCLE_DELAY: 20 s between cycles unless set).
NEGOTIATOR_INTERVAL = 2
NEGOTIATOR_MIN_INTERVAL = 1
NEGOTIATOR_CYCLE_DELAY = 1
NEGOTIATOR_UPDATE_INTERVAL = 2
STARTD.UPDATE_INTERVAL = 2

# The startd: {BATCH_SLOTS} static slots whatever the machine has; it runs the batch schedd's jobs only.
NUM_CPUS = {BATCH_SLOTS}
MEMORY = {BATCH_SLOTS * BATCH_SLOT_MEMORY}
SLOT_TYPE_1 = cpus=1, memory={BATCH_SLOT_MEMORY}
NUM_SLOTS_TYPE_1 = {BATCH_SLOTS}
RUNBENCHMARKS = False
use POLICY : ALWAYS_RUN_JOBS
START = {BATCH_START}
# only the schedds set GlobalJobId: a job owner's condor_qedit of it would get past START
PROTECTED_JOB_ATTRS = GlobalJobId
# a chrooted starter cannot unshare a mount namespace for a private /tmp
MOUNT_UNDER_SCRATCH =

# Tokens from outside the root; FS and CLAIMTOBE stay for the bed's accounts inside it.
SEC_DEFAULT_AUTHENTICATION_METHODS = IDTOKENS, FS, CLAIMTOBE
SEC_DEFAULT_AUTHENTICATION = REQUIRED
# Debian's 23.9 package makes READ optional (its 00-htcondor-9.0.config, security:recommended_v9_0)
SEC_READ_AUTHENTICATION = REQUIRED
"""


BLAH_RECORDER = """#!/bin/sh
# ce-k8s real-HTCondor test bed: records the call instead of talking to a batch system.
echo "$(date +%s) $(basename "$0") $*" >> {log}
case "$(basename "$0")" in
  *_submit.sh) echo "BLAHP_JOBID_PREFIX$(date +%s%N)" ;;
  *_status.sh) echo "[BatchJobId=\\"$2\\"; JobStatus=1;]" ;;
esac
exit 0
"""


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

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> State | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


class RealCondor:
    """One real-HTCondor environment: `up()`, `down()`, `status()`, and helpers to drive it."""

    #: The CE's configuration: this bed's own test configuration (ce_k8s.real.condor.stockce has HTCondor-CE's).
    ce_config = "bed"

    def __init__(self, state_dir: Path | str = STATE_DIR, root: Path | str | None = None,
                 htcondor: str = DEFAULT_HTCONDOR, kube_server=None, batch: bool = False) -> None:
        # kube_server: a real control plane (ce_k8s.real.kube.kubeserver.RealKubeServer, handed in so
        # this room never imports the real one) instead of `ce-k8s sim serve`; the agent then runs
        # with the kubeconfig it writes (its ServiceAccount's token) and nothing is emulated.
        # batch: the batch pool as well (a schedd, a negotiator and a startd that runs that schedd's
        # jobs only, reachable with an IDTOKEN from outside the root; `batch_config`), opt-in because
        # a negotiator in the pool is a change to what the CE's own tests run against.
        self.kube_server = kube_server
        self.batch = batch
        self._uid_domain: str | None = None
        self.flavour = flavour(htcondor)
        self.state_dir = Path(state_dir).absolute()
        self.root = Path(root if root is not None else default_root(self.flavour.htcondor)).absolute()
        self.state_file = self.state_dir / "state.json"

    # -------------------------------------------------------------------------- paths
    @property
    def spool(self) -> Path:
        return self.state_dir / "spool"

    @property
    def socket(self) -> Path:
        return self.state_dir / "run" / "agent.sock"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def blah_log(self) -> Path:
        return self.state_dir / "blah-calls.log"

    @property
    def ce_name(self) -> str:
        """The CE schedd's Name in the collector (HTCondor appends `@<host>` to SCHEDD_NAME)."""
        return f"{CE_SCHEDD}@{os.uname().nodename}"

    @property
    def factory_name(self) -> str:
        return f"{FACTORY_SCHEDD}@{os.uname().nodename}"

    @property
    def grid_resource(self) -> str:
        """What the factory's grid jobs name: `condor <CE schedd> <CE collector>`."""
        return f"condor {self.ce_name} 127.0.0.1:{COLLECTOR_PORT}"

    @property
    def batch_name(self) -> str:
        """The batch schedd's Name in the collector (`batch@<host>`), what a client locates."""
        return f"{BATCH_SCHEDD}@{os.uname().nodename}"

    @property
    def batch_spool(self) -> Path:
        return self.state_dir / f"{BATCH_SCHEDD}-spool"

    @property
    def collector_address(self) -> str:
        """The pool's collector as a client outside the root names it (`htcondor2.Collector(...)`)."""
        return f"127.0.0.1:{COLLECTOR_PORT}"

    @property
    def uid_domain(self) -> str:
        """The root's UID_DOMAIN (the host's name unless configured): the domain a token's identity
        must carry for the starter to run the job as the account it names."""
        if self._uid_domain is None:
            self._uid_domain = self.run(["condor_config_val", "UID_DOMAIN"]).stdout.strip()
        return self._uid_domain

    def batch_token(self, identity: str | None = None) -> str:
        """An IDTOKEN for the batch pool, made by HTCondor's own `condor_token_create` in the root from
        the signing key `up` wrote; `identity` defaults to `htcuser@<UID_DOMAIN>`.

        A client outside the root presents it (IDTOKENS). The schedd takes the identity as the job's
        `User` and its user part as `Owner`, and the starter runs the job as that account of the
        root. The default's domain is UID_DOMAIN, so `User` reads as a local submitter's would; a
        token for `htcuser@other.example` also ran as `htcuser` (measured), so the domain is not what
        decides the uid. The token carries no authorization limits: the identity's rights are the
        pool's ALLOW_* for it (all of them, in this bed).
        """
        if not self.batch:
            raise RealCondorError("batch_token: this bed has no batch pool; bring it up with "
                                  "RealCondor(..., batch=True) (`ce-k8s testbed real-condor up --batch`)")
        identity = identity or f"{BATCH_ACCOUNT}@{self.uid_domain}"
        token = self.run(["condor_token_create", "-identity", identity, "-key", "POOL"]).stdout.strip()
        if not token:
            raise RealCondorError("condor_token_create printed no token")
        return token

    def condor_config_for(self, args: list[str]) -> str:
        """The CONDOR_CONFIG a command in the root runs with (one configuration here; the CE's own
        configuration mode, ce_k8s.real.condor.stockce, has two hosts' worth)."""
        return "/etc/condor/condor_config"

    def log_path(self, name: str) -> Path:
        """A daemon log of the root (`SchedLog`, `JobRouterLog`, `GridmanagerLog.<owner>`, ...)."""
        return self.root / "var/log/condor" / name

    # -------------------------------------------------------------------------- commands in the root
    def run(self, args: list[str], *, user: str | None = None, input: str | None = None,
            check: bool = True, timeout: float = 120, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command inside the root (as `user` if given), with the root's HTCondor config."""
        cmd = ["chroot"]
        if user:
            cmd.append(f"--userspec={user}:{user}")
        cmd += [str(self.root)]
        if cwd:
            cmd += ["/bin/sh", "-c", 'cd "$0" && exec "$@"', cwd]
        cmd += args
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CONDOR_CONFIG": self.condor_config_for(args),
               "LANG": "C", "HOME": f"/home/{user}" if user else "/root"}
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout,
                              env=env, check=False)
        if check and proc.returncode != 0:
            raise RealCondorError(f"{' '.join(args)} failed ({proc.returncode}): "
                                  f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        return proc

    def query(self, constraint: str = "true", attrs: tuple[str, ...] = (), schedd: str | None = None) -> list[dict]:
        """`condor_q -json` of every user's jobs on the CE schedd (or `schedd`) as dicts."""
        args = ["condor_q", "-allusers", "-json", "-constraint", constraint]
        if schedd:
            args += ["-name", schedd]
        if attrs:
            args += ["-attributes", ",".join(attrs)]
        out = self.run(args).stdout.strip()
        return json.loads(out) if out else []

    def history(self, constraint: str = "true", attrs: tuple[str, ...] = (), schedd: str | None = None) -> list[dict]:
        """`condor_history -json` of the CE schedd (its history file), or of the schedd named `schedd`
        (asked over the wire: another schedd's history is in its own spool)."""
        args = ["condor_history", "-json", "-constraint", constraint]
        if schedd:
            args += ["-name", schedd]
        if attrs:
            args += ["-attributes", ",".join(attrs)]
        out = self.run(args, check=False).stdout.strip()
        return json.loads(out) if out.startswith("[") else []

    def agent_pids(self) -> list[int]:
        """The ce-k8s agent processes condor_master runs in the root (its wrapper execs `ce-k8s agent`)."""
        pids = []
        for pid in _processes_in(self.root):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(c.endswith(b"/ce-k8s") for c in cmd[:2]) and b"agent" in cmd:
                pids.append(pid)
        return pids

    def core_api(self):
        """A kubernetes CoreV1Api on the emulator (the test bed's view of the cluster)."""
        from kubernetes import client
        from kubernetes.config import new_client_from_config

        if self.kube_server is not None:     # the site's hands (evictions), not the agent's token
            return self.kube_server.admin_core
        return client.CoreV1Api(new_client_from_config(config_file=str(self.kubeconfig)))

    # -------------------------------------------------------------------------- lifecycle
    def up(self, poll: int = 2, nodes: str = DEFAULT_NODES, time_scale: float = 0.05, progress=print,
           split_logs: bool = True) -> State:
        """Build (or reuse) the root, lay the CE configuration, start the emulator and condor_master."""
        require_root()
        current = State.load(self.state_file)
        if current is not None and _alive(current.master_pid):
            raise RealCondorError(f"already up (condor_master pid {current.master_pid}); "
                                  f"`ce-k8s testbed real-condor down --state {self.state_dir}` first")
        if current is not None:
            self.down(progress=progress)
        _port_free(COLLECTOR_PORT)
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
                                                                       batch=self.batch))

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

    def _root_uid(self, name: str) -> int:
        """The uid of `name` in the root's /etc/passwd (the root's accounts are not the host's)."""
        for line in (self.root / "etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == name:
                return int(fields[2])
        raise RealCondorError(f"no account {name!r} in {self.root}/etc/passwd")

    def wait_ready(self, timeout: float = 90, progress=print) -> None:
        """Until the CE schedd, the factory schedd and the job router answer, and the agent pings; with
        the batch pool, also until the batch schedd answers and every slot is in the collector
        (a test's first batch job would otherwise wait for the startd's first update)."""
        from ce_k8s import protocol

        deadline = time.monotonic() + timeout
        need = {"ce schedd", "factory schedd", "job router", "agent"}
        if self.batch:
            need |= {"batch schedd", "batch slots"}
        while need and time.monotonic() < deadline:
            if "batch schedd" in need and self.run(["condor_q", "-totals", "-name", self.batch_name],
                                                   check=False).returncode == 0:
                need.discard("batch schedd")
            if "batch slots" in need:
                slots = self.run(["condor_status", "-af", "Name"], check=False).stdout.split()
                if len(slots) >= BATCH_SLOTS:
                    need.discard("batch slots")
            if "ce schedd" in need and self.run(["condor_q", "-totals"], check=False).returncode == 0:
                need.discard("ce schedd")
            if "factory schedd" in need and self.run(["condor_q", "-totals", "-name", self.factory_name],
                                                     check=False).returncode == 0:
                need.discard("factory schedd")
            if "job router" in need and "JobRouter: Checking for candidate jobs" in self._read_log("JobRouterLog"):
                need.discard("job router")
            if "agent" in need:
                with contextlib.suppress(OSError, protocol.ProtocolError):
                    if protocol.ask(str(self.socket), protocol.VERB_PING, b"", 2).status == protocol.STATUS_OK:
                        need.discard("agent")
            if need:
                time.sleep(0.5)
        if need:
            raise RealCondorError(f"not ready after {timeout:.0f} s: {', '.join(sorted(need))} "
                                  f"(logs in {self.root}/var/log/condor)")

    def _read_log(self, name: str) -> str:
        try:
            return self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""

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
        if state is not None and _alive(state.master_pid):
            off = self.run(["condor_off", "-master"], check=False, timeout=30)
            report["condor_off"] = off.returncode == 0
            if off.returncode != 0:
                # Refused (HTCondor-CE's ALLOW_ADMINISTRATOR does not admit root here): SIGTERM is
                # the master's own graceful shutdown, and waiting for a command that never came cost 40 s.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state.master_pid, signal.SIGTERM)
            deadline = time.monotonic() + 40
            while _alive(state.master_pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _alive(state.master_pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state.master_pid, signal.SIGQUIT)
        deadline = time.monotonic() + 10
        while (left := _processes_in(self.root)) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM if time.monotonic() < deadline - 5 else signal.SIGKILL)
            report["killed"] = int(report["killed"]) + len(left)  # type: ignore[call-overload]
            time.sleep(0.3)
        if state is not None and _alive(state.sim_pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(state.sim_pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _alive(state.sim_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(state.sim_pid, signal.SIGKILL)
        report["unmounted"] = len(_unmount_below(self.root))
        if state is not None:
            with contextlib.suppress(OSError):
                self.state_file.unlink()
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
        out.update(up=_alive(state.master_pid), master_pid=state.master_pid, sim=_alive(state.sim_pid),
                   ce_config=state.ce_config, batch=state.batch,
                   **({"batch_schedd": self.batch_name, "collector": self.collector_address}
                                         if state.batch else {}),
                   api_url=state.api_url, mounts=[m for m in _mounts() if m.startswith(str(self.root) + "/")],
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


def _port_free(port: int) -> None:
    """Refuse to start a second bed: every bed's daemons use the same loopback ports (the collector's
    first), so two at once talk to each other's daemons, and the second one's `down` would unmount and
    kill the first one's (seen when another session brought a bed up on a copy of the root)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise RealCondorError(f"127.0.0.1:{port} is in use ({exc.strerror}): another real-HTCondor bed (or "
                                  "a collector) is running; one bed per machine at a time, "
                                  "`ce-k8s testbed real-condor status --state DIR` finds it") from None


def _serve_accepts(flag: str) -> bool:
    """Whether `ce-k8s sim serve` knows `flag` (the split-logs option is newer than the serve command)."""
    import argparse

    from ce_k8s.sim import serve
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return any(flag in action.option_strings for action in parser._actions)
