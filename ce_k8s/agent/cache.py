"""One LIST+WATCH of our pods, kept as compact summaries (docs/design.md Decision 3).

The watch resumes from the last resourceVersion it saw (events or bookmarks) when the stream
ends or breaks, and relists only when the server says the version is too old (410 Gone), which
is what client-go's reflector does. Pods the watch sees deleted are remembered as "gone" with
their final state, so the status mapping can tell an eviction from a deletion.

Evidence of a disruption is sticky: once any event or LIST showed a pod's `DisruptionTarget`
condition, the pod's summary keeps it for the rest of its life and into its tombstone, even if a
later object lacks it (a status write from a stale copy, or an eviction whose first trace this
process sees is the DELETED event itself, which is handled by reading that event's object). An
eviction must never be mistaken for an out-of-band deletion: that would hold a pilot which
should simply run again (docs/holds.md).

The raw JSON is decoded straight into the few fields the agent reads (`ce_k8s.agent.podschema`,
msgspec) and summarised immediately (`PodInfo`): the kubernetes client's model deserialisation
costs ~0.1 ms per pod (docs/design.md "kmock 0.8, measured"), full objects would not fit the
memory budget at 50,000 pods, and a plain `json.loads` of every field was half of a relist's time
(docs/performance.md "Fast relist").
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import threading
import time
from collections.abc import Callable

import msgspec
from kubernetes.client.exceptions import ApiException

from ce_k8s.agent import podschema
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.ratelimit import backoff

log = logging.getLogger(__name__)

LIST_PAGE = 500


class GoneError(Exception):
    """The server no longer has the resourceVersion we asked for (HTTP 410)."""


class PodCache:
    """Thread-safe view of our pods by name, fed by a background LIST+WATCH thread."""

    def __init__(self, core_api, label_selector: str, *, watch_timeout: int = 300,
                 request_timeout: float = 30.0) -> None:
        self.api = core_api
        self.selector = label_selector
        self.watch_timeout = watch_timeout
        self.request_timeout = request_timeout
        self.pods: dict[str, PodInfo] = {}
        self.gone: dict[str, tuple[PodInfo, float]] = {}
        self.resource_version: str | None = None
        self.ready = threading.Event()
        self.lists = 0          # how many full LISTs were done (tests and metrics)
        self.watches = 0        # how many WATCH requests were opened
        self.listeners: list = []   # callables(name) run after every change, on the watch thread
        self.last_event = 0.0       # time.time() of the last watch event, bookmark or LIST (cache age)
        self.disrupted: dict[str, tuple[str, str, int | None]] = {}  # pod name -> (uid, reason, when) seen
        # on_error(verb, exc): every failed LIST/WATCH request (the agent's API error metric)
        self.on_error: Callable[[str, BaseException], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp = None
        self._lock = threading.Lock()

    # -- reading (any thread) ----------------------------------------------------------------------

    def get(self, name: str) -> PodInfo | None:
        return self.pods.get(name)

    def get_gone(self, name: str) -> PodInfo | None:
        entry = self.gone.get(name)
        return entry[0] if entry else None

    def forget_gone(self, older_than: float) -> None:
        """Drop tombstones recorded before `older_than` (time.time())."""
        with self._lock:
            for name in [n for n, (_, t) in self.gone.items() if t < older_than]:
                del self.gone[name]
                if name not in self.pods:
                    self.disrupted.pop(name, None)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ce-k8s-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            # Closing the response does not wake the watch thread blocked reading its socket, and a
            # real API server sends nothing on a quiet WATCH until its timeout (300 s): shut the
            # socket down first so the read returns now (tests/real/test_watch.py).
            try:
                resp.shutdown()     # urllib3 >= 2.3: shuts the socket down under a blocked read
            except (AttributeError, ValueError, RuntimeError, OSError):   # an older urllib3, or closed already
                pass
            try:
                resp.close()
            except Exception:  # noqa: S110 - closing a dead connection may fail; we are stopping anyway
                pass
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self.relist()
                self.watch_once()
                failures = 0
            except GoneError as exc:
                log.info("%s", fields(event="watch-expired", rv=self.resource_version, action="relist"))
                self._error("watch", exc)
                self.resource_version = None
            except Exception as exc:  # network errors, 5xx, timeouts: resume from the last version
                if self._stop.is_set():
                    break
                failures += 1
                self._error("list" if self.resource_version is None else "watch", exc)
                delay = backoff(failures, base=0.2, cap=10.0)
                log.warning("%s", fields(event="watch-failed", error=_short(exc), retry_s=round(delay, 1),
                                         rv=self.resource_version))
                self._stop.wait(delay)

    def _error(self, verb: str, exc: BaseException) -> None:
        if self.on_error is not None:
            try:
                self.on_error(verb, exc)
            except Exception:  # noqa: S110 - a metrics hiccup must never stop the watch
                pass

    # -- LIST --------------------------------------------------------------------------------------

    def relist(self) -> None:
        """Replace the cache with a fresh LIST (paged); see `_relist`. The cyclic GC is paused
        meanwhile: a LIST allocates only acyclic objects (decoded pages, summaries), and at
        50,000 pods the collections it triggered walked every job record of the agent again and
        again (docs/performance.md "Fast relist"). Anything cyclic other threads drop meanwhile
        waits for the next collection."""
        paused = gc.isenabled()
        gc.disable()
        try:
            self._relist()
        finally:
            if paused:
                gc.enable()

    def _relist(self) -> None:
        """Replace the cache with a fresh LIST (paged).

        Each page is summarised as it arrives, so the full pod objects of only one page are in
        memory at a time (20,000 pods of ~6 KB JSON would otherwise peak at several hundred MB).
        The next page is requested as soon as this one's `continue` token is read, before its
        pods are summarised: the server prepares page k+1 while we decode page k (on the API
        server's own machine in production, on the other core here), which keeps the relist
        at the speed of the slower side instead of the sum of both (docs/performance.md).
        """
        fresh: dict[str, PodInfo] = {}
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ce-k8s-list") as pool:
            cont: str | None = None
            pending = pool.submit(self._list_page, None)
            while True:
                try:
                    data = pending.result()
                except ApiException as exc:
                    if exc.status == 410 and cont:
                        fresh, cont = {}, None   # the continue token expired: start over
                        pending = pool.submit(self._list_page, None)
                        continue
                    raise
                meta = podschema.LIST_META.decode(data).metadata or podschema.ListMeta()
                cont = meta.continue_
                if cont:
                    pending = pool.submit(self._list_page, cont)
                for item in podschema.POD_LIST.decode(data).items or ():
                    info = self._sticky(PodInfo.from_pod(item))
                    if info.name:
                        fresh[info.name] = info
                del data
                if not cont:
                    rv = meta.resource_version or ""
                    break
                if self._stop.is_set():
                    # Stopping mid-LIST: nothing of it is kept (the cache only ever holds a
                    # complete LIST), and the next start lists again from the beginning.
                    pending.cancel()
                    log.info("%s", fields(event="relist-abandoned", pods_read=len(fresh)))
                    return
        with self._lock:
            # Pods that vanished between two LISTs get no tombstone: their last state here may
            # predate an eviction we never saw, so their fate is unknown (status.py handles that).
            for name in fresh:
                self.gone.pop(name, None)
            for name in [n for n in self.disrupted if n not in fresh and n not in self.gone]:
                del self.disrupted[name]
            self.pods = fresh
            self.resource_version = rv
            self.last_event = time.time()
        self.lists += 1
        self.ready.set()
        log.info("%s", fields(event="relisted", pods=len(fresh), rv=rv))
        for listener in self.listeners:
            listener(None)

    def _list_page(self, cont: str | None) -> bytes:
        """One page of our pods, as the raw JSON body."""
        kwargs = {"label_selector": self.selector, "limit": LIST_PAGE, "_preload_content": False,
                  "_request_timeout": self.request_timeout}
        if cont:
            kwargs["_continue"] = cont
        return self.api.list_pod_for_all_namespaces(**kwargs).data

    # -- WATCH -------------------------------------------------------------------------------------

    def watch_once(self) -> None:
        """One WATCH request from `resource_version`, until the server or `stop` ends it."""
        try:
            resp = self.api.list_pod_for_all_namespaces(
                label_selector=self.selector, watch=True, resource_version=self.resource_version,
                allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout, _preload_content=False,
                _request_timeout=(self.request_timeout, self.watch_timeout + self.request_timeout))
        except ApiException as exc:
            if exc.status == 410:
                raise GoneError() from exc
            raise
        self.watches += 1
        self._resp = resp
        try:
            if self._stop.is_set():     # `stop` ran before `_resp` was set: it could not close it
                return
            buf = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                if self._stop.is_set():
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        self.apply_line(line)
            if buf.strip():
                self.apply_line(buf)
        finally:
            self._resp = None
            try:
                resp.release_conn()
            except Exception:  # noqa: S110 - best effort
                pass

    def apply_line(self, line: bytes) -> None:
        """Apply one line of a WATCH stream (one JSON event) to the cache."""
        self._apply(podschema.EVENT.decode(line))

    def _apply(self, event: podschema.WatchEvent) -> None:
        kind = event.type
        raw = event.object
        if kind == "ERROR":
            obj = podschema.ANY.decode(raw) if raw else {}
            obj = obj if isinstance(obj, dict) else {}
            if obj.get("code") == 410:
                raise GoneError()
            raise RuntimeError(f"watch error event: {obj.get('message') or obj}")
        pod = podschema.POD.decode(raw) if raw else podschema.Pod()
        rv = pod.metadata.resource_version if pod.metadata is not None else None
        self.last_event = time.time()
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        info = self._sticky(PodInfo.from_pod(pod))
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(info.name, None)
                self.gone[info.name] = (info, time.time())
            elif kind in ("ADDED", "MODIFIED"):
                self.pods[info.name] = info
                self.gone.pop(info.name, None)
            if rv:
                self.resource_version = rv
        for listener in self.listeners:
            listener(info.name)

    # -- direct updates from our own API calls -----------------------------------------------------

    def observe(self, pod: dict) -> None:
        """Record a pod our own create/read returned, unless the watch already has a newer one.

        Why: the reply to the next update hook should not depend on how fast the watch event
        arrives. Versions are compared as integers when both are numeric (etcd revisions);
        otherwise the watch's copy wins. A reply about a pod the watch has already reported
        DELETED (its tombstone has the same uid) is older than that event and is dropped: it would
        bring a deleted pod back, which no event would ever remove, and the GC would delete it
        again on every pass (a cleanup that overtook the create; docs/agent.md "Deleting a pod once").
        """
        info = self._sticky(PodInfo.from_dict(pod))
        if not info.name:
            return
        with self._lock:
            gone = self.gone.get(info.name)
            if gone is not None and info.uid and gone[0].uid == info.uid:
                return
            cur = self.pods.get(info.name)
            if cur is None or _newer(info.resource_version, cur.resource_version):
                self.pods[info.name] = info
                self.gone.pop(info.name, None)


    def _sticky(self, info: PodInfo) -> PodInfo:
        """`info` with the DisruptionTarget evidence any earlier object of this pod showed."""
        if info.disruption:
            if self.disrupted.get(info.name) != (info.uid, info.disruption, info.disruption_at):
                self.disrupted[info.name] = (info.uid, info.disruption, info.disruption_at)
            return info
        seen = self.disrupted.get(info.name) if self.disrupted else None
        if seen is None or seen[0] != info.uid:      # another pod that reuses the name: no evidence
            return info
        return msgspec.structs.replace(info, disruption=seen[1], disruption_at=seen[2])


def _newer(a: str, b: str) -> bool:
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return False


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 300 else text[:297] + "..."
