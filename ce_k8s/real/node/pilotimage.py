"""The pilot image: Debian's HTCondor 25.14.1 and ce-k8s's pilot entry point, as an OCI archive.

    ce-k8s.invalid/pilot:25.14.1   (PILOT_IMAGE; docs/pilot.md, "The image")

There is no registry here, so the image is built as the node's other images are
(:func:`ce_k8s.real.node.noderuntime.write_oci_image`, one layer), from the root the real-HTCondor
bed already builds (`ce_k8s.real.condor.condor.build_root`: debootstrap sid + `condor`): the same
HTCondor as the CE's. What a startd pilot does not need is left out:

* documentation, man pages, info, translations, lintian and bash-completion data (the packages'
  `copyright` files stay: the image is a redistribution of them);
* apt's caches and lists, logs, `/var/lib/condor`, `/var/tmp`;
* the daemons only a central manager, a CE or a submit host runs (`CE_ONLY`): collector,
  negotiator, schedd, shadow, gridmanager, job router, ... (the startd, starter, master, procd and
  every client tool stay);
* everything the bed writes into the root: its configuration (`/etc/condor/config.d`), its pool
  signing key and tokens, the package's host key and CA key, the snakeoil key, the bed's accounts
  (`/etc/passwd` and `/etc/group` are rewritten: the system accounts, and `pilot`, uid 1000),
  `/etc/shadow`, the host's resolv.conf, hostname and hosts (the kubelet mounts its own), and any
  directory that is another filesystem (the bed's bind mounts, if it is up).

Every file is readable by everyone (the pilot runs as uid 1000 under the restricted profile) and
no file keeps a setuid or setgid bit (no_new_privs makes them inert; they are removed anyway).
Hard links stay hard links; symlinks stay symlinks.

The archive is cached in the node cache's `images/` (`CACHE`, beside the node runtimes), named by
a key of the root's marker (its content and its mtime: a rebuilt root rebuilds the image), this
module's source (the recipe) and the entry point's sources. A warm call reads the marker and the
entry point's few files and stats the archive.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ce_k8s.real.node.noderuntime import (
    CACHE,
    DEFAULT_PATH,
    IMAGE_REGISTRY,
    PILOT_UID,
    LayerEntry,
    NodeBuildError,
    write_oci_image,
)

HTCONDOR_VERSION = "25.14.1"
PILOT_IMAGE = f"{IMAGE_REGISTRY}/pilot:{HTCONDOR_VERSION}"
PACKAGE = Path(__file__).resolve().parents[2] / "pilot"     # ce_k8s/pilot, copied into the image
LIB = "opt/ce-k8s/lib"
LAUNCHER = "usr/local/bin/ce-k8s-pilot"
HOME = "home/pilot"
#: Top-level entries of the root the image takes (merged /usr: bin, sbin, lib* are symlinks).
TOP = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "var")
#: Dropped with everything under them.
DROP = frozenset({
    "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian", "usr/share/linda",
    "usr/share/bash-completion", "usr/share/bug", "usr/share/doc-base", "usr/libexec/ce-k8s",
    "var/cache", "var/log", "var/tmp", "var/lib/apt/lists", "var/lib/condor", "var/spool/condor",
    "var/lib/dpkg/info-old",
    "etc/condor/config.d", "etc/condor/passwords.d", "etc/condor/tokens.d", "etc/ssl/private",
    "etc/shadow", "etc/shadow-", "etc/gshadow", "etc/gshadow-", "etc/passwd-", "etc/group-",
    "etc/resolv.conf", "etc/hostname", "etc/hosts", "etc/machine-id",
    "etc/passwd", "etc/group",          # rewritten below
})
#: Daemons a startd-only pilot never runs (a CE's, a central manager's, a submit host's).
CE_ONLY = frozenset(f"usr/sbin/{d}" for d in (
    "condor_collector", "condor_negotiator", "condor_schedd", "condor_shadow", "condor_gridmanager",
    "condor_c-gahp", "condor_c-gahp_worker_thread", "condor_had", "condor_replication", "condor_credd",
    "condor_credmon_krb", "condor_credmon_oauth", "condor_credmon_vault", "condor_librarian")) | frozenset(
    f"usr/libexec/condor/{d}" for d in (
        "condor_job_router", "condor_defrag", "condor_rooster", "condor_gangliad", "condor_transferer",
        "accountant_log_fixer", "adstash", "annex", "condor_annex", "condor_credmon_oauth.wsgi", "credmon"))
#: Empty directories the image adds (mode).
ADD_DIRS = {"tmp": 0o1777, "var/tmp": 0o1777, "var/log": 0o755, "var/cache": 0o755, "proc": 0o555,
            "sys": 0o555, "dev": 0o755, "run": 0o755, "root": 0o700, "home": 0o755, "ce-k8s": 0o755}
LAUNCHER_TEXT = """#!/usr/bin/python3 -I
# ce-k8s pilot entry point (ce_k8s/pilot/entrypoint.py; docs/pilot.md)
import sys
sys.dont_write_bytecode = True
sys.path.insert(0, "/opt/ce-k8s/lib")
from ce_k8s.pilot.entrypoint import main
raise SystemExit(main())
"""


@dataclass(frozen=True)
class PilotImage:
    """A built pilot archive and what its build measured."""

    archive: Path
    name: str
    digest: str
    size: int
    build_seconds: float    # what the build took (read from the stamp on a warm call)
    files: int
    dropped_setid: int
    warm: bool = False      # found in the cache, not built by this call

    def as_dict(self) -> dict[str, object]:
        return {"archive": str(self.archive), "name": self.name, "digest": self.digest, "size": self.size,
                "build_seconds": self.build_seconds, "files": self.files, "dropped_setid": self.dropped_setid,
                "warm": self.warm}


def _dropped(rel: str) -> bool:
    if rel in CE_ONLY:
        return True
    parts = rel.split("/")
    if any("/".join(parts[:i]) in DROP for i in range(1, len(parts) + 1)):
        return True
    # keep only the copyright files of /usr/share/doc
    if rel.startswith("usr/share/doc/") and len(parts) > 4 and parts[-1] != "copyright":
        return True
    # the package's host and CA keys and certificates: generated per host, never shipped
    return rel.startswith("etc/condor/") and rel.endswith(".pem")


def _mounts() -> set[str]:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            return {line.split()[1].replace("\\040", " ") for line in fh}
    except OSError:
        return set()


def _walk(root: Path) -> Iterator[str]:
    """Relative paths under the root's TOP entries, sorted, not crossing into other filesystems."""
    dev = root.stat().st_dev
    mounts = _mounts()

    def walk(rel: str) -> Iterator[str]:
        path = root / rel
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode) and (st.st_dev != dev or str(path) in mounts):
            return
        yield rel
        if stat.S_ISDIR(st.st_mode):
            for name in sorted(os.listdir(path)):
                child = f"{rel}/{name}"
                if not _dropped(child):
                    yield from walk(child)

    for top in TOP:
        if os.path.lexists(root / top) and not _dropped(top):
            yield from walk(top)


def _accounts(root: Path) -> dict[str, bytes]:
    """/etc/passwd and /etc/group: the root's system accounts (ids below 1000, and nobody/nogroup),
    then `pilot` (PILOT_UID), whose home is in the image and its own."""
    def system(path: Path) -> list[str]:
        keep = []
        for line in path.read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 3 and fields[2].isdigit() and (int(fields[2]) < 1000 or int(fields[2]) == 65534):
                keep.append(line)
        return keep

    passwd = [*system(root / "etc/passwd"), f"pilot:x:{PILOT_UID}:{PILOT_UID}:ce-k8s pilot:/{HOME}:/bin/sh"]
    group = [*system(root / "etc/group"), f"pilot:x:{PILOT_UID}:"]
    return {"etc/passwd": ("\n".join(passwd) + "\n").encode(), "etc/group": ("\n".join(group) + "\n").encode()}


def _info(name: str, kind: bytes, mode: int, uid: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid = kind, mode, uid, uid
    return info


def layer_entries(root: Path) -> tuple[list[LayerEntry], int]:
    """The image's entries from `root`, sorted by path, and how many setuid/setgid bits were dropped."""
    entries: dict[str, LayerEntry] = {}
    first_of_inode: dict[tuple[int, int], str] = {}
    dropped_setid = 0
    for rel in _walk(root):
        path = root / rel
        st = path.lstat()
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            entries[rel] = (_info(rel, tarfile.DIRTYPE, mode | 0o555), None)
        elif stat.S_ISLNK(st.st_mode):
            info = _info(rel, tarfile.SYMTYPE, 0o777)
            info.linkname = os.readlink(path)
            entries[rel] = (info, None)
        elif stat.S_ISREG(st.st_mode):
            if mode & (stat.S_ISUID | stat.S_ISGID):
                dropped_setid += 1
            mode = (mode & ~(stat.S_ISUID | stat.S_ISGID)) | 0o444
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key in first_of_inode:
                info = _info(rel, tarfile.LNKTYPE, mode)
                info.linkname = first_of_inode[key]
                entries[rel] = (info, None)
                continue
            first_of_inode[key] = rel
            info = _info(rel, tarfile.REGTYPE, mode)
            info.size = st.st_size
            entries[rel] = (info, path)
        # devices, fifos, sockets: none belongs in an image
    for rel, mode in ADD_DIRS.items():
        entries.setdefault(rel, (_info(rel, tarfile.DIRTYPE, mode), None))
        entries[rel][0].mode = mode
    entries[HOME] = (_info(HOME, tarfile.DIRTYPE, 0o755, PILOT_UID), None)
    for rel, data in _accounts(root).items():
        entries[rel] = (_info(rel, tarfile.REGTYPE, 0o644), data)
    for d in ("opt", "opt/ce-k8s", LIB, f"{LIB}/ce_k8s", f"{LIB}/ce_k8s/pilot", "usr/local", "usr/local/bin"):
        entries.setdefault(d, (_info(d, tarfile.DIRTYPE, 0o755), None))
    entries[f"{LIB}/ce_k8s/__init__.py"] = (_info(f"{LIB}/ce_k8s/__init__.py", tarfile.REGTYPE, 0o644), b"")
    for src in sorted(PACKAGE.glob("*.py")):
        rel = f"{LIB}/ce_k8s/pilot/{src.name}"
        entries[rel] = (_info(rel, tarfile.REGTYPE, 0o644), src.read_bytes())
    entries[LAUNCHER] = (_info(LAUNCHER, tarfile.REGTYPE, 0o755), LAUNCHER_TEXT.encode())
    return [entries[k] for k in sorted(entries)], dropped_setid


def image_config() -> dict[str, object]:
    """The OCI config: the pilot's numeric user (the kubelet checks runAsNonRoot without reading
    /etc/passwd), its home, and the entry point as Cmd (a pod's `command` replaces it)."""
    return {"User": f"{PILOT_UID}:{PILOT_UID}", "WorkingDir": f"/{HOME}", "Cmd": [f"/{LAUNCHER}"],
            "Env": [DEFAULT_PATH, "LANG=C.UTF-8", f"HOME=/{HOME}"],
            "Labels": {"org.opencontainers.image.title": "ce-k8s pilot",
                       "org.opencontainers.image.version": HTCONDOR_VERSION}}


def cache_key(root: Path) -> str:
    """The root's marker (content and mtime), the recipe (this module's source) and the entry point's sources."""
    marker = root / ".ce-k8s-root"
    try:
        st = marker.stat()
        text = marker.read_bytes()
    except OSError:
        raise NodeBuildError(f"{root} has no {marker.name}: build the HTCondor root first "
                             "(ce_k8s.real.condor.condor.build_root, `ce-k8s testbed real-condor up`)") from None
    version = json.loads(text).get("version")
    if version != HTCONDOR_VERSION:
        raise NodeBuildError(f"{root} holds HTCondor {version}, not the pilot's {HTCONDOR_VERSION}")
    h = hashlib.sha256(text + str(st.st_mtime_ns).encode() + Path(__file__).read_bytes())   # the recipe: this file
    for src in sorted(PACKAGE.glob("*.py")):
        h.update(src.name.encode() + src.read_bytes())
    h.update(LAUNCHER_TEXT.encode())
    return h.hexdigest()[:12]


def default_root() -> Path:
    from ce_k8s.real.condor.condor import default_root as condor_root  # the bed's cached sid root
    return condor_root("25")


def build(root: Path | None = None, cache: Path = CACHE, progress: Callable[[str], None] = print) -> PilotImage:
    """The pilot archive for `root` (the bed's sid root by default), built once per key."""
    root = Path(root) if root is not None else default_root()
    images = cache / "images"
    archive = images / f"pilot-{HTCONDOR_VERSION}-{cache_key(root)}.oci.tar"
    stamp = archive.with_suffix(".json")
    if archive.exists() and stamp.exists():
        return PilotImage(archive=archive, warm=True, **json.loads(stamp.read_text()))
    images.mkdir(parents=True, exist_ok=True)
    with open(images / "pilot.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists() and stamp.exists():
            return PilotImage(archive=archive, warm=True, **json.loads(stamp.read_text()))
        started = time.monotonic()
        progress(f"building {PILOT_IMAGE} from {root}")
        entries, dropped_setid = layer_entries(root)
        # level 6: a third of level 9's time on a root this size, a few per cent bigger
        digest = write_oci_image(archive, PILOT_IMAGE, entries, image_config(), compresslevel=6)
        built = {"name": PILOT_IMAGE, "digest": digest, "size": archive.stat().st_size,
                 "files": sum(1 for info, _ in entries if info.isreg()), "dropped_setid": dropped_setid}
        seconds = round(time.monotonic() - started, 1)
        stamp.write_text(json.dumps({**built, "build_seconds": seconds}) + "\n")
        for old in images.glob("pilot-*.oci.tar"):
            if old != archive:
                old.unlink(missing_ok=True)
                old.with_suffix(".json").unlink(missing_ok=True)
        progress(f"{PILOT_IMAGE}: {built['size'] / 1e6:.0f} MB, {built['files']} files, in {seconds} s: {archive}")
        return PilotImage(archive=archive, build_seconds=seconds, **built)
