"""The pilot's settings from its pod's environment, its credential, and the condor_config it writes.

The environment contract (docs/pilot.md, "Environment") is read once into `PilotSettings`; every
problem is a `ConfigError` or a `TokenError`, so the entry point maps it to its exit code. The
credential is a *file* (the pod's Secret, mounted); the environment only names its path: a token
in an environment variable is readable by every process of the pod and shows in `kubectl describe`
and in `/proc/<pid>/environ`, so a token-shaped value where a path belongs is refused.

The configuration is a startd-only pilot in the spirit of GlideinWMS's condor_startup.sh: one
partitionable slot of the pod's size, the collector and the token of the VO's pool, no local
privilege (the startd runs as the pod's user, no cgroups, no mount namespaces), an idle shutdown
(`STARTD_NOCLAIM_SHUTDOWN`, with the master following its startd out), and the glidein's two
times before the pod's deadline: `GLIDEIN_ToRetire` (no new jobs after it) and `GLIDEIN_ToDie`
(the startd shuts down gracefully, vacating its jobs, in time for the pod's own deadline).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ce_k8s.pilot.sizing import Size

#: The defaults (docs/pilot.md's table says why each).
DEFAULT_LOCAL_DIR = "/ce-k8s/scratch/pilot"     # the pod builder's scratch emptyDir
DEFAULT_IDLE_SECONDS = 600
DEFAULT_GRACE_SECONDS = 25                       # under Kubernetes' default 30 s termination grace
DEFAULT_JOIN_TIMEOUT = 60
DEFAULT_UPDATE_INTERVAL = 60                     # HTCondor's 300 s is long for a pilot's short life
DEFAULT_COLLECTOR_PORT = 9618
#: Seconds kept between GLIDEIN_ToDie + the grace and the pod's deadline: the container starts
#: after the pod (image, sandbox), and activeDeadlineSeconds counts from the pod's start.
MAX_DEADLINE_MARGIN = 60
#: A pilot that could take jobs for less than this is refused (GlideinWMS's floor is 600 s; the
#: tests run pilots of 20 s).
MIN_RETIRE_SECONDS = 10
TOKEN_NAME = "pilot.token"  # noqa: S105 (a file name)
_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
_NAME = re.compile(r"[^A-Za-z0-9_.-]")


class ConfigError(ValueError):
    """The pod's environment cannot describe a pilot (a wrong pod spec, not a wrong credential)."""


class TokenError(ValueError):
    """The credential is missing, unreadable, malformed or expired (before any daemon saw it)."""


def looks_like_token(value: str) -> bool:
    """A JWT (IDTOKEN or SciToken): three base64url parts; what must never be in the environment."""
    return bool(_JWT.match(value.strip())) and len(value.strip()) > 40


@dataclass(frozen=True)
class Token:
    """The pilot's credential as read from its file: the text, its kind and its claims."""

    text: str
    kind: str            # "IDTOKENS" or "SCITOKENS" (HTCondor's method name)
    claims: dict

    @property
    def identity(self) -> str:
        return str(self.claims.get("sub", "?"))


def read_token(path_value: str, now: float | None = None) -> Token:
    """The token the factory sent, from the file `path_value` names (never the value itself)."""
    if not path_value:
        raise TokenError("CE_K8S_PILOT_TOKEN_FILE is not set: the pilot has no credential "
                         "(it names the token's file in the pod's Secret)")
    if looks_like_token(path_value):
        raise TokenError("CE_K8S_PILOT_TOKEN_FILE holds a token, not a path: a credential must be "
                         "mounted from the pod's Secret, never put in the environment")
    path = Path(path_value)
    if not path.is_absolute():
        raise TokenError(f"CE_K8S_PILOT_TOKEN_FILE={path_value!r} is not an absolute path")
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise TokenError(f"the token file {path} does not exist (is the Secret mounted?)") from None
    except OSError as exc:
        raise TokenError(f"the token file {path} is unreadable by uid {os.getuid()}: {exc.strerror} "
                         "(the Secret's mode and the pod's fsGroup decide)") from None
    if not text:
        raise TokenError(f"the token file {path} is empty")
    if not _JWT.match(text):
        raise TokenError(f"the token file {path} does not hold a JWT (IDTOKEN or SciToken)")
    try:
        payload = text.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        raise TokenError(f"the token in {path} has no readable claims") from None
    if not isinstance(claims, dict):
        raise TokenError(f"the token in {path} has no readable claims")
    exp = claims.get("exp")
    now = time.time() if now is None else now
    if isinstance(exp, (int, float)) and exp <= now:
        raise TokenError(f"the token in {path} (sub {claims.get('sub')!r}) expired "
                         f"{int(now - exp)} s ago")
    # A SciToken carries its authorizations as `scope` (WLCG profile: `wlcg.ver`); an IDTOKEN does not.
    kind = "SCITOKENS" if ("scope" in claims or "wlcg.ver" in claims) else "IDTOKENS"
    return Token(text, kind, claims)


def _seconds(env: dict[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number of seconds") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} is below {minimum}")
    return value


@dataclass(frozen=True)
class Times:
    """The pilot's clock: when it started, stops taking jobs and shuts down (epoch seconds)."""

    start: float
    retire: float | None     # GLIDEIN_ToRetire: START is false from then on
    die: float | None        # GLIDEIN_ToDie: the startd shuts down gracefully, vacating jobs


def deadline_times(start: float, deadline: int | None, grace: int, job_max: int,
                   source: str = "CE_K8S_PILOT_DEADLINE_SECONDS") -> Times:
    """GLIDEIN_ToDie = start + deadline - grace - margin; GLIDEIN_ToRetire = ToDie - job_max.

    As GlideinWMS's die time (max walltime - update interval - graceful shutdown), with the
    entry point itself signalling the master at ToDie, so there is no advertisement delay to
    cover; the margin (a tenth of the deadline, at most MAX_DEADLINE_MARGIN) covers the time
    between the pod's start, from which Kubernetes counts, and the pilot's."""
    if deadline is None:
        return Times(start, None, None)
    margin = min(MAX_DEADLINE_MARGIN, deadline // 10)
    die = start + deadline - grace - margin
    retire = die - job_max
    if retire - start < MIN_RETIRE_SECONDS:
        raise ConfigError(f"{source}={deadline} leaves no time to run a job "
                          f"(grace {grace} s, margin {margin} s, job max {job_max} s)")
    return Times(start, retire, die)


@dataclass(frozen=True)
class PilotSettings:
    """Everything the entry point reads from the environment (docs/pilot.md, "Environment")."""

    collector: str               # host:port of the VO pool's collector
    token_file: str              # the path of the credential's file (never the credential)
    local_dir: Path              # a writable directory of the pod (emptyDir): LOG, EXECUTE, SPOOL, ...
    name: str                    # MASTER_NAME / STARTD_NAME (the pod's hostname: its name)
    idle_seconds: int            # STARTD_NOCLAIM_SHUTDOWN
    grace_seconds: int           # what SIGTERM or ToDie leaves the startd to vacate its jobs
    join_timeout: int            # how long the startd's ad may take to reach the collector
    times: Times
    update_interval: int = DEFAULT_UPDATE_INTERVAL   # the startd's ad to the collector, every this many s
    network_interface: str | None = None
    ca_file: str | None = None   # the CAs that sign the VO collector's host certificate (SciTokens run in TLS)

    @property
    def collector_address(self) -> tuple[str, int]:
        host, _, port = self.collector.rpartition(":")
        if not host or not port.isdigit():
            return self.collector, DEFAULT_COLLECTOR_PORT
        return host.strip("[]"), int(port)


def settings_from_env(env: dict[str, str], now: float | None = None) -> PilotSettings:
    """The pilot's settings; a missing or malformed value is a ConfigError naming the variable."""
    collector = env.get("CE_K8S_PILOT_COLLECTOR", "").strip()
    if not collector:
        raise ConfigError("CE_K8S_PILOT_COLLECTOR is not set: the pilot does not know its VO's collector")
    if any(c.isspace() for c in collector) or "," in collector:
        raise ConfigError(f"CE_K8S_PILOT_COLLECTOR={collector!r}: one host[:port], no spaces or lists")
    local_dir = Path(env.get("CE_K8S_PILOT_LOCAL_DIR", "").strip() or DEFAULT_LOCAL_DIR)
    if not local_dir.is_absolute():
        raise ConfigError(f"CE_K8S_PILOT_LOCAL_DIR={str(local_dir)!r} is not an absolute path")
    name = _NAME.sub("-", env.get("CE_K8S_PILOT_NAME", "").strip() or socket.gethostname())[:63] or "pilot"
    grace = _seconds(env, "CE_K8S_PILOT_GRACE_SECONDS", DEFAULT_GRACE_SECONDS, 1)
    start = time.time() if now is None else now
    # The pilot's own setting first (a VO may want it shorter), else the deadline ce-k8s's pod
    # builder puts in every pod it makes (the pod's activeDeadlineSeconds).
    source = "CE_K8S_PILOT_DEADLINE_SECONDS"
    deadline = _seconds(env, source, None, 1)
    if deadline is None:
        source = "CE_K8S_DEADLINE_SECONDS"
        deadline = _seconds(env, source, None, 1)
    times = deadline_times(start, deadline, grace, _seconds(env, "CE_K8S_PILOT_JOB_MAX_SECONDS", 0), source)
    return PilotSettings(
        collector=collector,
        token_file=env.get("CE_K8S_PILOT_TOKEN_FILE", "").strip(),
        local_dir=local_dir,
        name=name,
        idle_seconds=_seconds(env, "CE_K8S_PILOT_IDLE_SECONDS", DEFAULT_IDLE_SECONDS, 1),
        grace_seconds=grace,
        join_timeout=_seconds(env, "CE_K8S_PILOT_JOIN_TIMEOUT", DEFAULT_JOIN_TIMEOUT, 1),
        times=times,
        update_interval=_seconds(env, "CE_K8S_PILOT_UPDATE_INTERVAL", DEFAULT_UPDATE_INTERVAL, 1),
        network_interface=env.get("CE_K8S_PILOT_NETWORK_INTERFACE", "").strip() or None,
        ca_file=_ca_file(env),
    )


def _ca_file(env: dict[str, str]) -> str | None:
    """CE_K8S_PILOT_CA_FILE: an absolute path (a file of the pod's Secret beside the token), or None."""
    value = env.get("CE_K8S_PILOT_CA_FILE", "").strip()
    if value and not Path(value).is_absolute():
        raise ConfigError(f"CE_K8S_PILOT_CA_FILE={value!r} is not an absolute path")
    return value or None


def token_path(s: PilotSettings) -> Path:
    """Where the pilot keeps its copy of the token (0600, its own: HTCondor reads it from there)."""
    return s.local_dir / "tokens.d" / TOKEN_NAME


def layout(local_dir: str | Path, uid: int, gid: int) -> str:
    """The lines every self-contained condor_config of ours starts with: the package's binaries,
    everything of its own under `local_dir`, no other file read, the daemons as `uid`.`gid`
    (the pilot's, and the bed's VO pool's: ce_k8s.real.node.vopool)."""
    return f"""\
RELEASE_DIR = /usr
LIBEXEC = $(RELEASE_DIR)/libexec/condor
LIB = $(RELEASE_DIR)/lib/condor
SHARE = $(RELEASE_DIR)/share/condor
LOCAL_DIR = {local_dir}
LOCAL_CONFIG_FILE =
LOCAL_CONFIG_DIR =
LOG = $(LOCAL_DIR)/log
SPOOL = $(LOCAL_DIR)/spool
EXECUTE = $(LOCAL_DIR)/execute
LOCK = $(LOCAL_DIR)/lock
RUN = $(LOCAL_DIR)/run
CONDOR_IDS = {uid}.{gid}
CONDOR_ADMIN =
MAIL = /bin/true
"""


def condor_config(s: PilotSettings, size: Size, token: Token, pilot_id: str) -> str:
    """The pilot's whole condor_config (it reads no other file: LOCAL_CONFIG_* are emptied)."""
    uid, gid = os.getuid(), os.getgid()
    slot = f"cpus={size.cpus}, memory={size.memory_mb}" + (f", gpus={size.gpus}" if size.gpus else "")
    retire = "" if s.times.retire is None else f"GLIDEIN_ToRetire = {int(s.times.retire)}\n"
    die = "" if s.times.die is None else f"GLIDEIN_ToDie = {int(s.times.die)}\n"
    start = "True" if s.times.retire is None else "(time() < $(GLIDEIN_ToRetire))"
    shutdown = "" if s.times.die is None else "STARTD.DAEMON_SHUTDOWN = time() > $(GLIDEIN_ToDie)\n"
    # a count or the devices' UUIDs, not discovery: the pod's GPUs are what Kubernetes gave it (0 included).
    # A job is told its devices by HTCondor's own ENVIRONMENT_FOR_AssignedGPUs (CUDA_VISIBLE_DEVICES
    # with only a "CUDA" prefix taken off); the bare variable name would keep nothing but the
    # digits of a UUID (the real node showed it).
    gpus = f"MACHINE_RESOURCE_GPUs = {', '.join(size.gpu_ids) or size.gpus}\n"
    interface = f"NETWORK_INTERFACE = {s.network_interface}\n" if s.network_interface else ""
    # A SciToken is presented inside TLS: the pilot checks the collector's host certificate against
    # the system's CAs, or the VO's own (CE_K8S_PILOT_CA_FILE) when its CA is not a public one.
    sec_file = (f"SCITOKENS_FILE = {token_path(s)}\n" if token.kind == "SCITOKENS" else "") + (
        f"AUTH_SSL_CLIENT_CAFILE = {s.ca_file}\n" if s.ca_file else "")
    return f"""\
# ce-k8s pilot (ce_k8s/pilot; docs/pilot.md): a startd-only glidein sized from its pod.
{layout(s.local_dir, uid, gid)}
# The VO's pool
COLLECTOR_HOST = {s.collector}
CONDOR_HOST = $(COLLECTOR_HOST)
DAEMON_LIST = MASTER, STARTD
MASTER_NAME = {s.name}
STARTD_NAME = {s.name}
USE_SHARED_PORT = False
UPDATE_COLLECTOR_WITH_TCP = True
STARTD.UPDATE_INTERVAL = {s.update_interval}
MASTER.UPDATE_INTERVAL = {s.update_interval}
{interface}
# The credential: the pilot's copy of the mounted token, nothing else
SEC_DEFAULT_AUTHENTICATION = REQUIRED
SEC_DEFAULT_AUTHENTICATION_METHODS = {token.kind}
SEC_CLIENT_AUTHENTICATION_METHODS = {token.kind}
SEC_DEFAULT_ENCRYPTION = REQUIRED
SEC_DEFAULT_INTEGRITY = REQUIRED
SEC_TOKEN_DIRECTORY = $(LOCAL_DIR)/tokens.d
SEC_TOKEN_SYSTEM_DIRECTORY = $(LOCAL_DIR)/tokens.d
SEC_PASSWORD_DIRECTORY = $(LOCAL_DIR)/passwords.d
{sec_file}
# The pod's size: one partitionable slot ({size.sources.get('cpus', '?')}; {size.sources.get('memory', '?')})
NUM_CPUS = {size.cpus}
MEMORY = {size.memory_mb}
{gpus}NUM_SLOTS = 1
NUM_SLOTS_TYPE_1 = 1
SLOT_TYPE_1 = {slot}
SLOT_TYPE_1_PARTITIONABLE = True
RUNBENCHMARKS = False

# Unprivileged, inside a pod: no cgroups of its own, no mount or pid namespaces
BASE_CGROUP =
MOUNT_UNDER_SCRATCH =
USE_PID_NAMESPACES = False
DISCARD_SESSION_KEYRING_ON_STARTUP = False
ENABLE_KERNEL_TUNING = False

# When to leave: idle, before the pod's deadline, on SIGTERM
STARTD_NOCLAIM_SHUTDOWN = {s.idle_seconds}
MASTER.DAEMON_SHUTDOWN = STARTD_StartTime =?= 0
{retire}{die}START = {start}
{shutdown}MAXJOBRETIREMENTTIME = 0
MACHINE_MAX_VACATE_TIME = {max(1, s.grace_seconds - 5)}
CE_K8S_PILOT_ID = "{pilot_id}"
STARTD_ATTRS = $(STARTD_ATTRS) CE_K8S_PILOT_ID{' GLIDEIN_ToRetire' if retire else ''}{' GLIDEIN_ToDie' if die else ''}
"""
