"""The part of a Kubernetes List (nodes, pods, resource quotas) the information provider reads, as
msgspec types, and the pods read straight from them.

Why (issue 17, docs/performance.md "What each change bought"): on a 100,000-pod cluster, decoding
the whole List into dicts and lists, walking them, and freeing them again was most of
`ce-k8s info`. Decoding into these structs skips every field not named here while parsing (managed
fields, env, volumes, probes...), and the pods, nearly every item, are then read by attribute.

This is a fast path and nothing more. `typed_snapshot` returns None whenever a document does not fit
these types (a label that is not a string, a node marked unschedulable with `"yes"`, a document
that is not a List...), and the caller then takes the generic path, `snapshot.snapshot_from_document`,
with its located error messages. Nodes, quotas and the rare pod with init containers, overhead or
pod-level resources are converted by that same generic code, from the fields kept here, so there is
one implementation of each rule; `tests/info/test_info_listschema.py` checks both paths give the
same snapshot.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ce_k8s.info.quantity import QuantityError, app_resources

Quantity = str | int | float


class _Doc(msgspec.Struct, rename="camel", omit_defaults=True):
    """Base: camelCase JSON names, unknown fields skipped, unset fields left out of `to_builtins`."""


class Metadata(_Doc):
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None


class Resources(_Doc):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class Container(_Doc):
    resources: Resources | None = None
    restart_policy: str | None = None


class Taint(_Doc):
    key: str | None = None
    value: str | None = None
    effect: str | None = None


class Spec(_Doc):
    # pods
    node_name: str | None = None
    containers: list[Container] | None = None
    init_containers: list[Container] | None = None
    overhead: dict[str, Quantity] | None = None
    resources: Resources | None = None
    # nodes
    unschedulable: bool | None = None
    taints: list[Taint] | None = None
    # resource quotas
    hard: dict[str, Quantity] | None = None
    scopes: list[str] | None = None
    scope_selector: dict[str, Any] | None = None


class Condition(_Doc):
    type: str | None = None
    status: str | None = None


class Status(_Doc):
    phase: str | None = None
    allocatable: dict[str, Quantity] | None = None
    capacity: dict[str, Quantity] | None = None
    conditions: list[Condition] | None = None
    used: dict[str, Quantity] | None = None


class Item(_Doc):
    kind: str | None = None
    metadata: Metadata | None = None
    spec: Spec | None = None
    status: Status | None = None


class ListDoc(_Doc):
    kind: str | None = None
    items: list[Item] | None = None


LIST = msgspec.json.Decoder(ListDoc)
_FINISHED = frozenset({"Succeeded", "Failed"})
_NO_SPEC = Spec()


def decode_list(data: bytes) -> ListDoc | None:
    """The List in `data`, or None when it does not decode into these types."""
    try:
        return LIST.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def simple_pod(item: Item, snapshot_pod):
    """The `snapshot.Pod` of a pod with app containers only, else None (generic path).

    `snapshot_pod` is `snapshot.Pod` (passed in: snapshot imports this module lazily). Same rules
    as `snapshot.pod_from_object` and `quantity.pod_resources`' fast path, read by attribute.
    """
    spec = item.spec or _NO_SPEC
    if spec.init_containers or spec.overhead or spec.resources:
        return None
    try:
        requests, limits = _container_sums(spec.containers or ())
    except QuantityError:
        return None                      # the generic path names the bad quantity
    meta = item.metadata
    status = item.status
    phase = status.phase if status is not None else None
    return snapshot_pod(
        namespace=(meta.namespace if meta is not None else None) or "default",
        name=(meta.name if meta is not None else None) or "",
        node_name=spec.node_name or None,
        phase=phase or "Pending",
        labels=(meta.labels if meta is not None else None) or {},
        requests=requests,
        limits=limits,
    )


# (requests, limits) of a one-container pod by its quantities as written: a cluster's pods repeat a
# handful of resource specs, so most pods cost one look-up (and two dict copies: Pod owns its dicts).
_ONE_CONTAINER: dict[tuple, tuple[dict[str, int], dict[str, int]]] = {}
_ONE_CONTAINER_MAX = 4096


def _container_sums(containers: list[Container]) -> tuple[dict[str, int], dict[str, int]]:
    if len(containers) == 1 and containers[0].resources is not None:
        res = containers[0].resources
        key = (tuple(res.requests.items()) if res.requests else (), tuple(res.limits.items()) if res.limits else ())
        sums = _ONE_CONTAINER.get(key)
        if sums is None:
            sums = app_resources([(res.requests, res.limits)])
            if len(_ONE_CONTAINER) < _ONE_CONTAINER_MAX:
                _ONE_CONTAINER[key] = sums
        return dict(sums[0]), dict(sums[1])
    return app_resources((c.resources.requests, c.resources.limits) for c in containers if c.resources is not None)


def as_object(item: Item) -> dict[str, Any]:
    """The item as the dicts and lists the generic converters read (only the fields kept here)."""
    return msgspec.to_builtins(item)


def is_finished(item: Item) -> bool:
    return item.status is not None and item.status.phase in _FINISHED
