"""Kubernetes resource quantities (``500m``, ``64Gi``, ``1e3``) as exact fractions.

The scheduler simulator and quota admission compare sums of requests against allocatable and
hard limits; doing that in floats would make ``0.1+0.2`` cpus not fit into ``300m``. Fractions
are exact. Formatting follows the API server's canonical forms closely enough for messages and
``status.used``: cpu-like values in whole units or millis, byte-like values with binary suffixes
when they divide evenly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction

_SUFFIX: dict[str, Fraction] = {
    "Ki": Fraction(1024), "Mi": Fraction(1024**2), "Gi": Fraction(1024**3), "Ti": Fraction(1024**4),
    "Pi": Fraction(1024**5), "Ei": Fraction(1024**6),
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
}
_QTY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity (the API server answers 422 Invalid)."""


def parse_quantity(value: object) -> Fraction:
    """Parse a quantity string or number into an exact :class:`Fraction`."""
    if isinstance(value, bool):
        raise QuantityError(f"quantities must match the regular expression, got {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"quantities must be strings, got {value!r}")
    m = _QTY.match(value.strip())
    if not m:
        raise QuantityError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            f", got {value!r}")
    number = Fraction(m[1])
    if m[2]:
        return number * Fraction(10) ** int(m[2][1:])
    return number * _SUFFIX[m[3] or ""]


def is_cpu_like(resource: str) -> bool:
    """Whether a resource name is measured in cores (formatted in millis)."""
    return resource.split(".")[-1] == "cpu" or resource == "cpu"


def format_quantity(value: Fraction, resource: str = "") -> str:
    """Render ``value`` the way ``kubectl describe`` would show it for ``resource``."""
    if is_cpu_like(resource):
        if value.denominator == 1:
            return str(value.numerator)
        return f"{math.ceil(value * 1000)}m"
    if value.denominator != 1:
        millis = value * 1000
        return f"{math.ceil(millis)}m"
    n = value.numerator
    if "memory" in resource or "storage" in resource:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = _SUFFIX[suffix].numerator
            if n and n % unit == 0:
                return f"{n // unit}{suffix}"
    return str(n)


def add_into(total: dict[str, Fraction], more: Mapping[str, Fraction], sign: int = 1) -> None:
    """``total += sign * more`` per resource name (in place)."""
    for k, v in more.items():
        total[k] = total.get(k, Fraction(0)) + sign * v


def _container_list(spec: Mapping[str, object], key: str) -> Iterable[Mapping[str, object]]:
    items = spec.get(key)
    return [c for c in items if isinstance(c, dict)] if isinstance(items, list) else []


def _resources_of(container: Mapping[str, object], kind: str) -> dict[str, Fraction]:
    res = container.get("resources")
    table = res.get(kind) if isinstance(res, dict) else None
    if not isinstance(table, dict):
        return {}
    return {str(k): parse_quantity(v) for k, v in table.items()}


def pod_resources(pod: Mapping[str, object], kind: str = "requests") -> dict[str, Fraction]:
    """Effective pod requests (or limits): max(sum of containers, each init container) + overhead.

    This is the rule of the scheduler's NodeResourcesFit plugin and of quota evaluation, so a pod
    with a big init container is charged for it.
    """
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return {}
    total: dict[str, Fraction] = {}
    for c in _container_list(spec, "containers"):
        add_into(total, _resources_of(c, kind))
    for c in _container_list(spec, "initContainers"):
        for k, v in _resources_of(c, kind).items():
            if v > total.get(k, Fraction(0)):
                total[k] = v
    overhead = spec.get("overhead")
    if isinstance(overhead, dict):
        add_into(total, {str(k): parse_quantity(v) for k, v in overhead.items()})
    return total
