"""Credential refresh: a proxy or token renewed in the job's spool reaches its running pilot's Secret.

Why: a 48-hour pilot usually starts with a proxy or token that lives 12-24 hours. The factory
renews it over Condor-C and the CE schedd replaces the file in the job's spool directory (new
content, new `x509UserProxyExpiration`). The pod reads its credentials from the per-job Secret
through links in its working directory (`ce_k8s.pods.builder`), and the kubelet swaps a mounted
Secret's files atomically when the Secret changes, so patching the Secret is all it takes for the
running pilot to see the new file (docs/agent.md "Credential refresh").

How, without slowing the update path (tens of µs per update, docs/performance.md):

* On the hot path (`check`, every update of a live pod whose create is done) the agent `lstat`s
  the credential files the routed ad names (`x509userproxy`, `ScitokensFile`) and compares
  (inode, size, mtime, ctime) with what it last put into the Secret: one or two system calls, no
  read, no parse. The schedd writes a refreshed proxy to a new file and renames it over the old
  one, so the inode changes too; an in-place rewrite changes mtime/ctime.
* A difference asks for a refresh at the pod's next turn on the agent's work queue (effects.py:
  never beside the same pod's create or delete). The refresh (`CredentialRefresher`) parses the
  routed ad, plans the sandbox and reads only the credential files exactly as the create did
  (`ce_k8s.agent.sandbox_io.read_sandbox`: inside the job's own spool directory, no symlink, a
  regular file, owned by the caller's account), compares their SHA-256 with what the Secret
  holds, and patches only the changed keys of the Secret.
* A patch that fails is retried with back-off on a later update; a file that cannot be read
  safely is reported and retried later the same way. Nothing here ever deletes or holds a pod:
  an expired credential is the pilot's business (it fails its own way), never our reason to kill.

What the agent knows: never the Secret itself (it never reads Secrets back). After a create it
keeps the SHA-256 of the credentials it put in and the time it read them; after a restart it has
neither, and takes the pod's `creationTimestamp` instead (the Secret was made from a read done just
before the pod's POST). On the first look at a pod, a file last changed before that time is what
the Secret holds: no read, no patch (see `LOCAL_SLACK_S`, `RESTART_MARGIN_S`). The paths come from
the first update this process sees for the pod; the schedd renews a proxy under the same name.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import posixpath
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubernetes.client.exceptions import ApiException

from ce_k8s.agent.logfmt import fields
from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.names import secret_name
from ce_k8s.ratelimit import backoff

if TYPE_CHECKING:
    from collections.abc import Callable

    from kubernetes.client import CoreV1Api

    from ce_k8s.agent.creator import Creator
    from ce_k8s.agent.effects import Effects
    from ce_k8s.agent.metrics import AgentMetrics
    from ce_k8s.agent.routedjob import RoutedJob
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)

# The sandbox roles that are credentials (ce_k8s.pods.sandbox.sandbox_plan): only these are
# refreshed; the executable and the other inputs are read once, at create time.
CREDENTIAL_ROLES = frozenset({"x509", "token"})
# First look at a pod's files: a file last written or replaced (mtime, ctime) before `since` is
# what its Secret holds. After a create in this process, `since` is the time of the read less
# LOCAL_SLACK_S (file times come from the kernel's coarse clock, a few ms behind time.time()).
# After a restart, `since` is the pod's creationTimestamp plus RESTART_MARGIN_S: the read was done
# just before the pod's POST, a renewal seconds after the pod was made would have been seen by the
# agent that made it, and the API server's clock may differ a little from the CE's.
LOCAL_SLACK_S = 0.1
RESTART_MARGIN_S = 2.0
RETRY_BASE_S = 2.0
RETRY_CAP_S = 300.0

Signature = tuple[int, int, int, int] | None


def signature(path: str) -> Signature:
    """(inode, size, mtime ns, ctime ns) of `path` itself (a symlink is not followed), None if absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def changed_after(seen: tuple[Signature, ...], since: float) -> bool:
    """Whether a file was written (mtime) or replaced/chowned (ctime) at `since` or later."""
    limit_ns = int(since * 1e9)
    return any(sig is None or max(sig[2], sig[3]) >= limit_ns for sig in seen)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(slots=True)
class CredentialState:
    """What the agent knows about one pod's credential files (kept on its JobRecord)."""

    paths: tuple[str, ...] | None = None      # the files the routed ad names, absolute
    taken: tuple[Signature, ...] | None = None  # their signatures when the Secret last got them
    digests: dict[str, str] | None = None     # Secret key -> SHA-256 of what the Secret holds
    since: float | None = None                # files unchanged since this time.time() are in the Secret
    busy: bool = False                        # queued or being refreshed
    failures: int = 0                         # consecutive failed refreshes
    next_try: float = 0.0                     # earliest time (the agent's clock) of the next refresh attempt
    refreshes: int = 0                        # Secret patches that carried a new credential


def credential_paths(job: RoutedJob, spool: str) -> tuple[str, ...]:
    """The absolute credential paths the routed ad names (relative ones below `Iwd`), only
    those below the spool: the agent does not even `lstat` a path a caller names elsewhere (a
    `ScitokensFile` outside the spool is the factory's own token, never in the Secret)."""
    iwd = job.iwd
    root = posixpath.normpath(spool) + "/"
    paths = []
    for value in (job.x509userproxy, job.scitokensfile):
        if not value:
            continue
        if not value.startswith("/"):
            if not iwd.startswith("/"):
                continue
            value = posixpath.join(iwd, value)
        value = posixpath.normpath(value)
        if value.startswith(root):
            paths.append(value)
    return tuple(paths)


@dataclass(slots=True)
class _Task:
    """One queued refresh: the job's record, the ad and caller it came with, and the pod's identity."""

    rec: object
    text: str
    uid: int | None
    seen: tuple[Signature, ...]
    pod: str
    namespace: str
    since: float | None      # files unchanged since this time are in the Secret (None: unknown)
    job: str


class CredentialRefresher:
    """The hot-path check, and the refresh that runs at the pod's turn on the agent's work queue
    (effects.py): never beside the same pod's create or delete (module docstring)."""

    def __init__(self, settings: Settings, core: CoreV1Api, effects: Effects, stop: threading.Event,
                 prom: AgentMetrics, metrics: dict[str, int], writer: Creator,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        # The `now` of `check` comes from the agent's clock, so the back-off's `next_try` must too
        # (a test passes its own). The files' times are the kernel's: `since` stays time.time().
        self.clock = clock
        self.core = core
        self.effects = effects
        self.stop = stop
        self.prom = prom
        self.metrics = metrics
        # The creator reads the credential files exactly as a create does, and its `call` and
        # `note_warnings` put the Secret patch under the same budget, metrics and warning notes.
        self.writer = writer
        self._lock = threading.Lock()

    # -- hot path ------------------------------------------------------------------------------

    def check(self, rec, job: RoutedJob, text: str, uid: int | None, pod, now: float) -> None:
        """Queue a refresh when a credential file of this live pod changed since the Secret got it.

        Cost when nothing changed: one `lstat` per credential file and a tuple comparison.
        """
        cs = rec.credentials
        if cs is None:
            cs = rec.credentials = CredentialState()
        if cs.paths is None:
            cs.paths = credential_paths(job, self.settings.spool)
        if not cs.paths:
            return
        seen = tuple(map(signature, cs.paths))
        if seen == cs.taken or cs.busy or now < cs.next_try or None in seen:
            return          # unchanged, already queued, backing off, or a file is gone (nothing to copy)
        since = cs.since if cs.since is not None else (pod.created + RESTART_MARGIN_S if pod.created else None)
        if cs.taken is None and since is not None and not changed_after(seen, since):
            cs.taken = seen     # first look (new pod, or agent restart): the Secret has these files
            return
        with self._lock:
            if cs.busy:
                return
            cs.busy = True
        task = _Task(rec, text, uid, seen, pod.name, pod.namespace, since, rec.reporting.routed_job or "?")
        self.effects.refresh(pod.name, lambda: self._run(task), lambda: self._release(cs))

    def seed(self, rec, built, read_at: float) -> None:
        """After a create: the Secret holds the credential contents `built` carries, read after
        `read_at` (time.time() before the read)."""
        data = (built.secret or {}).get("data") or {}
        digests = {item.key: digest(base64.b64decode(data[item.key])) for item in built.sandbox
                   if item.role in CREDENTIAL_ROLES and item.key in data}
        cs = rec.credentials
        if cs is None:
            cs = rec.credentials = CredentialState()
        cs.digests, cs.taken, cs.since = digests, None, read_at - LOCAL_SLACK_S

    def _release(self, cs: CredentialState) -> None:
        """The queued refresh will not run (the pod's delete took its turn, or the agent stopped):
        the next changed file may be queued again."""
        with self._lock:
            cs.busy = False

    # -- worker --------------------------------------------------------------------------------

    def _run(self, task: _Task) -> None:
        """The pod's turn: refresh, and let the next changed file be queued again."""
        try:
            if not self.stop.is_set():
                self.refresh(task)
        except Exception as exc:
            log.exception("%s", fields(event="credential-refresh-crashed", job=task.job, pod=task.pod,
                                       error=type(exc).__name__))
            self._failed(task, "internal", "internal error (see the agent log)")
        finally:
            task.rec.credentials.busy = False

    def refresh(self, task: _Task) -> bool:
        """Read the job's credential files safely; patch the Secret's changed keys. True if patched."""
        cs: CredentialState = task.rec.credentials
        try:
            files = self.writer.read_credentials(task.text, task.uid)
        except PodBuildError as exc:
            self._failed(task, "read", f"{exc.code}: {exc.message}")
            return False
        if not files:
            cs.taken = task.seen
            return False
        new = {key: digest(data) for key, data in files.items()}
        if cs.digests is None:      # after a restart: the Secret is older than a file that changed
            cs.digests = {} if task.since is None or changed_after(task.seen, task.since) else dict(new)
        changed = {key: data for key, data in files.items() if cs.digests.get(key) != new[key]}
        if not changed:
            cs.taken, cs.failures = task.seen, 0
            return False
        body = {"data": {key: base64.b64encode(data).decode("ascii") for key, data in changed.items()}}
        name = secret_name(task.pod)
        core = self.core
        try:
            resp = self.writer.call("patch secret", core.patch_namespaced_secret, name, task.namespace, body)
        except ApiException as exc:
            if exc.status == 404:
                # The Secret (and so its pod) is gone: nothing left to refresh for this pod.
                cs.taken = task.seen
                log.info("%s", fields(event="credential-refresh-skipped", job=task.job, pod=task.pod,
                                      why="secret not found"))
                return False
            self._failed(task, "api", f"HTTP {exc.status}: {exc.reason}")
            return False
        except Exception as exc:
            self._failed(task, "api", f"{type(exc).__name__}: {str(exc)[:200]}")
            return False
        self.writer.note_warnings(resp, "secrets", task.pod, task.namespace, task.job, task.rec)
        cs.digests.update({key: new[key] for key in changed})
        cs.taken, cs.failures, cs.next_try = task.seen, 0, 0.0
        cs.refreshes += 1
        self.prom.credential_refreshes.inc()
        self.metrics["credentials_refreshed"] += 1
        log.info("%s", fields(event="credential-refreshed", job=task.job, pod=task.pod, namespace=task.namespace,
                              secret=name, keys=",".join(sorted(changed))))
        return True

    def _failed(self, task: _Task, why: str, message: str) -> None:
        cs: CredentialState = task.rec.credentials
        cs.failures += 1
        delay = backoff(cs.failures, base=RETRY_BASE_S, cap=RETRY_CAP_S)
        cs.next_try = self.clock() + delay
        self.prom.credential_failures.labels(why).inc()
        log.warning("%s", fields(event="credential-refresh-failed", job=task.job, pod=task.pod, why=why,
                                 error=message, attempt=cs.failures, retry_s=round(delay, 1)))
