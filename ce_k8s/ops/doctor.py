"""`ce-k8s doctor`: check a CE host end to end and say what to fix, one line per check.

    ce-k8s doctor [--config PATH] [--socket PATH] [--kubeconfig F] [--timeout S] [--json]

Why: most ways a ce-k8s CE can be misconfigured are *silent*. The job router treats a hook whose
file or directory fails its path checks as "not configured" and routes the pilot without a pod,
logging nothing (docs/hook-protocol.md §1.1); a missing `CE_K8S_ATTRS_TO_COPY` entry only shows
when a pilot is rerouted; missing RBAC only shows as held pilots. Each check here prints
`OK`, `WARN` or `FAIL` with a fix hint; a check that cannot run because an earlier one failed
prints `SKIP`. Exit status: 1 if any check failed, else 0 (2 for bad usage).

The checks, in order: configuration parses (and the `CE_K8S_*` knobs are valid), `routes check`
passes, the route files are read after the ce-k8s knob files, the hook keyword and the four hook
paths (hook-protocol.md §1.1 rules, plus "executable by the pilot accounts", because hooks run as the job's owner,
hook-protocol.md §2.1, and launchers written by `--install-hooks` with the CE's socket and `CE_K8S_GRID_RESOURCE`),
`<KW>_ATTRS_TO_COPY`, the agent socket answers a ping, the Kubernetes API answers, RBAC (a
SelfSubjectAccessReview per permission the agent uses), and the spool directory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ce_k8s.ops.status import kubeconfig_from, load_config_and_settings, new_api_client, short

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"
CE_CONFIG = "/etc/condor-ce/condor_config"
DEFAULT_TIMEOUT = 5.0

HOOKS = ("TRANSLATE_JOB", "UPDATE_JOB_INFO", "JOB_FINALIZE", "JOB_CLEANUP")
HOOK_SHORT = {"TRANSLATE_JOB": "translate", "UPDATE_JOB_INFO": "update", "JOB_FINALIZE": "finalize",
              "JOB_CLEANUP": "cleanup"}
# The translate hook names attempt n+1's pod from the source job's K8sAttempt, which only reaches
# the source job through <KW>_ATTRS_TO_COPY (ce_k8s/hooks/translate.py): without it a rerouted
# pilot reuses the old pod's name.
REQUIRED_COPY = ("K8sAttempt",)
# Without these condor_ce_q does not show the pod, node and pending reason (htcondor-ce.md §4.1).
RECOMMENDED_COPY = ("K8sPodName", "K8sPodNamespace", "K8sPodPhase", "K8sPodReason", "K8sNodeName")

# What the agent does with its credentials (containers/k8s/base/rbac.yaml grants exactly this):
# (API group, resource, subresource, verb); namespaced ones are checked in every pilot namespace.
NAMESPACED_PERMISSIONS = (
    ("", "pods", "", "create"), ("", "pods", "", "get"), ("", "pods", "", "delete"),
    ("", "pods", "log", "get"),
    ("", "secrets", "", "create"), ("", "secrets", "", "patch"), ("", "secrets", "", "delete"),
    ("", "events", "", "list"),
)
CLUSTER_PERMISSIONS = (
    ("", "pods", "", "list"), ("", "pods", "", "watch"), ("", "nodes", "", "list"),
    ("", "resourcequotas", "", "list"),
)
# The permission the agent's usage source needs (CE_K8S_USAGE_SOURCE, docs/accounting.md): get
# nodes/stats on the kubelets themselves (granted by rbac.yaml), or get nodes/proxy through the API
# server (a site's own addition: it reaches the whole kubelet API). A site may leave it out: without
# it the agent accounts CPU time as unknown and everything else works, so its absence is a warning.
USAGE_PERMISSIONS = {
    "kubelet": (("", "nodes", "stats", "get"),),
    "proxy": (("", "nodes", "proxy", "get"),),
    "none": (),
}
RBAC_FIX = ("apply containers/k8s/base/rbac.yaml, with the Role and RoleBinding copied into every pilot "
            "namespace (docs/deploy-kubernetes.md)")

_LAUNCHER_SOCKET = re.compile(r"^protocol\.DEFAULT_SOCKET = (['\"])(.*)\1$", re.MULTILINE)
_LAUNCHER_GRID_RESOURCE = re.compile(r"^protocol\.DEFAULT_GRID_RESOURCE = (['\"])(.*)\1$", re.MULTILINE)

# A minimal pilot routed through each route to learn the namespace its pods go to.
_TRIAL_PILOT = """ClusterId = 1
ProcId = 0
JobUniverse = 5
JobStatus = 1
Owner = "pilot"
GlobalJobId = "doctor.invalid#1.0#1760000000"
QDate = 1760000000
Cmd = "glidein_startup.sh"
RequestCpus = 1
RequestMemory = 2000
"""


@dataclass
class Result:
    """One check's verdict; `str()` is its output line."""

    level: str
    name: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.level:<5} {self.name}: {self.message}"
        return text + (f" -- fix: {self.fix}" if self.fix and self.level in (WARN, FAIL) else "")


@dataclass
class Context:
    """What the checks share; later checks look at what earlier ones found."""

    args: argparse.Namespace
    timeout: float = DEFAULT_TIMEOUT
    config_path: str | None = None
    cfg: Any = None
    settings: Any = None
    router: Any = None
    keyword: str | None = None
    api_client: Any = None
    api_ok: bool = False
    results: list[Result] = field(default_factory=list)

    def add(self, level: str, name: str, message: str, fix: str = "") -> Result:
        result = Result(level, name, " ".join(message.split()), fix)
        self.results.append(result)
        return result


# --------------------------------------------------------------------------------------------
# Configuration


def config_path(arg: str | None) -> str | None:
    """`--config`, else `$CONDOR_CONFIG`, else the CE's own file if this host has one, else None."""
    if arg:
        return arg
    if os.environ.get("CONDOR_CONFIG"):
        return os.environ["CONDOR_CONFIG"]
    return CE_CONFIG if os.path.exists(CE_CONFIG) else None


def check_config(ctx: Context) -> None:
    from ce_k8s.condor.config import ConfigError

    ctx.config_path = config_path(ctx.args.config)
    where = ctx.config_path or "the shipped defaults"
    try:
        ctx.cfg, ctx.settings = load_config_and_settings(ctx.config_path)
    except ConfigError as exc:
        ctx.add(FAIL, "config", str(exc), "correct the value at that file and line")
        return
    except OSError as exc:
        ctx.add(FAIL, "config", f"{where}: {short(exc)}", "pass --config /etc/condor-ce/condor_config")
        return
    level = OK if ctx.config_path else WARN
    name_from = getattr(ctx.settings, "origins", {}).get("ce_name")
    ctx.add(level, "config", f"{where}: {len(ctx.cfg.names())} knobs, CE name {ctx.settings.ce_name}"
            + (f" (from {name_from})" if name_from else ""),
            "run on the CE host, or pass --config /etc/condor-ce/condor_config")


def check_routes(ctx: Context) -> None:
    from ce_k8s.condor.check import check_config as routes_problems
    from ce_k8s.condor.routing import RouterConfig

    try:
        from ce_k8s.condor.oldsyntax import has_old_syntax
    except ImportError:  # pragma: no cover - the module ships with ce-k8s
        has_old_syntax = None
    cmd = "ce-k8s routes check" + (f" --config {ctx.config_path}" if ctx.config_path else "")
    if has_old_syntax is not None and has_old_syntax(ctx.cfg):
        ctx.add(FAIL, "routes", "the configuration uses JOB_ROUTER_ENTRIES (old route syntax), which HTCondor "
                "24.10 and later ignore", "convert with 'ce-k8s routes convert' (docs/upgrading.md)")
    ctx.router = RouterConfig.from_config(ctx.cfg)
    ctx.keyword = ctx.router.hook_keyword
    from ce_k8s.condor.diagnostics import Severity

    # doctor is strict (errors and warnings fail); notes, such as the batch routes a stock CE's
    # packages define and the site does not enable, are not problems
    problems = [d for d in routes_problems(ctx.cfg, ctx.router) if d.severity > Severity.NOTE]
    if problems:
        shown = "; ".join(str(p) for p in problems[:3]) + ("; ..." if len(problems) > 3 else "")
        ctx.add(FAIL, "routes", f"{len(problems)} problem(s): {shown}", f"run '{cmd}' and fix each line")
    elif not ctx.router.routes:
        ctx.add(FAIL, "routes", "JOB_ROUTER_ROUTE_NAMES enables no route: the router routes nothing",
                "list your routes in JOB_ROUTER_ROUTE_NAMES (docs/routes.md)")
    else:
        names = " ".join(r.name for r in ctx.router.routes)
        ctx.add(OK, "routes", f"{len(ctx.router.routes)} route(s): {names}")


def check_route_order(ctx: Context) -> None:
    """Route files must be read after every ce-k8s knob file: `20-ce-k8s-routing.conf` empties
    JOB_ROUTER_ROUTE_NAMES, so a route appended before it is disabled and the router says nothing
    (the layout `ce-k8s install` uses, docs/install.md)."""
    from ce_k8s.ops.install import ROUTE_PREFIX, is_route_file, route_order_problems, shipped_knob_files

    problems = route_order_problems(ctx.cfg.sources)
    if problems:
        ctx.add(WARN, "route-order", "; ".join(problems) + ": a route appended to JOB_ROUTER_ROUTE_NAMES "
                "before 20-ce-k8s-routing.conf is disabled",
                f"remove or rename the file (ce-k8s install puts routes in {ROUTE_PREFIX}*.conf, after the "
                "knob files)")
        return
    knobs = {p.name for p in shipped_knob_files()}
    n_routes = sum(is_route_file(s) for s in ctx.cfg.sources if os.path.basename(s) not in knobs)
    ctx.add(OK, "route-order", f"{n_routes} route file(s) read after the ce-k8s knob files")


# --------------------------------------------------------------------------------------------
# Hooks (docs/hook-protocol.md §1.1, §2.1)


def check_keyword(ctx: Context) -> None:
    if not ctx.keyword:
        ctx.add(FAIL, "hook-keyword", "JOB_ROUTER_HOOK_KEYWORD is not set: the router calls no hook and routes "
                "pilots without pods", "set JOB_ROUTER_HOOK_KEYWORD = CE_K8S (config.d/50-ce-k8s-hooks.conf)")
        return
    origin = ctx.cfg.origin("JOB_ROUTER_HOOK_KEYWORD")
    at = f" ({origin.file}:{origin.line})" if origin else ""
    ctx.add(OK, "hook-keyword", f"JOB_ROUTER_HOOK_KEYWORD = {ctx.keyword}{at}")


def hook_problems(path: str) -> list[tuple[str, str, str]]:
    """(level, problem, fix) for one hook path, in the order the router checks (hook_utils.cpp).

    Empty means the router accepts the path and the pilot accounts can run it.
    """
    install = f"ce-k8s agent --install-hooks {os.path.dirname(path) or '<dir>'}"
    if not os.path.isabs(path):
        return [(FAIL, f"{path} is not an absolute path", "use the full path of the launcher")]
    try:
        st = os.stat(path)
    except OSError as exc:
        return [(FAIL, f"{path}: {exc.strerror or short(exc)}; the router silently routes without this hook",
                 install)]
    found: list[tuple[str, str, str]] = []
    if not stat.S_ISREG(st.st_mode):
        found.append((FAIL, f"{path} is not a regular file", install))
    elif not os.access(path, os.X_OK):
        found.append((FAIL, f"{path} is not executable; the router ignores it", f"chmod 0755 {path}"))
    if st.st_mode & stat.S_IWOTH:
        found.append((FAIL, f"{path} is world-writable; the router ignores it without a word",
                      f"chmod o-w {path}"))
    parent = os.path.dirname(path)
    try:
        if os.stat(parent).st_mode & stat.S_IWOTH:
            found.append((FAIL, f"its directory {parent} is world-writable; the router ignores the hook",
                          f"chmod o-w {parent}, or install the hooks elsewhere"))
    except OSError as exc:
        found.append((FAIL, f"{parent}: {short(exc)}", install))
    if not found and not st.st_mode & stat.S_IXOTH:
        found.append((WARN, f"{path} is not executable by others; the router runs hooks as the pilot's Unix "
                      "account (hook-protocol.md §2.1)", f"chmod 0755 {path}"))
    return found


def _launcher_head(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(4096)
    except OSError:
        return ""


def launcher_socket(path: str) -> str | None:
    """The socket a launcher written by `ce-k8s agent --install-hooks` talks to, if it is one."""
    m = _LAUNCHER_SOCKET.search(_launcher_head(path))
    return m.group(2) if m else None


def launcher_grid_resource(path: str) -> str | None:
    """The `CE_K8S_GRID_RESOURCE` a launcher written by `ce-k8s agent --install-hooks` falls back
    to, if it is one. A launcher written before the knob existed bakes none in, so its hook uses
    `protocol.DEFAULT_GRID_RESOURCE` as shipped."""
    from ce_k8s import protocol

    head = _launcher_head(path)
    if not _LAUNCHER_SOCKET.search(head):
        return None
    m = _LAUNCHER_GRID_RESOURCE.search(head)
    return m.group(2) if m else protocol.DEFAULT_GRID_RESOURCE


def _same_words(a: str, b: str) -> bool:
    """Whether two GridResource prefixes name the same jobs (the hooks compare words
    case-insensitively, `ce_k8s.hooks._common.grid_resource_matches`)."""
    return a.lower().split() == b.lower().split()


def check_hooks(ctx: Context) -> None:
    from ce_k8s.condor.routing import hook_path_ok

    kw = ctx.keyword
    socket_path = ctx.args.socket or ctx.settings.socket
    for hook in HOOKS:
        name = f"hook-{HOOK_SHORT[hook]}"
        knob = f"{kw}_HOOK_{hook}"
        path = (ctx.cfg.get(knob) or "").strip()
        if not path and hook == "JOB_FINALIZE":
            knob = f"{kw}_HOOK_JOB_EXIT"
            path = (ctx.cfg.get(knob) or "").strip()
        if not path:
            ctx.add(FAIL, name, f"{kw}_HOOK_{hook} is not set", "keep config.d/50-ce-k8s-hooks.conf in the CE's "
                    "config.d, or set the knob to the hook launcher's path")
            continue
        found = hook_problems(path)
        if not any(level == FAIL for level, _, _ in found) and not hook_path_ok(path):
            found.append((FAIL, f"{path} fails the router's path checks", "see docs/hook-protocol.md §1.1"))
        if found:
            level = FAIL if any(lv == FAIL for lv, _, _ in found) else WARN
            worst = next(f for f in found if f[0] == level)
            ctx.add(level, name, f"{knob} = {worst[1]}", worst[2])
            continue
        stale = []
        baked = launcher_socket(path)
        if baked is not None and os.path.normpath(baked) != os.path.normpath(socket_path):
            stale.append(f"{path} talks to {baked}, but the agent listens on {socket_path}")
        # The hooks decide which routed jobs are Kubernetes jobs with the launcher's value; the CE
        # (`ce-k8s route`, routes check) with CE_K8S_GRID_RESOURCE. If they differ, the hooks
        # pass Kubernetes pilots through (no pod) or claim another backend's jobs.
        words = launcher_grid_resource(path)
        if words is not None and not _same_words(words, ctx.settings.grid_resource):
            stale.append(f"{path} takes routed jobs whose GridResource starts with {words!r}, but "
                         f"CE_K8S_GRID_RESOURCE is {ctx.settings.grid_resource!r}")
        if stale:
            ctx.add(WARN, name, "; ".join(stale), f"ce-k8s agent --install-hooks {os.path.dirname(path)}")
            continue
        ctx.add(OK, name, f"{knob} = {path}")


def check_attrs_to_copy(ctx: Context) -> None:
    import classad2

    knob = f"{ctx.keyword}_ATTRS_TO_COPY"
    have = {n.lower() for n in ctx.router.attrs_to_copy(classad2.ClassAd())}
    missing = [a for a in REQUIRED_COPY if a.lower() not in have]
    if missing:
        ctx.add(FAIL, "attrs-to-copy", f"{knob} lacks {', '.join(missing)}: a rerouted pilot would reuse its old "
                "pod's name", f"add {', '.join(missing)} to {knob} (config.d/50-ce-k8s-hooks.conf)")
        return
    missing = [a for a in RECOMMENDED_COPY if a.lower() not in have]
    if missing:
        ctx.add(WARN, "attrs-to-copy", f"{knob} lacks {', '.join(missing)}: condor_ce_q will not show them on "
                "the CE job", f"add them to {knob}")
        return
    ctx.add(OK, "attrs-to-copy", f"{knob} has {', '.join(REQUIRED_COPY + RECOMMENDED_COPY)}")


# --------------------------------------------------------------------------------------------
# Agent, API, RBAC, spool


def check_agent(ctx: Context) -> None:
    from ce_k8s import protocol

    path = ctx.args.socket or ctx.settings.socket
    start = "start the agent (CE_K8S_AGENT in DAEMON_LIST, or systemctl start ce-k8s-agent) and read its log"
    try:
        st = os.stat(path)
    except OSError as exc:
        ctx.add(FAIL, "agent", f"{path}: {exc.strerror or short(exc)}: the agent is not running, so every "
                "update hook fails", start)
        return
    if not stat.S_ISSOCK(st.st_mode):
        ctx.add(FAIL, "agent", f"{path} is not a socket", f"remove it and {start}")
        return
    try:
        answer = protocol.ask(path, protocol.VERB_PING, b"", ctx.timeout)
    except (OSError, protocol.ProtocolError) as exc:
        ctx.add(FAIL, "agent", f"{path}: no answer to ping: {short(exc)}", start)
        return
    text = answer.message().strip()
    if answer.status == protocol.STATUS_BUSY:
        ctx.add(WARN, "agent", f"{path}: agent is busy ({text})", "wait for its first LIST; if it stays busy, "
                "check the API and the agent's log")
        return
    if answer.status != protocol.STATUS_OK:
        ctx.add(FAIL, "agent", f"{path}: agent answered {answer.status}: {text}", "read the agent's log")
        return
    parent = os.path.dirname(path) or "."
    if not st.st_mode & stat.S_IWOTH or not os.stat(parent).st_mode & stat.S_IXOTH:
        ctx.add(WARN, "agent", f"{path} answers, but pilot accounts cannot connect (socket must be 0666 in a "
                "directory others may enter): hooks run as the pilot accounts (hook-protocol.md §2.1)",
                f"chmod 0755 {parent}; restart the agent")
        return
    ctx.add(OK, "agent", f"{path} answers ping ({text or 'no version'})")


def check_api(ctx: Context) -> None:
    from kubernetes import client

    kubeconfig = kubeconfig_from(ctx.args.kubeconfig, ctx.settings)
    what = kubeconfig or "in-cluster service account"
    try:
        ctx.api_client = new_api_client(kubeconfig)
    except Exception as exc:  # the loaders raise several unrelated types
        ctx.add(FAIL, "api", f"no Kubernetes credentials from {what}: {short(exc)}",
                "set CE_K8S_KUBECONFIG to a kubeconfig for the agent's service account")
        return
    host = ctx.api_client.configuration.host
    try:
        version = client.VersionApi(ctx.api_client).get_code(_request_timeout=ctx.timeout)
    except Exception as exc:
        ctx.add(FAIL, "api", f"{host} (from {what}) does not answer: {short(exc)}",
                "check the server address and certificates in the kubeconfig, and the network path from this host")
        return
    ctx.api_ok = True
    if kubeconfig:
        try:
            mode = os.stat(kubeconfig).st_mode
        except OSError:
            mode = 0
        if mode & (stat.S_IROTH | stat.S_IWOTH):
            ctx.add(WARN, "api", f"{host} answers (Kubernetes {version.git_version}), but {kubeconfig} is readable "
                    "by every local user (it holds the agent's credentials)", f"chmod 0600 {kubeconfig}")
            return
    ctx.add(OK, "api", f"{host} answers (Kubernetes {version.git_version}, credentials from {what})")


def pilot_namespaces(ctx: Context) -> list[str]:
    """`CE_K8S_NAMESPACE` plus every namespace a route sends a trial pilot to (`K8sNamespace`)."""
    namespaces = {ctx.settings.namespace}
    try:
        from ce_k8s.condor import wire
        from ce_k8s.condor.trial import route_one, translator

        trial = wire.parse_old_ads(_TRIAL_PILOT, "<doctor trial pilot>")[0]
        translate = translator()
        for route in ctx.router.routes:
            result = route_one(trial, ctx.router, ctx.cfg, translate, None, ctx.settings, force_route=route)
            ns = result.ad.eval("K8sNamespace") if result.ad is not None and "K8sNamespace" in result.ad else None
            if isinstance(ns, str) and ns:
                namespaces.add(ns)
    except Exception as exc:  # a route that cannot be applied is reported by the routes check
        ctx.add(WARN, "rbac", f"could not learn the routes' namespaces: {short(exc)}; checking "
                f"{ctx.settings.namespace} only", "run 'ce-k8s route' on a pilot ad")
    return sorted(namespaces)


def access_allowed(api_client, group: str, resource: str, sub: str, verb: str, namespace: str,
                   timeout: float) -> tuple[bool, str]:
    """(allowed, reason) from one SelfSubjectAccessReview (every identity may create those)."""
    from kubernetes import client

    attrs: dict[str, str] = {"group": group, "resource": resource, "verb": verb}
    if sub:
        attrs["subresource"] = sub
    if namespace:
        attrs["namespace"] = namespace
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}}
    review = client.AuthorizationV1Api(api_client).create_self_subject_access_review(body, _request_timeout=timeout)
    status = review.status
    return bool(status and status.allowed), str((status and status.reason) or "")


def describe(group: str, resource: str, sub: str, verb: str, namespace: str) -> str:
    res = resource + (f"/{sub}" if sub else "") + (f".{group}" if group else "")
    return f"{verb} {res}" + (f" in {namespace}" if namespace else " (cluster-wide)")


def check_rbac(ctx: Context) -> None:
    source = getattr(ctx.settings, "usage_source", "kubelet")
    usage = USAGE_PERMISSIONS.get(source, ())
    wanted = [(*p, ns) for ns in pilot_namespaces(ctx) for p in NAMESPACED_PERMISSIONS]
    wanted += [(*p, "") for p in CLUSTER_PERMISSIONS + usage]
    optional = {(*p, "") for p in usage}
    missing, missing_optional = [], []
    deadline = time.monotonic() + max(ctx.timeout * 4, 10.0)
    for group, resource, sub, verb, ns in wanted:
        left = deadline - time.monotonic()
        if left <= 0:
            ctx.add(FAIL, "rbac", f"the API took too long answering access reviews ({len(wanted)} asked)",
                    "check the API server's load and retry")
            return
        try:
            allowed, _reason = access_allowed(ctx.api_client, group, resource, sub, verb, ns, min(ctx.timeout, left))
        except Exception as exc:
            ctx.add(FAIL, "rbac", f"SelfSubjectAccessReview failed: {short(exc)}", RBAC_FIX)
            return
        if not allowed:
            (missing_optional if (group, resource, sub, verb, ns) in optional else missing).append(
                describe(group, resource, sub, verb, ns))
    if missing:
        ctx.add(FAIL, "rbac", f"the agent's credentials may not {'; '.join(missing)}", RBAC_FIX)
        return
    if missing_optional:
        how = ("through the API server's node proxy" if source == "proxy"
               else "from each node's kubelet, which asks the API server whether the agent may")
        ctx.add(WARN, "rbac", f"the agent's credentials may not {'; '.join(missing_optional)}: pilots' CPU "
                f"time is accounted as unknown (CE_K8S_USAGE_SOURCE = {source}: the kubelet's summary API is "
                f"read {how})", RBAC_FIX)
        return
    ctx.add(OK, "rbac", f"all {len(wanted)} permissions the agent uses are granted")


def check_spool(ctx: Context) -> None:
    spool = ctx.settings.spool
    fix = "set CE_K8S_SPOOL to the CE's SPOOL directory (condor_ce_config_val SPOOL)"
    if not os.path.isdir(spool):
        what = "is not a directory" if os.path.exists(spool) else "does not exist"
        ctx.add(FAIL, "spool", f"CE_K8S_SPOOL {spool} {what}: pilots' sandboxes and output cannot be found", fix)
        return
    ce_spool = (ctx.cfg.get("SPOOL") or "").rstrip("/")
    if ce_spool and os.path.isabs(ce_spool) and os.path.normpath(ce_spool) != os.path.normpath(spool):
        ctx.add(WARN, "spool", f"CE_K8S_SPOOL {spool} differs from the CE's SPOOL {ce_spool}", fix)
        return
    spool_from = getattr(ctx.settings, "origins", {}).get("spool")
    ctx.add(OK, "spool", f"{spool} exists" + (f" (from {spool_from})" if spool_from else ""))


# --------------------------------------------------------------------------------------------
# Running the checks


CHECKS: list[tuple[str, Callable[[Context], None], Callable[[Context], bool]]] = [
    ("config", check_config, lambda c: True),
    ("routes", check_routes, lambda c: c.cfg is not None),
    ("route-order", check_route_order, lambda c: c.cfg is not None),
    ("hook-keyword", check_keyword, lambda c: c.router is not None),
    ("hooks", check_hooks, lambda c: bool(c.keyword)),
    ("attrs-to-copy", check_attrs_to_copy, lambda c: bool(c.keyword)),
    ("agent", check_agent, lambda c: c.settings is not None),
    ("api", check_api, lambda c: c.settings is not None),
    ("rbac", check_rbac, lambda c: c.api_ok and c.router is not None),
    ("spool", check_spool, lambda c: c.settings is not None),
]


def diagnose(args: argparse.Namespace) -> list[Result]:
    """Run every check whose prerequisites hold; the others are reported as SKIP."""
    ctx = Context(args=args, timeout=args.timeout)
    try:
        for name, check, ready in CHECKS:
            if not ready(ctx):
                ctx.add(SKIP, name, "not checked: an earlier check failed")
                continue
            try:
                check(ctx)
            except Exception as exc:  # a bug or an unexpected environment must not hide the other checks
                ctx.add(FAIL, name, f"check crashed: {type(exc).__name__}: {short(exc)}", "report this as a bug")
    finally:
        if ctx.api_client is not None:
            ctx.api_client.close()
    return ctx.results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH",
                        help=f"condor_config file or directory (default: $CONDOR_CONFIG, else {CE_CONFIG})")
    parser.add_argument("--socket", metavar="PATH", help="the agent's socket (default: CE_K8S_SOCKET)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: CE_K8S_KUBECONFIG, else in-cluster)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds to wait for the agent and the API per call (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    """Print one line per check; exit 1 if any check failed."""
    if not args.timeout > 0:
        print("ce-k8s doctor: --timeout must be positive", file=sys.stderr)
        return 2
    results = diagnose(args)
    failed = sum(r.level == FAIL for r in results)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        for r in results:
            print(r)
        counts = {lv: sum(r.level == lv for r in results) for lv in (OK, WARN, FAIL, SKIP)}
        print("doctor: " + ", ".join(f"{n} {lv}" for lv, n in counts.items() if n))
    return 1 if failed else 0
