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
import json
import logging
import sys
from typing import TYPE_CHECKING

from ce_k8s.condor import trial

# the dry run's engine; load_config and routed_diagnostics are also what other modules used from here
from ce_k8s.condor.trial import JobResult, load_config, plain, route_one, routed_diagnostics  # noqa: F401

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.diagnostics import Diagnostic
    from ce_k8s.condor.routing import RouterConfig

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


def _shown(diag: Diagnostic) -> str:
    """``severity: file:line: message`` for the indented per-job lines of the text output."""
    return f"{diag.severity}: {plain(diag)}"


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
        if res.edited is not None:
            print("  source job as edited in place (EditJobInPlace; no routed job):", file=out)
            for line in wire.sprint_ad(res.edited).splitlines():
                print(f"    {line}", file=out)
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
        # null whenever the router submits no routed job: no route, or the route's transforms (or a
        # pre/post-route transform) failed and the router gave the job up (the errors say which)
        "routed_ad": wire.to_json_dict(res.ad) if res.ad is not None and res.route is not None else None,
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
        # whether the router submits a routed job for it at all (False: it gives the job up, or
        # edits the source job in place)
        obj["submitted"] = res.ad is not None
    if res.edited is not None:
        obj["edited_in_place"] = wire.to_json_dict(res.edited)
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
    translate = trial.translator()
    tools = trial.pod_tools()
    settings = None
    if tools is not None:
        try:
            settings = tools[2].from_config(cfg)
        except ValueError as exc:
            print(f"ce-k8s route: CE_K8S_* settings are invalid, pods are not built: {exc}", file=sys.stderr)
    results = [route_one(job, router, cfg, translate, tools, settings) for job in jobs]
    if args.json:
        json.dump([_json_result(r) for r in results], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_text(results, router, sys.stdout)
    strict = bool(getattr(args, "strict", False))
    findings = config_findings + [d for r in results for d in r.diagnostics]
    failed = any(r.failed for r in results) or worst(findings, strict=strict) == Severity.ERROR
    return 1 if failed else 0
