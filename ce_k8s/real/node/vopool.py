"""The VO's pool beside the real node: the frontend's collector, negotiator and schedd that pilots join.

A GlideinWMS pilot joins its VO's pool, not the site's: the VO's collector takes the pilot's
startd, the VO's negotiator matches the users' jobs to it, and the VO's schedd runs them there.
This is that pool for the bed, HTCondor 25.14.1 from the same sid root as the pilot image:

* **Where it runs.** In the real node's own network namespace (the holder's), on the CNI bridge's
  gateway address `10.244.<n>.1`: the pods' default route, so a pilot reaches it and it reaches
  the pilot's startd at its pod IP; nothing listens on the host and nothing leaves the namespaces
  the bed made (docs/real-node.md's network rule). Its files are an unpacked copy of the pilot
  image (`rootfs`) with the four daemons the image leaves out copied in from the sid root
  (collector, negotiator, schedd, shadow), run as uid 1000 (`pilot`) under `condor_master` in a
  mount and pid namespace of its own (`unshare --kill-child`: the pool ends with its master).
* **Who may do what.** IDTOKENS signed with the pool's own key (`/vo/passwords.d/POOL`): the
  pilot's token names `pilot@vo.ce-k8s.test` and is the only identity that may advertise a
  startd; the users submit on the pool's host, authenticated by FS (as on an access point).
  The schedd claims a pilot's slot with the match's own session (the negotiator hands the
  startd's claim id over), so the pilot needs no key of the pool's. With `trust_scitokens`, the
  SciTokens of the VO's issuer too (inside TLS: the collector's host certificate, its name
  `COLLECTOR_NAME`, the issuer's CA in the pool's system store).
* **A personal schedd.** The pool's daemons run as uid 1000, so every user job is uid 1000's
  (`vo-user` here); in the pilot it runs as the pilot's own uid, whatever it was submitted as.
* **Fast cycles.** The negotiator and the schedd every 5 s, so a test's job starts seconds after
  its pilot joins.

`VOPool.start` returns once the collector, the negotiator and the schedd answer; `stop` (also
after a failed start) ends the master and its namespace; `run` runs an HTCondor tool as the pool's
user in the pool's namespaces. Used by tests/real/node/test_vo_pool.py (and the real-pilot demo).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ce_k8s.pilot.pilotconfig import layout
from ce_k8s.real.node.noderuntime import PILOT_UID

if TYPE_CHECKING:                   # the bed's issuer (ce_k8s.real.condor.issuer) is handed in, not imported
    from ce_k8s.real.condor.issuer import TestIssuer

TRUST_DOMAIN = "vo.ce-k8s.test"
PILOT_IDENTITY = f"pilot@{TRUST_DOMAIN}"
PORT = 9618
#: The daemons the pilot image leaves out, copied from the sid root into the pool's tree.
POOL_DAEMONS = ("usr/sbin/condor_collector", "usr/sbin/condor_negotiator", "usr/sbin/condor_schedd",
                "usr/sbin/condor_shadow")
CONFIG = "/vo/condor_config"
JOBS = "/home/vo-user"            # the users' submit directories live under here
SCITOKEN_SUBJECT = "vo-pilots"
#: What a startd does at the collector: advertise itself and its master, read the pool.
SCITOKEN_SCOPES = "condor:/READ condor:/ADVERTISE_STARTD condor:/ADVERTISE_MASTER"
COLLECTOR_CERT = "vo-collector"   # the name of the collector's host certificate in the issuer's files
#: The collector's host name, as a real VO's has one: a SciToken is presented inside TLS, and
#: HTCondor checks the collector's certificate against the name it was asked for ("No SSL host name
#: specified" for a bare address). Pods resolve it from their /etc/hosts (hostAliases): no DNS.
COLLECTOR_NAME = "vo-collector.ce-k8s.test"


class VOPoolError(RuntimeError):
    """The VO pool could not be prepared, started or asked."""


def pool_config(ip: str, port: int = PORT) -> str:
    """The pool's whole condor_config: a central manager and a submit host in one master."""
    return f"""\
# ce-k8s bed: the VO's pool (ce_k8s/real/node/vopool.py)
{layout("/vo", PILOT_UID, PILOT_UID)}CONDOR_HOST = {ip}
COLLECTOR_HOST = {ip}:{port}
NETWORK_INTERFACE = {ip}
USE_SHARED_PORT = False
DAEMON_LIST = MASTER, COLLECTOR, NEGOTIATOR, SCHEDD
COLLECTOR_NAME = vo-pool
SCHEDD_NAME = vo-schedd
UID_DOMAIN = {TRUST_DOMAIN}
TRUST_DOMAIN = {TRUST_DOMAIN}

# IDTOKENS signed with the pool's key; FS for the users on this host
SEC_DEFAULT_AUTHENTICATION = REQUIRED
SEC_DEFAULT_AUTHENTICATION_METHODS = FS, IDTOKENS
SEC_CLIENT_AUTHENTICATION_METHODS = FS, IDTOKENS
SEC_PASSWORD_DIRECTORY = $(LOCAL_DIR)/passwords.d
SEC_TOKEN_POOL_SIGNING_KEY_FILE = $(LOCAL_DIR)/passwords.d/POOL
SEC_TOKEN_DIRECTORY = $(LOCAL_DIR)/tokens.d
SEC_TOKEN_SYSTEM_DIRECTORY = $(LOCAL_DIR)/tokens.d
# Every peer is authenticated; only the bed's own namespaces can reach the pool at all.
ALLOW_READ = *
ALLOW_WRITE = *
ALLOW_DAEMON = *
ALLOW_NEGOTIATOR = *
ALLOW_ADMINISTRATOR = *
ALLOW_ADVERTISE_STARTD = {PILOT_IDENTITY}

# A test's pace
NEGOTIATOR_INTERVAL = 5
NEGOTIATOR_MIN_INTERVAL = 2
NEGOTIATOR_CYCLE_DELAY = 2
SCHEDD_INTERVAL = 5
UPDATE_INTERVAL = 10
NEGOTIATOR_UPDATE_INTERVAL = 10
"""


def unpack_image(archive: Path, dest: Path) -> dict:
    """The OCI archive's one layer unpacked into `dest`; returns the image's config."""
    with tarfile.open(archive) as oci:
        index = json.load(oci.extractfile("index.json"))
        manifest = json.load(oci.extractfile(f"blobs/sha256/{index['manifests'][0]['digest'].split(':')[1]}"))
        config = json.load(oci.extractfile(f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))
        layer = oci.extractfile(f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}")
        with tarfile.open(fileobj=layer, mode="r|gz") as tar:
            tar.extractall(dest, filter="fully_trusted")  # noqa: S202 (our own archive, built here)
    return config


def in_namespaces(netns_pid: int | None, rootfs: Path, argv: str, *, user: int = PILOT_UID) -> list[str]:
    """`argv` (a shell word list, ours) as `user` in `rootfs`, in the network namespace of
    `netns_pid` (None: this one) and a mount and pid namespace of its own, with /proc and /dev:
    all gone when its pid 1 ends (or unshare is killed)."""
    enter = [] if netns_pid is None else ["nsenter", f"--target={netns_pid}", "--net", "--"]
    return [*enter, "unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c",
            f"mount -t proc proc {rootfs}/proc && mount --rbind /dev {rootfs}/dev && "
            f"exec chroot --userspec={user}:{user} {rootfs} {argv}"]


def _child_of(pid: int) -> int | None:
    """The first child of `pid` (unshare's forked pid 1), or None."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
    return None


@dataclass
class VOPool:
    """The pool of one bed run: `rootfs` (made by `prepare`), the node's network namespace, its address."""

    rootfs: Path
    netns_pid: int
    ip: str
    port: int = PORT
    master: subprocess.Popen | None = field(default=None, repr=False)
    issuer: TestIssuer | None = field(default=None, repr=False)      # set by trust_scitokens

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def named_address(self) -> str:
        """The collector by its name (COLLECTOR_NAME): what a pilot that presents a SciToken is given."""
        return f"{COLLECTOR_NAME}:{self.port}"

    def host_alias(self) -> dict[str, object]:
        """The pod's `hostAliases` entry that resolves COLLECTOR_NAME to the collector, from /etc/hosts."""
        return {"ip": self.ip, "hostnames": [COLLECTOR_NAME]}

    # ------------------------------------------------------------------ files
    def prepare(self, image_archive: Path, sid_root: Path) -> None:
        """Unpack the pilot image into `rootfs`, add the pool's daemons, configuration, key and the
        users' home. Everything the pool writes is under `rootfs` (the caller removes it)."""
        if self.rootfs.exists():
            raise VOPoolError(f"{self.rootfs} exists: a pool is prepared in a new directory")
        unpack_image(image_archive, self.rootfs)
        for rel in POOL_DAEMONS:
            src = sid_root / rel
            if not src.is_file():
                raise VOPoolError(f"{src} is missing: the sid root has no {Path(rel).name}")
            shutil.copy2(src, self.rootfs / rel)
        shutil.copy("/etc/hosts", self.rootfs / "etc/hosts")
        vo = self.rootfs / "vo"
        for sub in ("log", "spool", "execute", "lock", "run", "tokens.d", "passwords.d"):
            (vo / sub).mkdir(parents=True)
        (vo / "condor_config").write_text(pool_config(self.ip, self.port))
        (vo / "passwords.d" / "POOL").write_bytes(os.urandom(48).hex().encode())
        home = self.rootfs / JOBS.lstrip("/")
        home.mkdir(parents=True)
        for path in [vo, *vo.rglob("*"), home]:
            os.chown(path, PILOT_UID, PILOT_UID)
        (vo / "passwords.d").chmod(0o700)
        (vo / "passwords.d" / "POOL").chmod(0o600)
        (self.rootfs / "tmp").chmod(0o1777)

    def trust_scitokens(self, issuer: TestIssuer, subject: str = SCITOKEN_SUBJECT) -> None:
        """Also take SciTokens, as a VO pool whose pilots carry its issuer's tokens: the issuer's
        tokens for `subject` map to the pilot's identity. SCITOKENS runs inside TLS, so the
        collector gets the host certificate `issuer` made for its name and address
        (`create({COLLECTOR_CERT: [COLLECTOR_NAME, ip]})`), and scitokens-cpp (libcurl, the root's
        system store) trusts the issuer's CA to fetch its keys. Before `start`."""
        vo = self.rootfs / "vo"
        ssl_dir = vo / "ssl"
        ssl_dir.mkdir()
        cert, key = issuer.host_cert(COLLECTOR_CERT)
        for src, name, mode in ((cert, "host.crt", 0o644), (key, "host.key", 0o600), (issuer.ca_file, "ca.crt", 0o644)):
            shutil.copyfile(src, ssl_dir / name)
            (ssl_dir / name).chmod(mode)
            os.chown(ssl_dir / name, PILOT_UID, PILOT_UID)
        os.chown(ssl_dir, PILOT_UID, PILOT_UID)
        with open(self.rootfs / "etc/hosts", "a") as fh:              # the pool's own tools use the name too
            fh.write(f"{self.ip} {COLLECTOR_NAME}\n")
        store = self.rootfs / "etc/ssl/certs/ca-certificates.crt"
        store.parent.mkdir(parents=True, exist_ok=True)
        with open(store, "ab") as fh:                                   # the pool's copy, not the host's
            fh.write(issuer.ca_file.read_bytes())
        # HTCondor's map file: a regex between slashes, `/` and `.` escaped (a `\-` matches nothing there)
        def literal(text: str) -> str:
            return text.replace(".", "\\.").replace("/", "\\/")
        (vo / "mapfile").write_text(f"SCITOKENS /^{literal(issuer.url)},{literal(subject)}$/ {PILOT_IDENTITY}\n")
        with open(vo / "condor_config", "a") as fh:
            fh.write(f"""
# SciTokens of the VO's issuer ({issuer.url}) for its pilots, inside TLS
SEC_DEFAULT_AUTHENTICATION_METHODS = FS, IDTOKENS, SCITOKENS
CERTIFICATE_MAPFILE = /vo/mapfile
# a key between slashes is a regex, any other a literal (as HTCondor-CE sets it); without this
# every key is a regex, slashes included, and the line above would match nothing
CERTIFICATE_MAPFILE_ASSUME_HASH_KEYS = True
AUTH_SSL_SERVER_CERTFILE = /vo/ssl/host.crt
AUTH_SSL_SERVER_KEYFILE = /vo/ssl/host.key
AUTH_SSL_CLIENT_CAFILE = /vo/ssl/ca.crt
SCITOKENS_SERVER_AUDIENCE = {self.named_address}
""")
        self.issuer = issuer

    def pilot_scitoken(self, subject: str = SCITOKEN_SUBJECT, lifetime: int = 3600, audience: str | None = None) -> str:
        """A SciToken of the pool's issuer (`trust_scitokens`) for the pilot: the authorizations a
        startd needs (condor scopes), for this collector's audience unless told otherwise."""
        if self.issuer is None:
            raise VOPoolError("the pool takes no SciTokens: call trust_scitokens before start")
        return self.issuer.mint(subject, audience or self.named_address, scopes=SCITOKEN_SCOPES, lifetime=lifetime)

    def pilot_token(self, identity: str = PILOT_IDENTITY, lifetime: int = 3600) -> str:
        """An IDTOKEN signed with the pool's key: what the frontend gives the factory for its pilots."""
        proc = subprocess.run(
            ["chroot", f"--userspec={PILOT_UID}:{PILOT_UID}", str(self.rootfs), "env", "-i",
             f"CONDOR_CONFIG={CONFIG}", "PATH=/usr/bin:/usr/sbin", "condor_token_create", "-identity", identity,
             "-key", "POOL", "-lifetime", str(lifetime)], capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise VOPoolError(f"condor_token_create failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
        return proc.stdout.strip()

    # ------------------------------------------------------------------ processes
    def start(self, timeout: float = 90, progress: Callable[[str], None] = lambda m: None) -> None:
        """The master in the node's network namespace; back once collector, negotiator and schedd
        answer `condor_status`. A start that fails stops what it started."""
        argv = in_namespaces(self.netns_pid, self.rootfs,
                             f"env -i CONDOR_CONFIG={CONFIG} PATH=/usr/bin:/usr/sbin:/bin /usr/sbin/condor_master -f")
        self.master = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.master.poll() is not None:
                    raise VOPoolError(f"the VO pool's master exited {self.master.returncode}: {self.log('MasterLog')}")
                daemons = self.daemons()
                if {"Collector", "Negotiator", "Scheduler"} <= daemons:
                    progress(f"VO pool up at {self.address}: {sorted(daemons)}")
                    return
                if time.monotonic() > deadline:
                    raise VOPoolError(f"the VO pool did not come up in {timeout:.0f} s (answering: "
                                      f"{sorted(daemons)}): {self.log('MasterLog')}")
                time.sleep(0.5)                    # the daemons start on their own; this is a poll
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the master (unshare waits, ignoring it: signal its child), then SIGKILL to
        unshare, which takes its namespace's processes along."""
        if self.master is None:
            return
        inner = _child_of(self.master.pid)
        if inner is not None:
            with contextlib.suppress(OSError):
                os.kill(inner, signal.SIGTERM)
        try:
            self.master.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.master.kill()
            self.master.wait(timeout=timeout)
        self.master = None

    def run(self, argv: str, *, check: bool = True, timeout: float = 60,
            cwd: str = JOBS) -> subprocess.CompletedProcess[str]:
        """An HTCondor tool (`argv`: ours, a shell word list) as the pool's user, in `cwd`."""
        proc = subprocess.run(
            in_namespaces(self.netns_pid, self.rootfs,
                          f"/bin/sh -c 'cd {cwd} && exec env -i CONDOR_CONFIG={CONFIG} HOME={JOBS} "
                          f"PATH=/usr/bin:/usr/sbin:/bin {argv}'"),
            capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise VOPoolError(f"{argv} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-800:]}")
        return proc

    def daemons(self) -> set[str]:
        """The MyType of every ad the collector holds but the startds' (Collector, Negotiator, ...)."""
        proc = self.run("condor_status -any -af MyType", check=False, timeout=30, cwd="/")
        return set(proc.stdout.split()) if proc.returncode == 0 else set()

    def log(self, name: str, tail: int = 2000) -> str:
        path = self.rootfs / "vo" / "log" / name
        return path.read_text(errors="replace")[-tail:] if path.exists() else f"(no {name})"

    # ------------------------------------------------------------------ the users' side
    def submit(self, directory: str, description: str, files: dict[str, str] | None = None) -> int:
        """A user's job: its directory under the users' home, the submit file and its inputs; the cluster."""
        where = self.rootfs / JOBS.lstrip("/") / directory
        where.mkdir(parents=True)
        for name, text in {"job.sub": description, **(files or {})}.items():
            (where / name).write_text(text)
            (where / name).chmod(0o755 if name.endswith(".sh") else 0o644)
        for path in [where, *where.iterdir()]:
            os.chown(path, PILOT_UID, PILOT_UID)
        out = self.run("condor_submit -terse job.sub", cwd=f"{JOBS}/{directory}").stdout
        return int(out.split()[0].split(".")[0])

    def jobs(self, cluster: int, attrs: tuple[str, ...]) -> list[dict]:
        """The cluster's job ads, from the queue, then the history for those that left it."""
        projection = ",".join(attrs)
        found: list[dict] = []
        for tool in ("condor_q", "condor_history"):
            proc = self.run(f"{tool} {cluster} -json -attributes {projection}", cwd="/", timeout=60)
            found += json.loads(proc.stdout or "[]")
            if found:
                return found
        return found

    def user_file(self, directory: str, name: str) -> str:
        return (self.rootfs / JOBS.lstrip("/") / directory / name).read_text(errors="replace")


# ------------------------------------------------------------------ on a bed's real node
def gateway(node_index: int) -> str:
    """The CNI bridge's address in real node `node_index`'s network namespace: its pods' gateway."""
    from ce_k8s.real.node.node import POD_CIDR_BASE

    return f"{POD_CIDR_BASE}.{node_index}.1"


def _has_address(netns_pid: int, ip: str) -> bool:
    proc = subprocess.run(["nsenter", f"--target={netns_pid}", "--net", "--", "ip", "-4", "-o", "addr", "show"],
                          capture_output=True, text=True, check=False, timeout=10)
    return f"inet {ip}/" in proc.stdout


def ensure_bridge(core, node_name: str, netns_pid: int, ip: str, timeout: float = 120) -> None:
    """The bridge and its gateway address come with the node's first pod (the CNI ADD): if no pod
    has run there yet, run one (busybox, `exit 0`, in `default`) and delete it."""
    from ce_k8s.real.node.node import REAL_NODE_LABEL, REAL_NODE_TAINT
    from ce_k8s.real.node.noderuntime import BUSYBOX_IMAGE

    if _has_address(netns_pid, ip):
        return
    name = f"ce-k8s-bridge-{os.urandom(3).hex()}"
    limits = {"cpu": "100m", "memory": "16Mi"}
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "nodeName": node_name, "automountServiceAccountToken": False,
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {"runAsNonRoot": True, "runAsUser": PILOT_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["true"],
                        "resources": {"requests": limits, "limits": limits},
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}})
    deadline = time.monotonic() + timeout
    try:
        while core.read_namespaced_pod(name, "default").status.phase not in ("Succeeded", "Failed"):
            if time.monotonic() > deadline:
                raise VOPoolError(f"the bridge pod {name} did not finish in {timeout:.0f} s")
            time.sleep(0.5)
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    if not _has_address(netns_pid, ip):
        raise VOPoolError(f"the node's bridge has no address {ip} after a pod ran there")


def pool_on_node(kube, core, base: Path, progress: Callable[[str], None] = lambda m: None) -> VOPool:
    """The VO pool on `kube`'s (a RealKube) first real node, the pilot image imported into it: built
    (cached) from the real-HTCondor bed's root. The caller stops the pool and removes `base`."""
    from ce_k8s.real.condor.condor import build_root
    from ce_k8s.real.node import pilotimage

    state = kube.state()
    if state is None or not state.real_nodes:
        raise VOPoolError("the control plane has no real node (`ce-k8s testbed real-kube up --real-nodes 1`)")
    node = state.real_nodes[0]
    root = build_root(progress=progress)
    image = pilotimage.build(root, progress=progress)
    kube.nodes.import_image(image.name, image.archive, progress=progress)
    ip = gateway(node["index"])
    ensure_bridge(core, node["name"], node["pids"]["holder"], ip)
    pool = VOPool(rootfs=base / "rootfs", netns_pid=node["pids"]["holder"], ip=ip)
    pool.prepare(image.archive, root)
    pool.start(progress=progress)
    return pool
