"""Which of a job's spooled files go into its Secret, and where each one comes from.

Why a plan separate from reading: the builder is pure (no I/O), the agent does the reading; the
plan is the contract between them. The agent resolves symlinks (realpath) before reading and calls
`check_inside_spool` again on the resolved path, so a symlink in the spool cannot point the
(privileged) agent at another user's proxy.

Where the files are (docs/hook-protocol.md §2.2, htcondor-ce.md §6.2): Condor-C spools a pilot's
input into `$(SPOOL)/<cluster % 10000>/<proc % 10000>/cluster<C>.proc<P>.subproc0` and the schedd
then points `Iwd` there and rewrites `Cmd` and `TransferInput` to base names; `x509userproxy` holds
the full spool path. An executable copied with `copy_to_spool` lives in
`$(SPOOL)/<cluster % 10000>/cluster<C>.ickpt.subproc0` (spooled_job_files.cpp gen_ckpt_name). We
compute the expected directory from the *source* job id (`RoutedFromJobId`, else `ClusterId` /
`ProcId`) and `CE_K8S_SPOOL`, never from `Iwd` alone: `Iwd` of a job that was not spooled is
whatever the submitter wrote, and must not let one job read another job's credentials.

What is left out, on purpose:
* URLs in `TransferInput` (`https://…`, `osdf://…`, anything with `://`): the pilot fetches them
  itself, exactly as it would on any worker node.
* `ScitokensFile` naming a file outside the spool: it is the factory-side token the gridmanager
  used to authenticate to the CE (htcondor-ce.md §6.1); Condor-C does not transfer it.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.jobad import JobAd

EXECUTABLE_MODE = 0o550   # kubelet adds g+r for fsGroup on read-only volumes; g+x must be ours
FILE_MODE = 0o400         # the Secret's defaultMode; group-readable through fsGroup
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")


@dataclass(frozen=True)
class SandboxItem:
    """One file for the Secret: its key (also its file name in the pod), spool path, mode, role."""

    key: str
    path: str
    mode: int = FILE_MODE
    role: str = "input"   # "executable", "x509", "token" or "input"


def job_spool_dir(ad: JobAd, spool: str) -> str:
    """The source job's spool directory, from RoutedFromJobId (routed ad) or ClusterId/ProcId."""
    cluster, proc = _source_ids(ad)
    return posixpath.join(spool, str(cluster % 10000), str(proc % 10000), f"cluster{cluster}.proc{proc}.subproc0")


def ickpt_path(ad: JobAd, spool: str) -> str:
    """Where `copy_to_spool` puts a cluster's executable (gen_ckpt_name with ICKPT)."""
    cluster, _ = _source_ids(ad)
    return posixpath.join(spool, str(cluster % 10000), f"cluster{cluster}.ickpt.subproc0")


def _source_ids(ad: JobAd) -> tuple[int, int]:
    routed_from = ad.get_str("RoutedFromJobId", code="missing-job-id")
    if routed_from is not None:
        cluster_s, dot, proc_s = routed_from.strip().partition(".")
        if dot and cluster_s.isdigit() and proc_s.isdigit() and cluster_s.isascii() and proc_s.isascii():
            return int(cluster_s), int(proc_s)
        raise PodBuildError("missing-job-id", f"RoutedFromJobId {routed_from[:40]!r} is not <cluster>.<proc>")
    cluster = ad.get_int("ClusterId", code="missing-job-id")
    proc = ad.get_int("ProcId", code="missing-job-id")
    if cluster is None or proc is None or cluster < 0 or proc < 0:
        raise PodBuildError("missing-job-id", "neither RoutedFromJobId nor ClusterId/ProcId is set")
    return cluster, proc


def check_inside_spool(path: str, spool_dir: str, *, what: str, extra_allowed: tuple[str, ...] = ()) -> str:
    """The normalised absolute path, if it names a file strictly inside `spool_dir` (lexically).

    Raises PodBuildError("sandbox-path-outside-spool") otherwise. Callers that have resolved
    symlinks call this again on the resolved path.
    """
    if "\x00" in path:
        raise PodBuildError("sandbox-path-outside-spool", f"{what} path contains a NUL byte")
    norm = posixpath.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    root = posixpath.normpath(spool_dir)
    if norm in extra_allowed or (norm.startswith(root + "/") and norm != root):
        return norm
    raise PodBuildError(
        "sandbox-path-outside-spool", f"{what} {_short(path)} is not inside the job's spool directory {root}"
    )


def _short(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _key_for(path: str, taken: set[str]) -> str:
    """A Secret key from the file's base name: only [-._a-zA-Z0-9], never `.`, never starting
    with `..` (the API server refuses such a key, and the pod's volume item path named after it:
    "must not start with '..'"), unique."""
    base = posixpath.basename(path)
    key = "".join(c if c in _KEY_CHARS else "_" for c in base)[:200] or "file"
    if key == ".":
        key = "_"
    elif key.startswith(".."):
        key = "_" + key[1:]
    candidate, n = key, 2
    while candidate in taken:
        candidate = f"{key}-{n}"
        n += 1
    taken.add(candidate)
    return candidate


def _split_transfer_input(value: str) -> list[str]:
    """`TransferInput` entries: comma-separated, surrounding whitespace dropped (HTCondor StringList)."""
    return [e.strip() for e in value.split(",") if e.strip()]


def sandbox_plan(ad: JobAd, settings) -> list[SandboxItem]:
    """The files of the job that go into its Secret, each checked to lie inside its spool directory."""
    spool_dir = job_spool_dir(ad, settings.spool)
    iwd = ad.get_str("Iwd", code="sandbox-bad-entry") or spool_dir
    items: list[SandboxItem] = []
    seen_paths: set[str] = set()
    taken: set[str] = set()

    def resolve(path: str) -> str:
        return path if path.startswith("/") else posixpath.join(iwd, path)

    def add(path: str, mode: int, role: str, what: str, extra: tuple[str, ...] = ()) -> None:
        norm = check_inside_spool(resolve(path), spool_dir, what=what, extra_allowed=extra)
        if norm in seen_paths:
            return
        seen_paths.add(norm)
        items.append(SandboxItem(_key_for(norm, taken), norm, mode, role))

    transfer_exe = ad.get_bool("TransferExecutable", True, code="missing-executable")
    cmd = ad.get_str("Cmd", code="missing-executable")
    if transfer_exe:
        if not cmd:
            raise PodBuildError("missing-executable", "the job has no Cmd")
        add(cmd, EXECUTABLE_MODE, "executable", "executable", (ickpt_path(ad, settings.spool),))

    proxy = ad.get_str("x509userproxy", code="sandbox-bad-entry")
    if proxy:
        add(proxy, FILE_MODE, "x509", "x509userproxy")

    token = ad.get_str("ScitokensFile", code="sandbox-bad-entry")
    if token:
        candidate = posixpath.normpath(resolve(token))
        if candidate.startswith(posixpath.normpath(spool_dir) + "/"):
            add(token, FILE_MODE, "token", "ScitokensFile")
        # else: the factory-side authentication token; not transferred by Condor-C (module doc)

    # HTCondor's attribute is TransferInput (ATTR_TRANSFER_INPUT_FILES); TransferInputFiles is the
    # spelling of the htcondor-ce.md §6.3 composite, accepted so such ads are not silently short.
    transfer_input = ad.get_str("TransferInput", code="sandbox-bad-entry")
    if transfer_input is None:
        transfer_input = ad.get_str("TransferInputFiles", code="sandbox-bad-entry")
    for entry in _split_transfer_input(transfer_input or ""):
        if "://" in entry:
            continue  # a URL: the pilot fetches it itself
        if entry.endswith("/"):
            raise PodBuildError(
                "sandbox-bad-entry", f"TransferInput entry {_short(entry)} is a directory; only files are supported"
            )
        add(entry, FILE_MODE, "input", "TransferInput entry")
    return items
