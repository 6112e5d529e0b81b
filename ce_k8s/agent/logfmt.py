"""One log line per event, as `key=value` fields: `event=pod-created job=104711.0 pod=... namespace=...`.

Why: an admin greps the agent's log for one pilot (`grep 'job=104711.0 '`) or one kind of event
(`grep event=pod-deleted`), and log shippers (Loki, Elasticsearch) parse `key=value` without a
custom pattern. Every line about a job carries `job=` (the routed job id when the agent has seen
an update for it, else the source job id from the pod's annotation); the first field is always
`event=`. Values are single-line: text with spaces, quotes or `=` is double-quoted with `"` and
`\\` escaped, and control characters become spaces, so job text can never forge a second line or a
second field.

`fields(...)` returns an object whose `str()` does the formatting, so
`log.debug("%s", fields(...))` costs nothing when DEBUG is off.
"""

from __future__ import annotations

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:#@+,%")
MAX_VALUE = 512


def value_text(value: object) -> str:
    """One value as it appears after `key=`."""
    if value is None:
        return '""'
    text = value if isinstance(value, str) else str(value)
    if text and len(text) <= MAX_VALUE and all(c in _PLAIN for c in text):
        return text
    clean = "".join(c if c.isprintable() else " " for c in text)
    if len(clean) > MAX_VALUE:
        clean = clean[: MAX_VALUE - 3] + "..."
    return '"' + clean.replace("\\", "\\\\").replace('"', '\\"') + '"'


class fields:  # lower-case: used like a function, log.info("%s", fields(event=..., job=...))
    """Lazy `key=value` rendering of keyword arguments in the order given; None values are dropped."""

    __slots__ = ("_items",)

    def __init__(self, **items: object) -> None:
        self._items = items

    def __str__(self) -> str:
        return " ".join(f"{k}={value_text(v)}" for k, v in self._items.items() if v is not None)

    __repr__ = __str__


def short_error(exc: BaseException) -> str:
    """An exception as one short value for `error=`: its type and text on one line, under 300 characters."""
    text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) < 300 else text[:297] + "..."


def parse(line: str) -> dict[str, str]:
    """The fields of one formatted line (tests and tools): the inverse of `fields`."""
    out: dict[str, str] = {}
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        eq = line.find("=", i)
        if eq < 0:
            break
        key = line[i:eq]
        i = eq + 1
        if i < n and line[i] == '"':
            i += 1
            buf = []
            while i < n and line[i] != '"':
                if line[i] == "\\" and i + 1 < n:
                    i += 1
                buf.append(line[i])
                i += 1
            i += 1
            out[key] = "".join(buf)
        else:
            end = line.find(" ", i)
            end = n if end < 0 else end
            out[key] = line[i:end]
            i = end
    return out
