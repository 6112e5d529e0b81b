"""A cluster snapshot (nodes, pods, resource quotas) and the three places it can come from.

* a file: ``kubectl get nodes,pods,resourcequotas -A -o json`` (a ``List``), so an admin can ask
  "what would we advertise" offline, and tests can use hand-made clusters;
* the Kubernetes API directly (LIST with paging, only non-finished pods);
* the agent, whose watch cache is already warm (see ``ce_k8s.protocol``).

Only the fields ``ce_k8s.info.capacity`` needs are kept, already converted to scheduler units, so a
100,000-pod cluster costs a few hundred milliseconds and not the memory of the raw objects.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ce_k8s.info.quantity import QuantityError, parse_resource_list, pod_resources

log = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 2 * 1024**3  # a dump larger than this is refused before reading


class SnapshotError(Exception):
    """The snapshot could not be read or does not have the shape of a Kubernetes List.

    ``str()`` is ``"<source>: <message>"`` where source is a file (with ``:line:col`` for JSON
    syntax errors), ``agent <socket>`` or ``api <server>``.
    """

    def __init__(self, source: str, message: str) -> None:
        super().__init__(f"{source}: {message}")
        self.source = source
        self.message = message


class SourceUnavailable(SnapshotError):
    """The agent or the API server could not be reached or did not answer in time."""


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(slots=True)
class Node:
    name: str
    labels: dict[str, str]
    allocatable: dict[str, int]
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    ready: bool = True


@dataclass(slots=True)
class Pod:
    namespace: str
    name: str
    node_name: str | None
    phase: str
    labels: dict[str, str]
    requests: dict[str, int]
    limits: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Quota:
    namespace: str
    name: str
    hard: dict[str, int]
    used: dict[str, int] | None  # status.used; None when the controller has not filled it in
    scopes: tuple[str, ...] = ()
    scope_selector: tuple[Mapping[str, object], ...] = ()


@dataclass
class ClusterSnapshot:
    nodes: list[Node]
    pods: list[Pod]
    quotas: list[Quota]
    source: str
    taken_at: float | None = None  # epoch seconds the data describes; None = unknown (a file)


# --------------------------------------------------------------------------------------------
# Object conversion


def _labels(meta: Mapping[str, object]) -> dict[str, str]:
    raw = meta.get("labels") or {}
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def node_from_object(obj: Mapping[str, object], where: str) -> Node:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise ValueError("metadata, spec and status must be objects")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("node without metadata.name")
    alloc_raw = status.get("allocatable")
    if alloc_raw is None:
        alloc_raw = status.get("capacity")
    allocatable = parse_resource_list(alloc_raw, f"{where}.status.allocatable")
    taints = []
    for t in spec.get("taints") or ():  # type: ignore[union-attr]
        if isinstance(t, Mapping) and t.get("key"):
            taints.append(Taint(str(t.get("key")), str(t.get("value") or ""), str(t.get("effect") or "")))
    ready = True
    for cond in status.get("conditions") or ():  # type: ignore[union-attr]
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
    return Node(
        name=name,
        labels=_labels(meta),
        allocatable=allocatable,
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(taints),
        ready=ready,
    )


def pod_from_object(obj: Mapping[str, object], where: str) -> Pod:
    # Runs once per pod of the whole cluster: plain dict access, no copies of what is only read.
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if type(meta) is not dict or type(spec) is not dict or type(status) is not dict:
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping) or not isinstance(status, Mapping):
            raise ValueError("metadata, spec and status must be objects")
    requests, limits = pod_resources(spec, f"{where}.spec")
    labels = meta.get("labels")
    if type(labels) is not dict:
        labels = _labels(meta)
    node_name = spec.get("nodeName")
    return Pod(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        node_name=str(node_name) if node_name else None,
        phase=str(status.get("phase") or "Pending"),
        labels=labels,
        requests=requests,
        limits=limits,
    )


def quota_from_object(obj: Mapping[str, object], where: str) -> Quota:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise ValueError("metadata, spec and status must be objects")
    used_raw = status.get("used")
    selector = spec.get("scopeSelector") or {}
    exprs = selector.get("matchExpressions") if isinstance(selector, Mapping) else None
    return Quota(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        hard=_quota_list(spec.get("hard"), f"{where}.spec.hard"),
        used=_quota_list(used_raw, f"{where}.status.used") if used_raw is not None else None,
        scopes=tuple(str(s) for s in (spec.get("scopes") or ())),  # type: ignore[union-attr]
        scope_selector=tuple(e for e in (exprs or ()) if isinstance(e, Mapping)),
    )


def _quota_list(raw: object, where: str) -> dict[str, int]:
    # Quota keys carry a prefix ("requests.cpu", "limits.memory", "count/pods"); the unit is the
    # unit of the underlying resource, so "requests.cpu" is parsed as cpu (millicores).
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise QuantityError(raw, f"{where}: expected a map")
    out: dict[str, int] = {}
    for key, value in raw.items():
        base = str(key)
        for prefix in ("requests.", "limits."):
            if base.startswith(prefix):
                base = base[len(prefix):]
        try:
            out[str(key)] = parse_resource_list({base: value}, where)[base]
        except QuantityError as exc:
            raise QuantityError(value, f"{where}.{key}: {exc.reason.split(': ')[-1]}") from None
    return out


_FINISHED = frozenset({"Succeeded", "Failed"})
_CONVERTERS = {"Node": node_from_object, "Pod": pod_from_object, "ResourceQuota": quota_from_object}


def snapshot_from_items(items: Iterable[object], source: str, taken_at: float | None = None,
                        default_kind: str | None = None) -> ClusterSnapshot:
    """Build a snapshot from Kubernetes objects (the ``items`` of a ``List``).

    Objects of other kinds are ignored, so a dump with extra resources still loads. Malformed
    objects raise ``SnapshotError`` naming the item index, its name and the offending field.
    """
    snap = ClusterSnapshot(nodes=[], pods=[], quotas=[], source=source, taken_at=taken_at)
    for i, item in enumerate(items):
        if type(item) is not dict and not isinstance(item, Mapping):
            raise SnapshotError(source, f"items[{i}] is not an object")
        kind = item.get("kind") or default_kind
        conv = _CONVERTERS.get(str(kind))
        if conv is None:
            continue
        if conv is pod_from_object:
            # Finished pods hold nothing (the API path asks for them not to be sent at all).
            status = item.get("status")
            if type(status) is dict and status.get("phase") in _FINISHED:
                continue
        try:
            obj = conv(item, "items[%d]" % i)  # noqa: UP031 - %-format is cheaper, and this runs per pod
        except (QuantityError, ValueError, TypeError, AttributeError) as exc:
            meta = item.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            raise SnapshotError(source, f"items[{i}] ({kind} {name!r}): {exc}") from None
        if isinstance(obj, Node):
            snap.nodes.append(obj)
        elif isinstance(obj, Pod):
            snap.pods.append(obj)
        else:
            snap.quotas.append(obj)
    return snap


def snapshot_from_document(doc: object, source: str, taken_at: float | None = None) -> ClusterSnapshot:
    """A ``List`` (or ``NodeList``/``PodList``/...) document, as ``kubectl get -o json`` prints it."""
    if not isinstance(doc, Mapping):
        raise SnapshotError(source, "expected a JSON object with 'items' (kubectl get ... -o json)")
    kind = str(doc.get("kind") or "")
    items = doc.get("items")
    if not isinstance(items, list):
        if kind in _CONVERTERS:
            items = [doc]
        else:
            raise SnapshotError(source, f"kind {kind or '?'!r} has no 'items' list; expected a List")
    return snapshot_from_items(items, source, taken_at, _item_kind(kind))


def _item_kind(list_kind: str) -> str | None:
    """The kind of the items of a `NodeList`/`PodList`/... (None for a plain `List`)."""
    return list_kind[: -len("List")] if list_kind.endswith("List") and list_kind != "List" else None


def decode_json(data: bytes) -> object:
    """What ``json.loads(data)`` returns or raises, decoded by msgspec when msgspec accepts it.

    Why: decoding is a third of ``ce-k8s info`` on a 100,000-pod dump, and msgspec builds the
    same dicts and lists in 200 ms where the stdlib takes 310 ms (docs/performance.md). Anything
    msgspec refuses (bad JSON, but also what the stdlib takes and msgspec does not: ``NaN``,
    ``1e400``, lone surrogates, UTF-16) goes to the stdlib, so the answer and the error message
    with its line and column are the stdlib's.
    """
    import msgspec

    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return json.loads(data)


def typed_snapshot(data: bytes, source: str, taken_at: float | None = None) -> ClusterSnapshot | None:
    """The snapshot of a List read through `ce_k8s.info.listschema`'s types, or None when the
    document does not fit them or an object in it is malformed: the caller then decodes it
    generically and gets the same snapshot, or the located error. Pods with app containers only
    are read by attribute; every other object goes through the generic converter, built from the
    fields the types keep."""
    from ce_k8s.info import listschema

    doc = listschema.decode_list(data)
    if doc is None or doc.items is None:
        return None
    default_kind = _item_kind(doc.kind or "")
    snap = ClusterSnapshot(nodes=[], pods=[], quotas=[], source=source, taken_at=taken_at)
    try:
        for i, item in enumerate(doc.items):
            item_kind = item.kind or default_kind
            if item_kind == "Pod":
                if listschema.is_finished(item):
                    continue
                pod = listschema.simple_pod(item, Pod)
                snap.pods.append(pod if pod is not None
                                 else pod_from_object(listschema.as_object(item), "items[%d]" % i))  # noqa: UP031
            elif item_kind == "Node":
                snap.nodes.append(node_from_object(listschema.as_object(item), "items[%d]" % i))  # noqa: UP031
            elif item_kind == "ResourceQuota":
                snap.quotas.append(quota_from_object(listschema.as_object(item), "items[%d]" % i))  # noqa: UP031
    except (QuantityError, ValueError, TypeError, AttributeError):
        return None
    return snap


def load_snapshot_file(path: str | os.PathLike[str]) -> ClusterSnapshot:
    """Read a ``kubectl get nodes,pods,resourcequotas -A -o json`` dump."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(str(p), f"{size} bytes is more than the {MAX_SNAPSHOT_BYTES} byte limit")
        with p.open("rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise SnapshotError(str(p), exc.strerror or str(exc)) from None
    snap = typed_snapshot(data, str(p))
    if snap is not None:
        return snap
    try:
        doc = decode_json(data)
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{p}:{exc.lineno}:{exc.colno}", f"invalid JSON: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise SnapshotError(str(p), f"not UTF-8 text: {exc.reason}") from None
    return snapshot_from_document(doc, str(p))


# --------------------------------------------------------------------------------------------
# Live sources


def snapshot_from_api(kubeconfig: str | None = None, timeout: float = 20.0, page_size: int = 500) -> ClusterSnapshot:
    """LIST nodes, non-finished pods and quotas from the API server (paged, with one deadline).

    The kubeconfig / in-cluster loading and authentication are the official client's; the three
    LIST calls go through its generic ``call_api`` with raw JSON: importing ``CoreV1Api`` costs
    about a second and deserialising 100,000 pods into model classes far more than the cron
    period allows.
    """
    from ce_k8s.kubeclient import new_api_client

    try:
        api_client = new_api_client(kubeconfig)
    except Exception as exc:  # the loaders raise several unrelated types for a bad kubeconfig
        raise SourceUnavailable(f"api {kubeconfig or '(default kubeconfig)'}", f"cannot load: {_short(exc)}") from None
    conf = api_client.configuration
    source = f"api {conf.host}"
    deadline = time.monotonic() + timeout
    taken_at = time.time()

    def list_all(path: str, kind: str, **query: str) -> list[object]:
        items: list[object] = []
        cont: str | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SourceUnavailable(source, f"listing {kind}s took longer than {timeout:g}s")
            params = [("limit", str(page_size)), *sorted(query.items())]
            if cont:
                params.append(("continue", cont))
            try:
                method, url, headers, body, post = api_client.param_serialize(
                    "GET", path, query_params=params, header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"])
                resp = api_client.call_api(method, url, headers, body, post,
                                           _request_timeout=(min(5.0, left), left))
                data = resp.read() if hasattr(resp, "read") else resp.data
                if resp.status != 200:
                    raise SourceUnavailable(source, f"listing {kind}s: HTTP {resp.status}: {_short(data[:200])}")
                page = json.loads(data)
            except SourceUnavailable:
                raise
            except Exception as exc:  # connection refused, TLS, timeout, bad JSON: "not now"
                raise SourceUnavailable(source, f"listing {kind}s: {_short(exc)}") from None
            for it in page.get("items") or ():
                it.setdefault("kind", kind)
                items.append(it)
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items

    try:
        items = list_all("/api/v1/nodes", "Node")
        items += list_all("/api/v1/pods", "Pod", fieldSelector="status.phase!=Succeeded,status.phase!=Failed")
        items += list_all("/api/v1/resourcequotas", "ResourceQuota")
    finally:
        api_client.close()
    return snapshot_from_items(items, source, taken_at)


AGENT_SNAPSHOT_VERB = "snapshot"  # proposed verb: empty payload; reply ok + one part, a JSON List


def _agent_call(socket_path: str, verb: str, timeout: float) -> list[bytes]:
    """One request to the agent; every failure (refused, timeout, non-ok status) is SourceUnavailable."""
    from ce_k8s import protocol

    source = f"agent {socket_path}"
    try:
        answer = protocol.ask(socket_path, verb, b"", timeout)
    except (OSError, protocol.ProtocolError) as exc:
        raise SourceUnavailable(source, _short(exc)) from None
    if answer.status != protocol.STATUS_OK:
        detail = _short(answer.message()) if answer.parts else ""
        raise SourceUnavailable(source, f"agent answered {answer.status}" + (f": {detail}" if detail else ""))
    return answer.parts


def agent_offers_snapshots() -> bool:
    """Whether this installation's agent protocol has the snapshot verb (else: ping + API)."""
    from ce_k8s import protocol

    return AGENT_SNAPSHOT_VERB in protocol.VERBS


def ping_agent(socket_path: str, timeout: float = 5.0) -> str:
    """The agent's version string if it answers a ping in time; raises SourceUnavailable otherwise."""
    from ce_k8s import protocol

    parts = _agent_call(socket_path, protocol.VERB_PING, timeout)
    return parts[0].decode("utf-8", "replace").strip() if parts else ""


def snapshot_from_agent(socket_path: str, timeout: float = 5.0) -> ClusterSnapshot:
    """Ask the agent for its cached view of the cluster.

    The answer is the ``kubectl get -o json`` List shape plus ``taken_at``: when the agent's watch
    cache was last known to be in sync with the API server, so a stale cache (agent up, API
    unreachable) is detected here and never advertised as fresh.
    """
    source = f"agent {socket_path}"
    parts = _agent_call(socket_path, AGENT_SNAPSHOT_VERB, timeout)
    if not parts:
        raise SourceUnavailable(source, "empty snapshot reply")
    try:
        doc = json.loads(parts[0])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SourceUnavailable(source, f"snapshot is not JSON: {_short(exc)}") from None
    taken_at = doc.get("taken_at") if isinstance(doc, Mapping) else None
    return snapshot_from_document(doc, source, float(taken_at) if isinstance(taken_at, (int, float)) else None)


def _short(exc: object, limit: int = 200) -> str:
    """One line of an exception for a log line or an ad attribute."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
