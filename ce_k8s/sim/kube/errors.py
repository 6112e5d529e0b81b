"""API errors as the real server reports them: a ``Status`` object with code, reason and message.

Clients (the official client, kubectl, our agent) branch on ``code`` and ``reason``; their
messages end up in hold reasons and logs. The constructors here produce the exact message shapes
of ``k8s.io/apimachinery/pkg/api/errors`` so tests of the agent see what production sees.
"""

from __future__ import annotations

from collections.abc import Mapping


class ApiError(Exception):
    """An HTTP error answer carrying a Kubernetes ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, object] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details) if details else None
        self.headers = dict(headers) if headers else {}

    def status(self) -> dict[str, object]:
        """The ``Status`` object sent as the response body (or inside a watch ERROR event)."""
        body: dict[str, object] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def qualified(plural: str, group: str) -> str:
    """``pods`` or ``selfsubjectaccessreviews.authorization.k8s.io`` as used in messages."""
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    """404 NotFound: ``pods "x" not found``."""
    q = qualified(plural, group)
    return ApiError(404, "NotFound", f'{q} "{name}" not found', {"name": name, "kind": plural, "group": group}
                    if group else {"name": name, "kind": plural})


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    """409 AlreadyExists: ``pods "x" already exists``."""
    q = qualified(plural, group)
    return ApiError(409, "AlreadyExists", f'{q} "{name}" already exists', {"name": name, "kind": plural})


def conflict(plural: str, name: str, why: str, group: str = "") -> ApiError:
    """409 Conflict: ``Operation cannot be fulfilled on pods "x": <why>``."""
    q = qualified(plural, group)
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {q} "{name}": {why}',
                    {"name": name, "kind": plural})


MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid from ``(field, reason, message)`` causes, message joined like the real server."""
    parts = [f"{f}: {m}" for f, _, m in causes]
    text = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details = {"name": name, "kind": kind,
               "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes]}
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details)


def forbidden(plural: str, name: str, why: str, group: str = "") -> ApiError:
    """403 Forbidden: ``pods "x" is forbidden: <why>``."""
    q = qualified(plural, group)
    return ApiError(403, "Forbidden", f'{q} "{name}" is forbidden: {why}', {"name": name, "kind": plural})


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource"
                       ) -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(405, "MethodNotAllowed", message)
