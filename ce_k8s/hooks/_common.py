"""What the four hook executables share: bounded stdin, a hard deadline, tiny ad scanning.

Standard library only, and only cheap modules (`posix`, `_signal`, `sys`, `time`): the router
forks one hook per job per poll and never times it out (docs/hook-protocol.md §0, §2.1), so every
import is paid thousands of times a minute and every hang blocks that job for good. Measured
(`-X importtime` and per-process CPU from `wait4`, issue 7): `os` alone adds ~1.1 ms of CPU to a
6.3 ms bare start, `__future__` ~0.15 ms, a shared-library extension such as `_socket` ~0.35 ms;
so the hooks use `posix` instead of `os`, skip `from __future__ import annotations` (Python 3.11
evaluates their annotations without it) and load `_socket` only when they talk to the agent.
"""

import _signal
import posix
import sys

MAX_STDIN = 4 * 1024 * 1024


def log(message: str) -> None:
    """One line to stderr: the router copies hook stderr into the JobRouterLog (hook-protocol.md §2.1)."""
    try:
        posix.write(2, ("ce-k8s: " + message.replace("\n", " ") + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def arm_deadline(seconds: float, exit_code: int) -> None:
    """Exit with `exit_code` (never by a signal) if the hook is still running after `seconds`.

    A hook killed by a signal counts as exit 0 for the router (hook-protocol.md §2.1), which for cleanup means
    "done" although the pod was not deleted; so the alarm handler exits with the hook's own
    failure code instead. The socket calls have their own, shorter deadlines; this is the
    backstop for anything else (a stuck stdin pipe, a slow disk).
    """

    def _expire(_signum, _frame):
        log(f"deadline of {seconds:g}s exceeded")
        posix._exit(exit_code)

    _signal.signal(_signal.SIGALRM, _expire)
    _signal.alarm(max(int(seconds + 0.999), 1) + 1)


def read_stdin() -> bytes | None:
    """All of stdin, or None when it exceeds 4 MiB (refused before anything is parsed)."""
    data = sys.stdin.buffer.read(MAX_STDIN + 1)
    if len(data) > MAX_STDIN:
        log(f"stdin exceeds {MAX_STDIN} bytes; refused")
        return None
    return data


def exit_now(code: int | None) -> None:
    """End the hook with exit status `code` (None = 0) at once; never returns.

    Why not `sys.exit`: the interpreter's teardown (clearing every module, a final garbage
    collection, freeing the heap) costs ~1.1 ms of CPU per process here, a sixth of a bare
    `python -S -c pass`, and a hook has nothing to tear down: its output went straight to the fds
    with `posix.write`, its files and socket are closed by the kernel, and it registers no
    `atexit` handler. Python-level buffers (a stray `print`, a warning) are flushed first, so
    nothing written is lost. The launchers call this; the pip console scripts keep `sys.exit`.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    posix._exit((code or 0) & 0xFF)


def write_stdout(data: bytes) -> None:
    """Write all of `data` to fd 1 (no text-layer buffering surprises at exit)."""
    view = memoryview(data)
    while view:
        view = view[posix.write(1, view):]


def scan_attrs(text: str, names: frozenset[str]) -> dict[str, str]:
    """Raw right-hand sides of the wanted attributes (lower-case names) in sPrintAd text.

    Only the few attributes a hook needs are looked at; nothing is evaluated. The last
    occurrence wins, as with ClassAd Insert.
    """
    found: dict[str, str] = {}
    for line in text.split("\n"):
        name, sep, value = line.partition("=")
        if not sep:
            continue
        key = name.strip().lower()
        if key in names:
            found[key] = value.strip()
    return found


def unquote(raw: str | None) -> str | None:
    """The value of an old-syntax string literal, or None if `raw` is not one.

    In the old ClassAd syntax the router parses, only `\\"` is an escape; backslashes are
    otherwise literal (checked against classad2's old parser).
    """
    if raw is None or len(raw) < 2 or raw[0] != '"' or raw[-1] != '"':
        return None
    return raw[1:-1].replace('\\"', '"')


def to_int(raw: str | None) -> int | None:
    """An integer literal's value, or None (expressions are not evaluated here)."""
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


# -- which routed jobs are ours --------------------------------------------------------------------
# JOB_ROUTER_HOOK_KEYWORD is global, so the router runs these hooks for every routed job on the CE,
# including jobs a site routes to Slurm, PBS or another HTCondor pool. The rule (docs/routes.md,
# "CEs with other backends"): a routed job is a Kubernetes job iff the leading whitespace-separated
# words of its GridResource equal, case-insensitively, the words of CE_K8S_GRID_RESOURCE
# (`batch k8s` by default). Every other job is passed through untouched and never reaches the agent.


def grid_resource_matches(grid_resource: str | None, knob: str) -> bool:
    """Whether `grid_resource` (None = absent) starts with the words of `knob` (the rule above).

    `batch k8s` matches `batch k8s`, `BATCH  K8s` and `batch k8s cluster-b`, not `batch k8sx`,
    `batch slurm` or `k8s`. A knob of no words never matches: it must not claim every job.
    """
    if grid_resource is None:
        return False
    want = knob.lower().split()
    if not want:
        return False
    return grid_resource.lower().split()[:len(want)] == want


def ad_grid_resource(data: bytes) -> str | None:
    """The value of the `GridResource` string attribute of an sPrintAd text, None if it has none.

    Cheap (the update hook runs this for every routed job on every poll): works on the bytes as
    read (`bytes.lower` changes only ASCII, so positions stay aligned), one `find` per occurrence
    of the name, no per-line loop. Only a line `GridResource = "<old-syntax string>"` counts (a
    bare `"` inside the value disqualifies it); of several, the last wins, as with ClassAd Insert.
    A line made by a raw newline inside another attribute's string (sPrintAd writes those raw,
    docs/hook-protocol.md §2.2) does not qualify in practice: its first bare `"` closes that other
    string, and what the ClassAd grammar allows after it is an operator or a delimiter, never the
    first word of a GridResource. (The job's owner would gain nothing anyway: it may talk to the
    agent about its own jobs directly, docs/security.md.)
    """
    low = data.lower()
    found = None
    at = low.find(b"gridresource")
    while at >= 0:
        start = low.rfind(b"\n", 0, at) + 1
        end = low.find(b"\n", at)
        if end < 0:
            end = len(low)
        if not low[start:at].strip():
            name, sep, value = data[start:end].partition(b"=")
            value = value.strip()
            if (sep and name.strip().lower() == b"gridresource" and len(value) >= 2 and value[:1] == b'"'
                    and value[-1:] == b'"' and b'"' not in value[1:-1].replace(b'\\"', b"")):
                found = value[1:-1].replace(b'\\"', b'"').decode("utf-8", "surrogateescape")
        at = low.find(b"gridresource", end)
    return found
