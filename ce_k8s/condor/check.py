"""``ce-k8s routes check``: find route configuration mistakes before the router does.

The router's reaction to most mistakes is silent or costly: a route with an unknown keyword is not
loaded, a missing pre-route transform disables routing entirely, ``TARGET.x`` in a route's
REQUIREMENTS is UNDEFINED so the route never matches (§4.4), a catch-all route placed first makes
every later route dead, and a bad Kubernetes value only shows up as a held pilot. Each problem is
reported as ``file:line: message`` so an editor can jump to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import classad2

from ce_k8s.condor.routing import Route, RouterConfig
from ce_k8s.condor.transform import Transform, evaluate_in, parse_old_expr

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import CondorConfig, Origin

_ROUTE_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_ATTR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MACRO_REF = re.compile(r"(?<!\$)\$[A-Za-z_]*\([^()]*\)")
_PROBLEM = re.compile(r"^(?P<file>.*?):(?P<line>\d+): (?P<message>.*)$", re.DOTALL)

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


@dataclass(frozen=True, order=True)
class Problem:
    """One finding; ``str()`` is the ``file:line: message`` line the CLI prints."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"

    @classmethod
    def from_text(cls, text: str) -> Problem:
        m = _PROBLEM.match(text)
        if m is None:
            return cls("<config>", 0, text)
        return cls(m.group("file"), int(m.group("line")), m.group("message"))


def _at(origin: Origin | None, message: str) -> Problem:
    if origin is None:
        return Problem("<config>", 0, message)
    return Problem(origin.file, origin.line, message)


def _without_macros(text: str) -> str:
    """Replace ``$(...)`` references by ``0`` so the expression's own syntax can be checked."""
    previous = None
    while previous != text:
        previous = text
        text = _MACRO_REF.sub("0", text)
    return text


def _statement_problems(transform: Transform, label: str) -> list[Problem]:
    """Expressions that can never parse and names that can never be valid, line by line."""
    found: list[Problem] = []
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
                found.append(_at(where, f"{label}: {word}: bad regular expression: {exc}"))
            if end < 0:
                found.append(_at(where, f"{label}: {word}: regular expression has no closing '/'"))
            continue
        attr = parts[0].rstrip(",=")
        rest = parts[1].strip() if len(parts) > 1 else ""
        if rest[:1] in ("=", ",") and (len(rest) == 1 or rest[1].isspace()):
            rest = rest[1:].strip()
        if "$" not in attr and not _ATTR_NAME.match(attr) and word != "EVALMACRO":
            found.append(_at(where, f"{label}: {word}: {attr!r} is not a valid attribute name"))
        if word in ("SET", "DEFAULT", "EVALSET", "EVALMACRO"):
            if not rest:
                found.append(_at(where, f"{label}: {word} {attr} has no value"))
            elif parse_old_expr(_without_macros(rest)) is None:
                found.append(_at(where, f"{label}: {word} {attr}: unparsable expression: {rest}"))
        if word in ("COPY", "RENAME"):
            if "$" not in rest and not _ATTR_NAME.match(rest):
                found.append(_at(where, f"{label}: {word} {attr}: new name {rest!r} is not valid"))
        if word in ("SET", "DEFAULT", "EVALSET") and attr.lower().startswith("k8s"):
            low = attr.lower()
            if low in K8S_RUNTIME_ATTRIBUTES:
                found.append(_at(where, f"{label}: {attr} is written by ce-k8s itself; routes must not set it"))
            elif low not in K8S_ATTRIBUTES:
                found.append(_at(where, f"{label}: {attr} is not a Kubernetes attribute ce-k8s knows "
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


def _route_problems(router: RouterConfig) -> list[Problem]:
    found: list[Problem] = []
    catch_all: tuple[Route, str] | None = None
    for route in router.routes + router.disabled:
        if not _ROUTE_NAME.match(route.name):
            found.append(_at(route.origin, f"route name {route.name!r} may contain only letters, digits and '_'"))
        if route.requirements and re.search(r"\btarget\s*\.", route.requirements, re.IGNORECASE):
            found.append(_at(route.requirements_origin or route.origin,
                             f"route {route.name}: REQUIREMENTS uses TARGET., which is UNDEFINED when routes are "
                             "matched (only the job is in scope, §4.4); use MY. or a plain name"))
        found += _statement_problems(route, f"route {route.name}")
    for route in router.routes:
        if catch_all is not None:
            earlier, why = catch_all
            found.append(_at(route.origin, f"route {route.name} can never match: the earlier route "
                             f"{earlier.name} takes every job ({why})"))
            continue
        why = _always_true(route, router.source_constraint is not None)
        if why is not None:
            catch_all = (route, why)
    for transform in router.pre_transforms + router.post_transforms:
        found += _statement_problems(transform, f"transform {transform.name}")
    return found


def _pod_problems(router: RouterConfig, cfg: CondorConfig) -> list[Problem]:
    """Route a minimal pilot through every route, as ``ce-k8s route`` does (translate hook logic,
    transforms, pod builder), and report what the pod builder rejects."""
    from ce_k8s.condor import cli_route, wire

    pod_tools = cli_route._pod_tools()
    if pod_tools is None:
        return []
    try:
        settings = pod_tools[2].from_config(cfg)
    except ValueError as exc:
        return [Problem("<config>", 0, f"CE_K8S_* settings are invalid: {exc}")]
    translate = cli_route._translator()
    found: list[Problem] = []
    trial = wire.parse_old_ads(_TRIAL_JOB, "<trial pilot>")[0]
    for route in router.routes:
        result = cli_route.route_one(trial, router, cfg, translate, pod_tools, settings, force_route=route)
        if result.pod_error is not None:
            code, message = result.pod_error
            found.append(_at(route.origin, f"route {route.name}: the pod builder rejects it ({code}): {message}"))
        elif result.failed:
            found.append(_at(route.origin, f"route {route.name}: a minimal pilot fails routing: "
                             + "; ".join(result.errors)))
    return found


def check_config(cfg: CondorConfig) -> list[Problem]:
    """Every problem found in a configuration, sorted by file and line, duplicates removed."""
    router = RouterConfig.from_config(cfg)
    found = [Problem.from_text(text) for text in router.errors + router.warnings]
    found += [Problem.from_text(text) for text in getattr(cfg, "warnings", [])]
    found += _route_problems(router)
    if router.enabled:
        found += _pod_problems(router, cfg)
    return sorted(set(found))
