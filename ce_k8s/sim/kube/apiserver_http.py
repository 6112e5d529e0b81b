"""The HTTP plumbing every handler of the emulated API server shares: routes, JSON answers, query
parameters.

Why a module of its own: the router (apiserver.py) and the handlers it dispatches to
(apiserver_resources.py, apiserver_kubelet.py) all answer the same way, and none of them should
import another for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec
from aiohttp import web

from ce_k8s.sim.kube.errors import ApiError, bad_request
from ce_k8s.sim.kube.resources import ResourceInfo

MAX_BODY = 3 * 1024 * 1024
PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


@dataclass
class Route:
    """A parsed resource URL."""

    info: ResourceInfo
    namespace: str | None
    name: str | None
    sub: str | None
    watch_path: bool


def reply(body: object, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A JSON answer."""
    return web.Response(body=encode(body), status=status, content_type="application/json", headers=headers)


def encode(body: object) -> bytes:
    """Compact JSON of a reply body.

    Why msgspec: a 500-pod LIST page is ~3 MB of JSON, and the stdlib encoder spent a core-second
    per 20,000 pods on it, on the two cores the client under test shares with the emulator. The
    stdlib stays as the fallback for anything msgspec will not encode.
    """
    try:
        return msgspec.json.encode(body)
    except (TypeError, ValueError, OverflowError):
        return json.dumps(body, separators=(",", ":")).encode()


def error_reply(e: ApiError) -> web.Response:
    """The Status answer of an error."""
    return reply(e.status(), e.code, e.headers)


def int_param(q: Mapping[str, str], key: str) -> int | None:
    """An integer query parameter (None when absent or empty; 400 when not an integer)."""
    raw = q.get(key)
    if raw in (None, ""):
        return None
    try:
        return int(str(raw))
    except ValueError as e:
        raise bad_request(f"invalid {key} {raw!r}: must be an integer") from e


def flag(q: Mapping[str, str], key: str) -> bool:
    """A boolean query parameter: "true" or "1"."""
    return str(q.get(key, "")).lower() in ("true", "1")
