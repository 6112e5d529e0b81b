"""A pod's effective requests and limits, and ResourceLists, in the scheduler's integer units.

Why a module of its own: both the snapshot reader (which converts every node and pod of a dump
once) and the capacity arithmetic (which sizes a pilot pod built by ``ce_k8s.pods``) need the same
exact conversion, and neither should import the other for it. Quantities are read by
``ce_k8s.quantity`` (exactly, as the API server decodes them) and converted into the units the
kube-scheduler compares: millicores for CPU (``Quantity.MilliValue``) and the rounded-up integer
value for everything else (``Quantity.Value``: bytes, GPUs, pod counts). Standard library only; no
I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from functools import lru_cache

from ce_k8s.quantity import QuantityError, decode_quantity, int_value, milli_value

CPU = "cpu"
MEMORY = "memory"


@lru_cache(maxsize=4096)
def _units_cached(resource: str, value: str) -> int:
    return to_units(resource, decode_quantity(value))


def to_units(resource: str, quantity: Fraction) -> int:
    """The integer the scheduler compares: millicores for ``cpu``, the rounded-up value otherwise."""
    if resource == CPU:
        return milli_value(quantity)
    return int_value(quantity)


def resource_units(resource: str, value: str | int | float) -> int:
    """Parse one quantity of ``resource`` into scheduler units (cached: dumps repeat the same strings)."""
    if isinstance(value, str):
        return _units_cached(resource, value)
    return to_units(resource, decode_quantity(value))


def parse_resource_list(raw: object, where: str) -> dict[str, int]:
    """A ``ResourceList`` (``{"cpu": "2", "memory": "4Gi"}``) in scheduler units.

    ``where`` names the place in the input for the error message when a quantity is malformed.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise QuantityError(raw, f"{where}: expected a map of resource name to quantity")
    out: dict[str, int] = {}
    for name, value in raw.items():
        try:
            out[str(name)] = resource_units(str(name), value)
        except QuantityError as exc:
            raise QuantityError(value, f"{where}.{name}: {exc.reason}") from None
    return out


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max_into(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        if v > into.get(k, 0):
            into[k] = v


def _container_resources(container: Mapping[str, object], where: str) -> tuple[dict[str, int], dict[str, int]]:
    res = container.get("resources") or {}
    if not isinstance(res, Mapping):
        return {}, {}
    limits = parse_resource_list(res.get("limits"), f"{where}.resources.limits")
    requests = parse_resource_list(res.get("requests"), f"{where}.resources.requests")
    # API defaulting: a container that sets only a limit gets request = limit. Real dumps already
    # carry it; hand-made ones may not, and the scheduler would see the defaulted value.
    for k, v in limits.items():
        requests.setdefault(k, v)
    return requests, limits


def pod_resources(spec: Mapping[str, object], where: str = "spec") -> tuple[dict[str, int], dict[str, int]]:
    """Effective (requests, limits) of a pod as the scheduler and quota admission compute them.

    max(sum(app containers) + sum(sidecars), peak over init containers) + overhead, where a
    restartable init container (``restartPolicy: Always``, a sidecar) keeps running alongside
    everything started after it. Pod-level ``spec.resources`` (when set) replaces the cpu/memory
    figures, as in Kubernetes >= 1.32.

    Most pods have app containers only; they take a fast path (this runs for every pod of the
    cluster on every run). Any doubt -- odd types, a bad quantity -- goes to the careful path,
    which also produces the located error message.
    """
    if type(spec) is dict and not spec.get("initContainers") and not spec.get("overhead") \
            and not spec.get("resources"):
        try:
            return _app_only(spec.get("containers") or ())
        except (QuantityError, AttributeError, TypeError, ValueError):
            pass
    return _pod_resources_careful(spec, where)


def _app_only(containers: object) -> tuple[dict[str, int], dict[str, int]]:
    pairs = []
    for c in containers:  # type: ignore[union-attr]
        res = c.get("resources")
        if res:
            pairs.append((res.get("requests"), res.get("limits")))
    return app_resources(pairs)


def app_resources(pairs: Iterable[tuple[Mapping[str, object] | None, Mapping[str, object] | None]]
                  ) -> tuple[dict[str, int], dict[str, int]]:
    """Summed (requests, limits) of app containers given as (requests, limits) pairs (None = unset),
    with the API's defaulting (a resource with only a limit is requested at that limit). Shared by
    the dict path above and the typed one (`ce_k8s.info.listschema`)."""
    req: dict[str, int] = {}
    lim: dict[str, int] = {}
    for requests, limits in pairs:
        requests = requests or {}
        for k, v in requests.items():
            req[k] = req.get(k, 0) + (_units_cached(k, v) if type(v) is str else resource_units(k, v))
        if limits:
            for k, v in limits.items():
                u = _units_cached(k, v) if type(v) is str else resource_units(k, v)
                lim[k] = lim.get(k, 0) + u
                if k not in requests:  # API defaulting: request = limit
                    req[k] = req.get(k, 0) + u
    return req, lim


def _pod_resources_careful(spec: Mapping[str, object], where: str) -> tuple[dict[str, int], dict[str, int]]:
    result: list[dict[str, int]] = []
    for kind in ("requests", "limits"):
        app: dict[str, int] = {}
        for i, c in enumerate(spec.get("containers") or ()):  # type: ignore[union-attr]
            if isinstance(c, Mapping):
                req, lim = _container_resources(c, f"{where}.containers[{i}]")
                _add(app, req if kind == "requests" else lim)
        sidecars: dict[str, int] = {}
        init_peak: dict[str, int] = {}
        for i, c in enumerate(spec.get("initContainers") or ()):  # type: ignore[union-attr]
            if not isinstance(c, Mapping):
                continue
            req, lim = _container_resources(c, f"{where}.initContainers[{i}]")
            this = req if kind == "requests" else lim
            if c.get("restartPolicy") == "Always":
                _add(sidecars, this)
                _max_into(init_peak, sidecars)
            else:
                running = dict(sidecars)
                _add(running, this)
                _max_into(init_peak, running)
        total = dict(app)
        _add(total, sidecars)
        _max_into(total, init_peak)
        pod_level = spec.get("resources")
        if isinstance(pod_level, Mapping) and pod_level.get(kind):
            for k, v in parse_resource_list(pod_level.get(kind), f"{where}.resources.{kind}").items():
                if k in (CPU, MEMORY):
                    total[k] = v
        if kind == "requests":
            overhead = spec.get("overhead")
            if overhead:
                _add(total, parse_resource_list(overhead, f"{where}.overhead"))
        result.append(total)
    return result[0], result[1]
