"""One HTCondor per-job history file per finished pilot attempt, for APEL (docs/accounting.md).

Why this format: HTCondor-CE's APEL script (contrib/apelscripts/condor_batch_blah.py) reads the
batch system's `PER_JOB_HISTORY_DIR`: every regular file in it, one job ClassAd per file, through
`condor_q -job FILE -format ...`, and it deletes each file it has turned into a batch and a blah
record (a file it cannot read is moved to `quarantine/`). HTCondor's schedd writes those files in
`WritePerJobHistoryFile` (src/condor_utils/classadHistory.cpp): the ad in long form (`Name = value`
lines, private attributes left out) written to a temporary name, then renamed to
`history.<ClusterId>.<ProcId>` (or `history.<GlobalJobId>` when asked to name by the global id).
With ce-k8s as the LRMS the batch job is one pod, an *attempt*, so the files are named by the
attempt's GlobalJobId, the useGjid form: `history.<GlobalJobId>`.

Guarantees:

* **Atomic**: the ad is written and fsynced under `.ce-k8s/tmp/`, then renamed into the directory.
  Unlike HTCondor, whose temporary `.history.*.tmp` sits in the scanned directory itself, ours is in
  a subdirectory, which the APEL script skips (it takes regular files only): a reader never sees
  half a file, and a crash never leaves one where it looks.
* **Once per attempt**: the APEL script deletes the files it has read, so "the file is there" cannot
  tell a restarted agent whether an attempt was already written. A marker `.ce-k8s/written/<key>`
  is created after the temporary file is complete and before the rename. On a retry: marker and
  temporary file present → the rename was not done, do it; marker alone → done (the file may
  already be consumed); no marker → nothing durable happened, write from scratch. Markers older
  than `keep` seconds are removed (the pod, and with it any chance of a second write, is long gone).
"""

from __future__ import annotations

import logging
import os
import re
import time

import classad2

from ce_k8s.agent.logfmt import fields
from ce_k8s.condor.wire import unparse_old

log = logging.getLogger(__name__)

STATE_DIR = ".ce-k8s"
DEFAULT_KEEP = 30 * 86400
_SAFE = re.compile(r"[^A-Za-z0-9_.#@:+-]")


def file_name(global_job_id: str) -> str:
    """`history.<GlobalJobId>`, with anything that cannot be in a file name replaced by `_`."""
    return "history." + _SAFE.sub("_", global_job_id)


def render(ad: dict[str, object]) -> str:
    """The ad in long form, one `Name = value` line each (what fPrintAd writes), values in the old
    ClassAd syntax; a dict value becomes a nested ad (e.g. `MachineAttrApelSpecs0`)."""
    lines = []
    for name, value in ad.items():
        if value is None:
            continue
        if isinstance(value, dict):
            nested = classad2.ClassAd()
            for k, v in value.items():
                nested[k] = v
            value = nested
        lines.append(f"{name} = {unparse_old(value)}\n")
    return "".join(lines)


class HistoryWriter:
    """Writes attempt ads into a per-job history directory, each exactly once (module docstring)."""

    def __init__(self, directory: str, keep: float = DEFAULT_KEEP) -> None:
        self.directory = directory
        self.keep = keep
        self._tmp = os.path.join(directory, STATE_DIR, "tmp")
        self._marks = os.path.join(directory, STATE_DIR, "written")
        for d in (self._tmp, self._marks):
            os.makedirs(d, mode=0o755, exist_ok=True)
        self.written_count = 0

    def _mark_path(self, key: str) -> str:
        return os.path.join(self._marks, _SAFE.sub("_", key))

    def written(self, key: str) -> bool:
        """Whether the attempt `key` has been written (marker present and no rename left to do)."""
        return os.path.exists(self._mark_path(key)) and not os.path.exists(os.path.join(self._tmp, _SAFE.sub("_", key)))

    def write(self, key: str, ad: dict[str, object]) -> str | None:
        """Write attempt `key`'s ad as `history.<GlobalJobId>`; the path, or None if it was already written.

        Raises OSError when the directory is not writable (the caller logs it and retries later).
        """
        safe = _SAFE.sub("_", key)
        tmp = os.path.join(self._tmp, safe)
        mark = self._mark_path(key)
        final = os.path.join(self.directory, file_name(str(ad.get("GlobalJobId") or key)))
        if os.path.exists(mark):
            if not os.path.exists(tmp):
                return None                     # written before (and perhaps consumed by APEL since)
            os.replace(tmp, final)              # a crash between the marker and the rename: finish it
            self.written_count += 1
            return final
        data = render(ad).encode("utf-8", "replace")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(mark, "w") as f:            # the point of no return: from here on, only the rename
            f.write(f"{final}\n")
        os.replace(tmp, final)
        self._sync_dir()
        self.written_count += 1
        return final

    def _sync_dir(self) -> None:
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def prune(self, now: float | None = None) -> int:
        """Remove markers older than `keep` seconds; how many went."""
        now = time.time() if now is None else now
        removed = 0
        try:
            names = os.listdir(self._marks)
        except OSError:
            return 0
        for name in names:
            path = os.path.join(self._marks, name)
            try:
                if now - os.stat(path).st_mtime > self.keep:
                    os.unlink(path)
                    removed += 1
            except OSError:
                continue
        if removed:
            log.info("%s", fields(event="history-markers-pruned", count=removed, path=self._marks))
        return removed
