"""One job through the CE's router and ce-k8s, as far as they would take it: the dry run's engine.

``ce-k8s route`` prints what this finds, ``routes check`` runs a trial pilot through every route
with it, and ``doctor`` uses it to find each route's namespace; so it lives in a module of its own,
and the command modules only parse, call and print (docs/internals.md, "Rooms and imports").

The steps are the real ones (docs/hook-protocol.md §2.2, §4): the router's candidate query and
route choice, the translate hook's logic in-process (for a Kubernetes route; another backend's job
is handed back unchanged, docs/routes.md "CEs with other backends"), VanillaToGrid and every
transform, then the pod builder. Every finding carries the router's severity (docs/routes.md,
"Severity: errors, warnings, notes").
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    import classad2

    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.condor.diagnostics import Diagnostic
    from ce_k8s.condor.routing import Route, RoutedJob, RouterConfig, RouteVerdict

log = logging.getLogger(__name__)


@dataclass
class JobResult:
    """Everything reported for one job.

    ``failed`` is True when the real router would fail this job (and ``errors`` says why, one
    string per ERROR diagnostic); a job no route takes is not failed. ``diagnostics`` holds every
    finding with its severity, errors included.
    """

    job: str
    route: str | None = None
    ad: classad2.ClassAd | None = None
    errors: list[str] = field(default_factory=list)
    failed: bool = False
    diagnostics: list[Diagnostic] = field(default_factory=list)
    candidate: list[RouteVerdict] = field(default_factory=list)
    verdicts: list[RouteVerdict] = field(default_factory=list)
    is_candidate: bool = True
    notes: list[str] = field(default_factory=list)
    pod: dict | None = None
    secret: dict | None = None
    pod_error: tuple[str, str] | None = None
    kubernetes: bool = True
    edited: classad2.ClassAd | None = None   # EditJobInPlace: the source job as the router edits it


def load_config(path: str | None, *, no_commands: bool = False,
                htcondor_version: tuple[int, int, int] | None = None) -> tuple[CondorConfig, list[str]]:
    """The configuration as the modelled HTCondor's job router reads it, and notes for the caller.

    Read with HTCondor's own reader too (it runs the configuration's commands) unless
    ``no_commands``; ``htcondor_version`` is the version modelled (default: the installed wheel's).
    Old-syntax routes are converted only where that version reads them (``oldsyntax.gated_config``).

    Returns ``(cfg, notes)``: ``notes`` are plain strings (``note: ...`` lines), today only the
    conversion notice; every finding of the reader itself, with its severity (a command not run,
    HTCondor refusing the configuration, old-syntax routes the version does not read), is in
    ``cfg.diagnostics``, which ``routes check`` reports and ``route`` prints.
    """
    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.condor.oldsyntax import gated_config

    def warm_up() -> None:
        # while HTCondor's reader (a child process) runs, import what route and routes check use next
        for name in ("ce_k8s.condor.routing", "ce_k8s.hooks.translate",
                     "ce_k8s.pods.builder", "ce_k8s.settings", "yaml"):
            try:
                importlib.import_module(name)
            except ImportError:  # pragma: no cover - an optional part missing is reported where it is used
                log.debug("%s not importable", name)

    cfg = CondorConfig.load(path, run_commands=not no_commands, version=htcondor_version, detected_specials=True,
                            while_reading=warm_up)
    notes: list[str] = []
    gated, found, converted = gated_config(cfg)
    gated.diagnostics.extend(d for d in found if d not in gated.diagnostics)
    if converted:
        notes.append(f"the configuration uses the old JOB_ROUTER_ENTRIES route syntax, which the modelled HTCondor "
                     f"{'.'.join(map(str, cfg.version))} still reads (24.10.0 and later do not); it was converted to "
                     "JOB_ROUTER_ROUTE_<name> transforms for this run (see 'ce-k8s routes convert')")
    return gated, notes


def translator():
    """The translate hook's in-process function, or None when the hooks are not installed."""
    try:
        module = importlib.import_module("ce_k8s.hooks.translate")
    except ImportError:
        return None
    return getattr(module, "translate_ad_text", None)


def pod_tools():
    """The pod builder's pieces, or None when the pods room is not installed."""
    try:
        builder = importlib.import_module("ce_k8s.pods.builder")
        settings = importlib.import_module("ce_k8s.settings")
        jobad = importlib.import_module("ce_k8s.pods.jobad")
        errors = importlib.import_module("ce_k8s.pods.errors")
    except ImportError:
        return None
    needed = (getattr(builder, "build_manifests", None), getattr(builder, "redact_secret", None),
              getattr(settings, "Settings", None), getattr(jobad, "JobAd", None),
              getattr(errors, "PodBuildError", None))
    return needed if all(item is not None for item in needed) else None


def _route_is_kubernetes(route: Route, settings) -> tuple[bool, str]:
    """(whether ``route`` is a Kubernetes route, the knob's value), by the translate hook's own
    test of the route-description line (``ce_k8s.hooks.translate.is_kubernetes_route``)."""
    from ce_k8s.hooks.translate import is_kubernetes_route
    from ce_k8s.protocol import DEFAULT_GRID_RESOURCE

    knob = getattr(settings, "grid_resource", None) or DEFAULT_GRID_RESOURCE
    return is_kubernetes_route(route.route_info_line(), knob), knob


def _decision_mismatch(route: Route, routed: classad2.ClassAd, kubernetes: bool, knob: str) -> str | None:
    """Why the translate hook and the later hooks would disagree about this job, or None.

    The translate hook sees only the route's `GridResource` macro (the route line); update,
    finalize and cleanup see the routed ad's `GridResource`, which a `SET`/`EVALSET` in a route or
    transform may have changed. Then a job is claimed by one hook and not the others: a Kubernetes
    job the update hook ignores never gets a pod, and a job translate passed through (no
    `Managed = "ScheddDone"`, the factory's own `K8s*` attributes kept) would reach the agent.
    """
    from ce_k8s.condor import wire
    from ce_k8s.hooks._common import ad_grid_resource, grid_resource_matches

    final = ad_grid_resource(wire.sprint_ad(routed).encode("utf-8", "surrogateescape"))
    if grid_resource_matches(final, knob) == kubernetes:
        return None
    if kubernetes:
        return (f'the routed job\'s GridResource is "{final or ""}", which does not start with '
                f'CE_K8S_GRID_RESOURCE "{knob}", so the update, finalize and cleanup hooks would ignore a job the '
                "translate hook claimed; do not change GridResource in the route body or a transform")
    macro = f'"{route.grid_resource}"' if route.grid_resource else "not set"
    return (f'the routed job\'s GridResource "{final}" is a Kubernetes one, but the route\'s '
            f"GridResource macro is {macro}, so the translate hook passes the job through unmarked; set the "
            f'macro (`GridResource = "{knob}"` in the route) instead of SET/EVALSET GridResource')


def _job_diag(severity, message: str, where=None) -> Diagnostic:
    from ce_k8s.condor.diagnostics import Diagnostic

    if where is None:
        return Diagnostic("<job>", 0, severity, message)
    return Diagnostic(where.file, where.line, severity, message)


def _fail(result: JobResult, message: str, where=None) -> JobResult:
    """Record an error: the real router would not route this job (or would hold it)."""
    from ce_k8s.condor.diagnostics import Severity

    result.errors.append(message)
    result.diagnostics.append(_job_diag(Severity.ERROR, message, where))
    result.failed = True
    return result


def routed_diagnostics(routed: RoutedJob) -> list[Diagnostic]:
    """What the router logged while routing one job, with severities.

    The router model may attach them itself (``RoutedJob.diagnostics``). Older models only have
    ``errors`` strings: then only the message that made the router give up (the last one, when
    ``failed``) is an error; the rest were logged and routing went on (xform_utils.cpp logs a bad
    ``EVALMACRO`` and carries on), so they are warnings.
    """
    from ce_k8s.condor.diagnostics import Diagnostic, Severity

    found = getattr(routed, "diagnostics", None)
    if found is not None:
        return list(found)
    texts = list(routed.errors)
    return [Diagnostic.from_text(text, Severity.ERROR if routed.failed and i == len(texts) - 1 else Severity.WARNING)
            for i, text in enumerate(texts)]


def route_one(job: classad2.ClassAd, router: RouterConfig, cfg: CondorConfig, translate, pod_tools,
              settings, force_route: Route | None = None) -> JobResult:
    """Route one job exactly as far as the router (and then ce-k8s) would take it.

    ``force_route`` skips selection (``routes check`` builds a trial pod for every route). A route
    that is not a Kubernetes one gets the translate hook's pass-through (the source ad, unchanged)
    and no pod: ``result.kubernetes`` is False and a note says why.
    """
    from ce_k8s.condor import wire
    from ce_k8s.condor.diagnostics import Severity
    from ce_k8s.condor.routing import job_id, submit_edits

    result = JobResult(job_id(job))
    if force_route is None:
        result.is_candidate = router.is_candidate(job)
        result.verdicts = router.explain(job)
        if not result.is_candidate:
            result.candidate = router.candidate_verdicts(job)
            return result                  # the router leaves it alone: a verdict, not a failure
    route = force_route or router.choose_route(job)
    if route is None:
        return result
    result.route = route.name
    result.kubernetes, knob = _route_is_kubernetes(route, settings)
    if not result.kubernetes:
        why = (f'its GridResource "{route.grid_resource}" does not start with' if route.grid_resource
               else "it sets no GridResource, so it cannot match")
        note = (f'route {route.name} is not a Kubernetes route ({why} CE_K8S_GRID_RESOURCE "{knob}"): '
                "the ce-k8s hooks pass this job through unchanged and no pod is built")
        result.notes.append(note)
        result.diagnostics.append(_job_diag(Severity.NOTE, note))
    translated = None
    if translate is not None:
        try:
            text = wire.sprint_ad(job)
            # the translate hook writes another backend's source ad back as it arrived
            output = translate(route.route_info_line(), text) if result.kubernetes else text
            if not output.strip():
                return _fail(result, "the translate hook printed nothing (the router would ask again next poll)")
            translated = wire.parse_hook_output(output, "<translate hook output>")
        except ValueError as exc:
            return _fail(result, f"translate hook: {exc}")
    else:
        note = "ce_k8s.hooks.translate is not available: routed without the translate hook"
        result.notes.append(note)
        result.diagnostics.append(_job_diag(Severity.NOTE, note))
    routed = router.route_job(job, route, translated)
    found = routed_diagnostics(routed)
    result.diagnostics += found
    result.errors += [plain(d) for d in found if d.severity == Severity.ERROR]
    result.failed = routed.failed or any(d.severity == Severity.ERROR for d in found)
    if result.failed:
        # the router gives the job up (GracefullyRemoveJob) and submits nothing: there is no routed
        # ad to show, only the findings that say why
        return result
    if getattr(routed, "in_place", False):
        return _edited_in_place(result, route, routed.ad)
    result.ad = routed.ad
    submit_edits(routed.ad)
    mismatch = _decision_mismatch(route, routed.ad, result.kubernetes, knob)
    if mismatch:
        return _fail(result, mismatch, route.origin)
    if result.kubernetes and pod_tools is not None and settings is not None:
        build, redact, _settings_cls, jobad_cls, pod_error = pod_tools
        try:
            built = build(jobad_cls(wire.evaluate_ad(routed.ad)), settings)
            result.pod = built.pod
            result.secret = redact(built.secret)
        except pod_error as exc:
            result.pod_error = (exc.code, exc.message)
            _fail(result, f"pod builder: {exc.code}: {exc.message}", route.origin)
    return result


def _edited_in_place(result: JobResult, route: Route, edited: classad2.ClassAd) -> JobResult:
    """EditJobInPlace was true for the job: the router pushes the edited ad onto the *source* job and
    submits no routed job (JobRouter.cpp FinishSubmitJob, push_classad_diff; the real
    condor_job_router_info writes nothing for it, docs/real-condor.md "Route fidelity"). No update,
    finalize or cleanup hook ever runs for it, so no pod is made. On a Kubernetes route the
    translate hook has run first (SubmitJob), so its `Managed = "ScheddDone"` lands on the source
    job, which then never runs anywhere: an error. Elsewhere it is what the site asked for: a note."""
    from ce_k8s.condor.diagnostics import Severity

    result.edited = edited
    if result.kubernetes:
        return _fail(result, f"route {route.name}: EditJobInPlace is true for this job, so the router edits the "
                             "source job in place and submits no routed job: no pod is ever made, and the translate "
                             'hook\'s Managed = "ScheddDone" is written onto the source job, which then never runs; '
                             "do not set EditJobInPlace on a Kubernetes route", route.origin)
    note = (f"route {route.name}: EditJobInPlace is true for this job: the router edits the source job in place "
            "and submits no routed job")
    result.notes.append(note)
    result.diagnostics.append(_job_diag(Severity.NOTE, note, route.origin))
    return result


def plain(diag: Diagnostic) -> str:
    """``file:line: message`` (the message alone when the finding has no place)."""
    return f"{diag.file}:{diag.line}: {diag.message}" if diag.line else diag.message
