"""What every benchmark shares: sizes, progress, percentiles, and the same-run reference figures.

Why a reference taken in the same run: this is a shared 2-core machine whose speed drifts by tens
of percent between minutes. A ratio to `python -S -c pass` measured alongside (interleaved where
possible) survives that drift; an absolute millisecond figure alone does not.
"""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("bench")

ROOT = Path(__file__).resolve().parent.parent          # the source tree (bench/ lives in it)
PYTHON = sys.executable                                # the venv's python when run as documented
SCALE_ENV = "CE_K8S_BENCH_SCALE"
_T0 = time.monotonic()


class BenchError(RuntimeError):
    """A benchmark could not produce its figure (set-up failed, the pipeline stalled, ...)."""


def scale() -> float:
    """Size multiplier from `CE_K8S_BENCH_SCALE` (default 1). Only the smoke test lowers it."""
    raw = os.environ.get(SCALE_ENV, "1")
    try:
        value = float(raw)
    except ValueError as exc:
        raise BenchError(f"{SCALE_ENV}={raw!r} is not a number") from exc
    if not 0 < value <= 10:
        raise BenchError(f"{SCALE_ENV}={raw!r} must be in (0, 10]")
    return value


def scaled(n: int, minimum: int = 1) -> int:
    """`n` times the scale factor, never below `minimum`."""
    return max(minimum, round(n * scale()))


def progress(message: str) -> None:
    """One progress line on stderr (stdout carries only the JSON figures)."""
    sys.stderr.write(f"[bench {time.monotonic() - _T0:7.1f}s] {message}\n")
    sys.stderr.flush()


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        raise BenchError("percentile of no samples")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * p / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def run_wall(argv: Sequence[str], stdin: bytes = b"", env: dict[str, str] | None = None) -> tuple[float, int, bytes]:
    """Start `argv`, feed `stdin`, wait for exit: (wall seconds, exit code, stdout).

    Start to exit is measured the way the router experiences a hook: fork/exec, interpreter
    start, the work, and the reap, with stdin and stdout as pipes.
    """
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, env=env, check=False)
    return time.perf_counter() - t0, proc.returncode, proc.stdout


def bare_python_argv() -> list[str]:
    """The reference process: the venv's interpreter without `site`, doing nothing."""
    return [PYTHON, "-S", "-c", "pass"]


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process reaped so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def self_cpu() -> float:
    """CPU seconds (user + system) of this process, all threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def bare_python_cpu_s(samples: int) -> float:
    """CPU seconds of one bare `python -S -c pass`, from RUSAGE_CHILDREN deltas (mean of `samples`)."""
    argv = bare_python_argv()
    run_wall(argv)                                      # warm the page cache
    before = children_cpu()
    for _ in range(samples):
        run_wall(argv)
    return (children_cpu() - before) / samples


def proc_cpu_s(pid: int) -> float:
    """CPU seconds used so far by a live process (utime + stime from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks      # fields 14 and 15 of stat(5)


def proc_children_cpu_s(pid: int) -> float:
    """CPU seconds of the children a live process has reaped (cutime + cstime from /proc/<pid>/stat):
    the hooks, when a spawner process forks them (they are not our children then)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")   # fields 16 and 17 of stat(5)


def proc_rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident set size of a live process in MiB (VmRSS from /proc/<pid>/status; `VmHWM`: its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    raise BenchError(f"no {field} for pid {pid}")


def cores() -> int:
    """CPUs this process may run on (the pipeline-efficiency denominator's `cores`)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


def bench_env() -> dict[str, str]:
    """The environment for every process the benchmarks start: the source tree importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat.

    Why: this is a shared machine; the busy share that is not ours shows how much of the two
    cores other people's processes took while a figure was measured.
    """
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)       # idle + iowait
    total = sum(fields[:8])                                          # guest time is already in user
    return (total - idle) / ticks, total / ticks


def exit_on_sigterm() -> None:
    """Turn SIGTERM (e.g. from `timeout`) into SystemExit so `finally:` blocks stop the test bed.

    Why: the test bed starts the agent in its own session; a benchmark killed without unwinding
    would leave that agent running.
    """
    import signal

    def _exit(_signum, _frame) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, _exit)


def exit_now(code: int) -> None:
    """End a benchmark process once it has printed its figures and stopped its test bed.

    Why not a normal exit: a benchmark that held 20,000-50,000 cloned jobs and pods spends 10-20 s
    freeing them object by object at interpreter shutdown (measured on the herd: 22 s between its
    last figure and its exit), which only lengthens `bench/run.py`. Everything it started is
    stopped by then and its output is flushed here, so nothing is lost by skipping that.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
