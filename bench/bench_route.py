"""`ce-k8s route` on one pilot: the embedded default and a stock HTCondor-CE (issue 19: under 0.5 s).

    python bench/bench_route.py [--samples N] [--json]

What a site admin waits for when they dry-run a pilot, start to exit, for three configurations:

* ``default``: the shipped config.d/ + routes/ (what `ce-k8s route` reads without --config);
* ``stock_ce``: HTCondor-CE's own layout (tests/fixtures/stock_ce, every batch package, plus
  `ce-k8s install`), read by HTCondor's reader in a child process, which runs the CE's
  `condor_ce_router_defaults` as the router does (docs/routes.md, "How ce-k8s reads the configuration");
* ``stock_ce_nocmd``: the same with --no-commands (our reader alone, nothing run).

Samples of the three and of the reference (`python -S -c pass`, bench/common.py) are interleaved, so
machine drift hits them alike; figures are medians and p90s, plus the ratio of each median to the
reference's. A run of the command costs what its configuration's commands cost: the stock CE's
program is a Python start of its own, which the figure includes on purpose.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    PYTHON,
    ROOT,
    BenchError,
    bare_python_argv,
    percentile,
    progress,
    run_wall,
    scaled,
)

EXAMPLE = ROOT / "examples" / "pilot-cpu8.ad"
CE_K8S = [PYTHON, "-m", "ce_k8s.cli"]


def _stock_ce(dest: Path) -> Path:
    """A stock CE with ce-k8s installed under `dest`; its condor_config."""
    spec = importlib.util.spec_from_file_location("bench_stock_ce", ROOT / "tests" / "fixtures" / "stock_ce.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module      # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    ce = module.copy_stock_ce(dest / "ce")
    hooks = dest / "hooks"
    hooks.mkdir()
    _seconds, code, out = run_wall([*CE_K8S, "install", "--config-dir", str(ce.config_dir), "--hooks-dir", str(hooks)])
    if code != 0:
        raise BenchError(f"ce-k8s install into the stock CE failed ({code}): {out.decode()[-500:]}")
    return ce.condor_config


def measure(samples: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ce-k8s-bench-route-") as tmp:
        config = _stock_ce(Path(tmp))
        runs = {
            "default": [*CE_K8S, "route", "--jobads", str(EXAMPLE)],
            "stock_ce": [*CE_K8S, "route", "--config", str(config), "--jobads", str(EXAMPLE)],
            "stock_ce_nocmd": [*CE_K8S, "route", "--config", str(config), "--no-commands", "--jobads", str(EXAMPLE)],
        }
        for name, argv in runs.items():      # one warm-up each, and proof that the command works
            _seconds, code, out = run_wall(argv)
            if code != 0 or b"route Pilots" not in out:
                raise BenchError(f"ce-k8s route ({name}) exited {code} without routing the pilot: {out[-300:]!r}")
        times: dict[str, list[float]] = {name: [] for name in [*runs, "bare"]}
        for i in range(samples):
            times["bare"].append(run_wall(bare_python_argv())[0])
            for name, argv in runs.items():
                times[name].append(run_wall(argv)[0])
            if (i + 1) % 5 == 0:
                progress(f"route: {i + 1}/{samples} samples")
    bare = percentile(times["bare"], 50)
    figures: dict[str, float] = {"route_python_bare_ms_p50": round(bare * 1000, 2)}
    for name in runs:
        p50 = percentile(times[name], 50)
        figures[f"route_ms_{name}_p50"] = round(p50 * 1000, 1)
        figures[f"route_ms_{name}_p90"] = round(percentile(times[name], 90) * 1000, 1)
        figures[f"route_{name}_ratio"] = round(p50 / bare, 2)
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=scaled(20, 3), help="runs of each configuration (default 20)")
    ap.add_argument("--json", action="store_true", help="print only the JSON figures")
    a = ap.parse_args(argv)
    os.environ.pop("CONDOR_CONFIG", None)      # the default run must read the embedded configuration
    figures = measure(a.samples)
    print(json.dumps(figures, sort_keys=True))
    if not a.json:
        for key, value in sorted(figures.items()):
            sys.stderr.write(f"{key:32} {value}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
