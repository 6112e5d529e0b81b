"""The operator's copy of the HTCJobs it watches: what a pass reads instead of GETting its resource.

client-go's listers in small. The watch fills it (a list, then every event), and so does each of
the operator's own writes (a patch answers with the resource as written), so a pass that follows
a write of ours reads that write, not the version before it.

Newer wins: resourceVersions are opaque by the API's contract, but the API server's are etcd's
revisions, integers that only grow, so an event that arrives after a write of ours it predates
does not take the copy back. Where either is not an integer, the later arrival wins. Nothing here
is what keeps a pass safe: a copy may be stale whatever this does, and the pass is written for
that (ce_k8s.htcjob.reconcile: conditional writes, a fresh read before a submit).
"""

from __future__ import annotations

import threading
from typing import Any


def key_of(obj: dict[str, Any]) -> str:
    """namespace/name: the work queue's key for a resource."""
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _older(have: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether `new` is an older version of the resource `have` is (same uid, smaller revision)."""
    if have["metadata"].get("uid") != new["metadata"].get("uid"):
        return False
    mine, theirs = have["metadata"].get("resourceVersion", ""), new["metadata"].get("resourceVersion", "")
    return mine.isdigit() and theirs.isdigit() and int(theirs) < int(mine)


class ObjectCache:
    """key → the newest version seen of that resource. Thread-safe (the watch writes, the worker
    reads and writes)."""

    def __init__(self) -> None:
        self._objs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objs.get(key)

    def put(self, obj: dict[str, Any], *, known_only: bool = False) -> bool:
        """Keep `obj` unless an older version than the one held; with `known_only`, only in place of
        a version of the same resource (a write that answers after its resource's deletion event
        must not bring it back). Whether it was kept."""
        key = key_of(obj)
        meta = obj["metadata"]
        if "managedFields" in meta:      # half of a small resource's bytes, and no pass reads it
            obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        with self._lock:
            have = self._objs.get(key)
            if have is not None and _older(have, obj):
                return False
            if known_only and (have is None or have["metadata"].get("uid") != obj["metadata"].get("uid")):
                return False
            self._objs[key] = obj
            return True

    def drop(self, key: str) -> None:
        with self._lock:
            self._objs.pop(key, None)

    def keep_only(self, keys: set[str]) -> list[str]:
        """After a relist: forget every resource the list no longer has (its deletion event may have
        been missed while the watch was down); the keys forgotten."""
        with self._lock:
            gone = [k for k in self._objs if k not in keys]
            for k in gone:
                del self._objs[k]
            return gone

    def __len__(self) -> int:
        with self._lock:
            return len(self._objs)
