"""The part of a Pod (and of a pod LIST and WATCH event) the agent reads, as msgspec types.

Why typed decoding: at 20,000 pods the agent's relist spent half its time in `json.loads`
building every field of every pod (managedFields, volumes, env, probes...) only to throw most of
it away, and a third more walking those dicts (docs/performance.md "Fast relist"). Decoding the
API server's JSON straight into these structs skips every field not named here while parsing, so
only what `PodInfo` keeps is ever allocated. Field names follow the API's JSON (camelCase); every
field is optional with a `None`/empty default, as the API server omits empty fields.

A document that breaks these types (a string where the API promises an integer, say) raises
`msgspec.ValidationError`; the caller treats it like any other unreadable reply.
"""

from __future__ import annotations

import msgspec

Quantity = str | int | float


class _Doc(msgspec.Struct, rename="camel", omit_defaults=True):
    """Base: camelCase JSON names, unknown fields skipped."""


class Metadata(_Doc):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class Resources(_Doc):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class Container(_Doc):
    name: str | None = None
    image: str | None = None
    resources: Resources | None = None


class Spec(_Doc):
    node_name: str | None = None
    active_deadline_seconds: int | None = None
    containers: list[Container] | None = None


class Condition(_Doc):
    type: str | None = None
    status: str | None = None
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None


class Waiting(_Doc):
    reason: str | None = None
    message: str | None = None


class Running(_Doc):
    started_at: str | None = None


class Terminated(_Doc):
    exit_code: int | None = None
    reason: str | None = None
    started_at: str | None = None
    finished_at: str | None = None


class State(_Doc):
    waiting: Waiting | None = None
    running: Running | None = None
    terminated: Terminated | None = None


class ContainerStatus(_Doc):
    name: str | None = None
    state: State | None = None


class Status(_Doc):
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    start_time: str | None = None
    conditions: list[Condition] | None = None
    container_statuses: list[ContainerStatus] | None = None
    init_container_statuses: list[ContainerStatus] | None = None


class Pod(_Doc):
    metadata: Metadata | None = None
    spec: Spec | None = None
    status: Status | None = None


class ListMeta(_Doc):
    resource_version: str | None = None
    continue_: str | None = msgspec.field(default=None, name="continue")


class PodList(_Doc):
    metadata: ListMeta | None = None
    items: list[Pod] | None = None


class PodListHead(_Doc):
    """A LIST page read for its `metadata` only (the continue token), its items skipped."""

    metadata: ListMeta | None = None


class WatchEvent(_Doc):
    """One line of a WATCH stream; `object` is decoded once its `type` says what it is."""

    type: str | None = None
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


POD_LIST = msgspec.json.Decoder(PodList)
LIST_META = msgspec.json.Decoder(PodListHead)
POD = msgspec.json.Decoder(Pod)
EVENT = msgspec.json.Decoder(WatchEvent)
ANY = msgspec.json.Decoder()


def pod_of(obj: dict) -> Pod:
    """A pod the kubernetes client or a test already holds as a JSON dict, as a `Pod`."""
    return msgspec.convert(obj, Pod)
