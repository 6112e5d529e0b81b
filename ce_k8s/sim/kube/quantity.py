"""Quantity formatting and pod request sums for the emulator, in exact fractions.

The scheduler simulator and quota admission compare sums of requests against allocatable and
hard limits; doing that in floats would make ``0.1+0.2`` cpus not fit into ``300m``. Fractions
are exact, and ``ce_k8s.quantity`` reads them as the API server does (the product's one parser).
Formatting follows the API server's canonical forms closely enough for messages and
``status.used``: cpu-like values in whole units or millis, byte-like values with binary suffixes
when they divide evenly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fractions import Fraction

from ce_k8s.quantity import decode_quantity

_BINARY_UNITS = (("Ei", 1024**6), ("Pi", 1024**5), ("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024))


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
        for suffix, unit in _BINARY_UNITS:
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
    return {str(k): decode_quantity(v) for k, v in table.items()}


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
        add_into(total, {str(k): decode_quantity(v) for k, v in overhead.items()})
    return total
