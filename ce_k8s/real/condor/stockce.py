"""The real-HTCondor test bed with HTCondor-CE's own configuration (`--ce-config stock`).

    ce-k8s testbed real-condor up --ce-config stock [--state DIR]

The default bed (ce_k8s.real.condor.condor) runs one condor_master with a test configuration of
ours. This mode runs the real HTCondor 25 daemons the way an OSG CE does, on two "hosts" in the
one root:

* **The CE** is a condor_master with `CONDOR_CONFIG=/etc/condor-ce/condor_config` (what the
  condor-ce service sets): HTCondor-CE's stock files from tests/fixtures/stock_ce, unedited
  (`use security:recommended`, the router defaults, the batch packages' routes), then what
  `ce-k8s install` writes into /etc/condor-ce/config.d (its knob files and routes), then one site
  file of the bed's, `99-ce-k8s-testbed.conf`, whose every line says why it is there. The CE's
  ports are HTCondor-CE's: shared port and collector on 9619.
* **The factory** is a second condor_master with the root's own /etc/condor (Debian's file and
  a layer of ours): a collector on 19618 (the port that makes one bed per machine) and a schedd
  that submits pilots as `universe = grid`, `grid_resource = condor <CE> <CE>:9619`, as GlideinWMS
  does. Its HTCondor-C client (the C-GAHP) authenticates with TOKEN only, with an IDTOKEN
  that HTCondor's own `condor_token_create` made from the CE's signing key (the bed writes a
  random one in /etc/condor-ce/passwords.d/POOL): the CE sees `osg01@users.htcondor.org`, the
  pilot account, and the routed job runs as it. No CLAIMTOBE or FS crosses from factory to CE.
* **The CE's wrapper commands** (`condor_ce_q`, `condor_ce_status`, `condor_ce_job_router_info`,
  `condor_ce_config_val`, ...) are in the root's /usr/bin as two-line scripts that do what
  HTCondor-CE's do: set CONDOR_CONFIG to the CE's and exec the HTCondor command.

`RealCondor.run` picks the configuration per command: one that names the factory schedd runs
with the factory host's, every other one with the CE's, as `condor_ce_*` would.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from ce_k8s.real.condor.condor import (
    ACCOUNTS,
    CE_SCHEDD,
    COLLECTOR_PORT,
    CONFIG_DIR,
    DEBIAN_CONFIG,
    FACTORY_SCHEDD,
    HOOK_DIR,
    LOCAL_TRUST,
    RealCondor,
    RealCondorError,
    _bind,
    agent_and_demo_config,
)
from ce_k8s.real.condor.issuer import ISSUER_PORT, IssuerError, TestIssuer
from ce_k8s.real.processes import alive

CE_CONFIGS = ("bed", "stock")
CE_CONDOR_CONFIG = "/etc/condor-ce/condor_config"
FACTORY_CONDOR_CONFIG = "/etc/condor/condor_config"
CE_PORT = 9619                      # HTCondor-CE's condor_config: PORT, SHARED_PORT_PORT, COLLECTOR_PORT
CE_LOG = "/var/log/condor-ce"
#: The pilot account the factory's token names (an OSG CE maps a VO's token to one such account).
PILOT_ACCOUNT = "osg01"
FACTORY_ACCOUNT = "gfactory"
UID_DOMAIN = "users.htcondor.org"   # 05-ce-auth-defaults.conf: UID_DOMAIN, USERS = *@users.htcondor.org
TOKEN_NAME = "ce-k8s-testbed-ce"   # noqa: S105 (a file name)
#: The factory's SciToken: its subject (what the CE's mapfile line names) and its file in the
#: factory account's home, as a GlideinWMS factory keeps a frontend's token in its credential directory.
SCITOKEN_SUBJECT = "ce-k8s-testbed-frontend"
SCITOKEN_FILE = f"/home/{FACTORY_ACCOUNT}/credentials/pilot.scitoken"
#: The mapfile the bed adds to HTCondor-CE's /etc/condor-ce/mapfiles.d (a site's own file).
SCITOKENS_MAPFILE = "/etc/condor-ce/mapfiles.d/20-ce-k8s-testbed.conf"
#: The root's system trust store, which the bed extends with its CA while up.
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
#: condor_ce_<x> -> condor_<x>: HTCondor-CE's wrappers set CONDOR_CONFIG and exec the tool.
WRAPPERS = ("q", "status", "job_router_info", "config_val", "history", "rm", "hold", "release",
            "submit", "reconfig", "restart", "off", "on", "ping", "transfer_data", "token_create")
#: HTCondor-CE's files (htcondor-ce-client, htcondor-ce and the batch packages but one).
STOCK_PARTS = ("etc/condor-ce", "usr/share/condor-ce")
#: What htcondor-ce-condor installs, left out: a Kubernetes CE has no local HTCondor pool, and that
#: package's JOB_ROUTER_SCHEDD2_* send every routed job whose target universe is vanilla (ours) to
#: the pool's schedd ("Can't find address of schedd" in the JobRouterLog when there is none).
CONDOR_PACKAGE_FILES = frozenset({"02-ce-condor.conf", "02-ce-condor-defaults.conf", "uid_acct_group.map",
                                  "x509_acct_group.map"})


def stock_tree(tree: Path | str | None = None) -> Path:
    """HTCondor-CE's stock layout (tests/fixtures/stock_ce, see its README): `tree` if given, else
    that directory of the source checkout the package runs from or of the working directory (an
    installed package, as CI's `pip install .`, has no tests/ beside it)."""
    from ce_k8s.agent.launchers import package_root

    rel = Path("tests") / "fixtures" / "stock_ce"
    candidates = [Path(tree)] if tree is not None else [Path(package_root()) / rel, Path.cwd() / rel]
    for candidate in candidates:
        if (candidate / "etc/condor-ce/condor_config").is_file():
            return candidate
    raise RealCondorError(f"--ce-config stock (the default on HTCondor 25) needs HTCondor-CE's stock layout "
                          f"(tests/fixtures/stock_ce of a source checkout; run from one, or choose --ce-config "
                          f"bed); not found in {', '.join(map(str, candidates))}")


def ce_testbed_config(state: Path, poll: int, python_prefix: str) -> str:
    """The site file the bed adds after HTCondor-CE's and ce-k8s's (`99-`: read last)."""
    return f"""\
# ce-k8s real-HTCondor test bed, --ce-config stock (ce_k8s/real/condor/stockce.py; docs/real-condor.md).
# Everything else in this directory and in /usr/share/condor-ce/config.d is HTCondor-CE's
# stock configuration or what `ce-k8s install` writes. Each line here says why it is needed.

# Loopback only: the CE's ports (9619) are HTCondor-CE's, but this machine is shared.
NETWORK_INTERFACE = 127.0.0.1
# The spool is bind-mounted from the state directory so paths mean the same file inside and out.
SPOOL = {state}/spool
# The schedd's name. HTCondor-CE sets none (the Name is FULL_HOSTNAME), but HTCondor 25 takes a bare
# host name in `condor_q -name` or the C-GAHP's `-s` as a host to resolve, and refuses one that
# resolves to loopback only ("unknown host"), as this machine's name does in the root. With
# SCHEDD_NAME = ce the Name is ce@<host>, which needs no lookup (the default bed's name too); the
# factory's grid_resource says `condor ce@<host> <host>:9619`.
SCHEDD_NAME = {CE_SCHEDD}
# Faster than a site's defaults (300 s, 60 s) so that tests wait seconds, not minutes; the info
# provider's period is $(SCHEDD_INTERVAL) (60-ce-k8s-info.conf).
SCHEDD_INTERVAL = 5
SCHEDD_MIN_INTERVAL = 1
PERIODIC_EXPR_INTERVAL = 5
JOB_ROUTER_POLLING_PERIOD = {poll}
MASTER_BACKOFF_CONSTANT = 1
MASTER_BACKOFF_CEILING = 5
MASTER_NEW_BINARY_RESTARTS = NEVER

# Token authentication: the factory's IDTOKEN (signed with this CE's POOL key). HTCondor-CE's
# 05-ce-auth-defaults.conf lists FS,SCITOKENS,SSL for the schedd; a site taking IDTOKENs adds
# TOKEN, as here.
SCHEDD.SEC_WRITE_AUTHENTICATION_METHODS = $(SCHEDD.SEC_WRITE_AUTHENTICATION_METHODS), TOKEN
SCHEDD.SEC_READ_AUTHENTICATION_METHODS = $(SCHEDD.SEC_READ_AUTHENTICATION_METHODS), TOKEN
# SciTokens (ce_k8s/real/condor/issuer.py): SCITOKENS runs inside TLS, and HTCondor-CE's stock host
# certificate paths (/etc/grid-security/hostcert.pem, ...) do not exist here, so the CE presents the
# certificate the bed's CA signed. The token's issuer is trusted through the system store, where the
# bed puts its CA; its mapping is in {SCITOKENS_MAPFILE}. The key cache is per bed.
AUTH_SSL_SERVER_CERTFILE = {state}/scitokens/ce.crt
AUTH_SSL_SERVER_KEYFILE = {state}/scitokens/ce.key
SEC_SCITOKENS_CACHE = {state}/scitokens/cache

# ce-k8s on this bed: the agent and the info provider on this checkout's interpreter, their
# files in the state directory, the emulator's kubeconfig.
CE_K8S_INFO_EXECUTABLE = {python_prefix}/bin/ce-k8s
CE_K8S_AGENT = {HOOK_DIR}/ce-k8s-agent-testbed
CE_K8S_AGENT_ARGS = agent --verbose --config {CE_CONDOR_CONFIG}
CE_K8S_AGENT_ENVIRONMENT = "CONDOR_CONFIG={CE_CONDOR_CONFIG} PYTHONUNBUFFERED=1"
{agent_and_demo_config(state)}"""


def factory_config(state: Path) -> str:
    """The factory host's layer over Debian's /etc/condor (a GlideinWMS factory's schedd)."""
    return f"""\
# ce-k8s real-HTCondor test bed, --ce-config stock: the factory host (ce_k8s/real/condor/stockce.py).
CONDOR_HOST = 127.0.0.1
NETWORK_INTERFACE = 127.0.0.1
USE_SHARED_PORT = False
COLLECTOR_HOST = 127.0.0.1:{COLLECTOR_PORT}
DAEMON_LIST = MASTER, COLLECTOR, SCHEDD
SCHEDD_NAME = {FACTORY_SCHEDD}
SPOOL = {state}/factory-spool
# Local commands on the factory host (loopback, test accounts only).
{LOCAL_TRUST}# HTCondor-C to the CE: the C-GAHP (and its worker thread) present a token and nothing else, so
# FS (same machine) can never stand in for it: the job's SciToken (`scitokens_file`, as GlideinWMS
# submits) if it has one, else the IDTOKEN in the job owner's ~/.condor/tokens.d. The CE's
# certificate is checked against the system store, which holds the bed's CA.
C_GAHP.SEC_CLIENT_AUTHENTICATION_METHODS = SCITOKENS, IDTOKENS
C_GAHP_WORKER_THREAD.SEC_CLIENT_AUTHENTICATION_METHODS = SCITOKENS, IDTOKENS
SCHEDD_INTERVAL = 5
SCHEDD_MIN_INTERVAL = 1
PERIODIC_EXPR_INTERVAL = 5
GRIDMANAGER_JOB_PROBE_INTERVAL = 5
C_GAHP_CONTACT_SCHEDD_DELAY = 2
GRIDMANAGER_MAX_SUBMITTED_JOBS_PER_RESOURCE = 1000
GRIDMANAGER_RESOURCE_PROBE_INTERVAL = 5
MASTER_NEW_BINARY_RESTARTS = NEVER
MASTER_BACKOFF_CONSTANT = 1
MASTER_BACKOFF_CEILING = 5
"""


class StockCE(RealCondor):
    """The bed with HTCondor-CE's own configuration: a CE master and a factory master."""

    ce_config = "stock"
    #: The collector's, the CE's (HTCondor-CE's own 9619) and the SciTokens issuer's.
    fixed_ports = (COLLECTOR_PORT, CE_PORT, ISSUER_PORT)

    def __init__(self, *args, stock_dir: Path | str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stock_dir = stock_dir
        self._full_hostname: str | None = None
        self._config: str | None = None

    def run(self, args: list[str], *, config: str | None = None, **kw):
        """As RealCondor.run; `config` forces a host's CONDOR_CONFIG (else `condor_config_for`)."""
        self._config = config
        try:
            return super().run(args, **kw)
        finally:
            self._config = None

    # -------------------------------------------------------------------------- names
    @property
    def full_hostname(self) -> str:
        """The CE's FULL_HOSTNAME: CONDOR_HOST and the host of the collector's address (HTCondor-CE's)."""
        if self._full_hostname is None:
            out = self.run(["condor_config_val", "FULL_HOSTNAME"], check=False).stdout.strip()
            self._full_hostname = out or os.uname().nodename
        return self._full_hostname

    @property
    def ce_name(self) -> str:
        """The CE schedd's Name: `ce@<FULL_HOSTNAME>` (HTCondor appends the host to SCHEDD_NAME = ce;
        the bed's site file says why it sets one)."""
        return f"{CE_SCHEDD}@{self.full_hostname}"

    @property
    def grid_resource(self) -> str:
        """`condor <CE> <CE>:9619`: what an OSG CE's grid_resource attribute says (01-ce-router-defaults)."""
        return f"condor {self.ce_name} {self.full_hostname}:{CE_PORT}"

    def condor_config_for(self, args: list[str]) -> str:
        if self._config:
            return self._config
        if any(a == self.factory_name for a in args):
            return FACTORY_CONDOR_CONFIG
        return CE_CONDOR_CONFIG

    def log_path(self, name: str) -> Path:
        """A CE log (/var/log/condor-ce) unless only the factory host has it (/var/log/condor)."""
        ce = self.root / CE_LOG.lstrip("/") / name
        factory = self.root / "var/log/condor" / name
        return factory if not ce.exists() and factory.exists() else ce

    def factory_run(self, args: list[str], **kw):
        """A command on the factory host (its /etc/condor), e.g. `condor_q` as the factory sees it."""
        return self.run(args, config=FACTORY_CONDOR_CONFIG, **kw)

    # -------------------------------------------------------------------------- lifecycle
    def _fresh_state_dir(self) -> None:
        super()._fresh_state_dir()
        ce_log = self.root / CE_LOG.lstrip("/")
        if ce_log.exists():
            shutil.rmtree(ce_log)

    def _write_config(self, poll: int) -> None:
        """HTCondor-CE's stock tree, `ce-k8s install`'s files, the bed's site file; the factory's layer."""
        from ce_k8s.ops.install import config_items

        tree = stock_tree(self.stock_dir)
        for part in STOCK_PARTS:
            dest = self.root / part
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(tree / part, dest, symlinks=True,
                            ignore=lambda _d, names: [n for n in names if n in CONDOR_PACKAGE_FILES])
        confdir = self.root / "etc/condor-ce/config.d"
        for item in config_items(confdir):
            item.path.write_bytes(item.content)
            item.path.chmod(item.mode)
        prefix = os.path.realpath(sys.prefix)
        (confdir / "99-ce-k8s-testbed.conf").write_text(ce_testbed_config(self.state_dir, poll, prefix)
                                                        + self._kube_usage_config())
        condor = self._root_uid("condor")
        for sub in ("var/log/condor-ce", "var/log/condor-ce/user", "var/lib/condor-ce/spool",
                    "var/lib/condor-ce/execute", "run/condor-ce", "var/lock/condor-ce", "var/lock/condor-ce/user"):
            d = self.root / sub
            d.mkdir(parents=True, exist_ok=True)
            os.chown(d, condor, condor)
        for sub in ("var/log/condor-ce/user", "var/lock/condor-ce/user"):
            (self.root / sub).chmod(0o1777)    # the C-GAHP of each job owner logs there
        with contextlib.suppress(FileExistsError):
            (self.root / "var/run").mkdir()
        # the factory host
        fconf = self.root / CONFIG_DIR.lstrip("/")
        for old in fconf.iterdir():
            if old.name not in DEBIAN_CONFIG:
                old.unlink()
        (fconf / "99-ce-k8s-testbed.conf").write_text(factory_config(self.state_dir))
        self._wrappers()
        self._token()
        self._scitokens()

    def _wrappers(self) -> None:
        """condor_ce_<x>: as HTCondor-CE's, export CONDOR_CONFIG=/etc/condor-ce/condor_config, exec condor_<x>."""
        for tool in WRAPPERS:
            path = self.root / "usr/bin" / f"condor_ce_{tool}"
            target = f"/usr/sbin/condor_{tool}" if (self.root / f"usr/sbin/condor_{tool}").exists() \
                else f"condor_{tool}"
            path.write_text(f'#!/bin/sh\n# ce-k8s test bed: as HTCondor-CE\'s condor_ce_{tool}\n'
                            f'export CONDOR_CONFIG={CE_CONDOR_CONFIG}\nexec {target} "$@"\n')
            path.chmod(0o755)

    def _token(self) -> None:
        """The CE's signing key, and the factory account's IDTOKEN from HTCondor's condor_token_create."""
        keydir = self.root / "etc/condor-ce/passwords.d"
        keydir.mkdir(mode=0o700, exist_ok=True)
        key = keydir / "POOL"
        key.write_text(base64.b64encode(os.urandom(48)).decode() + "\n")
        key.chmod(0o600)
        (self.root / "etc/condor-ce/tokens.d").mkdir(mode=0o700, exist_ok=True)
        for name in (PILOT_ACCOUNT, FACTORY_ACCOUNT):
            if name not in ACCOUNTS:
                raise RealCondorError(f"no test account {name}")
        self._accounts()     # the factory's home directory holds its token
        token = self.run(["condor_token_create", "-identity", f"{PILOT_ACCOUNT}@{UID_DOMAIN}", "-key", "POOL"]
                         ).stdout.strip()
        if not token:
            raise RealCondorError("condor_token_create printed no token")
        home = self.root / "home" / FACTORY_ACCOUNT
        tokdir = home / ".condor" / "tokens.d"
        tokdir.mkdir(parents=True, exist_ok=True)
        (tokdir / TOKEN_NAME).write_text(token + "\n")
        uid = self._root_uid(FACTORY_ACCOUNT)
        for path in (home / ".condor", tokdir, tokdir / TOKEN_NAME):
            os.chown(path, uid, uid)
            path.chmod(0o600 if path.is_file() else 0o700)

    @property
    def issuer(self) -> TestIssuer:
        """The bed's SciTokens issuer and CA (ce_k8s.real.condor.issuer), files in the state directory."""
        return TestIssuer(self.state_dir / "scitokens", ISSUER_PORT)

    def _scitokens(self) -> None:
        """The issuer's CA and the CE's host certificate, the CA added to the root's system store (a
        bind mount over the bundle, undone by `down`), the mapfile line that maps the factory's token
        to the pilot account, and that token in the factory's credential directory."""
        issuer = self.issuer
        try:
            issuer.create({"ce": [self.full_hostname, "localhost"]})
            token = issuer.mint(SCITOKEN_SUBJECT, f"{self.full_hostname}:{CE_PORT}")
        except IssuerError as exc:
            raise RealCondorError(f"the SciTokens issuer: {exc}") from exc
        cache = issuer.dir / "cache"
        cache.mkdir(exist_ok=True)
        condor = self._root_uid("condor")
        os.chown(cache, condor, condor)
        bundle = issuer.dir / "ca-bundle.crt"
        system = self.root / SYSTEM_CA_BUNDLE.lstrip("/")
        bundle.write_bytes(system.read_bytes() + issuer.ca_file.read_bytes())
        bundle.chmod(0o644)
        _bind(bundle, self.root, SYSTEM_CA_BUNDLE)
        issuer_re = issuer.url.replace("/", "\\/").replace(".", "\\.")
        (self.root / SCITOKENS_MAPFILE.lstrip("/")).write_text(
            "# ce-k8s real-HTCondor test bed (ce_k8s/real/condor/stockce.py): the factory's SciToken, from the bed's\n"
            "# issuer, maps to the pilot account, as an OSG CE maps a VO's tokens.\n"
            f"SCITOKENS /^{issuer_re},{SCITOKEN_SUBJECT}$/ {PILOT_ACCOUNT}\n")
        path = self.root / SCITOKEN_FILE.lstrip("/")
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.write_text(token + "\n")
        uid = self._root_uid(FACTORY_ACCOUNT)
        for p in (path.parent, path):
            os.chown(p, uid, uid)
        path.chmod(0o600)

    def _install_hooks(self) -> None:
        super()._install_hooks()
        wrapper = self.root / HOOK_DIR.lstrip("/") / "ce-k8s-agent-testbed"
        wrapper.write_text(f"#!/bin/sh\nexec {os.path.realpath(sys.prefix)}/bin/ce-k8s \"$@\" "
                           f"2>>{CE_LOG}/CeK8sAgentLog\n")

    def _mount_all(self) -> list[str]:
        """As the default bed, and the root's /root traversable while up: this checkout's Python may
        live under /root (pyenv), and the CE schedd runs its cron (`ce-k8s info`) as `condor`."""
        points = super()._mount_all()
        (self.root / "root").chmod(0o711)
        return points

    def _prepare_cluster(self) -> None:
        """As the default bed; the kubeconfig readable by `condor`, who runs the info provider."""
        super()._prepare_cluster()
        gid = next(int(line.split(":")[3]) for line in (self.root / "etc/passwd").read_text().splitlines()
                   if line.startswith("condor:"))
        os.chown(self.kubeconfig, 0, gid)
        self.kubeconfig.chmod(0o640)

    @property
    def _factory_pidfile(self) -> Path:
        return self.state_dir / "pid" / "factory-master.pid"

    def _start_master(self) -> int:
        """The factory host's condor_master, then the CE's (whose pid the state keeps)."""
        piddir = self.state_dir / "pid"
        piddir.mkdir(exist_ok=True)
        condor = self._root_uid("condor")
        os.chown(piddir, condor, condor)
        try:
            self.issuer.start()         # before the CE: scitokens-cpp caches a failed key lookup for 600 s
        except IssuerError as exc:
            raise RealCondorError(f"the SciTokens issuer: {exc}") from exc
        self.factory_run(["/usr/sbin/condor_master", "-pidfile", str(self._factory_pidfile)])
        return super()._start_master()

    def _factory_master_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(self._factory_pidfile.read_text().split()[0])
        return None

    def down(self, progress=print) -> dict[str, object]:
        """The factory master by its own command first; then everything as the default bed does."""
        pid = self._factory_master_pid()
        if self.state_file.exists() and alive(pid):
            self.factory_run(["condor_off", "-master"], check=False, timeout=30)
            deadline = time.monotonic() + 30
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)   # type: ignore[arg-type]
        report = super().down(progress=progress)
        report["issuer_stopped"] = self.issuer.stop()
        with contextlib.suppress(OSError):
            (self.root / "root").chmod(0o700)      # as Debian made it
        return report


def default_ce_config(htcondor: str | None = None, batch: bool = False) -> str:
    """The CE's configuration when none is named: HTCondor-CE's own (``stock``) on HTCondor 25, which
    HTCondor-CE 25 runs on; the bed's (``bed``) on 23.9, whose daemons refuse HTCondor-CE 25's
    `use security:recommended` (docs/real-condor.md, R11), and with the batch pool, which a CE
    without a local pool does not have."""
    from ce_k8s.real.condor.condor import DEFAULT_HTCONDOR, flavour

    return "bed" if batch or flavour(htcondor or DEFAULT_HTCONDOR).htcondor != "25" else "stock"


def real_condor(state_dir, root=None, htcondor: str | None = None, kube_server=None,
                ce_config: str | None = None, batch: bool = False) -> RealCondor:
    """The bed of `ce_config`: ``stock`` (HTCondor-CE's own files) or ``bed`` (the test configuration).

    None: what the bed up in `state_dir` runs (so `down` and `status` act as `up` did), else
    :func:`default_ce_config`. `batch` (the batch pool of ce_k8s.real.condor.condor.batch_config) is the
    default bed's only: HTCondor-CE's own configuration is a CE without a local pool, and this mode
    exists to test exactly that.
    """
    from ce_k8s.real.condor.condor import DEFAULT_HTCONDOR, State, flavour

    if ce_config is not None and ce_config not in CE_CONFIGS:
        raise RealCondorError(f"--ce-config {ce_config!r}: choose one of {', '.join(CE_CONFIGS)}")
    state = State.load(Path(state_dir).absolute() / "state.json")
    if state is not None:
        if ce_config is not None and ce_config != state.ce_config:
            raise RealCondorError(f"{state_dir} has a bed with --ce-config {state.ce_config} (started, or left "
                                  f"after a crash): `ce-k8s testbed real-condor down --state {state_dir}` first")
        ce_config = state.ce_config
        if ce_config == "stock":
            htcondor = "25"           # the only version it runs on; `down` follows the state's root anyway
    if ce_config is None:
        ce_config = default_ce_config(htcondor, batch)
    htcondor = htcondor or DEFAULT_HTCONDOR
    if ce_config == "stock":
        if batch:
            raise RealCondorError("--batch is for the default bed (--ce-config bed): the stock CE has no "
                                  "local pool by design")
        if flavour(htcondor).htcondor != "25":
            raise RealCondorError(f"--ce-config stock needs HTCondor 25: HTCondor-CE 25's files say `use "
                                  f"security:recommended`, which HTCondor {flavour(htcondor).version} refuses "
                                  "(docs/real-condor.md, R11); use --ce-config bed with --htcondor 23")
        return StockCE(state_dir, root, htcondor=htcondor, kube_server=kube_server)
    return RealCondor(state_dir, root, htcondor=htcondor, kube_server=kube_server, batch=batch)
