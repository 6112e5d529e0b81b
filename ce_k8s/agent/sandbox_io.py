"""Read the files of a sandbox plan, as the privileged agent, without being tricked by symlinks.

Why this care: the agent runs as root or as the CE's service account and reads pilot proxies and
tokens out of the spool; the spool directories are writable by the job owners. A symlink planted
there must not make the agent copy another user's credentials into a pod (docs/design.md Decision 6).
The plan already checked each path lexically (`ce_k8s.pods.sandbox.check_inside_spool`); here
every path must resolve to itself below the resolved spool root (no symlink anywhere below the
spool, so the lexical check holds for the real file too), and is opened with `O_NOFOLLOW` as a
regular file.
"""

from __future__ import annotations

import os
import posixpath
import stat

from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.sandbox import SandboxItem


def read_sandbox(items: list[SandboxItem], spool: str, max_bytes: int,
                 owner_uid: int | None = None) -> dict[str, bytes]:
    """Contents of every planned file, keyed by the item's key; PodBuildError on any refusal.

    `owner_uid`: the SO_PEERCRED uid of the pilot account that asked (None for root or the agent's
    own uid). Each file must then belong to that account, or to root / the agent: the ad naming
    the files is the caller's own text, so without this check an account could name another
    account's spooled proxy and have the agent copy it into its own pod (tests/hardening).
    """
    trusted = {0, os.geteuid()}
    real_spool = os.path.realpath(spool)
    spool_norm = posixpath.normpath(spool)
    files: dict[str, bytes] = {}
    total = 0
    for item in items:
        path = posixpath.normpath(item.path)
        rel = posixpath.relpath(path, spool_norm)
        if rel.startswith(".."):
            raise PodBuildError("sandbox-path-outside-spool", f"{item.path!r} is not inside {spool}")
        expected = posixpath.join(real_spool, rel)
        resolved = os.path.realpath(path)
        if resolved != expected:
            raise PodBuildError("sandbox-path-outside-spool",
                                f"{item.path!r} goes through a symlink (resolves to {resolved!r})")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise PodBuildError("sandbox-file-missing", f"{item.path!r}: {exc.strerror}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise PodBuildError("sandbox-bad-entry", f"{item.path!r} is not a regular file")
            if owner_uid is not None and st.st_uid != owner_uid and st.st_uid not in trusted:
                raise PodBuildError("sandbox-path-outside-spool",
                                    f"{item.path!r} belongs to uid {st.st_uid}, not to the job's owner")
            total += st.st_size
            if total > max_bytes:
                raise PodBuildError("sandbox-too-large",
                                    f"input files exceed {max_bytes} bytes at {item.path!r}")
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
        files[item.key] = data
    return files
