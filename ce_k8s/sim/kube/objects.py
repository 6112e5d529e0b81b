"""Helpers on stored objects, which are JSON documents: a fast deep copy, metadata, timestamps,
conditions.

Why a module of their own: the API's verbs (api.py), its admission step (api_admission.py), its
built-in controllers (api_controllers.py) and the kubelet simulator all read and stamp objects the
same way, and none of them should have to import another to do it. api.py re-exports them, where
the rest of the emulator has always found them.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping
from typing import Any

TERMINAL_PHASES = ("Succeeded", "Failed")
SCALARS = frozenset({str, int, float, bool, type(None)})


def clone(obj: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, scalars); anything else goes to deepcopy.

    Why not ``copy.deepcopy`` everywhere: every kubelet status change copies a whole ~6 KB pod, and
    deepcopy's memo bookkeeping made that the API emulator's largest cost after HTTP in the
    pipeline benchmark (docs/performance.md). Stored objects are JSON documents with no shared
    sub-objects that matter, so a structural copy gives the same result several times faster.
    """
    t = type(obj)
    if t is dict:
        return {k: v if type(v) in SCALARS else clone(v) for k, v in obj.items()}
    if t is list:
        return [v if type(v) in SCALARS else clone(v) for v in obj]
    if t in SCALARS:
        return obj
    return copy.deepcopy(obj)


def now_iso(offset_s: float = 0.0) -> str:
    """RFC 3339 UTC timestamp with second precision, as metadata timestamps are."""
    t = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset_s)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def meta_of(obj: Mapping[str, object]) -> dict[str, object]:
    """``obj["metadata"]`` (an empty dict when absent)."""
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def set_condition(status: dict[str, object], ctype: str, cstatus: str, reason: str | None = None,
                  message: str | None = None) -> None:
    """Set a condition, keeping ``lastTransitionTime`` when the status does not change."""
    conds = status.setdefault("conditions", [])
    assert isinstance(conds, list)
    now = now_iso()
    for c in conds:
        if c.get("type") == ctype:
            if c.get("status") != cstatus:
                c["lastTransitionTime"] = now
            c["status"] = cstatus
            c["lastProbeTime"] = None
            for k, val in (("reason", reason), ("message", message)):
                if val is None:
                    c.pop(k, None)
                else:
                    c[k] = val
            return
    cond: dict[str, object] = {"type": ctype, "status": cstatus, "lastProbeTime": None, "lastTransitionTime": now}
    if reason is not None:
        cond["reason"] = reason
    if message is not None:
        cond["message"] = message
    conds.append(cond)
