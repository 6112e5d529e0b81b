"""``ce-k8s routes check``: find route configuration mistakes before the router does.

The router's reaction to most mistakes is silent or costly: a route with an unknown keyword is not
loaded, a missing pre-route transform disables routing entirely, ``TARGET.x`` in a route's
REQUIREMENTS is UNDEFINED so the route never matches (docs/routes.md, "Pitfalls"), a catch-all
route placed first makes every later route dead, and a bad Kubernetes value only shows up as a held
pilot. Each finding is a ``Diagnostic`` (``file:line: severity: message``) with the severity the
real router gives it (docs/routes.md, "Severity: errors, warnings, notes"):

* error: the router refuses or mis-routes (unknown keyword, parse error, a listed route that does
  not exist, a Kubernetes route the pod builder rejects);
* warning: HTCondor logs an error and carries on, or the configuration is almost certainly not
  what was meant (``TARGET.`` in REQUIREMENTS, a route that can never be reached);
* note: nothing the router does differently (a route HTCondor-CE's packages define and the site
  does not enable, a metaknob that cannot change routing, a configuration command not run).

The configuration reader and the router model may already attach severities
(``CondorConfig.diagnostics``, ``RouterConfig.diagnostics``); where they only have the older
``warnings``/``errors`` string lists, ``config_diagnostics`` and ``router_diagnostics`` classify
those strings by the same rules.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import classad2

from ce_k8s.condor.diagnostics import Diagnostic, Severity
from ce_k8s.condor.routing import Route, RouterConfig
from ce_k8s.condor.transform import Transform, evaluate_in, parse_new_expr, parse_old_expr

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import CondorConfig, Origin

_ROUTE_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_ATTR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MACRO_REF = re.compile(r"(?<!\$)\$[A-Za-z_]*\([^()]*\)")
# HTCondor-CE's batch packages: each installs 02-ce-<batch>-defaults.conf (shipped) and a site copy
# 02-ce-<batch>.conf defining one route (docs/routes.md, "Severity"; tests/fixtures/stock_ce/).
CE_BATCH_ROUTES = {
    "bosco": "SSH_Endpoint", "condor": "Condor_Pool", "lsf": "LSF_Cluster", "pbs": "PBS_Cluster",
    "sge": "SGE_Cluster", "slurm": "Slurm_Cluster",
}
_CE_BATCH_FILE = re.compile(r"^02-ce-(?P<batch>[a-z]+)(?:-defaults)?\.conf$")
# Metaknob categories whose knobs are daemon roles, security or execute-side policy: none of them
# is read by the job router (param_info.in's metaknob tables), so not expanding one cannot change
# a routing verdict.
_INERT_METAKNOB_CATEGORIES = frozenset({"security", "role", "policy"})
_METAKNOB = re.compile(r"'use (?P<category>[A-Za-z_]+)\s*:")
_ROUTE_KNOB = "JOB_ROUTER_ROUTE_"
_ROUTE_IN_MESSAGE = re.compile(r"(?:^|\(|; )route (?P<name>[A-Za-z0-9_.-]+)\b")

# docs/internals.md "Kubernetes settings on the routed job": what routes may set.
K8S_ATTRIBUTES = frozenset(
    name.lower()
    for name in (
        "K8sNamespace", "K8sImage", "K8sImagePullPolicy", "K8sServiceAccount", "K8sAutomountToken",
        "K8sPriorityClass", "K8sRuntimeClass", "K8sNodeSelector", "K8sTolerations", "K8sAffinity",
        "K8sLabels", "K8sAnnotations", "K8sGpuResource", "K8sCpuLimit", "K8sEnv", "K8sVolumes",
        "K8sPodPatch", "K8sWholeNodeCpus", "K8sWholeNodeMemory", "K8sWholeNodeGpus", "K8sMaxAttempts",
        "K8sPendingTimeout",
    )
)
# Written by ce-k8s itself; a route setting them is overwritten or confuses the agent.
K8S_RUNTIME_ATTRIBUTES = frozenset(
    n.lower() for n in ("K8sPodName", "K8sAttempt", "K8sPodNamespace", "K8sPodPhase", "K8sPodReason", "K8sNodeName")
)

# The pilot a trial pod build uses: the smallest ad a CE schedd would route.
_TRIAL_JOB = """ClusterId = 1
ProcId = 0
JobUniverse = 5
JobStatus = 1
Owner = "pilot"
User = "pilot@ce.example.org"
GlobalJobId = "ce.example.org#1.0#1760000000"
QDate = 1760000000
Cmd = "glidein_startup.sh"
Arguments = "-v std"
RequestCpus = 1
RequestMemory = 2000
Out = "_condor_stdout"
Err = "_condor_stderr"
"""


def _at(origin: Origin | None, severity: Severity, message: str) -> Diagnostic:
    if origin is None:
        return Diagnostic("<config>", 0, severity, message)
    return Diagnostic(origin.file, origin.line, severity, message)


# --------------------------------------------------------------------------------------------
# Severities for the reader's and the router model's findings


def _config_severity(text: str) -> Severity:
    """The severity of one ``CondorConfig.warnings`` string (reader without ``diagnostics``)."""
    if "is a command" in text or "'include' of a command" in text:
        return Severity.NOTE         # the CE runs it; ce-k8s did not (--no-commands or no support)
    metaknob = _METAKNOB.search(text)
    if metaknob is not None and "(a metaknob)" in text:
        if metaknob.group("category").lower() in _INERT_METAKNOB_CATEGORIES:
            return Severity.NOTE
        return Severity.WARNING      # a FEATURE or unknown metaknob may set router knobs
    return Severity.WARNING


def config_diagnostics(cfg: CondorConfig) -> list[Diagnostic]:
    """What the configuration reader found, with severities."""
    found = getattr(cfg, "diagnostics", None)
    if found is not None:
        return list(found)
    return [Diagnostic.from_text(text, _config_severity(text)) for text in getattr(cfg, "warnings", [])]


def _router_warning_severity(text: str) -> Severity:
    """The severity of one ``RouterConfig.warnings`` string (router model without ``diagnostics``)."""
    if "JOB_ROUTER_ROUTE_NAMES lists" in text and "is not defined" in text:
        return Severity.ERROR        # a listed route that does not exist (JobRouter::config)
    return Severity.WARNING


def shipped_batch_route(route: Route) -> str | None:
    """The HTCondor-CE batch package (``slurm``, ``condor`` ...) that defines ``route``, or None.

    A route counts as shipped when it has the name the package gives it and its definition comes
    from that package's file, ``02-ce-<batch>-defaults.conf`` or the site copy ``02-ce-<batch>.conf``
    (rpm/htcondor-ce.spec installs both). Each of those files also sets JOB_ROUTER_ROUTE_NAMES to
    its own route outright, so on a CE that lists its own routes the shipped ones are defined and
    not enabled, which is how HTCondor-CE is meant to be used and not a mistake.
    """
    return _shipped_batch(route.name, route.origin.file if route.origin is not None else None)


def _shipped_batch(name: str, file: str | None) -> str | None:
    m = _CE_BATCH_FILE.match(os.path.basename(file)) if file else None
    if m is None:
        return None
    batch = m.group("batch")
    return batch if CE_BATCH_ROUTES.get(batch, "").lower() == name.lower() else None


def _unlisted_routes(router: RouterConfig) -> set[str]:
    """Lower-case names of the routes defined (``JOB_ROUTER_ROUTE_<name>``) but not listed."""
    listed = {name.lower() for name in router.route_names}
    names = router.config.names() if router.config is not None else []
    return {knob[len(_ROUTE_KNOB):].lower() for knob in names
            if knob.upper().startswith(_ROUTE_KNOB) and knob.upper() != "JOB_ROUTER_ROUTE_NAMES"} - listed


def _not_enabled(router: RouterConfig, diag: Diagnostic) -> Diagnostic:
    """Findings about routes that are not enabled, at the severity the router gives them: none.

    The router loads only the routes JOB_ROUTER_ROUTE_NAMES lists (JobRouter::config), so a
    problem inside a route that is not listed cannot change what it does (a note), and a route the
    CE's own packages define but the site does not list is a note too. A site's own unlisted route
    stays a warning: a route that is never tried is usually a forgotten entry in the list.
    """
    m = _ROUTE_IN_MESSAGE.search(diag.message)
    if m is None:
        return diag
    name = m.group("name")
    low = name.lower()
    if "is defined but not listed in JOB_ROUTER_ROUTE_NAMES" in diag.message:
        origin = router.config.origin(_ROUTE_KNOB + name) if router.config is not None else None
        batch = _shipped_batch(name, origin.file if origin is not None else diag.file)
        if batch is None:
            return diag
        return Diagnostic(diag.file, diag.line, Severity.NOTE,
                          f"route {name} (HTCondor-CE's htcondor-ce-{batch} package) is defined but not "
                          "listed in JOB_ROUTER_ROUTE_NAMES, so it is not enabled; list it there to route jobs "
                          "to it")
    if low not in _unlisted_routes(router) or diag.severity == Severity.NOTE:
        return diag
    return Diagnostic(diag.file, diag.line, Severity.NOTE,
                      f"{diag.message} (route {name} is not in JOB_ROUTER_ROUTE_NAMES, so the router "
                      "never loads it)")


def _listed_but_missing(diag: Diagnostic) -> Diagnostic:
    """A route JOB_ROUTER_ROUTE_NAMES lists and nothing defines is an error, whoever reported it.

    The router logs "route '<name>' from JOB_ROUTER_ROUTE_NAMES not found in the routing table"
    and routes with the others (JobRouter.cpp, ``JobRouter::config``), so the jobs meant for that
    route go to a later one or stay idle: a mis-route, not a detail.
    """
    if diag.severity == Severity.ERROR or _router_warning_severity(diag.message) != Severity.ERROR:
        return diag
    return Diagnostic(diag.file, diag.line, Severity.ERROR, diag.message)


def router_diagnostics(router: RouterConfig) -> list[Diagnostic]:
    """What the router model found while loading the configuration, with severities."""
    found = getattr(router, "diagnostics", None)
    if found is None:
        found = [Diagnostic.from_text(text, Severity.ERROR) for text in router.errors]
        found += [Diagnostic.from_text(text, Severity.WARNING) for text in router.warnings]
    return [_not_enabled(router, _listed_but_missing(diag)) for diag in found]


def load_diagnostics(cfg: CondorConfig, router: RouterConfig) -> list[Diagnostic]:
    """The reader's and the router model's findings: what ``route`` reports about the configuration."""
    return sorted(set(config_diagnostics(cfg) + router_diagnostics(router)))


# --------------------------------------------------------------------------------------------
# ce-k8s's own checks


def _without_macros(text: str) -> str:
    """Replace ``$(...)`` references by ``0`` so the expression's own syntax can be checked."""
    previous = None
    while previous != text:
        previous = text
        text = _MACRO_REF.sub("0", text)
    return text


def _statement_problems(transform: Transform, label: str) -> list[Diagnostic]:
    """Expressions that can never parse and names that can never be valid, line by line.

    The router logs such a statement and carries on with the rest of the transform
    (xform_utils.cpp, ParseRulesCallback: a SET/EVALSET/EVALMACRO expression that does not parse, a
    bad regular expression, an invalid new name), so these are warnings: the job is routed without
    that statement's effect. A ``K8s*`` name ce-k8s does not know is ignored by the pod builder (a
    warning, usually a typo); one ce-k8s writes itself is an error, since the agent's value would be
    replaced. EVALSET and EVALMACRO are parsed in new ClassAd syntax, SET and DEFAULT in old syntax,
    as the router parses them.
    """
    error, warning = Severity.WARNING, Severity.WARNING
    found: list[Diagnostic] = []
    for line in transform.lines:
        if line.kind != "stmt":
            continue
        where = transform.where(line.lineno)
        word = line.keyword
        parts = line.value.split(None, 1)
        if word in ("COPY", "RENAME", "DELETE") and line.value.startswith("/"):
            end = line.value.find("/", 1)
            try:
                re.compile(line.value[1:end] if end > 0 else line.value[1:])
            except re.error as exc:
                found.append(_at(where, error, f"{label}: {word}: bad regular expression: {exc}"))
            if end < 0:
                found.append(_at(where, error, f"{label}: {word}: regular expression has no closing '/'"))
            continue
        attr = parts[0].rstrip(",=")
        rest = parts[1].strip() if len(parts) > 1 else ""
        if rest[:1] in ("=", ",") and (len(rest) == 1 or rest[1].isspace()):
            rest = rest[1:].strip()
        if "$" not in attr and not _ATTR_NAME.match(attr) and word != "EVALMACRO":
            found.append(_at(where, error, f"{label}: {word}: {attr!r} is not a valid attribute name"))
        if word in ("SET", "DEFAULT", "EVALSET", "EVALMACRO"):
            if not rest:
                found.append(_at(where, error, f"{label}: {word} {attr} has no value"))
            elif (parse_new_expr if word in ("EVALSET", "EVALMACRO") else parse_old_expr)(
                    _without_macros(rest)) is None:
                found.append(_at(where, error, f"{label}: {word} {attr}: unparsable expression: {rest}"))
        if word in ("COPY", "RENAME"):
            if "$" not in rest and not _ATTR_NAME.match(rest):
                found.append(_at(where, error, f"{label}: {word} {attr}: new name {rest!r} is not valid"))
        if word in ("SET", "DEFAULT", "EVALSET") and attr.lower().startswith("k8s"):
            low = attr.lower()
            if low in K8S_RUNTIME_ATTRIBUTES:
                found.append(_at(where, Severity.ERROR,
                                 f"{label}: {attr} is written by ce-k8s itself; routes must not set it"))
            elif low not in K8S_ATTRIBUTES:
                found.append(_at(where, warning, f"{label}: {attr} is not a Kubernetes attribute ce-k8s knows "
                                 "(see docs/routes.md, 'Kubernetes attributes')"))
    return found


def _always_true(route: Route, has_source_constraint: bool) -> str | None:
    """Why a route provably takes every job, or None. Conservative: constants only."""
    if route.requirements_expr is None:
        return "no REQUIREMENTS" if has_source_constraint else None
    empty = classad2.ClassAd()
    try:
        refs = empty.externalRefs(route.requirements_expr) + empty.internalRefs(route.requirements_expr)
    except (ValueError, TypeError, classad2.ClassAdException):
        return None
    if any(refs):  # classad2 reports "" when there are none
        return None
    value = evaluate_in(empty, route.requirements_expr)
    if value is True:
        return f"REQUIREMENTS {route.requirements} is always true"
    return None


def _cap(diagnostics: list[Diagnostic], severity: Severity, why: str) -> list[Diagnostic]:
    return [d if d.severity <= severity else Diagnostic(d.file, d.line, severity, f"{d.message} ({why})")
            for d in diagnostics]


def _route_problems(router: RouterConfig) -> list[Diagnostic]:
    found: list[Diagnostic] = []
    catch_all: tuple[Route, str] | None = None
    not_enabled = {id(route) for route in router.disabled}
    for route in router.routes + router.disabled:
        own: list[Diagnostic] = []
        if not _ROUTE_NAME.match(route.name):
            own.append(_at(route.origin, Severity.ERROR,
                           f"route name {route.name!r} may contain only letters, digits and '_'"))
        if route.requirements and re.search(r"\btarget\s*\.", route.requirements, re.IGNORECASE):
            own.append(_at(route.requirements_origin or route.origin, Severity.WARNING,
                           f"route {route.name}: REQUIREMENTS uses TARGET., which is UNDEFINED when routes are "
                           "matched (only the job is in scope); use MY. or a plain name"))
        own += _statement_problems(route, f"route {route.name}")
        if id(route) in not_enabled:
            own = _cap(own, Severity.NOTE, f"route {route.name} is not enabled, so the router never loads it")
        found += own
    for route in router.routes:
        if catch_all is not None:
            earlier, why = catch_all
            found.append(_at(route.origin, Severity.WARNING, f"route {route.name} can never match: the earlier "
                             f"route {earlier.name} takes every job ({why})"))
            continue
        why = _always_true(route, router.source_constraint is not None)
        if why is not None:
            catch_all = (route, why)
    for transform in router.pre_transforms + router.post_transforms:
        found += _statement_problems(transform, f"transform {transform.name}")
    return found


def _pod_problems(router: RouterConfig, cfg: CondorConfig) -> list[Diagnostic]:
    """Route a minimal pilot through every route, as ``ce-k8s route`` does (translate hook logic,
    transforms, pod builder), and report what the pod builder rejects: the pilot would be held."""
    from ce_k8s.condor import wire
    from ce_k8s.condor.trial import pod_tools as find_pod_tools
    from ce_k8s.condor.trial import route_one, translator

    pod_tools = find_pod_tools()
    if pod_tools is None:
        return []
    try:
        settings = pod_tools[2].from_config(cfg)
    except ValueError as exc:
        return [Diagnostic("<config>", 0, Severity.ERROR, f"CE_K8S_* settings are invalid: {exc}")]
    translate = translator()
    found: list[Diagnostic] = []
    trial = wire.parse_old_ads(_TRIAL_JOB, "<trial pilot>")[0]
    for route in router.routes:
        result = route_one(trial, router, cfg, translate, pod_tools, settings, force_route=route)
        if result.pod_error is not None:
            code, message = result.pod_error
            found.append(_at(route.origin, Severity.ERROR,
                             f"route {route.name}: the pod builder rejects it ({code}): {message}"))
        elif result.failed:
            found.append(_at(route.origin, Severity.ERROR, f"route {route.name}: a minimal pilot fails routing: "
                             + "; ".join(result.errors)))
    return found


def check_config(cfg: CondorConfig, router: RouterConfig | None = None) -> list[Diagnostic]:
    """Every finding in a configuration, sorted by file and line, duplicates removed."""
    router = router if router is not None else RouterConfig.from_config(cfg)
    found = load_diagnostics(cfg, router) + _route_problems(router)
    if router.enabled:
        found += _pod_problems(router, cfg)
    return sorted(set(found))
