"""The benchmarks run end to end and report every figure of issue 7 (no speed is asserted here).

`bench/run.py --quick --json` with `CE_K8S_BENCH_SCALE=0.01` shrinks every size (200 pods, 10
pilots, a 50-node dump), so this proves the whole chain works -- test bed, agent, hooks, router
emulator, information provider -- and that the JSON carries each figure docs/performance.md
records. The figures themselves are meaningless at that size.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Issue 7 ("What to build"): every figure the benchmark must publish.
FIGURES = (
    "python_bare_ms_p50", "hook_update_ms_p50", "hook_update_ms_p99", "hook_overhead_ratio",
    "agent_update_us_p50", "agent_update_us_p99", "agent_rss_mb",
    "pipeline_pilots_per_s", "api_calls_per_pilot", "hook_spawns_per_pilot", "python_bare_cpu_s",
    "pipeline_efficiency", "info_ms", "api_calls_per_pilot_lifecycle",
    # issue 19: `ce-k8s route` on one pilot, embedded default and stock CE
    "route_ms_default_p50", "route_ms_stock_ce_p50", "route_ms_stock_ce_nocmd_p50", "route_stock_ce_ratio",
    # issue 17: ready after a start and after a 410 Gone, at 20,000 and 50,000 pods, and the memory
    "agent_relist_s", "agent_relist_410_s", "agent_rss_peak_mb",
    "steady_cost_ratio",
)


def test_quick_run_reports_every_figure_as_a_number():
    """Issue 7: `python bench/run.py --quick --json` prints one JSON object with every figure."""
    env = dict(os.environ, CE_K8S_BENCH_SCALE="0.01")
    env.pop("CE_K8S_SOCKET", None)
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--json"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)     # every bench process unwinds and stops its test bed
        out, err = proc.communicate(timeout=60)
        raise AssertionError("bench/run.py --quick did not finish in 240 s: " + err.decode()[-2000:]) from None
    stderr = err.decode(errors="replace")
    assert proc.returncode == 0, stderr[-3000:]
    lines = out.decode().strip().splitlines()
    assert len(lines) == 1, f"stdout must be exactly one JSON line, got {lines[:3]}"
    figures = json.loads(lines[0])
    for key in FIGURES:
        assert key in figures, f"{key} missing; have {sorted(figures)}"
        value = figures[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), f"{key} = {value!r}"
        assert math.isfinite(value) and value >= 0, f"{key} = {value!r}"
    # The ratios are built from the same run's reference figures, so they must agree with them.
    assert figures["hook_overhead_ratio"] > 0
    assert math.isclose(figures["hook_overhead_ratio"],
                        figures["hook_update_ms_p50"] / figures["python_bare_ms_p50"], rel_tol=0.02)
    limit = figures["cores"] / (figures["hook_spawns_per_pilot"] * figures["python_bare_cpu_s"])
    assert math.isclose(figures["pipeline_efficiency"], figures["pipeline_pilots_per_s"] / limit, rel_tol=0.05,
                        abs_tol=0.002)
    # The steady-state ratio is the worst of the sizes measured, each built from its own terms.
    sizes = [k for k in figures if k.startswith("steady_cost_ratio_")]
    assert sizes and figures["steady_cost_ratio"] == max(figures[k] for k in sizes)
    for key in sizes:
        label = key.removeprefix("steady_cost_ratio_")
        assert math.isclose(figures[key], figures[f"steady_cpu_s_per_pilot_hour_{label}"]
                            / figures[f"steady_floor_cpu_s_per_pilot_hour_{label}"], rel_tol=0.01)
    # Every pilot needs at least translate + one update + finalize + cleanup (docs/hook-protocol.md §2.1).
    assert figures["hook_spawns_per_pilot"] >= 4
    assert "[bench" in stderr, "progress lines go to stderr"


def test_the_full_run_plans_the_issue_17_sizes_and_names():
    """The full run (not run here: minutes) adds the 50,000- and 5,000-pod agent runs, and their
    figures reach the JSON under the names issue 17 asks for; the quick run leaves them out."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    full, quick = run.plan(quick=False), run.plan(quick=True)
    assert {"agent-50k", "agent-5k", "herd"} <= set(full) and not {"agent-50k", "agent-5k", "herd"} & set(quick)

    def arg(argv: list[str], flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert "--poll-check" in full["agent-5k"] and arg(full["agent-50k"], "--pods") == str(run.scaled(50_000, 50))
    assert quick["pipeline"] == full["pipeline"]      # the quick run's pipeline is the full run's measurement
    assert int(arg(full["agent-5k"], "--poll-check")) > 0
    assert "pipeline-burst" not in full and "pipeline-burst" in run.plan(quick=False, burst=True)
    names = set(run.RENAME["agent-50k"].values())
    assert {"agent_relist_50k_s", "agent_relist_410_50k_s", "agent_rss_50k_mb"} <= names
    targets = {key for key, _op, _limit in run.TARGETS}
    assert {"agent_relist_s", "agent_relist_50k_s", "agent_rss_50k_mb", "steady_cost_ratio",
            "herd_recover_polls"} <= targets


def test_herd_formula_prices_the_herds_hooks_with_the_steady_figures():
    """run.py's cross-step check: the herd's hooks and agent CPU against hooks x (hook + update CPU)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    figures = {"herd_hooks_run": 20_000, "herd_cek8s_cpu_s": 210.0, "steady_hook_cpu_ms_20k": 10.0,
               "steady_agent_update_cpu_us_20k": 500.0}
    got = run.herd_formula(figures)
    assert got == {"herd_formula_predicted_cpu_s": 210.0, "herd_formula_error": 0.0}
    assert run.herd_formula({**figures, "herd_cek8s_cpu_s": 231.0})["herd_formula_error"] == 0.1
    assert run.herd_formula({"herd_hooks_run": 1}) == {}       # a quick run has no herd: no figure


def test_the_poll_check_prices_a_poll_in_bare_starts_of_the_same_moment():
    """bench/steady.py's formula check (issue 17): a small agent, a poll over some of its jobs with
    bare starts among the hooks, and the figures the full run's 5,000-pod step reports."""
    env = dict(os.environ, CE_K8S_BENCH_SCALE="0.01")
    env.pop("CE_K8S_SOCKET", None)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_agent.py"), "--pods", "40", "--hook-samples",
                           "0", "--agent-rounds", "1", "--steady", "5", "--poll-check", "24", "--json"],
                          cwd=ROOT, env=env, capture_output=True, timeout=240, start_new_session=True)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    figures = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert figures["steady_poll_hooks_40"] == 24
    assert figures["steady_poll_bare_cpu_ms_40"] > 0 and figures["steady_poll_cpu_s_40"] > 0
    for key in ("steady_formula_error_40", "steady_formula_error_abs_40"):
        assert math.isfinite(figures[key]) and figures[key] > -1.0, (key, figures[key])
