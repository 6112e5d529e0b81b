"""Indexed object store with resourceVersions, a bounded event history and watchers.

Why not kmock's store: it scans every object on every write and its watch ignores
``resourceVersion`` (docs/design.md "kmock 0.8, measured"), so it neither scales to 20,000 pods nor
lets a client resume a watch or see ``410 Gone``. Here objects live in ``resource → namespace →
name`` dicts (O(1) writes), every write takes the next global resourceVersion (etcd's revision),
and each resource keeps a bounded history of events so a watch can resume after a version or be
told that version is too old, exactly the contract of the real watch cache.

Threading rule: all writes happen on the event loop thread of the server (HTTP handlers, the
kubelet simulator and the controllers all run there), so watchers' queues are fed without locks.
Stored objects are never mutated after they are stored (every write stores a new dict), so
readers on other threads (tests) only need the lock to pick up a consistent reference; the public
``get``/``list`` methods return deep copies for them.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from ce_k8s.sim.kube.selectors import make_filter

log = logging.getLogger(__name__)

Obj = dict[str, object]
Pred = Callable[[Mapping[str, object]], bool]


class GoneError(Exception):
    """The requested resourceVersion is older than the retained history (HTTP 410)."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


@dataclass
class WatchEvent:
    """One change of one object, as stored in the history."""

    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None
    rv: int
    _json: dict[str, bytes] = field(default_factory=dict, repr=False)

    def encoded(self, etype: str, obj: Obj) -> bytes:
        """The event line as sent on the wire, encoded once per type and shared by all watchers."""
        line = self._json.get(etype)
        if line is None:
            line = json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"
            self._json[etype] = line
        return line


def _meta(obj: Mapping[str, object]) -> dict[str, object]:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def _owner_uids(obj: Mapping[str, object] | None) -> set[str]:
    if obj is None:
        return set()
    refs = _meta(obj).get("ownerReferences")
    if not isinstance(refs, list):
        return set()
    return {str(r["uid"]) for r in refs if isinstance(r, dict) and r.get("uid")}


class Watcher:
    """One open watch: a namespace/selector filter and a queue of encoded event lines."""

    # A watcher that falls this far behind is closed, as the real server closes slow watchers.
    MAX_BACKLOG = 200_000

    def __init__(self, resource: str, namespace: str | None, pred: Pred | None) -> None:
        self.resource = resource
        self.namespace = namespace
        self.pred = pred
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.overflowed = False

    def _selected(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and _meta(obj).get("namespace") != self.namespace:
            return False
        return self.pred is None or self.pred(obj)

    def translate(self, ev: WatchEvent) -> bytes | None:
        """Map a store event onto what this watcher sees.

        A selector watch sees an object that stops matching as DELETED and one that starts
        matching as ADDED: that is how the real watch cache filters, and the agent relies on it
        (a pod relabelled away from our selector must leave the cache).
        """
        new_ok = ev.type != "DELETED" and self._selected(ev.obj)
        old_ok = self._selected(ev.old) if ev.type != "ADDED" else False
        if ev.type == "DELETED":
            return ev.encoded("DELETED", ev.obj) if self._selected(ev.obj) else None
        if new_ok and old_ok:
            return ev.encoded("MODIFIED", ev.obj)
        if new_ok:
            return ev.encoded("ADDED", ev.obj)
        if old_ok:
            return ev.encoded("DELETED", ev.obj)
        return None

    def offer(self, ev: WatchEvent) -> None:
        """Queue ``ev`` if selected; close the watch if the client is too far behind."""
        if self.overflowed:
            return
        line = self.translate(ev)
        if line is None:
            return
        if self.queue.qsize() >= self.MAX_BACKLOG:
            self.overflowed = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(line)


class Store:
    """Objects by resource/namespace/name with a global resourceVersion and per-resource history."""

    def __init__(self, history_size: int = 10_000) -> None:
        self.lock = threading.RLock()
        self._rv = 0
        self._objs: dict[str, dict[str, dict[str, Obj]]] = {}
        self._counts: dict[str, int] = {}
        self._uids: dict[str, tuple[str, str, str]] = {}
        self._dependents: dict[str, set[tuple[str, str, str]]] = {}
        self._history: dict[str, deque[WatchEvent]] = {}
        self._compacted: dict[str, int] = {}
        self._history_size = history_size
        self._watchers: dict[str, set[Watcher]] = {}
        self._listeners: list[Callable[[str, WatchEvent], None]] = []
        # Container logs: (namespace, pod, container) -> list of (timestamp, stream, line).
        self.logs: dict[tuple[str, str, str], list[tuple[str, str, str]]] = {}

    # ---- versions -------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out (the list resourceVersion)."""
        return self._rv

    def next_rv(self) -> int:
        """Take the next resourceVersion (used for writes and bookmarks)."""
        self._rv += 1
        return self._rv

    # ---- loop-thread reads (no copies; never mutate the result) ---------------------------
    def peek(self, resource: str, namespace: str, name: str) -> Obj | None:
        """The stored object or ``None``. Loop thread only; the dict must not be mutated."""
        return self._objs.get(resource, {}).get(namespace, {}).get(name)

    def peek_list(self, resource: str, namespace: str | None = None) -> Iterator[Obj]:
        """Iterate stored objects of ``resource`` (one namespace or all). Loop thread only."""
        by_ns = self._objs.get(resource, {})
        if namespace is not None:
            yield from list(by_ns.get(namespace, {}).values())
            return
        for ns in list(by_ns):
            yield from list(by_ns.get(ns, {}).values())

    def peek_uid(self, uid: str) -> Obj | None:
        """The object with ``uid``, if it still exists."""
        key = self._uids.get(uid)
        return self.peek(*key) if key else None

    def dependents_of(self, uid: str) -> list[tuple[str, str, str]]:
        """Keys of objects whose ownerReferences name ``uid``."""
        return sorted(self._dependents.get(uid, ()))

    def namespaces_of(self, resource: str) -> list[str]:
        """Namespaces that hold at least one object of ``resource``."""
        return [ns for ns, objs in self._objs.get(resource, {}).items() if objs]

    def count(self, resource: str) -> int:
        """How many objects of ``resource`` are stored."""
        return self._counts.get(resource, 0)

    # ---- thread-safe reads for tests --------------------------------------------------------
    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        """A deep copy of one object (``namespace`` None or "" for cluster-scoped). Any thread."""
        with self.lock:
            obj = self.peek(resource, namespace or "", name)
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, resource: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[Obj]:
        """Deep copies of the matching objects, sorted by namespace and name. Any thread."""
        pred = make_filter(label_selector, field_selector, resource)
        with self.lock:
            objs = list(self.peek_list(resource, namespace))
        objs = [o for o in objs if pred is None or pred(o)]
        objs.sort(key=lambda o: (str(_meta(o).get("namespace", "")), str(_meta(o).get("name", ""))))
        return copy.deepcopy(objs)

    def log_text(self, namespace: str, pod: str, container: str) -> str:
        """The container's log as ``read_namespaced_pod_log`` returns it. Any thread."""
        with self.lock:
            lines = list(self.logs.get((namespace, pod, container), ()))
        return "".join(line for _, _, line in lines)

    # ---- writes (loop thread only) ----------------------------------------------------------
    def put(self, resource: str, obj: Obj, etype: str) -> Obj:
        """Store ``obj`` (a new dict) with the next resourceVersion and notify watchers."""
        meta = _meta(obj)
        ns = str(meta.get("namespace") or "")
        name = str(meta["name"])
        with self.lock:
            rv = self.next_rv()
            meta["resourceVersion"] = str(rv)
            by_name = self._objs.setdefault(resource, {}).setdefault(ns, {})
            old = by_name.get(name)
            by_name[name] = obj
            if old is None:
                self._counts[resource] = self._counts.get(resource, 0) + 1
            uid = meta.get("uid")
            if uid:
                self._uids[str(uid)] = (resource, ns, name)
            self._reindex_owners((resource, ns, name), old, obj)
        self._emit(resource, WatchEvent(etype, obj, old, rv))
        return obj

    def remove(self, resource: str, namespace: str, name: str) -> Obj | None:
        """Delete an object for good; the DELETED event carries it with a fresh resourceVersion."""
        with self.lock:
            by_name = self._objs.get(resource, {}).get(namespace or "", {})
            old = by_name.pop(name, None)
            if old is None:
                return None
            self._counts[resource] -= 1
            rv = self.next_rv()
            final = dict(old)
            final["metadata"] = {**_meta(old), "resourceVersion": str(rv)}
            uid = _meta(old).get("uid")
            if uid:
                self._uids.pop(str(uid), None)
            self._reindex_owners((resource, namespace or "", name), old, None)
            if resource == "pods":
                for key in [k for k in self.logs if k[0] == namespace and k[1] == name]:
                    del self.logs[key]
        self._emit(resource, WatchEvent("DELETED", final, old, rv))
        return final

    def _reindex_owners(self, key: tuple[str, str, str], old: Obj | None, new: Obj | None) -> None:
        before, after = _owner_uids(old), _owner_uids(new)
        for uid in before - after:
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(key)
                if not deps:
                    del self._dependents[uid]
        for uid in after - before:
            self._dependents.setdefault(uid, set()).add(key)

    def _emit(self, resource: str, ev: WatchEvent) -> None:
        hist = self._history.setdefault(resource, deque())
        if len(hist) >= self._history_size:
            dropped = hist.popleft()
            self._compacted[resource] = dropped.rv
        hist.append(ev)
        for w in list(self._watchers.get(resource, ())):
            w.offer(ev)
        for fn in list(self._listeners):
            try:
                fn(resource, ev)
            except Exception:
                log.exception("store listener failed on %s %s", ev.type, resource)

    def compact(self, resource: str) -> int:
        """Forget the retained history of ``resource``, as an etcd compaction does.

        A fresh resourceVersion marks the cut: every version a client holds now is older than
        it, so a watch resumed from one is answered 410 Gone and the client must relist (the
        benchmarks use this to time the agent's relist after a 410). Returns that version.
        """
        with self.lock:
            rv = self.next_rv()
            self._history.pop(resource, None)
            self._compacted[resource] = rv
        return rv

    def end_watches(self, resource: str) -> int:
        """End every open watch of ``resource`` cleanly, as a restarting API server does; the
        clients resume from the last version they saw. Returns how many were ended."""
        watchers = list(self._watchers.get(resource, ()))
        for w in watchers:
            w.queue.put_nowait(None)
        return len(watchers)

    # ---- watch -------------------------------------------------------------------------------
    def add_listener(self, fn: Callable[[str, WatchEvent], None]) -> None:
        """Call ``fn(resource, event)`` after every write (loop thread). It must not write back
        synchronously; schedule follow-up writes with ``loop.call_soon``."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[str, WatchEvent], None]) -> None:
        """Undo :meth:`add_listener`."""
        if fn in self._listeners:
            self._listeners.remove(fn)

    def open_watch(self, resource: str, namespace: str | None, pred: Pred | None,
                   since: int | None) -> Watcher:
        """Register a watcher and pre-fill its queue.

        ``since`` None or 0: synthetic ADDED events for every current object (what the real
        server does for an unset or "0" resourceVersion). Otherwise replay every retained event
        newer than ``since``; raise :class:`GoneError` if some were already dropped.
        """
        w = Watcher(resource, namespace, pred)
        if since:
            compacted = self._compacted.get(resource, 0)
            if since < compacted:
                raise GoneError(since, compacted + 1)
            for ev in self._history.get(resource, ()):
                if ev.rv > since:
                    w.offer(ev)
        else:
            for obj in self.peek_list(resource, namespace):
                if pred is None or pred(obj):
                    w.queue.put_nowait(json.dumps({"type": "ADDED", "object": obj},
                                                  separators=(",", ":")).encode() + b"\n")
        self._watchers.setdefault(resource, set()).add(w)
        return w

    def close_watch(self, w: Watcher) -> None:
        """Unregister a watcher."""
        self._watchers.get(w.resource, set()).discard(w)

    def watcher_count(self) -> int:
        """Open watches (for tests and metrics)."""
        return sum(len(s) for s in self._watchers.values())
