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
`bench/run.py`), two at a time as two cores allow, with a bare start after every fourth hook; the
CPU of every hook and of the agent is summed and priced in the bare starts of that same poll
(`steady_formula_error`), against the formula's (hook + agent per update) ÷ bare from the pairs.
The plain seconds are compared too (`steady_formula_error_abs`), but the machine's speed moves
between the pairs and the poll. `bench/run.py` checks the formula once more, in seconds, on the
herd's 20,000 hooks (`herd_formula_error`).
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
        protocol.ask(warm.socket, protocol.VERB_UPDATE, payload, 10)
    return (proc_cpu_s(warm.agent_pid) - cpu0) / len(ads)


def agent_idle_cpu(warm, seconds: float) -> float:
    """Agent CPU seconds per second of wall time with no requests at all."""
    cpu0, t0 = proc_cpu_s(warm.agent_pid), time.monotonic()
    time.sleep(seconds)      # a measurement window, not a synchronisation: nothing is waited for
    return (proc_cpu_s(warm.agent_pid) - cpu0) / (time.monotonic() - t0)


def process_cpu(argv: list[str], stdin: bytes, env: dict[str, str]) -> tuple[float, int]:
    """CPU seconds and exit status of one process, from its own `wait4` rusage.

    Why not RUSAGE_CHILDREN: the poll runs two processes at a time, and this check needs the CPU
    of the hooks and of the bare starts among them apart. Stdin is written to a pipe before the
    start (a routed ad is far below the pipe's 64 KiB), stdout and stderr go to /dev/null.
    """
    r, w = os.pipe()
    try:
        os.write(w, stdin)
    finally:
        os.close(w)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        pid = os.posix_spawn(argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, r, 0), (os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2)])
    finally:
        os.close(r)
        os.close(null)
    _pid, status, usage = os.wait4(pid, 0)
    return usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status)


def one_poll(warm, parallel: int = 2, jobs: int | None = None, bare_every: int = 4) -> dict[str, float]:
    """The update hooks of a poll over `jobs` jobs (default every job), `parallel` at a time as two
    cores allow, with a bare start after every `bare_every` hooks in the same stream.

    The bare starts measured inside the poll put the poll's cost in bare-start units, which is what
    the formula predicts: a machine whose speed drifts between the interleaved pairs and the poll
    (seen: a bare start of 7.4 ms in one minute and 8.5 ms in the next) moves both alike.
    """
    env = _hook_env()
    hook, bare = [warm.update_hook], bare_python_argv()
    ads = warm.ads if jobs is None else warm.ads[:jobs]
    tasks = []
    for i, ad in enumerate(ads):
        tasks.append((hook, ad))
        if (i + 1) % bare_every == 0:
            tasks.append((bare, b""))
    a0, t0 = proc_cpu_s(warm.agent_pid), time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        done = list(pool.map(lambda task: (task[0] is bare, *process_cpu(task[0], task[1], env)), tasks))
    wall = time.monotonic() - t0
    agent = proc_cpu_s(warm.agent_pid) - a0
    failed = sum(1 for is_bare, _cpu, rc in done if rc != 0)
    if failed:
        raise BenchError(f"{failed} of {len(done)} processes failed in the poll")
    hooks = [cpu for is_bare, cpu, _rc in done if not is_bare]
    bares = [cpu for is_bare, cpu, _rc in done if is_bare]
    return {"hooks": len(hooks), "hooks_cpu": sum(hooks), "bare_cpu": sum(bares) / len(bares),
            "agent_cpu": agent, "wall": wall}


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
        poll = one_poll(warm, jobs=poll_jobs)
        hooks, wall = poll["hooks"], poll["wall"]
        measured = poll["hooks_cpu"] + poll["agent_cpu"]
        predicted = hooks * (hook_cpu + update_cpu) + idle * wall
        # per hook, in bare starts of the same moment: measured in the poll, predicted from the pairs
        measured_units = (measured - idle * wall) / hooks / poll["bare_cpu"]
        predicted_units = (hook_cpu + update_cpu) / bare_cpu
        out.update({"steady_poll_hooks": hooks,
                    "steady_poll_cpu_s": round(measured, 2), "steady_poll_predicted_cpu_s": round(predicted, 2),
                    "steady_poll_wall_s": round(wall, 1),
                    "steady_poll_bare_cpu_ms": round(poll["bare_cpu"] * 1e3, 3),
                    "steady_formula_error_abs": round(measured / predicted - 1.0, 4),
                    "steady_formula_error": round(measured_units / predicted_units - 1.0, 4)})
        progress(f"steady state: a poll of {hooks} update hooks took {measured:.1f} s CPU in {wall:.1f} s; "
                 f"the formula predicts {predicted:.1f} s ({(measured / predicted - 1) * 100:+.1f} %); in bare "
                 f"starts of the same moment ({poll['bare_cpu'] * 1e3:.2f} ms in the poll, {bare_cpu * 1e3:.2f} ms "
                 f"in the pairs) {measured_units:.3f} per hook against {predicted_units:.3f} "
                 f"({(measured_units / predicted_units - 1) * 100:+.1f} %)")
    return out
