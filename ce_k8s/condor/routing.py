"""The route table and the routing pipeline, as condor_job_router runs them (docs/hook-protocol.md).

``RouterConfig.from_config`` reads a CE's configuration the way ``JobRouter::config`` and
``JobRoute::ParseNext`` do: ``JOB_ROUTER_ROUTE_NAMES`` order, route bodies read unexpanded,
pre/post-route transforms that disable routing when missing or invalid, per-route macros
(``MaxJobs``, ``GridResource``…) read at load time (docs/hook-protocol.md §4.1). ``choose_route``
and ``route_job`` are the selection (docs/hook-protocol.md §4.4) and the post-translate pipeline
(docs/hook-protocol.md §2.2): VanillaToGrid, pre-route, route,
post-route transforms with one macro set, then the router's own stamps.

This module is the single place where "which route takes this pilot, and what comes out" is
decided; ``ce-k8s route``, ``routes check`` and the JobRouter emulator all call it.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import classad2

from ce_k8s.condor import usermaps, wire
from ce_k8s.condor.diagnostics import Diagnostic, Severity
from ce_k8s.condor.transform import (
    MacroError,
    MacroSet,
    Transform,
    TransformError,
    _boolean_equiv,
    evaluate_in,
    expand_macros,
    is_error_value,
    is_number,
    is_undefined_value,
    parse_old_expr,
    value_to_macro_text,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import CondorConfig, Origin

log = logging.getLogger(__name__)

GRID_UNIVERSE = 9
VANILLA_UNIVERSE = 5
HOOKS = ("TRANSLATE_JOB", "UPDATE_JOB_INFO", "JOB_FINALIZE", "JOB_CLEANUP")
_ROUTE_PREFIX = "JOB_ROUTER_ROUTE_"
_OLD_SYNTAX_KNOBS = ("JOB_ROUTER_DEFAULTS", "JOB_ROUTER_ENTRIES", "JOB_ROUTER_ENTRIES_FILE", "JOB_ROUTER_ENTRIES_CMD")

# VanillaToGrid.cpp: attributes the routed copy must not inherit from the source job.
VANILLA_TO_GRID_DELETE: tuple[str, ...] = (
    "ClusterId", "ProcId", "BufferBlockSize", "BufferSize", "CondorPlatform", "CondorVersion",
    "CoreSize", "GlobalJobId", "User", "OsUser", "QDate", "RemoteWallClockTime",
    "LastRemoteWallClockTime", "ServerTime", "AutoClusterId", "AutoClusterAttrs",
    "TotalSubmitProcs", "StageInFinish", "StageInStart", "UserLog", "UserLogUseXML",
    "DAGManNodesLog", "DAGManNodesMask", "TimerRemove", "SUBMIT_Iwd",
)
# ...and the counters it resets, with the type the router writes.
VANILLA_TO_GRID_RESET: tuple[tuple[str, object], ...] = (
    ("JobStatus", 1), ("RemoteUserCpu", 0.0), ("RemoteSysCpu", 0.0), ("ExitStatus", 0),
    ("CompletionDate", 0), ("NumCkpts", 0), ("NumRestarts", 0), ("NumSystemHolds", 0),
    ("CommittedTime", 0), ("CommittedSlotTime", 0), ("CumulativeSlotTime", 0),
    ("TotalSuspensions", 0), ("LastSuspensionTime", 0), ("CumulativeSuspensionTime", 0),
    ("CommittedSuspensionTime", 0), ("ExitBySignal", False),
)
# submit_job.cpp: secure attributes only the schedd may set, dropped when the routed job is submitted.
SECURE_ATTRS: tuple[str, ...] = (
    "x509UserProxySubject", "x509UserProxyExpiration", "x509UserProxyEmail", "x509UserProxyVOName",
    "x509UserProxyFirstFQAN", "x509UserProxyFQAN", "AuthTokenSubject", "AuthTokenIssuer",
    "AuthTokenGroups", "AuthTokenScopes", "AuthTokenId",
)


def _split_names(text: str | None) -> list[str]:
    return [n for n in re.split(r"[\s,]+", text or "") if n]


def copy_ad(ad: classad2.ClassAd) -> classad2.ClassAd:
    """A deep copy: transforms mutate their ad, the source job must stay as it was."""
    out = classad2.ClassAd()
    for name in ad.keys():
        out[name] = ad.lookup(name)
    return out


def job_id(job: classad2.ClassAd) -> str:
    """``ClusterId.ProcId`` as the router keys jobs (``?`` for a missing part)."""
    parts = []
    for name in ("ClusterId", "ProcId"):
        value = job.eval(name) if name in job else None
        parts.append(str(value) if is_number(value) and isinstance(value, int) else "?")
    return ".".join(parts)


def _remap_find(remaps: str, filename: str) -> str | None:
    """filename_remap_find: ``src=dst;src2=dst2`` → dst for src == filename."""
    for entry in remaps.split(";"):
        src, sep, dst = entry.partition("=")
        if sep and src.strip() == filename:
            return dst.strip()
    return None


def vanilla_to_grid(ad: classad2.ClassAd, target_universe: int, grid_resource: str | None,
                    sandboxed: bool = False) -> None:
    """VanillaToGrid::vanillaToGrid (docs/hook-protocol.md §2.2); raises ValueError where the real daemon aborts."""
    if "JobUniverse" not in ad:
        raise ValueError("VanillaToGrid: job ad lacks universe (the real condor_job_router daemon EXCEPTs here)")
    for name in VANILLA_TO_GRID_DELETE:
        if name in ad:
            del ad[name]
    for name, value in VANILLA_TO_GRID_RESET:
        ad[name] = value
    old_universe = ad.lookup("JobUniverse")
    ad["JobUniverse"] = int(target_universe)
    ad["Remote_JobUniverse"] = old_universe
    if target_universe != GRID_UNIVERSE:
        return
    if "CurrentHosts" in ad:
        del ad["CurrentHosts"]
    # The route's GridResource always wins, even an empty one (it overwrites the hook's value).
    ad["GridResource"] = grid_resource or ""
    remaps = ad.eval("TransferOutputRemaps") if "TransferOutputRemaps" in ad else None
    if sandboxed or not isinstance(remaps, str) or not remaps:
        return
    del ad["TransferOutputRemaps"]
    for attr in ("Out", "Err"):
        current = ad.eval(attr) if attr in ad else None
        if isinstance(current, str):
            mapped = _remap_find(remaps, current)
            if mapped is not None:
                ad[attr] = mapped


def submit_edits(ad: classad2.ClassAd) -> None:
    """What submit_job() does to the routed ad on its way into the schedd (docs/hook-protocol.md §2.2 step 5).

    The ids, ``QDate`` and ``EnteredCurrentStatus`` are the schedd's to assign and are left out.
    """
    for name in SECURE_ATTRS:
        if name in ad:
            del ad[name]
    ad["LeaveJobInQueue"] = parse_old_expr("JobStatus == 4")


# JobRouter.cpp GracefullyRemoveJob → CleanupJob/FinishCleanupJob: nothing is submitted, the
# cleanup hook runs, the source job is yielded back (idle) and the route counts a failure.
ABANDONED = ("the router submits nothing (GracefullyRemoveJob): the cleanup hook runs, the job is handed back idle "
             "and tried again at a later poll, and the route counts a failure")


def diagnostic_text(diag: Diagnostic) -> str:
    """The legacy ``file:line: message`` form (``<config>: message`` when there is no place)."""
    return f"{diag.file}:{diag.line}: {diag.message}" if diag.line else f"{diag.file}: {diag.message}"


@dataclass
class RoutedJob:
    """The routed ad, what the router logged on the way, and whether it gave up on the job.

    ``failed`` is True only where the real router removes the job (GracefullyRemoveJob): a
    transform that fails, or VanillaToGrid on an ad without a universe. What it only logs
    (an EVALMACRO that does not evaluate, a failing ``$INT()``) is a WARNING diagnostic.
    """

    ad: classad2.ClassAd
    diagnostics: list[Diagnostic] = field(default_factory=list)
    failed: bool = False
    # EditJobInPlace was true for the job: ``ad`` is the source job as the router edits it in place
    # (FinishSubmitJob, push_classad_diff); no routed job is submitted
    in_place: bool = False

    @property
    def errors(self) -> list[str]:
        """Every diagnostic as ``file:line: message`` text (the view older callers read)."""
        return [diagnostic_text(d) for d in self.diagnostics]

    def add(self, severity: Severity, message: str, where: Origin | None = None) -> None:
        if where is None:
            self.diagnostics.append(Diagnostic("<job>", 0, severity, message))
        else:
            self.diagnostics.append(Diagnostic(where.file, where.line, severity, message))


@dataclass
class RouteVerdict:
    """Why a route did (not) take a job: ``result`` is True, False, or None (undefined/error)."""

    route: str
    result: bool | None
    reason: str


class Route(Transform):
    """A ``JOB_ROUTER_ROUTE_<name>`` transform plus the per-route macros read at load (docs/hook-protocol.md §4.1)."""

    def __init__(self, name: str, origin: Origin | None = None) -> None:
        super().__init__(name, origin)
        self.target_universe = GRID_UNIVERSE
        self.grid_resource = ""
        self.max_jobs = 100
        self.max_idle_jobs = 50
        self.failure_rate_threshold = 0.03
        self.job_failure_test: str | None = None
        self.job_should_be_sandboxed: str | None = None
        self.edit_job_in_place_expr: str | None = None
        self.use_shared_x509_user_proxy: str | None = None
        self.shared_x509_user_proxy: str | None = None
        self.send_idtokens: str | None = None
        self.load_warnings: list[str] = []
        self.validation: list[Diagnostic] = []

    @property
    def edit_job_in_place(self) -> bool:
        """True when EditJobInPlace is the literal true (job-dependent values: ``edits_in_place``)."""
        return self.edit_job_in_place_expr is not None and self.edit_job_in_place_expr.strip().lower() == "true"

    @classmethod
    def load(cls, name: str, text: str, origin: Origin | None, config: CondorConfig | None,
             default_max_jobs: int = 100, default_max_idle: int = 50,
             line_numbers: list[int] | None = None) -> Route:
        """Parse the body and read the per-route macros the router reads at load time."""
        route = cls(name, origin)
        route.line_numbers = line_numbers
        route._parse_into(text)  # raises on an unparsable REQUIREMENTS (MacroStreamXFormSource::open)
        if route.statement_name and route.statement_name.lower() != name.lower():
            route.load_warnings.append(
                f'The Name specified in JOB_ROUTER_ROUTE_{name} was "{route.statement_name}". '
                f"using {name} instead."
            )
        # JobRoute::ParseNext: ValidateXForm runs the body with no job (raises when the route is not
        # valid) and leaves the route's macros, as its if/else branches set them, in a fresh macro set.
        macros = MacroSet(config)
        route.validation = route.validate(macros)
        route._read_macros(macros, default_max_jobs, default_max_idle)
        return route

    def _read_macros(self, macros: MacroSet, default_max_jobs: int, default_max_idle: int) -> None:
        """``mset.local_param``: the validated macro set first, then the configuration (also_in_config)."""

        def text(name: str) -> str | None:
            raw = macros.lookup(name)
            if raw is None:
                return None
            try:
                return expand_macros(raw, macros).strip()
            except MacroError as exc:
                self.load_warnings.append(f"{name}: {exc}")
                return None

        def number(name: str) -> float | None:
            value = text(name)
            if value is None:
                return None
            try:
                return float(int(value))
            except ValueError:
                pass
            try:
                return float(value)
            except ValueError:
                pass
            expr = parse_old_expr(value)
            result = evaluate_in(classad2.ClassAd(), expr) if expr is not None else None
            if is_number(result):
                return float(result)
            self.load_warnings.append(f"{name} = {value} is not a number; the default applies")
            return None

        max_jobs = number("MaxJobs")
        self.max_jobs = int(max_jobs) if max_jobs is not None else default_max_jobs
        max_idle = number("MaxIdleJobs")
        self.max_idle_jobs = int(max_idle) if max_idle is not None else default_max_idle
        threshold = number("FailureRateThreshold")
        self.failure_rate_threshold = threshold if threshold is not None else 0.03
        self.job_failure_test = text("JobFailureTest")
        self.job_should_be_sandboxed = text("JobShouldBeSandboxed")
        self.edit_job_in_place_expr = text("EditJobInPlace")
        self.use_shared_x509_user_proxy = text("UseSharedX509UserProxy")
        self.shared_x509_user_proxy = text("SharedX509UserProxy")
        if macros.lookup("SendIDTokens") is not None:
            self.send_idtokens = text("SendIDTokens") or '""'
        if self.universe:
            self.target_universe = self.universe
        else:
            universe = number("TargetUniverse")
            self.target_universe = int(universe) if universe else GRID_UNIVERSE
        if self.target_universe == GRID_UNIVERSE:
            resource = text("GridResource")
            if resource is not None:
                if len(resource) >= 2 and resource.startswith('"') and resource.endswith('"'):
                    resource = resource[1:-1]
                self.grid_resource = resource

    # ---- per-job evaluation of the route's boolean macros (against the source ad) -------

    def _job_bool(self, expr_text: str | None, job: classad2.ClassAd) -> bool:
        """Boolean route macros are evaluated against the source ad; UNDEFINED counts as false."""
        if not expr_text:
            return False
        expr = parse_old_expr(expr_text)
        if expr is None:
            return False
        return _boolean_equiv(evaluate_in(job, expr)) is True

    def edits_in_place(self, job: classad2.ClassAd) -> bool:
        return self._job_bool(self.edit_job_in_place_expr, job)

    def sandboxed(self, job: classad2.ClassAd) -> bool:
        return self._job_bool(self.job_should_be_sandboxed, job)

    def uses_shared_proxy(self, job: classad2.ClassAd) -> bool:
        return self._job_bool(self.use_shared_x509_user_proxy, job)

    def job_failed(self, source: classad2.ClassAd) -> bool:
        """JobFailureTest against the source ad at finalize: true counts as a route failure."""
        return self._job_bool(self.job_failure_test, source)

    # ---- matching ---------------------------------------------------------------------

    def evaluate_requirements(self, job: classad2.ClassAd) -> object:
        if self.requirements_expr is None:
            return True
        return evaluate_in(job, self.requirements_expr)

    def matches(self, job: classad2.ClassAd) -> bool:
        """MY-only evaluation (docs/hook-protocol.md §4.4): ``TARGET.x`` is UNDEFINED, so such a route never matches."""
        return _boolean_equiv(self.evaluate_requirements(job)) is True

    def route_info_line(self) -> str:
        return wire.route_info_line(self.name, self.target_universe, self.grid_resource or None)


def _always(_route: Route) -> bool:
    return True


class RouterConfig:
    """Everything the router reads from configuration, and the decisions made from it."""

    def __init__(self, config: CondorConfig | None = None) -> None:
        self.config = config
        self.router_name = "jobrouter"
        self.routes: list[Route] = []
        self.disabled: list[Route] = []
        self.pre_transforms: list[Transform] = []
        self.post_transforms: list[Transform] = []
        self.source_constraint: str | None = None
        self.source_constraint_expr: classad2.ExprTree | None = None
        self.round_robin = False
        self.polling_period = 10
        self.default_max_jobs = 100
        self.default_max_idle_jobs = 50
        self.max_jobs = -1
        self.hook_keyword: str | None = None
        self.enabled = True
        self.diagnostics: list[Diagnostic] = []
        self.user_maps: list[usermaps.UserMap] = []
        self.route_names: list[str] = []
        self.undefined_routes: list[str] = []
        self._rr_counter = 0

    # ---- findings ------------------------------------------------------------------------

    @property
    def errors(self) -> list[str]:
        """ERROR diagnostics as ``file:line: message`` text (the view older callers read)."""
        return [diagnostic_text(d) for d in self.diagnostics if d.severity == Severity.ERROR]

    @property
    def warnings(self) -> list[str]:
        """WARNING and NOTE diagnostics as ``file:line: message`` text."""
        return [diagnostic_text(d) for d in self.diagnostics if d.severity != Severity.ERROR]

    # ---- loading -------------------------------------------------------------------------

    def _problem(self, severity: Severity, knob: str | None, message: str, origin: Origin | None = None) -> None:
        if origin is None and knob and self.config is not None:
            origin = self.config.origin(knob)
        if origin is None:
            self.diagnostics.append(Diagnostic("<config>", 0, severity, message))
        else:
            self.diagnostics.append(Diagnostic(origin.file, origin.line, severity, message))

    def _add(self, found: list[Diagnostic]) -> None:
        self.diagnostics.extend(found)

    def _transform_error(self, exc: TransformError, severity: Severity, suffix: str) -> None:
        origin = exc.origin
        message = f"{exc.message} ({suffix})"
        if origin is None:
            self.diagnostics.append(Diagnostic("<config>", 0, severity, message))
        else:
            self.diagnostics.append(Diagnostic(origin.file, origin.line, severity, message))

    @classmethod
    def from_config(cls, cfg: CondorConfig) -> RouterConfig:
        self = cls(cfg)
        self.router_name = (cfg.get("JOB_ROUTER_NAME") or "jobrouter").strip()
        if not self.router_name:
            self._problem(Severity.ERROR, "JOB_ROUTER_NAME", "JOB_ROUTER_NAME must not be empty")
        self.round_robin = cfg.get_bool("JOB_ROUTER_ROUND_ROBIN_SELECTION", False)
        self.polling_period = cfg.get_int("JOB_ROUTER_POLLING_PERIOD", 10)
        self.default_max_jobs = cfg.get_int("JOB_ROUTER_DEFAULT_MAX_JOBS_PER_ROUTE", 100)
        self.default_max_idle_jobs = cfg.get_int("JOB_ROUTER_DEFAULT_MAX_IDLE_JOBS_PER_ROUTE", 50)
        self.max_jobs = cfg.get_int("JOB_ROUTER_MAX_JOBS", -1)
        keyword = (cfg.get("JOB_ROUTER_HOOK_KEYWORD") or "").strip()
        self.hook_keyword = keyword or None

        constraint = cfg.get("JOB_ROUTER_SOURCE_JOB_CONSTRAINT")
        if constraint is not None and constraint.strip():
            self.source_constraint = constraint.strip()
            self.source_constraint_expr = parse_old_expr(self.source_constraint)
            if self.source_constraint_expr is None:
                self._problem(Severity.ERROR, "JOB_ROUTER_SOURCE_JOB_CONSTRAINT",
                              f"JOB_ROUTER_SOURCE_JOB_CONSTRAINT does not parse: {self.source_constraint}")

        for knob in _OLD_SYNTAX_KNOBS:
            if cfg.raw(knob) is not None:
                self._problem(Severity.WARNING, knob, f"{knob} is no longer supported (HTCondor >= 24.10 ignores "
                              "it); convert it with 'ce-k8s routes convert'")

        self.user_maps, found = usermaps.read_user_maps(cfg)
        self._add(found)
        self._add(usermaps.activate(self.user_maps))
        self.pre_transforms = self._load_transforms("JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES")
        self.post_transforms = self._load_transforms("JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES")
        self._load_routes()
        return self

    def _load_transforms(self, names_knob: str) -> list[Transform]:
        assert self.config is not None
        loaded: list[Transform] = []
        seen: set[str] = set()
        for name in _split_names(self.config.get(names_knob)):
            if name.lower() in seen:
                continue  # param_and_insert_unique_items: each name once, case-insensitively
            seen.add(name.lower())
            knob = f"JOB_ROUTER_TRANSFORM_{name}"
            text = self.config.raw(knob)
            if text is None:
                self.enabled = False
                self._problem(Severity.ERROR, names_knob,
                              f"{names_knob} names {name}, but {knob} is not defined; routing is disabled")
                continue
            try:
                transform = Transform.parse(name, text, self.config.origin(knob), self._line_numbers(knob, text))
            except TransformError as exc:
                # JobRouter::config: "<knob> load error" and m_enable_job_routing = false.
                self.enabled = False
                self._transform_error(exc, Severity.ERROR, f"in {knob}; routing is disabled")
                continue
            # Pre/post-route transforms are not validated at load: what would fail shows up per job.
            self._add(transform.static_problems())
            self._body_warnings(transform, knob, f"transform {name}")
            loaded.append(transform)
        return loaded

    def _body_warnings(self, transform: Transform, knob: str, label: str) -> None:
        for warning in transform.warnings:
            self._problem(Severity.WARNING, knob, f"{label}: {warning}", transform.origin)
        if transform.ignored_after is not None:
            self.diagnostics.append(transform.diagnostic(
                Severity.WARNING, f"{label}: the lines after this TRANSFORM statement are not part of the "
                "body (MacroStreamXFormSource::open stops reading there); they are ignored",
                transform.ignored_after))

    def _line_numbers(self, knob: str, text: str) -> list[int] | None:
        """File line of each line of a raw value, when the config reader can tell."""
        raw_lines = getattr(self.config, "raw_lines", None)
        lines = raw_lines(knob) if raw_lines is not None else None
        if not lines or len(lines) != len(text.split("\n")):
            return None
        return [number for number, _ in lines]

    def _route_knobs(self) -> dict[str, str]:
        """Defined route names (lower-case → the knob's spelling of the name)."""
        assert self.config is not None
        found: dict[str, str] = {}
        for knob in self.config.names():
            if knob.upper().startswith(_ROUTE_PREFIX) and knob.upper() != "JOB_ROUTER_ROUTE_NAMES":
                found[knob[len(_ROUTE_PREFIX) :].lower()] = knob[len(_ROUTE_PREFIX) :]
        return found

    def _load_route(self, name: str, knob: str) -> Route | None:
        assert self.config is not None
        text = self.config.raw(knob) or ""
        origin = self.config.origin(knob)
        if text.lstrip().startswith("[") or text.lstrip().startswith("/*"):
            self._problem(Severity.ERROR, knob, f"route {name} is written in the old ClassAd syntax, which "
                          "HTCondor >= 24.10 no longer reads; convert it with 'ce-k8s routes convert'", origin)
            return None
        if not text.strip():
            self._problem(Severity.ERROR, knob, f"route {name} is empty", origin)
            return None
        try:
            route = Route.load(name, text, origin, self.config, self.default_max_jobs, self.default_max_idle_jobs,
                               self._line_numbers(knob, text))
        except TransformError as exc:
            # JobRoute::ParseNext: "route <name> is not valid"; the router never chooses it.
            self._transform_error(exc, Severity.ERROR, f"route {name} is not loaded")
            return None
        for warning in route.load_warnings:
            self._problem(Severity.WARNING, knob, f"route {name}: {warning}", origin)
        self._add(route.validation)
        self._body_warnings(route, knob, f"route {name}")
        if route.requirements_expr is None and self.source_constraint is None:
            self._problem(Severity.ERROR, knob, f"route {name}: Missing Requirements in job route (needed "
                          "when JOB_ROUTER_SOURCE_JOB_CONSTRAINT is not set); the route is not loaded", origin)
            return None
        return route

    def _load_routes(self) -> None:
        assert self.config is not None
        defined = self._route_knobs()
        listed_text = self.config.get("JOB_ROUTER_ROUTE_NAMES")
        listed = _split_names(listed_text)
        if listed_text is None:
            self._problem(Severity.WARNING, None, "JOB_ROUTER_ROUTE_NAMES is not set: no route is enabled")
        seen: set[str] = set()
        for name in listed:
            if name.lower() in seen:
                continue
            seen.add(name.lower())
            self.route_names.append(name)
            if name.lower() not in defined:
                self.undefined_routes.append(name)
                self._problem(Severity.WARNING, "JOB_ROUTER_ROUTE_NAMES",
                              f"JOB_ROUTER_ROUTE_NAMES lists {name}, but JOB_ROUTER_ROUTE_{name} is not defined; "
                              "it is skipped")
                continue
            route = self._load_route(name, _ROUTE_PREFIX + defined[name.lower()])
            if route is not None:
                self.routes.append(route)
        for low, spelled in sorted(defined.items()):
            if low in seen:
                continue
            knob = _ROUTE_PREFIX + spelled
            before = len(self.diagnostics)
            route = self._load_route(spelled, knob)
            # The router never reads a route that is not listed: what is wrong inside it changes nothing.
            self.diagnostics[before:] = [
                Diagnostic(d.file, d.line, Severity.NOTE, f"{d.message} (route {spelled} is not listed, so the "
                           "router never loads it)") for d in self.diagnostics[before:]]
            self._problem(Severity.WARNING, knob, f"route {spelled} is defined but not listed in "
                          "JOB_ROUTER_ROUTE_NAMES, so it is disabled")
            if route is not None:
                self.disabled.append(route)

    # ---- hooks -----------------------------------------------------------------------------

    def job_hook_keyword(self, job: classad2.ClassAd) -> str | None:
        """``HookKeyword`` from the source ad (must be a string) wins over the knob (docs/hook-protocol.md §1.1)."""
        if "HookKeyword" in job:
            value = job.eval("HookKeyword")
            if isinstance(value, str) and value:
                return value
        return self.hook_keyword

    def hook_path(self, job: classad2.ClassAd, hook: str) -> str | None:
        """The hook's path, or None when unconfigured or when the docs/hook-protocol.md §1.1 path checks fail."""
        if hook not in HOOKS:
            raise ValueError(f"unknown hook {hook!r}; expected one of {', '.join(HOOKS)}")
        keyword = self.job_hook_keyword(job)
        if keyword is None or self.config is None:
            return None
        path = self.config.get(f"{keyword}_HOOK_{hook}")
        if not (path or "").strip() and hook == "JOB_FINALIZE":
            path = self.config.get(f"{keyword}_HOOK_JOB_EXIT")
        path = (path or "").strip()
        if not path:
            return None
        return path if hook_path_ok(path) else None

    def attrs_to_copy(self, job: classad2.ClassAd) -> list[str]:
        """``<KW>_ATTRS_TO_COPY`` for the job's keyword; empty without a keyword (docs/hook-protocol.md §1.1)."""
        keyword = self.job_hook_keyword(job)
        if keyword is None or self.config is None:
            return []
        return _split_names(self.config.get(f"{keyword}_ATTRS_TO_COPY"))

    # ---- selection -------------------------------------------------------------------------

    def builtin_terms(self) -> list[str]:
        """The umbrella constraint's fixed terms (JobRouter.cpp, docs/hook-protocol.md §4.4)."""
        return [
            "target.ProcId >= 0",
            "target.JobStatus == 1",
            "(target.StageInStart is undefined || target.StageInFinish isnt undefined)",
            'target.Managed isnt "ScheddDone"',
            'target.Managed isnt "External"',
            "target.Owner isnt Undefined",
            f"target.RoutedBy isnt {_quote(self.router_name)}",
        ]

    def umbrella_constraint(self, accepting: list[Route] | None = None) -> str:
        """The candidate query: source constraint, OR of route REQUIREMENTS, built-in terms."""
        routes = self.routes if accepting is None else accepting
        parts: list[str] = []
        if self.source_constraint:
            parts.append(f"({self.source_constraint})")
        unique: list[str] = []
        for route in routes:
            req = route.requirements or "True"
            if req not in unique:
                unique.append(req)
        if not unique:
            parts.append("(false)")
        else:
            parts.append("(" + " || ".join(f"({req})" for req in unique) + ")")
        parts.append("(" + " && ".join(self.builtin_terms()) + ")")
        return " && ".join(parts)

    @staticmethod
    def _as_match(expr_text: str, job: classad2.ClassAd) -> object:
        """Evaluate as the candidate query does: the job is TARGET, and unqualified names reach it."""
        expr = parse_old_expr(expr_text)
        if expr is None:
            return classad2.Value.Error
        try:
            # classad2 resolves nothing through TARGET when scope and target are the same object.
            return expr.eval(job, copy_ad(job))
        except (ValueError, TypeError, classad2.ClassAdException):
            return classad2.Value.Error

    def is_candidate(self, job: classad2.ClassAd, accepting: list[Route] | None = None) -> bool:
        if not self.enabled:
            return False
        return self._as_match(self.umbrella_constraint(accepting), job) is True

    def candidate_verdicts(self, job: classad2.ClassAd) -> list[RouteVerdict]:
        """Each part of the umbrella constraint on its own, so "no route" can say which failed."""
        verdicts: list[RouteVerdict] = []
        if not self.enabled:
            verdicts.append(RouteVerdict("<routing>", False, "routing is disabled: " + "; ".join(self.errors)))
        if self.source_constraint:
            value = self._as_match(self.source_constraint, job)
            verdicts.append(RouteVerdict("JOB_ROUTER_SOURCE_JOB_CONSTRAINT", _tri(value),
                                         f"{self.source_constraint} → {_show(value)}"))
        for term in self.builtin_terms():
            value = self._as_match(term, job)
            verdicts.append(RouteVerdict("built-in", _tri(value), f"{term} → {_show(value)}"))
        return verdicts

    def choose_route(self, job: classad2.ClassAd, accepting: Callable[[Route], bool] = _always) -> Route | None:
        """First matching route in list order, or round robin among matches (docs/hook-protocol.md §4.4)."""
        if not self.enabled:
            return None
        usermaps.activate(self.user_maps)
        matching: list[Route] = []
        for route in self.routes:
            if not accepting(route) or not route.matches(job):
                continue
            if not self.round_robin:
                return route
            matching.append(route)
        if not matching:
            return None
        chosen = matching[self._rr_counter % len(matching)]
        self._rr_counter += 1
        return chosen

    def explain(self, job: classad2.ClassAd) -> list[RouteVerdict]:
        """Each enabled route's REQUIREMENTS result for this job, with the reason."""
        usermaps.activate(self.user_maps)
        verdicts: list[RouteVerdict] = []
        for route in self.routes:
            if route.requirements_expr is None:
                verdicts.append(RouteVerdict(route.name, True, "no REQUIREMENTS: matches every candidate job"))
                continue
            value = route.evaluate_requirements(job)
            result = route.matches(job)
            reason = f"REQUIREMENTS {route.requirements} → {_show(value)}"
            if _boolean_equiv(value) is None:
                if re.search(r"\btarget\.", route.requirements or "", re.IGNORECASE):
                    reason += " (TARGET.x is undefined here: route REQUIREMENTS see only the job)"
                elif is_undefined_value(value):
                    missing = _missing_refs(route.requirements_expr, job)
                    if missing:
                        reason += f" (the job has no {', '.join(missing)})"
            verdicts.append(RouteVerdict(route.name, result if _boolean_equiv(value) is not None else None,
                                         reason))
        return verdicts

    # ---- the post-translate pipeline --------------------------------------------------------

    def route_job(self, job: classad2.ClassAd, route: Route, translated: classad2.ClassAd | None = None,
                  macros: MacroSet | None = None) -> RoutedJob:
        """VanillaToGrid, pre-route, route and post-route transforms, then the router's stamps.

        docs/hook-protocol.md §2.2; JobRouter.cpp FinishSubmitJob and JobRoute::ApplyRoutingJobEdits.
        """
        usermaps.activate(self.user_maps)
        ad = copy_ad(translated if translated is not None else job)
        result = RoutedJob(ad)
        jid = job_id(job)
        in_place = route.edits_in_place(job)
        if not in_place:
            try:
                vanilla_to_grid(ad, route.target_universe, route.grid_resource or None, route.sandboxed(job))
            except ValueError as exc:
                result.add(Severity.ERROR, f"job {jid}: {exc}")
                result.failed = True
                return result
        macros = macros if macros is not None else MacroSet(self.config)
        steps: list[tuple[str, Transform, bool]] = [("pre-route transform", t, True) for t in self.pre_transforms]
        steps.append(("route", route, False))
        steps += [("post-route transform", t, True) for t in self.post_transforms]
        for what, transform, check_requirements in steps:
            # JobRoute::ApplyRoutingJobEdits: a pre/post transform whose REQUIREMENTS do not match
            # the ad being built is skipped; any TransformClassAd < 0 ends routing of the job.
            if check_requirements and not transform.requirements_match(ad):
                log.debug("job %s: %s %s does not match; skipped", jid, what, transform.name)
                continue
            try:
                result.diagnostics += transform.run(ad, macros)
            except (TransformError, MacroError) as exc:
                message = exc.message if isinstance(exc, TransformError) else str(exc)
                where = exc.origin if isinstance(exc, TransformError) else transform.origin
                # the route and the failing transform both named: a post-route transform fails the
                # jobs of every route it applies to, and the route is what `route --json` shows
                by = "" if transform is route else f" routed by {route.name}"
                result.add(Severity.ERROR, f"job {jid}{by}: JobRouter failure in {what} {transform.name}: "
                           f"{message}; {ABANDONED}", where)
                result.failed = True
                return result
        if in_place:
            result.in_place = True
            return result
        ad["RoutedFromJobId"] = jid
        ad["RoutedBy"] = self.router_name
        ad["RouteName"] = route.name
        if "RoutedToJobId" in ad:
            del ad["RoutedToJobId"]
        if route.uses_shared_proxy(job):
            self._shared_proxy(route, job, result)
        return result

    @staticmethod
    def _shared_proxy(route: Route, job: classad2.ClassAd, result: RoutedJob) -> None:
        """RoutedJob::PrepareSharedX509UserProxy: SharedX509UserProxy must be a string and the job
        sandboxed, else FinishSubmitJob removes the job; the proxy path replaces the job's."""
        expr = parse_old_expr(route.shared_x509_user_proxy or "")
        value = evaluate_in(job, expr) if expr is not None else None
        if not isinstance(value, str):
            problem = "UseSharedX509UserProxy is true, but SharedX509UserProxy is invalid"
        elif not route.sandboxed(job):
            problem = "UseSharedX509UserProxy is true, but JobShouldBeSandboxed is false"
        else:
            result.ad["x509userproxy"] = value
            return
        result.add(Severity.ERROR, f"route {route.name}: JobRouter failure: {problem}; {ABANDONED}", route.origin)
        result.failed = True


def hook_path_ok(path: str) -> bool:
    """hook_utils.cpp: exists, executable, not world-writable, parent not world-writable."""
    try:
        st = os.stat(path)
        parent = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    if not os.access(path, os.X_OK) or not stat.S_ISREG(st.st_mode):
        return False
    return not (st.st_mode & stat.S_IWOTH) and not (parent.st_mode & stat.S_IWOTH)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tri(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    return None


def _show(value: object) -> str:
    if is_undefined_value(value):
        return "undefined"
    if is_error_value(value):
        return "error"
    if isinstance(value, bool):
        return "true" if value else "false"
    return value_to_macro_text(value) if not isinstance(value, str) else wire.unparse_old(value)


def _missing_refs(expr: classad2.ExprTree, job: classad2.ClassAd) -> list[str]:
    try:
        refs = job.externalRefs(expr)
    except (ValueError, TypeError, classad2.ClassAdException):
        return []
    return sorted({ref for ref in refs if "." not in ref})
