"""The pod names this CE has POSTed, kept on disk so a restarted agent knows which attempts had a pod.

Why (docs/reliability.md, F1): "exactly one pod per attempt" (docs/design.md Decision 5) needs proof that
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

The same file remembers the pods a cleanup **released** instead of deleting (docs/agent.md,
"Released pods"): the router cleans a routed job up whenever a status push to the schedd fails
(HTCondor 23.9 JobRouter.cpp:2380-2427, UpdateRoutedJobStatus), then yields the source job, which
is routed again under the next attempt's pod name. A live pod of such a job is kept for
`CE_K8S_RELEASE_GRACE` seconds so the re-routed job can adopt it. An agent restart in between must
not forget that the pod is released (its GC would otherwise never delete it) nor which new name a
re-routed job was told to drop (its update would create a second pod).

Format: one line per event, ``<unix time> <kind> <pod name> [<argument>]``:

| kind | argument | meaning |
|---|---|---|
| `P` | | a create of the pod was sent (posted) |
| `X` | | the server refused that create: nothing was stored |
| `D` | | done: cleanup ended the routed job; the name's posts, release and aliases are forgotten |
| `R` | source `GlobalJobId` | released at this time (a later `R` renews it) |
| `A` | alias pod name | adopted: no longer released, and the never-created `alias` stands for this pod |
| `U` | | no longer released (an update named it again, or the GC deleted it) |

Each line is one `write(2)` on an `O_APPEND` descriptor, so a SIGKILL loses at most the line being
written and never tears another; no fsync, because the failure this guards against is the agent
dying, not the host (a host crash also restarts the router, which re-reads its job queue). Lines
older than `keep` seconds, and names marked done, are dropped when the file is rewritten at start
and whenever it has grown to several times its live content; the rewrite keeps every live post,
alias and release (with its own time: the release grace counts from it). The file lives in the
agent's 0700 output directory (output.py), next to the saved pod logs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from ce_k8s.agent.logfmt import fields

log = logging.getLogger(__name__)

FILE_NAME = "posted.journal"
DEFAULT_KEEP = 7 * 86400      # a routed job idle this long has long been held or removed by the router
POSTED, REFUSED, DONE = "P", "X", "D"
RELEASED, ADOPTED, UNRELEASED = "R", "A", "U"
_THREE = frozenset({POSTED, REFUSED, DONE, UNRELEASED})     # kinds whose line has no argument
_FOUR = frozenset({RELEASED, ADOPTED})
_MAX_NAME = 253
_MAX_GJID = 1024
_COMPACT_MIN_LINES = 10_000


def _valid_name(name: str) -> bool:
    """Pod names are DNS subdomains: a line with anything else is damage, not a name."""
    return 0 < len(name) <= _MAX_NAME and all((c.isalnum() and c.isascii()) or c in "-." for c in name)


def valid_global_job_id(gjid: str) -> bool:
    """A GlobalJobId (`schedd#cluster.proc#time`) fits one journal field: printable ASCII, no space."""
    return 0 < len(gjid) <= _MAX_GJID and all(33 <= ord(c) < 127 for c in gjid)


class PostJournal:
    """Which pod names an agent process of this CE has sent a create for, which pods a cleanup
    released and which never-created names stand for an adopted pod, across restarts."""

    def __init__(self, directory: str, keep: float = DEFAULT_KEEP, now: float | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self.clock = clock                       # the time of each line; a test passes its own
        self.keep = keep
        self._posted: dict[str, float] = {}      # name -> time of its POST
        self._released: dict[str, tuple[str, float]] = {}   # name -> (source GlobalJobId, last release)
        self._by_gjid: dict[str, set[str]] = {}  # source GlobalJobId -> released names (adoption lookup)
        self._aliases: dict[str, tuple[str, float]] = {}    # never-created name -> (adopted pod, when)
        self._targets: dict[str, set[str]] = {}  # adopted pod -> its aliases (cleanup forgets both)
        self._lock = threading.Lock()
        self._lines = 0                          # lines in the file now
        self._fd = -1
        self._load(clock() if now is None else now)
        self._rewrite()

    # -- queries --------------------------------------------------------------------------------

    def posted(self, name: str) -> bool:
        """A create was sent for `name` and not proven refused: the pod may have existed."""
        return name in self._posted

    def __len__(self) -> int:
        return len(self._posted)

    def released_at(self, name: str) -> float | None:
        """When `name` was last released (cleanup kept it for a re-route), or None if it is not."""
        entry = self._released.get(name)
        return entry[1] if entry is not None else None

    def released(self) -> dict[str, tuple[str, float]]:
        """A copy of every release: name -> (source GlobalJobId, time of the last release)."""
        with self._lock:
            return dict(self._released)

    def released_for(self, gjid: str) -> list[str]:
        """The released pod names of one source job (usually none, at most one)."""
        with self._lock:
            return sorted(self._by_gjid.get(gjid, ()))

    def alias_of(self, name: str) -> str | None:
        """The pod a re-routed job was told to use instead of the never-created `name`, if any."""
        entry = self._aliases.get(name)
        return entry[0] if entry is not None else None

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
            if name in self._posted or name in self._released or self._aliased(name):
                self._append(DONE, name, lambda now, n=name: self._forget(n))

    def record_release(self, name: str, gjid: str) -> None:
        """Cleanup kept the live pod `name` of source job `gjid` for a re-route (renews the grace)."""
        self._append(RELEASED, name, lambda now: self._set_released(name, gjid, now), gjid)

    def record_adopt(self, name: str, alias: str) -> None:
        """A re-routed job named `alias` (never created) was given the released pod `name` instead."""
        def apply(now: float) -> None:
            self._unrelease(name)
            self._set_alias(alias, name, now)
        self._append(ADOPTED, name, apply, alias)

    def record_unreleased(self, name: str) -> None:
        """`name` is no longer released: an update named it again, or the GC deleted it."""
        if name in self._released:
            self._append(UNRELEASED, name, lambda now: self._unrelease(name))

    def prune(self, now: float | None = None) -> None:
        """Forget entries older than `keep`; rewrite the file when it is mostly dead lines (GC loop)."""
        now = self.clock() if now is None else now
        with self._lock:
            for name in [n for n, t in self._posted.items() if now - t > self.keep]:
                del self._posted[name]
            for name in [n for n, (_, t) in self._aliases.items() if now - t > self.keep]:
                self._drop_alias(name)
            for name in [n for n, (_, t) in self._released.items() if now - t > self.keep]:
                self._unrelease(name)          # the GC ends releases long before; this is a backstop
            big = self._lines > max(_COMPACT_MIN_LINES, 4 * self._live())
        if big:
            self._rewrite()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # -- the memory copy (callers hold the lock) ---------------------------------------------------

    def _live(self) -> int:
        return len(self._posted) + len(self._released) + len(self._aliases)

    def _aliased(self, name: str) -> bool:
        return name in self._aliases or name in self._targets

    def _set_alias(self, alias: str, target: str, when: float) -> None:
        self._drop_alias(alias)
        self._aliases[alias] = (target, when)
        self._targets.setdefault(target, set()).add(alias)

    def _drop_alias(self, alias: str) -> None:
        entry = self._aliases.pop(alias, None)
        if entry is not None:
            aliases = self._targets.get(entry[0])
            if aliases is not None:
                aliases.discard(alias)
                if not aliases:
                    del self._targets[entry[0]]

    def _set_released(self, name: str, gjid: str, when: float) -> None:
        self._unrelease(name)
        self._released[name] = (gjid, when)
        self._by_gjid.setdefault(gjid, set()).add(name)

    def _unrelease(self, name: str) -> None:
        entry = self._released.pop(name, None)
        if entry is not None:
            names = self._by_gjid.get(entry[0])
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_gjid[entry[0]]

    def _forget(self, name: str) -> None:
        self._posted.pop(name, None)
        self._unrelease(name)
        self._drop_alias(name)
        for alias in list(self._targets.get(name, ())):
            self._drop_alias(alias)

    def _apply_line(self, kind: str, name: str, arg: str, when: float, now: float) -> None:
        """Replay one journal line into the memory copy (load)."""
        if kind == POSTED:
            if now - when <= self.keep:
                self._posted[name] = when
        elif kind == REFUSED:
            self._posted.pop(name, None)
        elif kind == DONE:
            self._forget(name)
        elif kind == RELEASED:
            if now - when <= self.keep:
                self._set_released(name, arg, when)
        elif kind == ADOPTED:
            self._unrelease(name)
            if now - when <= self.keep:
                self._set_alias(arg, name, when)
        elif kind == UNRELEASED:
            self._unrelease(name)

    # -- the file -------------------------------------------------------------------------------

    def _append(self, kind: str, name: str, apply, arg: str | None = None) -> None:
        now = self.clock()
        line = (f"{now:.3f} {kind} {name}\n" if arg is None else f"{now:.3f} {kind} {name} {arg}\n").encode()
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
                kind = parts[1] if len(parts) >= 2 else ""
                if not raw.endswith(b"\n") or not _well_formed(kind, parts):
                    bad += 1          # a torn last line after a SIGKILL, or damage: skip it
                    continue
                try:
                    when = float(parts[0])
                except ValueError:
                    bad += 1
                    continue
                self._apply_line(kind, parts[2], parts[3] if len(parts) == 4 else "", when, now)
        if bad:
            log.warning("%s", fields(event="journal-lines-skipped", path=self.path, lines=bad))
        log.info("%s", fields(event="journal-loaded", path=self.path, posted=len(self._posted),
                              released=len(self._released), aliases=len(self._aliases)))

    def _rewrite(self) -> None:
        """Write the live entries to a new file and switch to it (rename is atomic)."""
        tmp = self.path + ".new"
        with self._lock:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    # Aliases before releases: replaying `A` un-releases its pod, so a pod released
                    # again after an adoption must have its `R` line after the `A` line.
                    lines = [f"{t:.3f} {POSTED} {n}\n" for n, t in self._posted.items()]
                    lines += [f"{t:.3f} {ADOPTED} {n} {alias}\n" for alias, (n, t) in self._aliases.items()]
                    lines += [f"{t:.3f} {RELEASED} {n} {g}\n" for n, (g, t) in self._released.items()]
                    f.write("".join(lines).encode())
                os.replace(tmp, self.path)
                new_fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                log.warning("%s", fields(event="journal-unwritable", path=self.path, error=exc.strerror))
                return
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = new_fd
            self._lines = self._live()


def _well_formed(kind: str, parts: list[str]) -> bool:
    """A line of a known kind with the right fields: pod names, and a GlobalJobId after `R`."""
    if kind in _THREE:
        return len(parts) == 3 and _valid_name(parts[2])
    if kind in _FOUR:
        if len(parts) != 4 or not _valid_name(parts[2]):
            return False
        return valid_global_job_id(parts[3]) if kind == RELEASED else _valid_name(parts[3])
    return False
