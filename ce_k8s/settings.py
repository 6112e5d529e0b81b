"""The CE's `CE_K8S_*` knobs as one typed, frozen object.

Why knobs and not a separate config file: admins already manage the CE with
`condor_ce_config_val`/`condor_ce_reconfig` (docs/install.md), so ce-k8s reads its settings
from the same HTCondor configuration. `Settings()` gives the documented defaults (used by tests and
dry runs); `Settings.from_config(cfg)` reads a `CondorConfig` and reports a bad value with the file
and line where it was set, so a typo in `/etc/condor-ce/config.d` is found at start-up, not at the
first pilot. `cfg` is duck-typed (`get(name)` and `origin(name)`); a bad knob raises SettingsError,
a `ce_k8s.condor.config.ConfigError`, so callers handle both alike.

Values the CE itself already defines are taken from the CE, not restated: the spool is the CE's
`SPOOL`, the CE name is the Name its schedd advertises, the collector given to pilots is the CE's
`COLLECTOR_HOST` and the default wall time its `ROUTED_JOB_MAX_TIME`. A `CE_K8S_*` knob only
overrides them (docs/install.md, "Settings the CE already has"). `Settings.origins` says, per field,
which knob supplied the value and where it was set, so `ce-k8s doctor` can show it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

from ce_k8s.condor.args import ArgsError, parse_submit_env
from ce_k8s.condor.config import ConfigError
from ce_k8s.pods.k8svalues import parse_cpu_limit

SECRET_HARD_MAX = 1024 * 1024  # Kubernetes refuses Secrets bigger than 1 MiB
_TRUE = {"true", "yes", "1", "on", "t", "y"}
_FALSE = {"false", "no", "0", "off", "f", "n"}
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
# Where the agent reads each pilot's CPU time and memory (docs/accounting.md "Where the numbers come
# from"): each node's kubelet directly (RBAC get nodes/stats), through the API server's node proxy
# (get nodes/proxy: the whole kubelet API of every node), or nowhere (CPU time unknown).
USAGE_SOURCES = ("kubelet", "proxy", "none")
CE_SPOOL = "/var/lib/condor-ce/spool"  # HTCondor-CE's packaged SPOOL ($(LOCAL_DIR)/lib/condor-ce/spool)
CE_ROUTED_JOB_MAX_TIME = 4320  # HTCondor-CE's ROUTED_JOB_MAX_TIME (01-ce-router-defaults.conf), minutes
BUILT_IN = "built-in default"
AGENT_LOG_NAME = "CeK8sAgentLog"  # in the CE's LOG directory, named as HTCondor names its daemons' logs


class ConfigSource(Protocol):
    """What Settings needs from `ce_k8s.condor.config.CondorConfig`."""

    def get(self, name: str, default: str | None = None) -> str | None: ...
    def origin(self, name: str) -> Any: ...


class SettingsError(ConfigError, ValueError):
    """A `CE_K8S_*` knob with an unusable value; a ConfigError whose `str()` is `file:line: KNOB: message`."""

    def __init__(self, knob: str, message: str, file: str = "<config>", line: int = 0) -> None:
        super().__init__(file, line, f"{knob}: {message}")
        self.knob = knob


@dataclass(frozen=True)
class Settings:
    """Every site-wide ce-k8s setting, with the default the shipped config documents."""

    namespace: str = "ce-k8s-pilots"          # CE_K8S_NAMESPACE
    image: str = ""                           # CE_K8S_IMAGE ("" = routes must set K8sImage)
    image_pull_policy: str = "IfNotPresent"   # CE_K8S_IMAGE_PULL_POLICY
    ce_name: str = "htcondor-ce"              # CE_K8S_CE_NAME (default: the CE schedd's Name, see ce_schedd_name)
    socket: str = "/run/ce-k8s/agent.sock"    # CE_K8S_SOCKET
    kubeconfig: str = ""                      # CE_K8S_KUBECONFIG ("" = in-cluster, then ~/.kube/config)
    spool: str = CE_SPOOL                     # CE_K8S_SPOOL (default: the CE's SPOOL)
    secret_max_bytes: int = SECRET_HARD_MAX   # CE_K8S_SECRET_MAX_BYTES
    max_attempts: int = 3                     # CE_K8S_MAX_ATTEMPTS
    pending_timeout: int = 21600              # CE_K8S_PENDING_TIMEOUT (s)
    image_pull_timeout: int = 300             # CE_K8S_IMAGE_PULL_TIMEOUT (s)
    qps: float = 50.0                         # CE_K8S_QPS
    burst: int = 100                          # CE_K8S_BURST
    create_concurrency: int = 8               # CE_K8S_CREATE_CONCURRENCY
    gc_grace: int = 600                       # CE_K8S_GC_GRACE (s)
    hook_timeout: float = 20.0                # CE_K8S_HOOK_TIMEOUT (s)
    pilot_env: dict[str, str] = field(default_factory=dict)  # CE_K8S_PILOT_ENV (parsed)
    collector_host: str = ""                  # CE_K8S_COLLECTOR_HOST (default: the CE's COLLECTOR_HOST)
    default_walltime: int = CE_ROUTED_JOB_MAX_TIME  # CE_K8S_DEFAULT_WALLTIME (min; default: ROUTED_JOB_MAX_TIME)
    info_headroom: float = 0.0                # CE_K8S_INFO_HEADROOM (autoscaler headroom, fraction of the pool)
    run_as_user: int = 1000                   # CE_K8S_RUN_AS_USER (non-root uid for pilots)
    run_as_group: int = 1000                  # CE_K8S_RUN_AS_GROUP (also the pod's fsGroup)
    gpu_resource: str = "nvidia.com/gpu"      # CE_K8S_GPU_RESOURCE (default of K8sGpuResource)
    cpu_limit: str = "request"                # CE_K8S_CPU_LIMIT (default of K8sCpuLimit)
    grid_resource: str = "batch k8s"          # CE_K8S_GRID_RESOURCE (GridResource prefix of our routes)
    disable_pilot_ads: bool = False           # DISABLE_PILOT_ADS (the CE's own knob)
    # The CE removes a routed pilot that is idle again after a start (HTCondor-CE: ENABLE_JOB_RETRIES
    # false, used by its SYSTEM_PERIODIC_REMOVE): then a started pilot's next attempt waits retry_wait
    # seconds for that removal (docs/holds.md).
    ce_removes_restarts: bool = False         # from ENABLE_JOB_RETRIES and SYSTEM_PERIODIC_REMOVE
    retry_wait: int = 90                      # CE_K8S_RETRY_WAIT (s; default from the CE's poll intervals)
    agent_log: str = ""                       # CE_K8S_AGENT_LOG (default: $(LOG)/CeK8sAgentLog; "" = stderr only)
    per_job_history_dir: str = ""             # CE_K8S_PER_JOB_HISTORY_DIR ("" = off; APEL, docs/accounting.md)
    usage_interval: float = 60.0              # CE_K8S_USAGE_INTERVAL (s between kubelet Summary reads)
    usage_source: str = "kubelet"             # CE_K8S_USAGE_SOURCE (kubelet, proxy or none; USAGE_SOURCES)
    kubelet_ca: str = ""                      # CE_K8S_KUBELET_CA ("" = the cluster CA of the agent's credentials)
    kubelet_insecure: bool = False            # CE_K8S_KUBELET_INSECURE (do not verify kubelets' serving certs)
    # field name -> which knob gave the value and where it was set ("SPOOL (/etc/condor-ce/...:35)");
    # fields read from no knob are absent. Not part of equality: two equal configurations compare equal.
    origins: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __hash__(self) -> int:  # pilot_env is a dict; hash the rest so Settings stays usable as a key
        return hash(tuple(v for f in dataclasses.fields(self) if not isinstance(v := getattr(self, f.name), dict)))

    @classmethod
    def from_config(cls, cfg: ConfigSource) -> Settings:
        """Read every knob from `cfg`; an unusable value raises SettingsError naming its file and line."""
        r = _Reader(cfg)
        d = cls()
        ce_name = r.text("CE_K8S_CE_NAME", "")
        if ce_name:
            r.note("ce_name", "CE_K8S_CE_NAME")
        else:
            ce_name, how = ce_schedd_name(cfg)
            r.origins["ce_name"] = how
        disable_ads = r.boolean("DISABLE_PILOT_ADS", False)
        collector = r.first("collector_host", ("CE_K8S_COLLECTOR_HOST", "COLLECTOR_HOST"), r.text, "")
        if disable_ads:
            r.origins["collector_host"] = r.describe("DISABLE_PILOT_ADS")
        settings = cls(
            namespace=r.dns_label("CE_K8S_NAMESPACE", d.namespace),
            image=r.text("CE_K8S_IMAGE", d.image),
            image_pull_policy=r.choice("CE_K8S_IMAGE_PULL_POLICY", d.image_pull_policy, _PULL_POLICIES),
            ce_name=ce_name or d.ce_name,
            socket=r.text("CE_K8S_SOCKET", d.socket),
            kubeconfig=r.text("CE_K8S_KUBECONFIG", d.kubeconfig),
            spool=r.first("spool", ("CE_K8S_SPOOL", "SPOOL"), r.abspath, d.spool),
            secret_max_bytes=r.integer("CE_K8S_SECRET_MAX_BYTES", d.secret_max_bytes, 1, SECRET_HARD_MAX),
            max_attempts=r.integer("CE_K8S_MAX_ATTEMPTS", d.max_attempts, 1, 100),
            pending_timeout=r.integer("CE_K8S_PENDING_TIMEOUT", d.pending_timeout, 1, 365 * 86400),
            image_pull_timeout=r.integer("CE_K8S_IMAGE_PULL_TIMEOUT", d.image_pull_timeout, 1, 86400),
            qps=r.real("CE_K8S_QPS", d.qps, 0.1, 10000.0),
            burst=r.integer("CE_K8S_BURST", d.burst, 1, 100000),
            create_concurrency=r.integer("CE_K8S_CREATE_CONCURRENCY", d.create_concurrency, 1, 1000),
            gc_grace=r.integer("CE_K8S_GC_GRACE", d.gc_grace, 0, 30 * 86400),
            hook_timeout=r.real("CE_K8S_HOOK_TIMEOUT", d.hook_timeout, 0.1, 3600.0),
            pilot_env=r.env("CE_K8S_PILOT_ENV"),
            collector_host="" if disable_ads else collector,
            default_walltime=r.first("default_walltime", ("CE_K8S_DEFAULT_WALLTIME", "ROUTED_JOB_MAX_TIME"),
                                     lambda k, dflt: r.integer(k, dflt, 1, 525600), d.default_walltime),
            info_headroom=r.real("CE_K8S_INFO_HEADROOM", d.info_headroom, 0.0, 0.99),
            run_as_user=r.integer("CE_K8S_RUN_AS_USER", d.run_as_user, 1, 2**31 - 1),
            run_as_group=r.integer("CE_K8S_RUN_AS_GROUP", d.run_as_group, 1, 2**31 - 1),
            gpu_resource=r.text("CE_K8S_GPU_RESOURCE", d.gpu_resource),
            cpu_limit=r.cpu_limit("CE_K8S_CPU_LIMIT", d.cpu_limit),
            grid_resource=r.grid_resource("CE_K8S_GRID_RESOURCE", d.grid_resource),
            disable_pilot_ads=disable_ads,
            ce_removes_restarts=_ce_removes_restarts(cfg, r),
            retry_wait=r.integer("CE_K8S_RETRY_WAIT", _default_retry_wait(r), 0, 86400),
            agent_log=r.agent_log("CE_K8S_AGENT_LOG"),
            per_job_history_dir=(r.abspath("CE_K8S_PER_JOB_HISTORY_DIR", "/")
                                 if r.text("CE_K8S_PER_JOB_HISTORY_DIR", "") else ""),
            usage_interval=r.real("CE_K8S_USAGE_INTERVAL", d.usage_interval, 0.1, 86400.0),
            usage_source=r.choice("CE_K8S_USAGE_SOURCE", d.usage_source, USAGE_SOURCES),
            kubelet_ca=(r.abspath("CE_K8S_KUBELET_CA", "/") if r.text("CE_K8S_KUBELET_CA", "") else ""),
            kubelet_insecure=r.boolean("CE_K8S_KUBELET_INSECURE", d.kubelet_insecure),
            origins=r.origins,
        )
        for f in dataclasses.fields(cls):  # every other field: its own knob, or the built-in default
            if f.name != "origins" and f.name not in r.origins:
                knob = knob_of(f.name)
                if r.raw(knob) is not None:
                    r.note(f.name, knob)
                else:
                    r.origins[f.name] = BUILT_IN
        return settings


def knob_of(field_name: str) -> str:
    """The knob that sets a Settings field: `CE_K8S_<FIELD>`, and the CE's own `DISABLE_PILOT_ADS`."""
    return "DISABLE_PILOT_ADS" if field_name == "disable_pilot_ads" else "CE_K8S_" + field_name.upper()


def ce_schedd_name(cfg: ConfigSource) -> tuple[str, str]:
    """(the Name the CE's schedd advertises, which knob it came from), for labels and logs.

    HTCondor names a daemon in `build_valid_daemon_name` (src/condor_utils/get_daemon_name.cpp): a
    `SCHEDD_NAME` with an `@` is kept as it is; one without is completed to `name@<FULL_HOSTNAME>`
    unless it is this host's name; no `SCHEDD_NAME` gives the full host name (`default_daemon_name`,
    as the CE's schedd runs as root). HTCondor-CE sets no `SCHEDD_NAME`, so a stock CE is named by
    its `FULL_HOSTNAME`, the host part of its `grid_resource` (01-ce-router-defaults.conf).
    """
    full = (cfg.get("FULL_HOSTNAME") or "").strip()
    full_how = _describe(cfg, "FULL_HOSTNAME") if full else "this host's FQDN (no FULL_HOSTNAME)"
    full = full or socket.getfqdn()
    name = (cfg.get("SCHEDD_NAME") or "").strip()
    if not name:
        return full, full_how
    how = _describe(cfg, "SCHEDD_NAME")
    if "@" in name or name.lower() == full.lower():
        return name, how
    return f"{name}@{full}", f"{how} + '@' + {full_how}"


def _describe(cfg: ConfigSource, knob: str) -> str:
    """`KNOB (file:line)`, or `KNOB (built-in default)`; the knob name alone if its origin is unknown."""
    try:
        origin = cfg.origin(knob)
    except Exception:  # an origin is a nicety; a config source without one still works
        origin = None
    file = getattr(origin, "file", None)
    if not file:
        return knob
    line = getattr(origin, "line", 0) or 0
    return f"{knob} ({file}:{line})" if line else f"{knob} ({file})"


def _mentions(cfg: ConfigSource, knob: str, target: str) -> bool:
    """Whether the unexpanded value of `knob`, or of a macro it uses at any depth, names `target`.
    Each macro is read once (a breadth-first walk), so shared or self-referencing macros cost nothing."""
    raw = getattr(cfg, "raw", None)
    if not callable(raw):
        return False
    todo, seen = [knob.upper()], {knob.upper()}
    while todo:
        text = raw(todo.pop()) or ""
        for inner in re.findall(r"\$\(([A-Za-z0-9_.]+)\)", text):
            name = inner.upper()
            if name == target.upper():
                return True
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return False


def _ce_removes_restarts(cfg: ConfigSource, r: _Reader) -> bool:
    """HTCondor-CE's retry policy in force: `ENABLE_JOB_RETRIES` false and used by the schedd's
    `SYSTEM_PERIODIC_REMOVE` (01-ce-router-defaults.conf, REMOVE_CLAUSE_2: a routed job that is idle
    again after one start, or started twice, is removed). A configuration that sets the knob without
    that policy (ce-k8s's embedded one, the emulated CE) removes nothing, so retries go on there."""
    return not r.boolean("ENABLE_JOB_RETRIES", True) and _mentions(cfg, "SYSTEM_PERIODIC_REMOVE", "ENABLE_JOB_RETRIES")


def _default_retry_wait(r: _Reader) -> int:
    """How long the CE needs to remove a pilot that went idle: the router copies the idle state to the
    source job at its next poll, the schedd's next periodic pass removes it, the router's next poll
    removes the routed job (HTCondor's defaults: 10 s and 60 s), and a little more."""
    poll = r.integer("JOB_ROUTER_POLLING_PERIOD", 10, 1, 86400)
    periodic = r.integer("PERIODIC_EXPR_INTERVAL", 60, 1, 86400)
    return 2 * poll + periodic + 10


class _Reader:
    """Typed knob access that turns every parse failure into a located SettingsError."""

    def __init__(self, cfg: ConfigSource) -> None:
        self.cfg = cfg
        self.origins: dict[str, str] = {}

    def describe(self, knob: str) -> str:
        return _describe(self.cfg, knob)

    def macro_of(self, knob: str) -> str | None:
        """`SPOOL` when the unexpanded value of `knob` is exactly `$(SPOOL)`, else None."""
        raw = getattr(self.cfg, "raw", None)
        text = ((raw(knob) if callable(raw) else None) or "").strip()
        inner = text[2:-1]
        if text.startswith("$(") and text.endswith(")") and inner.replace("_", "").isalnum():
            return inner
        return None

    def note(self, field_name: str, knob: str) -> None:
        """Record that `knob` supplied `field_name`; a value that is one `$(MACRO)` also names the macro."""
        where = self.describe(knob)
        inner = self.macro_of(knob)
        if inner is not None:
            where = f"{self.describe(inner)} through {where} = $({inner})"
        self.origins[field_name] = where

    def first(self, field_name: str, knobs: tuple[str, ...], read: Any, default: Any) -> Any:
        """The value of the first of `knobs` that is set and not empty, read with `read(knob, default)`.

        Why: `CE_K8S_SPOOL` overrides the CE's `SPOOL`, which overrides the packaged default; an
        empty `CE_K8S_SPOOL =` (or one whose `$(SPOOL)` expands to nothing) falls through.
        """
        for knob in knobs:
            if self.raw(knob) is not None:
                self.note(field_name, knob)
                # `CE_K8S_SPOOL = $(SPOOL)`: a bad value is reported at the line that set SPOOL.
                inner = self.macro_of(knob)
                return read(inner if inner is not None and self.raw(inner) is not None else knob, default)
        self.origins[field_name] = BUILT_IN
        return default

    def fail(self, knob: str, message: str) -> SettingsError:
        origin = None
        try:
            origin = self.cfg.origin(knob)
        except Exception:  # an origin is a nicety; never hide the real error behind it
            origin = None
        file = getattr(origin, "file", None) or "<config>"
        line = getattr(origin, "line", None) or 0
        return SettingsError(knob, message, file, line)

    def raw(self, knob: str) -> str | None:
        value = self.cfg.get(knob)
        if value is None:
            return None
        value = value.strip()
        return value or None

    def text(self, knob: str, default: str) -> str:
        value = self.raw(knob)
        if value is None:
            return default
        if any(not c.isprintable() for c in value):
            raise self.fail(knob, "contains control characters")
        return value

    def choice(self, knob: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.text(knob, default)
        for c in choices:
            if value.lower() == c.lower():
                return c
        raise self.fail(knob, f"{value!r} is not one of {', '.join(choices)}")

    def dns_label(self, knob: str, default: str) -> str:
        from ce_k8s.pods.names import is_dns_label

        value = self.text(knob, default)
        if not is_dns_label(value):
            raise self.fail(knob, f"{value!r} is not a valid namespace name (RFC 1123 label)")
        return value

    def abspath(self, knob: str, default: str) -> str:
        value = self.text(knob, default)
        if not value.startswith("/"):
            raise self.fail(knob, f"{value!r} must be an absolute path")
        return value.rstrip("/") or "/"

    def integer(self, knob: str, default: int, low: int, high: int) -> int:
        value = self.raw(knob)
        if value is None:
            return default
        try:
            number = int(value, 10)
        except ValueError:
            raise self.fail(knob, f"{value!r} is not an integer") from None
        if not low <= number <= high:
            raise self.fail(knob, f"{number} is outside {low}..{high}")
        return number

    def real(self, knob: str, default: float, low: float, high: float) -> float:
        value = self.raw(knob)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise self.fail(knob, f"{value!r} is not a number") from None
        if not (math.isfinite(number) and low <= number <= high):
            raise self.fail(knob, f"{value} is outside {low}..{high}")
        return number

    def boolean(self, knob: str, default: bool) -> bool:
        value = self.raw(knob)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise self.fail(knob, f"{value!r} is not a boolean (true/false)")

    def env(self, knob: str) -> dict[str, str]:
        value = self.raw(knob)
        if value is None:
            return {}
        try:
            return parse_submit_env(value)
        except ArgsError as exc:
            raise self.fail(knob, f"not a valid environment string: {exc}") from None

    def agent_log(self, knob: str) -> str:
        """The agent's log file: the knob (an absolute path, or `none` for stderr only), else the
        CE's log directory (`$(LOG)/CeK8sAgentLog`), else "" (no CE: stderr only).

        Why: condor_master starts the agent as a non-DaemonCore daemon, whose stderr goes nowhere,
        so without a file the agent's log is lost on a CE (docs/install.md, "5. Start the agent").
        """
        value = self.raw(knob)
        if value is not None:
            self.note("agent_log", knob)
            return "" if value.lower() == "none" else self.abspath(knob, "")
        log_dir = self.raw("LOG")
        if log_dir is None or not log_dir.startswith("/"):
            self.origins["agent_log"] = BUILT_IN
            return ""
        self.origins["agent_log"] = f"{self.describe('LOG')} + /{AGENT_LOG_NAME}"
        return log_dir.rstrip("/") + "/" + AGENT_LOG_NAME

    def cpu_limit(self, knob: str, default: str) -> str:
        value = self.text(knob, default)
        try:
            parse_cpu_limit(value)
        except ValueError:
            raise self.fail(knob, f"{value!r} must be 'request', 'none' or a factor between 1 and 64") from None
        return value.strip().lower()

    def grid_resource(self, knob: str, default: str) -> str:
        """The words a Kubernetes route's GridResource starts with, one space apart.

        The hooks compare words case-insensitively (`ce_k8s.hooks._common.grid_resource_matches`).
        One pair of surrounding double quotes is dropped, as HTCondor unquotes a route's
        `GridResource` macro, because `CE_K8S_GRID_RESOURCE = "batch k8s"` is an easy slip that
        would otherwise match no route at all. Any other quote, or no word, is an error.
        """
        value = self.text(knob, default)
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        words = value.split()
        if not words:
            raise self.fail(knob, "names no GridResource words (e.g. 'batch k8s')")
        if any('"' in w or "'" in w for w in words):
            raise self.fail(knob, f"{value!r} must not contain quotes")
        return " ".join(words)
