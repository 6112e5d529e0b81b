"""Steady state at size: the CE CPU of *keeping* N running pilots, per pilot per hour (issue 17).

With no starts or ends, what a CE spends on N running pilots is, per polling period, one update
hook process per routed job (the router forks it, docs/hook-protocol.md §8), the agent's answer
to each, and whatever the agent does on its own (watch, bookmarks, GC, usage polls) spread over
the N pilots. Per pilot per hour, at P = 3600 / JOB_ROUTER_POLLING_PERIOD polls an hour:

    cost  = P × (hook CPU + agent CPU per update) + agent idle CPU per hour / N
    floor = P × CPU of a bare `python -S -c pass`        (the process starts the router forces)
    steady_cost_ratio = cost / floor

Each term is measured on the agent holding N pods (`bench_agent.WarmAgent`): hook and bare CPU
from interleaved pairs (RUSAGE_CHILDREN), the agent's CPU per update from a round over jobs it
already knows (/proc/<pid>/stat), its idle CPU from a window with no requests. `one_poll` checks
the formula directly: the update hooks of a poll over that many jobs (2,000 of the 5,000 in
`bench/run.py`), two at a time as two cores allow, with the CPU of every hook and of the agent
summed, against what the formula predicts for that poll. `bench/run.py` checks it once more on
the herd's first poll of 20,000 hooks (`herd_formula_error`).
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import time

from common import BenchError, bare_python_argv, children_cpu, proc_cpu_s, progress, run_wall

POLL_S = 60.0            # the shipped JOB_ROUTER_POLLING_PERIOD (config.d/50-ce-k8s-hooks.conf)


def _hook_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CE_K8S_")}


def hook_and_bare_cpu(warm, pairs: int, seed: int = 5) -> tuple[float, float]:
    """Mean CPU seconds of one update hook and of one bare start, `pairs` interleaved pairs."""
    env = _hook_env()
    bare, hook = bare_python_argv(), [warm.update_hook]
    rng = random.Random(seed)
    run_wall(bare, env=env)
    run_wall(hook, rng.choice(warm.ads), env=env)
    hook_cpu = bare_cpu = 0.0
    for _ in range(pairs):
        c0 = children_cpu()
        run_wall(bare, env=env)
        c1 = children_cpu()
        _dt, rc, _out = run_wall(hook, rng.choice(warm.ads), env=env)
        if rc != 0:
            raise BenchError(f"an update hook exited {rc}")
        hook_cpu += children_cpu() - c1
        bare_cpu += c1 - c0
    return hook_cpu / pairs, bare_cpu / pairs


def agent_update_cpu(warm, count: int) -> float:
    """Agent CPU seconds per update, over `count` updates of jobs it already knows (one client)."""
    from ce_k8s import protocol

    ads = warm.ads[:count]
    cpu0 = proc_cpu_s(warm.agent_pid)
    for payload in ads:
        reply = protocol.call(warm.socket, protocol.VERB_UPDATE, payload, time.monotonic() + 10)
        try:
            reply.read_all()
        finally:
            reply.close()
    return (proc_cpu_s(warm.agent_pid) - cpu0) / len(ads)


def agent_idle_cpu(warm, seconds: float) -> float:
    """Agent CPU seconds per second of wall time with no requests at all."""
    cpu0, t0 = proc_cpu_s(warm.agent_pid), time.monotonic()
    time.sleep(seconds)      # a measurement window, not a synchronisation: nothing is waited for
    return (proc_cpu_s(warm.agent_pid) - cpu0) / (time.monotonic() - t0)


def one_poll(warm, parallel: int = 2, jobs: int | None = None) -> tuple[float, float, int]:
    """The update hook of `jobs` jobs (default every job) once each, `parallel` at a time, as one
    router poll over that many jobs forks them: (CPU of hooks + agent, wall, hooks)."""
    env = _hook_env()
    hook = [warm.update_hook]
    ads = warm.ads if jobs is None else warm.ads[:jobs]
    c0, a0, t0 = children_cpu(), proc_cpu_s(warm.agent_pid), time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        codes = [rc for _dt, rc, _out in pool.map(lambda ad: run_wall(hook, ad, env=env), ads)]
    wall = time.monotonic() - t0
    failed = sum(1 for rc in codes if rc != 0)
    if failed:
        raise BenchError(f"{failed} of {len(codes)} update hooks failed in the poll")
    return children_cpu() - c0 + proc_cpu_s(warm.agent_pid) - a0, wall, len(codes)


def measure(warm, pods: int, *, pairs: int, updates: int, idle_s: float, poll_jobs: int = 0) -> dict[str, float]:
    """The steady-state figures of one size (see the module docstring)."""
    hook_cpu, bare_cpu = hook_and_bare_cpu(warm, pairs)
    update_cpu = agent_update_cpu(warm, min(updates, len(warm.ads)))
    idle = agent_idle_cpu(warm, idle_s)
    polls = 3600.0 / POLL_S
    cost = polls * (hook_cpu + update_cpu) + idle * 3600.0 / pods
    floor = polls * bare_cpu
    out = {
        "steady_hook_cpu_ms": round(hook_cpu * 1e3, 3),
        "steady_bare_cpu_ms": round(bare_cpu * 1e3, 3),
        "steady_agent_update_cpu_us": round(update_cpu * 1e6, 1),
        "steady_agent_idle_cpu_pct": round(idle * 100, 3),
        "steady_cpu_s_per_pilot_hour": round(cost, 4),
        "steady_floor_cpu_s_per_pilot_hour": round(floor, 4),
        "steady_cost_ratio": round(cost / floor, 4),
    }
    progress(f"steady state at {pods} pods: hook {hook_cpu * 1e3:.2f} ms CPU, bare {bare_cpu * 1e3:.2f} ms, agent "
             f"{update_cpu * 1e6:.0f} µs per update, idle {idle * 100:.2f} % of a core: "
             f"{cost:.3f} s per pilot-hour against a floor of {floor:.3f} s, ratio {cost / floor:.3f}")
    if poll_jobs:
        measured, wall, hooks = one_poll(warm, jobs=poll_jobs)
        predicted = hooks * (hook_cpu + update_cpu) + idle * wall
        out.update({"steady_poll_hooks": hooks,
                    "steady_poll_cpu_s": round(measured, 2), "steady_poll_predicted_cpu_s": round(predicted, 2),
                    "steady_poll_wall_s": round(wall, 1),
                    "steady_formula_error": round(measured / predicted - 1.0, 4)})
        progress(f"steady state: a poll of {hooks} update hooks took {measured:.1f} s CPU in {wall:.1f} s; "
                 f"the formula predicts {predicted:.1f} s ({(measured / predicted - 1) * 100:+.1f} %)")
    return out
