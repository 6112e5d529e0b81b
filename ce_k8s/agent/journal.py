"""The pod names this CE has POSTed, kept on disk so a restarted agent knows which attempts had a pod.

Why (docs/reliability.md, F1): "exactly one pod per attempt" (DESIGN decision 5) needs proof that
an attempt's pod existed before the agent may move the job to the next attempt. A pod that is
created, then evicted and deleted while no agent process watches leaves no tombstone, no
`K8sPodUid` in the routed ad, and, if it went before the scheduler wrote anything, no Event either.
Only the process that sent the POST knew, and a SIGKILL takes its memory. So the creator writes a
line here *before* every real POST and another one after an answer that proves the pod was not made;
a fresh agent that finds a name posted and the pod absent counts the attempt as over instead of
creating the same attempt's pod a second time.

A POST whose answer was lost (connection dropped, timeout) stays "posted": it may have been
applied. Counting it as an attempt can skip one attempt number when the request never arrived;
the other choice runs the same attempt twice, which is what this journal exists to prevent.

Format: one line per event, ``<unix time> <P|X|D> <pod name>``: posted, refused (the server answered
with an error, nothing was stored), done (cleanup: the routed job is finished with the name). Each
line is one `write(2)` on an `O_APPEND` descriptor, so a SIGKILL loses at most the line being
written and never tears another; no fsync, because the failure this guards against is the agent
dying, not the host (a host crash also restarts the router, which re-reads its job queue). Lines
older than `keep` seconds, and names marked done, are dropped when the file is rewritten at start
and whenever it has grown to several times its live content. The file lives in the agent's 0700
output directory (output.py), next to the saved pod logs.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ce_k8s.agent.logfmt import fields

log = logging.getLogger(__name__)

FILE_NAME = "posted.journal"
DEFAULT_KEEP = 7 * 86400      # a routed job idle this long has long been held or removed by the router
POSTED, REFUSED, DONE = "P", "X", "D"
_MAX_NAME = 253
_COMPACT_MIN_LINES = 10_000


def _valid_name(name: str) -> bool:
    """Pod names are DNS subdomains: a line with anything else is damage, not a name."""
    return 0 < len(name) <= _MAX_NAME and all((c.isalnum() and c.isascii()) or c in "-." for c in name)


class PostJournal:
    """Which pod names an agent process of this CE has sent a create for, across restarts."""

    def __init__(self, directory: str, keep: float = DEFAULT_KEEP, now: float | None = None) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self.keep = keep
        self._posted: dict[str, float] = {}      # name -> time of its POST
        self._lock = threading.Lock()
        self._lines = 0                          # lines in the file now
        self._fd = -1
        self._load(time.time() if now is None else now)
        self._rewrite()

    # -- queries --------------------------------------------------------------------------------

    def posted(self, name: str) -> bool:
        """A create was sent for `name` and not proven refused: the pod may have existed."""
        return name in self._posted

    def __len__(self) -> int:
        return len(self._posted)

    # -- events ---------------------------------------------------------------------------------

    def record_post(self, name: str) -> None:
        """Before the POST of `name` leaves this process (a crash right after must not forget it)."""
        self._append(POSTED, name, lambda now: self._posted.__setitem__(name, now))

    def record_refused(self, name: str) -> None:
        """The server answered the POST with an error: nothing of this name was stored."""
        if name in self._posted:
            self._append(REFUSED, name, lambda now: self._posted.pop(name, None))

    def record_done(self, names: list[str]) -> None:
        """Cleanup: the routed job will not name these pods again; their history can go."""
        for name in names:
            if name in self._posted:
                self._append(DONE, name, lambda now, n=name: self._posted.pop(n, None))

    def prune(self, now: float | None = None) -> None:
        """Forget posts older than `keep`; rewrite the file when it is mostly dead lines (GC loop)."""
        now = time.time() if now is None else now
        with self._lock:
            for name in [n for n, t in self._posted.items() if now - t > self.keep]:
                del self._posted[name]
            big = self._lines > max(_COMPACT_MIN_LINES, 4 * len(self._posted))
        if big:
            self._rewrite()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # -- the file -------------------------------------------------------------------------------

    def _append(self, kind: str, name: str, apply) -> None:
        now = time.time()
        line = f"{now:.3f} {kind} {name}\n".encode()
        with self._lock:
            apply(now)
            if self._fd < 0:
                return
            try:
                os.write(self._fd, line)
                self._lines += 1
            except OSError as exc:
                # The memory copy still protects this process; only a restart would forget.
                log.warning("%s", fields(event="journal-write-failed", pod=name, path=self.path, error=exc.strerror))

    def _load(self, now: float) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("%s", fields(event="journal-unreadable", path=self.path, error=exc.strerror))
            return
        bad = 0
        with os.fdopen(fd, "rb") as f:
            for raw in f:
                parts = raw.decode("ascii", "replace").split()
                if (not raw.endswith(b"\n") or len(parts) != 3 or parts[1] not in (POSTED, REFUSED, DONE)
                        or not _valid_name(parts[2])):
                    bad += 1          # a torn last line after a SIGKILL, or damage: skip it
                    continue
                try:
                    when = float(parts[0])
                except ValueError:
                    bad += 1
                    continue
                if parts[1] == POSTED:
                    if now - when <= self.keep:
                        self._posted[parts[2]] = when
                else:
                    self._posted.pop(parts[2], None)
        if bad:
            log.warning("%s", fields(event="journal-lines-skipped", path=self.path, lines=bad))
        log.info("%s", fields(event="journal-loaded", path=self.path, posted=len(self._posted)))

    def _rewrite(self) -> None:
        """Write the live entries to a new file and switch to it (rename is atomic)."""
        tmp = self.path + ".new"
        with self._lock:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(b"".join(f"{t:.3f} {POSTED} {n}\n".encode() for n, t in self._posted.items()))
                os.replace(tmp, self.path)
                new_fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                log.warning("%s", fields(event="journal-unwritable", path=self.path, error=exc.strerror))
                return
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = new_fd
            self._lines = len(self._posted)
