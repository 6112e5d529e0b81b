"""``ce-k8s routes convert``: print old-syntax routes (JOB_ROUTER_ENTRIES) as JOB_ROUTER_ROUTE_<name>.

The converted text goes to stdout so it can be redirected into a config.d file; warnings and errors
go to stderr as ``file:line: message`` lines. Exit 0 on success (also when there is nothing to
convert), 1 when the configuration or a route ad is broken.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help="condor_config file or config directory to read (default: $CONDOR_CONFIG, else the "
        "shipped ce-k8s configuration)",
    )


def run(args: argparse.Namespace) -> int:
    import os

    from ce_k8s.condor.config import CondorConfig, ConfigError
    from ce_k8s.condor.oldsyntax import ConversionError, convert, has_old_syntax

    path = args.config or os.environ.get("CONDOR_CONFIG") or None
    try:
        cfg = CondorConfig.load(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    for warning in cfg.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not has_old_syntax(cfg):
        print("nothing to convert: no JOB_ROUTER_ENTRIES, JOB_ROUTER_ENTRIES_FILE, JOB_ROUTER_ENTRIES_CMD "
              "or ClassAd-style JOB_ROUTER_ROUTE_<name> in the configuration", file=sys.stderr)
        return 0
    try:
        result = convert(cfg)
    except (ConversionError, ConfigError) as exc:
        print(exc, file=sys.stderr)
        return 1
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write(result.text)
    return 0
