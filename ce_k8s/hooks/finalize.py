"""JOB_FINALIZE hook: put the pod's stdout/stderr where Condor-C will return them to the factory.

stdin is `sPrintAd(source) + "\\n------\\n" + sPrintAd(routed)` (docs/hook-protocol.md §2.4).
The factory stages out the source job's `Out`/`Err` from the CE spool and treats an empty `.out`
as "CompletedNoOut" (htcondor-ce.md §6.4), so the logs matter. The hook runs as the job owner,
so it writes the files itself (the agent, which owns the Kubernetes credentials, streams the log
bytes over the socket):

* only inside the spool directory the agent reports, with every path component opened with
  `O_NOFOLLOW` relative to its parent, so a symlink planted by the job owner cannot redirect
  the write;
* `Out`/`Err` relative to the source job's `Iwd`, as the schedd resolves them.

The agent saved the log before it reported completion (`ce_k8s/agent/output.py`), so the pod
need not exist any more. If the agent cannot be reached (restarting, overloaded), the call is
retried with back-off until the hook's deadline (`CE_K8S_HOOK_TIMEOUT`).

Another backend's job (the routed ad's `GridResource` does not start with the words of
`CE_K8S_GRID_RESOURCE`, docs/routes.md "CEs with other backends") is not ours: the hook exits 0
at once, writes no file and never asks the agent.

Exit status is always 0: a non-zero exit re-runs the whole pilot (RerouteJob, another pod, hook-protocol.md §2.4),
and a re-run never brings the lost log back; it costs a pilot slot and produces another pilot's
log instead (docs/install.md, "Output return", says why exit 0 is the milder outcome). When the
output cannot be had, the hook still creates an empty `Out` (so stage-out finds a file) and puts a
one-line `ce-k8s:` note into `Err` saying why, unless `Out` already holds output (a repeated
finalize of a job whose output was delivered, see `_note_missing`); every problem is also reported
on stderr (the JobRouterLog).
"""

import posix
import sys
import time

from ce_k8s import protocol
from ce_k8s.hooks._common import (
    ad_grid_resource,
    arm_deadline,
    grid_resource_matches,
    log,
    read_stdin,
    scan_attrs,
    unquote,
)

_SRC_ATTRS = frozenset({"iwd", "out", "err", "clusterid", "procid"})
# Retried agent answers: it may be restarting (connection refused, socket missing), still
# listing pods (`busy`), or hit a transient error. `denied`/`notfound`/`bad` are final.
_RETRY_STATUSES = frozenset({protocol.STATUS_BUSY, protocol.STATUS_ERROR})
FIRST_DELAY = 0.2
MAX_DELAY = 2.0


class UnsafePath(Exception):
    """The target is outside the spool or goes through a symlink."""


# -- paths without `os` ----------------------------------------------------------------------------
# `import os` costs ~1.1 ms of CPU per process (it executes `os`, `stat`, `posixpath` and
# `_collections_abc`), a sixth of a bare interpreter start, and finalize runs once per pilot; what
# it needs of `os.path` is below, built on `posix` (always loaded) and posix's own C normpath.

try:
    from posix import _path_normpath
except ImportError:  # pragma: no cover - CPython 3.11+ on Linux has it
    from posixpath import normpath as _normpath
else:
    def _normpath(path: str) -> str:
        """`os.path.normpath` for str (the C function posixpath itself calls)."""
        return _path_normpath(path) or "."


def _join(a: str, *rest: str) -> str:
    """`os.path.join` for str."""
    path = a
    for b in rest:
        if b.startswith("/"):
            path = b
        elif not path or path.endswith("/"):
            path += b
        else:
            path += "/" + b
    return path


def realpath(path: str) -> str:
    """The spool root with every symlink resolved, as the kernel resolves it; `path` normalised
    when it cannot be opened (then writing below it fails anyway, in `open_in_spool`).

    Why the kernel: the root comes from the agent or the configuration, and what matters is the
    directory `open_in_spool` will really open; `/proc/self/fd` names the directory an `O_PATH`
    descriptor holds, without re-implementing symlink resolution (and without `os`).
    """
    try:
        fd = posix.open(path, posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    except (OSError, ValueError):
        return _normpath(path)
    try:
        resolved = posix.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return _normpath(path)
    finally:
        posix.close(fd)
    return resolved if resolved.startswith("/") else _normpath(path)


def _target(iwd: str | None, name: str | None, root: str) -> list[str] | None:
    """Components below `root` of the file to write, None when the job has no such file."""
    if not name or name == "/dev/null":
        return None
    path = name if name.startswith("/") else _join(iwd or "", name)
    if not path.startswith("/"):
        raise UnsafePath(f"{path!r} is not absolute (Iwd missing?)")
    path = _normpath(path)
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise UnsafePath(f"{path!r} is outside the spool {root!r}")
    parts = path[len(prefix):].split("/")
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(f"{path!r} has an unusable component")
    return parts


def _open_parent(root: str, parts: list[str]) -> int:
    """A descriptor of the directory root/parts[:-1], reached without following any symlink
    below root; the caller closes it."""
    fd = posix.open(root, posix.O_RDONLY | posix.O_DIRECTORY)
    for component in parts[:-1]:
        try:
            nfd = posix.open(component, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            posix.close(fd)
            raise UnsafePath(f"directory {component!r}: {exc.strerror}") from exc
        posix.close(fd)
        fd = nfd
    return fd


def open_in_spool(root: str, parts: list[str], truncate: bool = True) -> int:
    """Open root/parts... for writing (create; truncate unless told not to) without following any
    symlink below root."""
    fd = _open_parent(root, parts)
    try:
        try:
            flags = (posix.O_WRONLY | posix.O_CREAT | posix.O_NOFOLLOW | posix.O_CLOEXEC
                     | (posix.O_TRUNC if truncate else 0))
            return posix.open(parts[-1], flags, 0o644, dir_fd=fd)
        except OSError as exc:
            raise UnsafePath(f"file {parts[-1]!r}: {exc.strerror}") from exc
    finally:
        posix.close(fd)


def _writer(fd: int):
    def sink(chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[posix.write(fd, view):]
    return sink


def _split(text: str) -> tuple[str, str] | None:
    # sPrintAd ends with "\n", so the exact separator is an empty line then dashes (hook-protocol.md §2.4).
    for sep in ("\n\n------\n", "\n------\n"):
        src, found, dest = text.partition(sep)
        if found:
            return src, dest
    return None


def call_with_retries(path: str, payload: bytes, deadline: float, job: str) -> protocol.Reply | None:
    """The agent's `logs` reply, retrying unreachable/busy/error answers until `deadline`; None if
    it never answered usefully. The last ~10% of the time (at most 1 s) is kept for the transfer.
    `protocol.call`, not `protocol.ask` as the other hooks: the reply's parts are the pod's logs,
    streamed into the spool files rather than held in memory."""
    reserve = min(1.0, (deadline - time.monotonic()) * 0.1)
    delay = FIRST_DELAY
    attempt = 0
    while True:
        attempt += 1
        problem = ""
        try:
            reply = protocol.call(path, protocol.VERB_LOGS, payload, deadline)
        except (OSError, protocol.ProtocolError) as exc:
            problem = f"unreachable ({exc})"
        else:
            if reply.status not in _RETRY_STATUSES:
                return reply
            message = reply.message()
            reply.close()
            problem = f"answered {reply.status}: {message}"
        if time.monotonic() + delay >= deadline - reserve:
            log(f"job {job}: agent at {path} {problem}; gave up after {attempt} attempt(s)")
            return None
        time.sleep(delay)
        delay = min(delay * 2, MAX_DELAY)


def _has_output(root: str, parts: list[str]) -> bool:
    """Whether root/parts... is a regular file with at least one byte (checked without following
    a symlink below root, and without opening it: a FIFO planted there cannot block the hook)."""
    try:
        fd = _open_parent(root, parts)
    except (UnsafePath, OSError):
        return False
    try:
        st = posix.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    finally:
        posix.close(fd)
    return st.st_mode & 0o170000 == 0o100000 and st.st_size > 0   # S_ISREG, not empty


def _note_missing(iwd: str | None, out_name: str | None, err_name: str | None, root: str | None,
                  why: str, job: str) -> None:
    """No output to return: create `Out` if it is missing (never truncate) and say why in `Err`.

    Only below the CE spool (`root`, else `protocol.hook_spool()`), with the same no-symlink rule
    as a normal write; when the spool is unknown nothing is written (the JobRouterLog has the
    reason).

    When `Out` already holds output, both files are left alone: the output was delivered. A real
    HTCondor 23.9 router can run finalize a second time for a job it finalized before (it adopts
    the finished routed job again as an orphan, JobRouter.cpp AdoptOrphans); by then the agent
    has dropped its saved copy and answers `notfound`, and the note would overwrite the
    delivered `Err`.
    """
    base = root or protocol.hook_spool()
    if not base:
        return
    base = realpath(base)
    try:
        out_parts = _target(iwd, out_name, base)
    except UnsafePath:
        out_parts = None          # reported by the loop below, as before
    if out_parts is not None and _has_output(base, out_parts):
        log(f"job {job}: {out_name!r} already holds the pilot's output (an earlier finalize delivered it); "
            f"leaving Out and Err as they are ({why})")
        return
    note = f"ce-k8s: the pilot's output could not be returned: {why}\n".encode()
    for name, data in ((out_name, b""), (err_name, note)):
        try:
            parts = _target(iwd, name, base)
            if parts is None:
                continue
            fd = open_in_spool(base, parts, truncate=bool(data))
        except (UnsafePath, OSError) as exc:
            log(f"job {job}: not writing {name!r}: {exc}")
            continue
        try:
            _writer(fd)(data)
        finally:
            posix.close(fd)


def finalize(data: bytes, path: str, timeout: float) -> None:
    """Fetch the pod logs from the agent and write them; raises nothing the caller must handle."""
    deadline = time.monotonic() + timeout
    halves = _split(data.decode("utf-8", "surrogateescape"))
    if halves is None:
        log("stdin has no '------' separator; nothing written")
        return
    routed = halves[1].encode("utf-8", "surrogateescape")
    if not grid_resource_matches(ad_grid_resource(routed), protocol.hook_grid_resource()):
        return
    src = scan_attrs(halves[0], _SRC_ATTRS)
    job = f"{src.get('clusterid', '?')}.{src.get('procid', '?')}"
    iwd, out_name, err_name = (unquote(src.get(k)) for k in ("iwd", "out", "err"))
    if not out_name and not err_name:
        return
    reply = call_with_retries(path, routed, deadline, job)
    if reply is None:
        _note_missing(iwd, out_name, err_name, None, "the ce-k8s agent was unreachable at finalize", job)
        return
    try:
        if reply.status != protocol.STATUS_OK or len(reply.lengths) != 3:
            log(f"job {job}: agent answered {reply.status}: {reply.message()}; pod output not returned")
            if reply.status == protocol.STATUS_NOTFOUND:
                _note_missing(iwd, out_name, err_name, None, "neither the pod nor a saved copy of its log exists",
                              job)
            return
        root = realpath(reply.read_part(0).decode("utf-8", "surrogateescape"))
        targets = []
        for name in (out_name, err_name):
            try:
                targets.append(_target(iwd, name, root))
            except UnsafePath as exc:
                log(f"job {job}: not writing {name!r}: {exc}")
                targets.append(None)
        out_parts = targets[0]
        fds: list[int | None] = [None, None]
        try:
            for i, parts in enumerate(targets):
                if parts is None:
                    continue
                if i == 1 and parts == out_parts and fds[0] is not None:
                    fds[1] = fds[0]          # Out and Err name one file: append stderr to it
                    continue
                try:
                    fds[i] = open_in_spool(root, parts)
                except (UnsafePath, OSError) as exc:
                    log(f"job {job}: not writing {'/'.join(parts)!r}: {exc}")
            for i in (0, 1):
                fd = fds[i]
                reply.read_part(i + 1, sink=_writer(fd) if fd is not None else (lambda _c: None))
        finally:
            for fd in {f for f in fds if f is not None}:
                posix.close(fd)
    except (OSError, protocol.ProtocolError) as exc:
        log(f"job {job}: reading pod output failed: {exc}")
    finally:
        reply.close()


def main() -> int:
    path, timeout = protocol.hook_settings()
    arm_deadline(timeout, 0)
    data = read_stdin()
    if data is not None:
        finalize(data, path, timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
