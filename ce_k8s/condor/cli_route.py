"""``ce-k8s route --jobads FILE``: which route takes each pilot, and what the backend gets.

A dry run of the CE's job router with its real semantics (docs/hook-protocol.md §2.2, §4) and,
past the router, of ce-k8s itself: the translate hook's logic runs in-process, then VanillaToGrid
and every transform, then the pod builder. What ``condor_job_router_info`` cannot show (it never
calls hooks and knows nothing of pods, docs/hook-protocol.md §5) is shown here, from the same
config files a CE reads.

Every finding has the router's severity (docs/routes.md, "Severity: errors, warnings, notes"): an
error is something the real router would fail or refuse (a transform that fails, a translate hook
that prints nothing, a pod the builder rejects, a configuration error); a warning is what HTCondor
logs and carries on from (an ``EVALMACRO`` that does not evaluate); a note changes nothing. A job
no route takes is a verdict, not a failure: the router leaves it idle. Exit status 1 means an error
(with ``--strict`` also a warning), for a job or in the configuration.

A job taken by a route that is not a Kubernetes one (its GridResource does not start with the
words of `CE_K8S_GRID_RESOURCE`, docs/routes.md "CEs with other backends") is shown as the router
routes it with the ce-k8s hooks installed: the translate hook hands the source ad back unchanged,
and no pod or Secret is built.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    import classad2

    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.condor.diagnostics import Diagnostic
    from ce_k8s.condor.routing import Route, RoutedJob, RouterConfig, RouteVerdict

log = logging.getLogger(__name__)

# Shown first for a routed job: what an admin asks about a pilot before reading the whole ad.
SUMMARY_ATTRS = (
    "RouteName", "JobUniverse", "GridResource", "RequestCpus", "RequestMemory", "RequestGPUs",
    "BatchRuntime", "BatchQueue", "WantWholeNode", "K8sNamespace", "K8sImage", "K8sPriorityClass",
    "K8sNodeSelector", "K8sTolerations", "K8sPodName",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobads", required=True, metavar="FILE",
                        help="job ads in condor_q -long or -json form; '-' reads stdin")
    parser.add_argument("--config", metavar="PATH",
                        help="a condor_config file or a directory of config files "
                             "(default: the shipped config.d/ and routes/)")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per job")
    add_config_arguments(parser)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--no-commands`` and ``--htcondor-version``: how the configuration is read (route and routes check)."""
    from ce_k8s.condor.config import installed_version, parse_version

    def version(text: str) -> tuple[int, int, int]:
        try:
            return parse_version(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parser.add_argument("--no-commands", action="store_true",
                        help="do not run the commands the configuration names (LOCAL_CONFIG_FILE = cmd |, "
                             "include command : cmd); a note names each one whose output is missing")
    parser.add_argument("--htcondor-version", type=version, metavar="X.Y.Z",
                        help="the HTCondor version to model (if version ..., old-syntax routes); default: the "
                             "installed htcondor package's, " + ".".join(map(str, installed_version()))
                             + "; on a CE: --htcondor-version \"$(condor_ce_version)\"")
    parser.add_argument("--strict", action="store_true",
                        help="treat warnings as errors (exit 1 when a job or the configuration has any)")


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
        for name in ("ce_k8s.condor.routing", "ce_k8s.condor.check", "ce_k8s.hooks.translate",
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


def _translator():
    try:
        module = importlib.import_module("ce_k8s.hooks.translate")
    except ImportError:
        return None
    return getattr(module, "translate_ad_text", None)


def _pod_tools():
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
    result.errors += [_plain(d) for d in found if d.severity == Severity.ERROR]
    result.failed = routed.failed or any(d.severity == Severity.ERROR for d in found)
    if result.failed:
        # the router gives the job up (GracefullyRemoveJob) and submits nothing: there is no routed
        # ad to show, only the findings that say why
        return result
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


def _plain(diag: Diagnostic) -> str:
    """``file:line: message`` (the message alone when the finding has no place)."""
    return f"{diag.file}:{diag.line}: {diag.message}" if diag.line else diag.message


def _shown(diag: Diagnostic) -> str:
    """``severity: file:line: message`` for the indented per-job lines of the text output."""
    return f"{diag.severity}: {_plain(diag)}"


def _verdict_word(result: bool | None) -> str:
    return {True: "true", False: "false", None: "undefined"}[result]


def _print_text(results: list[JobResult], router: RouterConfig, out) -> None:
    import yaml

    from ce_k8s.condor import wire

    for index, res in enumerate(results):
        if index:
            print("", file=out)
        if res.route is None:
            print(f"Job {res.job}: no route", file=out)
            if not res.is_candidate:
                print("  not a candidate for routing; the router's job query fails on:", file=out)
                for verdict in res.candidate:
                    if verdict.result is not True:
                        print(f"    {verdict.route}: {verdict.reason}", file=out)
            for verdict in res.verdicts:
                print(f"  route {verdict.route}: {_verdict_word(verdict.result)} - {verdict.reason}", file=out)
            if not res.verdicts:
                print("  no route is enabled (see 'ce-k8s routes check')", file=out)
            for diag in res.diagnostics:
                print(f"  {_shown(diag)}", file=out)
            continue
        print(f"Job {res.job}: route {res.route}", file=out)
        for diag in res.diagnostics:
            print(f"  {_shown(diag)}", file=out)
        if res.ad is None:
            continue
        print("  summary:", file=out)
        for name in SUMMARY_ATTRS:
            if name in res.ad:
                print(f"    {name} = {wire.unparse_old(res.ad.lookup(name))}", file=out)
        print("  routed ad (as the routed job is submitted):", file=out)
        for line in wire.sprint_ad(res.ad).splitlines():
            print(f"    {line}", file=out)
        if res.pod is not None:
            meta = res.pod.get("metadata", {})
            print(f"  pod {meta.get('namespace', '?')}/{meta.get('name', '?')}:", file=out)
            for line in yaml.safe_dump(res.pod, sort_keys=False).splitlines():
                print(f"    {line}", file=out)
        if res.secret is not None:
            print("  secret (data redacted):", file=out)
            for line in yaml.safe_dump(res.secret, sort_keys=False).splitlines():
                print(f"    {line}", file=out)


def _json_result(res: JobResult) -> dict[str, object]:
    from ce_k8s.condor import wire

    obj: dict[str, object] = {
        "job": res.job,
        "route": res.route,
        "routed_ad": wire.to_json_dict(res.ad) if res.ad is not None and res.route is not None else {},
        "errors": list(res.errors),
    }
    if res.route is None:
        obj["explain"] = [
            {"check": v.route, "result": v.result, "reason": v.reason}
            for v in ([v for v in res.candidate if v.result is not True] + res.verdicts)
        ]
    if res.pod is not None:
        obj["pod"] = res.pod
        obj["secret"] = res.secret
    elif res.route is not None and not res.kubernetes:
        obj["pod"] = None       # another backend's route: the hooks pass the job through, no pod ever
        obj["secret"] = None
    if res.pod_error is not None:
        obj["pod_error"] = {"code": res.pod_error[0], "message": res.pod_error[1]}
    if res.route is not None:
        obj["kubernetes"] = res.kubernetes
    if res.notes:
        obj["notes"] = list(res.notes)
    obj["diagnostics"] = [{"file": d.file, "line": d.line, "severity": str(d.severity), "message": d.message}
                          for d in res.diagnostics]
    return obj


def run(args: argparse.Namespace) -> int:
    from ce_k8s.condor import wire
    from ce_k8s.condor.check import load_diagnostics
    from ce_k8s.condor.config import ConfigError
    from ce_k8s.condor.diagnostics import Severity, worst
    from ce_k8s.condor.routing import RouterConfig

    try:
        if args.jobads == "-":
            text = sys.stdin.read()
            source = "<stdin>"
        else:
            with open(args.jobads, encoding="utf-8") as handle:
                text = handle.read(wire.MAX_AD_BYTES + 1)
            source = args.jobads
        jobs = wire.parse_job_ads(text, source)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"ce-k8s route: cannot read {args.jobads}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"ce-k8s route: {exc}", file=sys.stderr)
        return 2
    if not jobs:
        print(f"ce-k8s route: no job ads in {source}", file=sys.stderr)
        return 2
    try:
        cfg, notes = load_config(args.config, no_commands=getattr(args, "no_commands", False),
                                 htcondor_version=getattr(args, "htcondor_version", None))
    except (ConfigError, OSError) as exc:
        print(f"ce-k8s route: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"ce-k8s route: note: {note}", file=sys.stderr)
    router = RouterConfig.from_config(cfg)
    config_findings = load_diagnostics(cfg, router)
    for diag in config_findings:
        print(f"ce-k8s route: {diag}", file=sys.stderr)
    translate = _translator()
    pod_tools = _pod_tools()
    settings = None
    if pod_tools is not None:
        try:
            settings = pod_tools[2].from_config(cfg)
        except ValueError as exc:
            print(f"ce-k8s route: CE_K8S_* settings are invalid, pods are not built: {exc}", file=sys.stderr)
    results = [route_one(job, router, cfg, translate, pod_tools, settings) for job in jobs]
    if args.json:
        json.dump([_json_result(r) for r in results], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_text(results, router, sys.stdout)
    strict = bool(getattr(args, "strict", False))
    findings = config_findings + [d for r in results for d in r.diagnostics]
    failed = any(r.failed for r in results) or worst(findings, strict=strict) == Severity.ERROR
    return 1 if failed else 0
