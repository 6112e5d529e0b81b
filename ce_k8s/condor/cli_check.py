"""``ce-k8s routes check [--config PATH]``: report route configuration problems as file:line."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH",
                        help="a condor_config file or a directory of config files "
                             "(default: the shipped config.d/ and routes/)")
    from ce_k8s.condor.cli_route import add_config_arguments

    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when no problem is found, 1 with one ``file:line: message`` per problem, 2 on bad input."""
    from ce_k8s.condor.check import check_config
    from ce_k8s.condor.config import ConfigError
    from ce_k8s.condor.routing import RouterConfig

    try:
        from ce_k8s.condor.cli_route import load_config

        cfg, notes = load_config(args.config, no_commands=getattr(args, "no_commands", False),
                                 htcondor_version=getattr(args, "htcondor_version", None))
    except (ConfigError, OSError) as exc:
        print(f"ce-k8s routes check: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"ce-k8s routes check: note: {note}", file=sys.stderr)
    problems = check_config(cfg)
    if problems:
        for problem in problems:
            print(problem)
        print(f"{len(problems)} problem(s) found", file=sys.stderr)
        return 1
    router = RouterConfig.from_config(cfg)
    names = " ".join(route.name for route in router.routes)
    print(f"OK: {len(router.routes)} route(s) in order: {names}; "
          f"{len(router.pre_transforms)} pre-route and {len(router.post_transforms)} post-route transform(s)")
    return 0
