"""``ce-k8s routes check [--config PATH] [--strict]``: report route configuration findings as
``file:line: severity: message``.

Exit status (docs/routes.md, "ce-k8s routes check"): 1 when there is an error (something the real
router refuses or mis-routes), or with ``--strict`` also a warning; 0 otherwise, notes and
warnings included; 2 when the configuration cannot be read at all.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH",
                        help="a condor_config file or a directory of config files "
                             "(default: the shipped config.d/ and routes/)")
    from ce_k8s.condor.cli_route import add_config_arguments

    add_config_arguments(parser)


def summary_line(counts: dict[str, int]) -> str:
    """``2 errors, 1 warning, 6 notes`` (every class named, so a script can read it)."""
    words = []
    for name in ("error", "warning", "note"):
        n = counts.get(name, 0)
        words.append(f"{n} {name}{'' if n == 1 else 's'}")
    return ", ".join(words)


def run(args: argparse.Namespace) -> int:
    from ce_k8s.condor.check import check_config
    from ce_k8s.condor.config import ConfigError
    from ce_k8s.condor.diagnostics import Severity, worst
    from ce_k8s.condor.routing import RouterConfig

    try:
        from ce_k8s.condor.trial import load_config

        cfg, notes = load_config(args.config, no_commands=getattr(args, "no_commands", False),
                                 htcondor_version=getattr(args, "htcondor_version", None))
    except (ConfigError, OSError) as exc:
        print(f"ce-k8s routes check: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"ce-k8s routes check: note: {note}", file=sys.stderr)
    router = RouterConfig.from_config(cfg)
    strict = bool(getattr(args, "strict", False))
    diagnostics = check_config(cfg, router)
    for diag in diagnostics:
        print(diag)
    counts = {str(sev): sum(1 for d in diagnostics if d.severity == sev) for sev in Severity}
    failed = worst(diagnostics, strict=strict) == Severity.ERROR
    names = " ".join(route.name for route in router.routes)
    verdict = "FAILED" if failed else "OK"
    strict_note = " (--strict: warnings count as errors)" if strict and counts["warning"] else ""
    print(f"{verdict}: {len(router.routes)} route(s) in order: {names or '(none)'}; "
          f"{len(router.pre_transforms)} pre-route and {len(router.post_transforms)} post-route transform(s); "
          f"{summary_line(counts)}{strict_note}")
    return 1 if failed else 0
