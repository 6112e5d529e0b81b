"""A read-only, case-insensitive view over an evaluated job ad, with typed reads.

Why not `classad2.ClassAd`: `ce_k8s.pods` is pure and must not pay for (or depend on) the ClassAd
library; the caller evaluates the routed ad once with `wire.evaluate_ad` and hands us plain Python
values (docs/internals.md "Job ads in memory"). ClassAd attribute names are case-insensitive, so
lookups here are too. Every typed read raises `PodBuildError` with a stable code on a wrong type,
so a route that sets `K8sNamespace = 42` becomes a clear hold instead of a crash.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from ce_k8s.pods.errors import PodBuildError

_MISSING = object()


class JobAd(Mapping[str, object]):
    """Case-insensitive mapping from attribute name to evaluated value (None = undefined)."""

    __slots__ = ("_data", "_names")

    def __init__(self, values: Mapping[str, object] | None = None) -> None:
        self._data: dict[str, object] = {}
        self._names: dict[str, str] = {}
        for name, value in (values or {}).items():
            if not isinstance(name, str):
                raise TypeError(f"attribute names must be str, not {type(name).__name__}")
            key = name.lower()
            self._data[key] = value
            self._names[key] = name

    def __getitem__(self, name: str) -> object:
        return self._data[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._names.values())

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"JobAd({dict(self.items())!r})"

    def get(self, name: str, default: object = None) -> object:
        """Like dict.get; an attribute that evaluated to undefined/error (None) counts as absent."""
        value = self._data.get(name.lower(), _MISSING)
        return default if value is _MISSING or value is None else value

    # -- typed reads ---------------------------------------------------------------------------

    def get_str(self, name: str, default: str | None = None, *, code: str = "bad-k8s-value") -> str | None:
        """A string attribute; any other type is a PodBuildError(code)."""
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise PodBuildError(code, f"{name} must be a string, got {_describe(value)}")
        return value

    def get_bool(self, name: str, default: bool | None = None, *, code: str = "bad-k8s-value") -> bool | None:
        """A boolean attribute; ClassAd treats 0/1 as boolean-equivalent, so ints 0/1 pass too."""
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise PodBuildError(code, f"{name} must be a boolean, got {_describe(value)}")

    def get_number(self, name: str, default: float | None = None, *, code: str = "bad-k8s-value") -> float | None:
        """A finite int or real attribute (booleans are not numbers here)."""
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PodBuildError(code, f"{name} must be a number, got {_describe(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise PodBuildError(code, f"{name} must be a finite number, got {value!r}")
        return value

    def get_int(self, name: str, default: int | None = None, *, code: str = "bad-k8s-value") -> int | None:
        """An integer attribute; a real with an integral value (8.0) is accepted as ClassAd would."""
        value = self.get_number(name, None, code=code)
        if value is None:
            return default
        if isinstance(value, float):
            if not value.is_integer():
                raise PodBuildError(code, f"{name} must be an integer, got {value!r}")
            return int(value)
        return value

    def get_dict(self, name: str, *, code: str = "bad-k8s-value") -> dict[str, object] | None:
        """A nested ad (`[ a = 1; b = "x" ]`), as a plain dict."""
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise PodBuildError(code, f"{name} must be a nested ClassAd [ k = v; ... ], got {_describe(value)}")
        return value

    def get_list(self, name: str, *, code: str = "bad-k8s-value") -> list[object] | None:
        """A ClassAd list (`{ ... }`), as a plain list."""
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise PodBuildError(code, f"{name} must be a ClassAd list {{ ... }}, got {_describe(value)}")
        return value


def _describe(value: object) -> str:
    """Type and a short, single-line preview of a bad value for the hold reason."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
