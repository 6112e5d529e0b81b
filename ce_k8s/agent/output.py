"""Pod output saved by the agent before it reports completion, so finalize never depends on the pod.

Why: the finalize hook runs one poll or more after the update that reported `JobStatus = 4`
(docs/hook-protocol.md §2.3, §2.4). By then the pod may be gone (GC, node loss, an admin), the
API server may be unreachable, or the agent may have restarted. So the agent reads the pod's log
once, as soon as the pod has finished and *before* the update hook may report completion, and
keeps it here; `logs` serves it from disk, and cleanup deletes it.

Layout: one agent-owned directory, mode 0700, files 0600 (pilot output can hold tokens a pilot
printed; no other local account may read it). Per pod name `<name>.out`, `<name>.err` and
`<name>.json` (uid, namespace, owner, source job id, whether stdout and stderr were split,
truncation, when it was saved). The `.json` is written last, each file through a temporary name
and `rename`, so a crash leaves either a complete entry or none. Pod names are DNS-1123
(`ce_k8s.pods.names.pod_name`) and are checked again here, so no name can leave the directory.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")


class OutputDirError(OSError):
    """The output directory is unsafe (not ours, a symlink, open to others) or cannot be made."""


@dataclass(frozen=True, slots=True)
class SavedOutput:
    """What was saved for one pod (the `.json` entry)."""

    name: str
    uid: str
    namespace: str
    owner: str
    global_job_id: str
    split: bool              # stdout and stderr came separately (API server with `stream=`)
    truncated: bool          # at least one stream hit CE_K8S_MAX_OUTPUT_BYTES
    lost: str                # non-empty: why no log could be read (pod gone, API refused)
    saved_at: float


def valid_name(name: str) -> bool:
    """A pod name this store accepts: DNS-1123 subdomain characters, no dot-only names."""
    return 0 < len(name) <= 253 and all(c in _NAME_CHARS for c in name) and name.strip(".") == name


class OutputStore:
    """The saved output of finished pods, on disk with an in-memory index of what is there."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._index: dict[str, tuple[str, float]] = {}   # name -> (uid, saved_at) of the saved entry
        self._lock = threading.Lock()
        self._prepare()
        self._load_index()

    def _prepare(self) -> None:
        """Create the directory 0700, or accept an existing one only if it is ours and closed."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            st = os.lstat(self.directory)
        except OSError as exc:
            raise OutputDirError(f"output directory {self.directory}: {exc.strerror}") from exc
        if not stat.S_ISDIR(st.st_mode):
            raise OutputDirError(f"output directory {self.directory} is not a directory (symlink?)")
        if st.st_uid != os.geteuid():
            raise OutputDirError(f"output directory {self.directory} belongs to uid {st.st_uid}, not to the agent")
        if st.st_mode & 0o077:
            os.chmod(self.directory, 0o700)

    def _load_index(self) -> None:
        for entry in os.listdir(self.directory):
            if entry.endswith(".json"):
                meta = self._read_meta(entry[:-5])
                if meta is not None:
                    self._index[meta.name] = (meta.uid, meta.saved_at)

    # -- queries (any thread) --------------------------------------------------------------------

    def has(self, name: str, uid: str | None = None) -> bool:
        """An entry exists for `name` (and for that pod uid, when given)."""
        saved = self._index.get(name)
        return saved is not None and (not uid or not saved[0] or saved[0] == uid)

    def __len__(self) -> int:
        return len(self._index)

    def meta(self, name: str) -> SavedOutput | None:
        return self._read_meta(name) if name in self._index else None

    def load(self, name: str) -> tuple[SavedOutput, bytes, bytes] | None:
        """(entry, stdout, stderr), or None when nothing (readable) is saved for `name`."""
        meta = self.meta(name)
        if meta is None:
            return None
        try:
            return meta, self._read(name + ".out"), self._read(name + ".err")
        except OSError as exc:
            log.warning("output of pod %s unreadable: %s", name, exc)
            return None

    # -- changes ---------------------------------------------------------------------------------

    def save(self, name: str, *, uid: str, namespace: str, owner: str, global_job_id: str, out: bytes,
             err: bytes, split: bool, lost: str = "") -> SavedOutput:
        """Write one pod's output (each stream cut to `max_bytes`), the `.json` last."""
        if not valid_name(name):
            raise ValueError(f"not a pod name: {name!r}")
        truncated = len(out) > self.max_bytes or len(err) > self.max_bytes
        meta = SavedOutput(name=name, uid=uid, namespace=namespace, owner=owner, global_job_id=global_job_id,
                           split=split, truncated=truncated, lost=lost, saved_at=time.time())
        self._write(name + ".out", out[: self.max_bytes])
        self._write(name + ".err", err[: self.max_bytes])
        self._write(name + ".json", json.dumps(_asdict(meta), sort_keys=True).encode())
        with self._lock:
            self._index[name] = (uid, meta.saved_at)
        return meta

    def remove(self, name: str) -> bool:
        """Delete the entry of `name`; True if there was one."""
        if not valid_name(name):
            return False
        with self._lock:
            had = self._index.pop(name, None) is not None
        for suffix in (".json", ".out", ".err"):
            try:
                os.unlink(os.path.join(self.directory, name + suffix))
            except FileNotFoundError:
                pass
        return had

    def prune(self, older_than: float, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Delete entries saved before `older_than` (time.time()) whose name is not in `keep`."""
        gone = []
        for name, (_uid, saved_at) in list(self._index.items()):
            if name not in keep and saved_at < older_than:
                self.remove(name)
                gone.append(name)
        return gone

    # -- files -----------------------------------------------------------------------------------

    def _read_meta(self, name: str) -> SavedOutput | None:
        if not valid_name(name):
            return None
        try:
            doc = json.loads(self._read(name + ".json"))
            return SavedOutput(**{k: doc[k] for k in SavedOutput.__slots__})
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _read(self, entry: str) -> bytes:
        fd = os.open(os.path.join(self.directory, entry), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        finally:
            os.close(fd)

    def _write(self, entry: str, data: bytes) -> None:
        path = os.path.join(self.directory, entry)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)


def _asdict(meta: SavedOutput) -> dict[str, object]:
    return {k: getattr(meta, k) for k in SavedOutput.__slots__}
