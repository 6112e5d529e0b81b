"""Kubelet, scheduler and node-lifecycle simulator running inside the API emulator's event loop.

Public API (documented in docs/testbed.md)::

    kl = srv.kubelet                      # created by ApiServer(kubelet=True)
    kl.cordon("cpu-1"); kl.uncordon("cpu-1")
    kl.drain("cpu-1")                     # cordon + Eviction of every pod on it
    kl.lose_node("cpu-2"); kl.restore_node("cpu-2")
    kl.add_node(NodeSpec(name="big-1", cpu="64"))
    Scenario / parse_scenario / SCENARIO_ANNOTATION (re-exported from scenario.py)

Why in-process: it writes through :class:`ce_k8s.sim.kube.api.Api` — the same write path as HTTP
requests — so every transition gets a resourceVersion and a watch event, exactly what a client
watching a real cluster would see, and tests need no second process. It reacts to store events
(no polling): new pods are scheduled at once, unschedulable pods are retried when resources are
freed or nodes change (the real scheduler's queues), and container lifecycles run on timers whose
durations are simulated seconds multiplied by ``time_scale``.

What it reproduces, from the kube-scheduler filters and the kubelet's status manager:
NodeUnschedulable, TaintToleration (NoSchedule/NoExecute), NodeAffinity (nodeSelector and required
node affinity), NodeResourcesFit (requests vs allocatable incl. extended resources and pod count)
with the scheduler's "0/3 nodes are available: …" message; then ContainerCreating, image pull
errors and back-off, missing Secrets (FailedMount / CreateContainerConfigError), Running,
Succeeded/Failed with exit codes, OOMKilled, activeDeadlineSeconds (DeadlineExceeded),
node-pressure eviction (Evicted), API eviction and drain (DisruptionTarget), graceful deletion,
and node loss.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ce_k8s.quantity import decode_quantity, milli_value
from ce_k8s.sim.kube.api import TERMINAL_PHASES, Api, meta_of, now_iso, set_condition
from ce_k8s.sim.kube.cluster import DEFAULT_NODES, NodeSpec, parse_nodes
from ce_k8s.sim.kube.errors import ApiError
from ce_k8s.sim.kube.kubelet_secrets import SecretMounts
from ce_k8s.sim.kube.kubelet_stats import UsageMeter
from ce_k8s.sim.kube.quantity import pod_resources
from ce_k8s.sim.kube.scenario import (
    DEFAULT_SCENARIO,
    SCENARIO_ANNOTATION,
    Scenario,
    ScenarioError,
    parse_scenario,
    scenario_for,
)
from ce_k8s.sim.kube.store import WatchEvent

__all__ = ["SCENARIO_ANNOTATION", "Kubelet", "NodeSpec", "Scenario", "ScenarioError", "parse_nodes",
           "parse_scenario"]

log = logging.getLogger(__name__)

Key = tuple[str, str]
UNREACHABLE = "node.kubernetes.io/unreachable"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
_ZERO = 0


_UNRESOLVABLE = "Preemption is not helpful for scheduling"
_NO_VICTIMS = "No preemption victims found for incoming pod"
_PRESSURE = (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
             ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
             ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))


def _now_nano() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def _dig(obj: Mapping[str, Any], *path: str) -> Any:
    cur: Any = obj
    for p in path:
        cur = cur.get(p) if isinstance(cur, Mapping) else None
    return cur


def tolerates(tolerations: list[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether any toleration matches the taint (key, operator Exists/Equal, value, effect)."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def _match_expression(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
        except ValueError:
            return False
    return False


def node_affinity_ok(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """nodeSelector plus requiredDuringSchedulingIgnoredDuringExecution (terms ORed, expressions ANDed)."""
    labels = meta_of(node).get("labels") or {}
    selector = _dig(pod, "spec", "nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    terms = _dig(pod, "spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                 "nodeSelectorTerms")
    if not terms:
        return True
    for term in terms:
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if all(_match_expression(e, labels.get(e.get("key"))) for e in exprs) and all(
                _match_expression(f, str(meta_of(node).get("name")) if f.get("key") == "metadata.name" else None)
                for f in fields):
            return True
    return False


@dataclass
class PodSim:
    """The kubelet's view of one pod bound to a node."""

    key: Key
    uid: str
    node: str
    scenarios: dict[str, Scenario | ScenarioError]
    state: str = "accepted"   # accepted, mount, pulling, config, running, terminating, done
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    backoff: float = 10.0

    def cancel(self) -> None:
        """Stop every pending transition of this pod."""
        for t in self.timers:
            t.cancel()
        self.timers.clear()


class Kubelet:
    """Scheduler + kubelets of all nodes + node lifecycle controller, on the server's loop."""

    def __init__(self, api: Api, nodes: object = None, time_scale: float = 1.0,
                 default_scenario: str = DEFAULT_SCENARIO, emit_events: bool = True, kill_time: float = 0.2,
                 retry_period: float = 2.0, image_pull_backoff: float = 10.0) -> None:
        self.api = api
        self.store = api.store
        self.loop = api.loop
        self.time_scale = time_scale
        self.default_scenario = default_scenario
        parse_scenario(default_scenario)  # fail early on a bad default
        self.emit_events = emit_events
        self.kill_time = kill_time
        self.retry_period = retry_period
        self.image_pull_backoff = image_pull_backoff
        if nodes is None:
            nodes = DEFAULT_NODES
        specs = parse_nodes(nodes) if isinstance(nodes, str) else list(nodes)  # type: ignore[call-overload]
        self.node_specs: list[NodeSpec] = specs
        self._pods: dict[Key, PodSim] = {}
        self._active: dict[Key, None] = {}
        self._unschedulable: dict[Key, None] = {}
        # Requests, usage and allocatable in thousandths of a unit, rounded up (milli_value, as
        # Quantity.MilliValue): exact Fractions made each node check of the scheduling pass several
        # times slower, and kube-scheduler itself compares integers.
        self._sig: dict[Key, tuple[str, dict[str, int]]] = {}
        self._charged: dict[Key, tuple[str, dict[str, int]]] = {}
        self._node_used: dict[str, dict[str, int]] = {}
        self._alloc_cache: dict[str, tuple[object, dict[str, int]]] = {}   # node -> (rv, parsed)
        self._fit_cache: dict[tuple[str, str], tuple[object, str]] = {}   # (pod sig, node) -> (rv, why)
        self._lost: set[str] = set()
        self._lost_timers: dict[str, list[asyncio.TimerHandle]] = {}
        self._pass_pending = False
        self._thread_id: int | None = None
        self._running = False
        # What each pod's Secret volumes show its containers (kubelet_secrets.py).
        self.secret_mounts = SecretMounts()
        # What the containers use, for the Summary API (kubelet_stats.py, docs/accounting.md).
        self.usage = UsageMeter()
        self._started_at = time.time()

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Register nodes, subscribe to store events and adopt existing pods (loop thread)."""
        self._thread_id = threading.get_ident()
        self._running = True
        for i, spec in enumerate(self.node_specs):
            self._register(spec, i)
        self.store.add_listener(self._on_event)
        self.api.grace_holds.append(self._unconfirmable)
        for pod in list(self.store.peek_list("pods")):
            self._observe(self._key(pod))

    def stop(self) -> None:
        """Stop reacting and cancel every timer."""
        self._running = False
        self.store.remove_listener(self._on_event)
        if self._unconfirmable in self.api.grace_holds:
            self.api.grace_holds.remove(self._unconfirmable)
        for sim in self._pods.values():
            sim.cancel()
        for timers in self._lost_timers.values():
            for t in timers:
                t.cancel()

    def _register(self, spec: NodeSpec, index: int) -> None:
        if self.store.peek("nodes", "", spec.name) is None:
            self.api.create("nodes", None, spec.manifest(index))
        self._set_ready(spec.name, True)

    # ---- thread-safe control -------------------------------------------------------------------------
    def _in_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        if threading.get_ident() == self._thread_id:
            return fn(*args)

        async def run() -> Any:
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def add_node(self, spec: NodeSpec) -> None:
        """Register one more node (any thread)."""
        self._in_loop(self._register, spec, len(self.node_specs))
        self.node_specs.append(spec)

    def cordon(self, node: str) -> None:
        """``kubectl cordon``: spec.unschedulable and the unschedulable taint (any thread)."""
        self._in_loop(self._set_cordon, node, True)

    def uncordon(self, node: str) -> None:
        """``kubectl uncordon`` (any thread)."""
        self._in_loop(self._set_cordon, node, False)

    def drain(self, node: str) -> list[str]:
        """``kubectl drain``: cordon, then evict every live pod on the node; returns their names."""
        return self._in_loop(self._drain, node)  # type: ignore[no-any-return]

    def summary(self, node: str) -> dict[str, Any] | None:
        """The Summary API document of `node` (stats/v1alpha1), or None when the node is unknown or lost
        (the API server's proxy then fails: the kubelet does not answer). Any thread."""
        return self._in_loop(self._summary, node)  # type: ignore[no-any-return]

    def _summary(self, node: str) -> dict[str, Any] | None:
        if node in self._lost or self.store.peek("nodes", "", node) is None:
            return None
        return self.usage.summary(node, self._pods_on(node), self._started_at)

    def lose_node(self, node: str) -> None:
        """The node stops reporting: Ready=Unknown, unreachable taints, its pods freeze with
        Ready=False; after their unreachable toleration (default 300 s simulated) the taint
        manager marks them DisruptionTarget and deletes them, and they stay Running and
        Terminating until `restore_node` (as on a real cluster: nobody can confirm the kill)."""
        self._in_loop(self._lose, node)

    def restore_node(self, node: str) -> None:
        """The node comes back: Ready=True, taints removed, surviving pods resume."""
        self._in_loop(self._restore, node)

    def mounted_files(self, namespace: str, pod: str, volume: str | None = None) -> dict[str, bytes] | None:
        """What the pod's containers read in a Secret volume now (default: its first one): file path
        → contents; None before the volume is mounted or once the pod is gone. Any thread."""
        return self._in_loop(self.secret_mounts.files, (namespace, pod), volume)  # type: ignore[no-any-return]

    # ---- event intake --------------------------------------------------------------------------------
    @staticmethod
    def _key(pod: Mapping[str, Any]) -> Key:
        m = meta_of(pod)
        return (str(m.get("namespace") or ""), str(m.get("name")))

    def _on_event(self, resource: str, ev: WatchEvent) -> None:
        if not self._running:
            return
        if resource == "pods":
            key = self._key(ev.obj)
            if ev.type == "DELETED":
                self.loop.call_soon(self._forget, key, str(meta_of(ev.obj).get("uid")))
            else:
                self.loop.call_soon(self._observe, key)
        elif resource == "nodes":
            if ev.type == "ADDED" and not any(c.get("type") == "Ready"
                                              for c in _dig(ev.obj, "status", "conditions") or []):
                self.loop.call_soon(self._set_ready, str(meta_of(ev.obj).get("name")), True)
            self._kick(full=True)
        elif resource == "secrets" and ev.type != "DELETED":
            ns = str(meta_of(ev.obj).get("namespace"))
            self.secret_mounts.secret_changed(ns, str(meta_of(ev.obj).get("name")), ev.obj)
            self.loop.call_soon(self._secrets_changed, ns)

    def _observe(self, key: Key) -> None:
        if not self._running:
            return
        pod = self.store.peek("pods", *key)
        if pod is None:
            return
        uid = str(meta_of(pod).get("uid"))
        sim = self._pods.get(key)
        if sim is not None and sim.uid != uid:
            self._forget(key, sim.uid)
            sim = None
        phase = _dig(pod, "status", "phase")
        node = _dig(pod, "spec", "nodeName")
        deleting = bool(meta_of(pod).get("deletionTimestamp"))
        if phase in TERMINAL_PHASES:
            self._uncharge(key)
            self._active.pop(key, None)
            self._unschedulable.pop(key, None)
            if sim is not None:
                if deleting and sim.state != "terminating" and node not in self._lost:
                    sim.cancel()
                    sim.state = "terminating"
                    self._after(sim, 0.0, self._confirm_delete, sim)
                elif sim.state != "terminating":
                    sim.cancel()
                    sim.state = "done"
            return
        if not node:
            if deleting or _dig(pod, "spec", "schedulerName") not in (None, "default-scheduler"):
                return
            if key not in self._unschedulable:
                self._active[key] = None
                self._kick()
            return
        self._active.pop(key, None)
        self._unschedulable.pop(key, None)
        if key not in self._charged:
            self._charge(key, str(node), self._requests(key, pod))
        if node in self._lost:
            if sim is None:
                self._pods[key] = PodSim(key, uid, str(node), self._scenarios(pod), state="frozen")
            return
        if sim is None:
            sim = PodSim(key, uid, str(node), self._scenarios(pod), backoff=self.image_pull_backoff)
            self._pods[key] = sim
            self._accept(sim)
        if deleting and sim.state not in ("terminating",):
            self._terminate(sim)

    def _forget(self, key: Key, uid: str) -> None:
        self.usage.forget(key, uid)
        self.secret_mounts.forget(key, uid)
        sim = self._pods.get(key)
        if sim is not None and sim.uid == uid:
            sim.cancel()
            del self._pods[key]
        if self.store.peek("pods", *key) is None:
            self._uncharge(key)
            self._active.pop(key, None)
            self._unschedulable.pop(key, None)
            self._sig.pop(key, None)

    def _scenarios(self, pod: Mapping[str, Any]) -> dict[str, Scenario | ScenarioError]:
        out: dict[str, Scenario | ScenarioError] = {}
        for c in _dig(pod, "spec", "containers") or []:
            try:
                out[str(c.get("name"))] = scenario_for(pod, c, self.default_scenario)
            except ScenarioError as e:
                out[str(c.get("name"))] = e
        return out

    # ---- timers ----------------------------------------------------------------------------------------
    def _after(self, sim: PodSim, sim_seconds: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` after ``sim_seconds`` simulated seconds, unless the pod is gone or replaced."""
        handle: asyncio.TimerHandle

        def run() -> None:
            if handle in sim.timers:
                sim.timers.remove(handle)
            if not self._running or self._pods.get(sim.key) is not sim:
                return
            try:
                fn(*args)
            except ApiError as e:
                log.debug("kubelet: %s/%s: %s", *sim.key, e.message)
            except Exception:
                log.exception("kubelet step failed for pod %s/%s", *sim.key)

        handle = self.loop.call_later(max(0.0, sim_seconds * self.time_scale), run)
        sim.timers.append(handle)

    def _event(self, obj: Mapping[str, Any], reason: str, message: str, etype: str = "Normal",
               component: str = "kubelet", host: str | None = None) -> None:
        if self.emit_events:
            self.api.record_event(dict(obj), reason, message, etype, component, host)

    # ---- scheduler ---------------------------------------------------------------------------------------
    def _kick(self, full: bool = False) -> None:
        if full and self._unschedulable:
            self._active.update(self._unschedulable)
            self._unschedulable.clear()
        if not self._pass_pending and self._active:
            self._pass_pending = True
            self.loop.call_soon(self._schedule_pass)

    def _requests(self, key: Key, pod: Mapping[str, Any]) -> dict[str, int]:
        cached = self._sig.get(key)
        if cached is not None:
            return cached[1]
        try:
            req = pod_resources(pod, "requests")
        except ValueError:
            req = {}
        req = {res: milli_value(q) for res, q in req.items()}
        req["pods"] = 1000
        spec = pod.get("spec") or {}
        sig = json.dumps([spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations"),
                          sorted((k, str(v)) for k, v in req.items())], sort_keys=True, default=str)
        self._sig[key] = (sig, req)
        return req

    def _schedule_pass(self) -> None:
        self._pass_pending = False
        if not self._running:
            return
        nodes = [n for n in self.store.peek_list("nodes")]
        memo: dict[str, str] = {}
        batch = list(self._active)
        self._active.clear()
        for key in batch:
            pod = self.store.peek("pods", *key)
            if pod is None or _dig(pod, "spec", "nodeName") or meta_of(pod).get("deletionTimestamp") \
                    or _dig(pod, "status", "phase") in TERMINAL_PHASES:
                continue
            req = self._requests(key, pod)
            sig = self._sig[key][0]
            msg = memo.get(sig)
            node = None
            if msg is None:
                node, msg = self._find_node(pod, req, nodes, sig)
            if node is None:
                memo[sig] = msg
                self._unschedulable[key] = None
                self._mark_unschedulable(pod, msg)
                continue
            self._charge(key, node, req)
            try:
                self.api.bind(key[0], key[1], {"target": {"name": node}})
            except ApiError as e:
                log.debug("bind %s/%s failed: %s", *key, e.message)
                self._uncharge(key)
                continue
            log.info("scheduler: pod %s/%s bound to %s", key[0], key[1], node)
            self._event(pod, "Scheduled", f"Successfully assigned {key[0]}/{key[1]} to {node}",
                        component="default-scheduler")

    def _static_fit(self, pod: Mapping[str, Any], node: Mapping[str, Any], name: str, sig: str | None) -> str:
        """Why ``node`` is ruled out for ``pod`` before resources (unschedulable, taints, affinity),
        or "" when it is not; kept per pod signature until the node changes (its resourceVersion),
        since the signature holds every pod field these checks read."""
        rv = meta_of(node).get("resourceVersion")
        if sig is not None and rv is not None:
            hit = self._fit_cache.get((sig, name))
            if hit is not None and hit[0] == rv:
                return hit[1]
        tolerations = _dig(pod, "spec", "tolerations") or []
        why = ""
        if _dig(node, "spec", "unschedulable") and not tolerates(
                tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
            why = "node(s) were unschedulable"
        else:
            bad = [t for t in _dig(node, "spec", "taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")
                   and not tolerates(tolerations, t)]
            if bad:
                t = bad[0]
                why = f"node(s) had untolerated taint {{{t.get('key')}: {t.get('value') or ''}}}"
            elif not node_affinity_ok(pod, node):
                why = "node(s) didn't match Pod's node affinity/selector"
        if sig is not None and rv is not None:
            self._fit_cache[(sig, name)] = (rv, why)
        return why

    def _find_node(self, pod: Mapping[str, Any], req: Mapping[str, int],
                   nodes: list[Mapping[str, Any]], sig: str | None = None) -> tuple[str | None, str]:
        reasons: dict[str, int] = {}
        preempt: dict[str, int] = {}
        best: tuple[float, str] | None = None
        for node in nodes:
            name = str(meta_of(node).get("name"))
            fail: list[str] = []
            resolvable = False
            why = self._static_fit(pod, node, name, sig)
            if why:
                fail = [why]
            else:
                alloc = self._allocatable(name, node)
                used = self._node_used.get(name, {})
                for res, amount in sorted(req.items()):
                    if amount and used.get(res, _ZERO) + amount > alloc.get(res, _ZERO):
                        fail.append("Too many pods" if res == "pods" else f"Insufficient {res}")
                resolvable = bool(fail)
            if fail:
                for r in fail:
                    reasons[r] = reasons.get(r, 0) + 1
                why = _NO_VICTIMS if resolvable else _UNRESOLVABLE
                preempt[why] = preempt.get(why, 0) + 1
                continue
            score = self._load(name, node)
            if best is None or (score, name) < best:
                best = (score, name)
        if best is not None:
            return best[1], ""
        total = len(nodes)
        if not total:
            return None, "no nodes available to schedule pods"
        first = ", ".join(sorted(f"{n} {r}" for r, n in reasons.items()))
        second = ", ".join(sorted(f"{n} {r}" for r, n in preempt.items()))
        return None, f"0/{total} nodes are available: {first}. preemption: 0/{total} nodes are available: {second}."

    def _allocatable(self, name: str, node: Mapping[str, Any]) -> dict[str, int]:
        """The node's parsed ``status.allocatable``, kept until the node object changes.

        Why: the scheduler checks every node for every pod, and parsing the same quantities
        again each time was the largest part of the scheduling pass (docs/performance.md). An
        unparsable quantity counts as 0, which fits nothing, as before.
        """
        rv = meta_of(node).get("resourceVersion")
        hit = self._alloc_cache.get(name)
        if hit is not None and hit[0] == rv and rv is not None:
            return hit[1]
        parsed: dict[str, int] = {}
        for res, raw in (_dig(node, "status", "allocatable") or {}).items():
            try:
                parsed[res] = milli_value(decode_quantity(raw))
            except ValueError:
                parsed[res] = _ZERO
        self._alloc_cache[name] = (rv, parsed)
        return parsed

    def _load(self, name: str, node: Mapping[str, Any]) -> float:
        alloc = self._allocatable(name, node)
        used = self._node_used.get(name, {})
        score = 0.0
        for res in ("cpu", "memory"):
            cap = alloc.get(res)
            if cap:
                score += float(used.get(res, _ZERO) / cap)
        return score

    def _charge(self, key: Key, node: str, req: Mapping[str, int]) -> None:
        if key in self._charged:
            return
        self._charged[key] = (node, dict(req))
        used = self._node_used.setdefault(node, {})
        for k, val in req.items():
            used[k] = used.get(k, 0) + val

    def _uncharge(self, key: Key) -> None:
        entry = self._charged.pop(key, None)
        if entry is None:
            return
        node, req = entry
        used = self._node_used.setdefault(node, {})
        for k, val in req.items():
            used[k] = used.get(k, 0) - val
        self._kick(full=True)

    def _mark_unschedulable(self, pod: Mapping[str, Any], msg: str) -> None:
        for c in _dig(pod, "status", "conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message") == msg:
                return
        key = self._key(pod)

        def mark(p: dict[str, Any]) -> None:
            set_condition(p.setdefault("status", {}), "PodScheduled", "False", "Unschedulable", msg)
        try:
            self.api.write("pods", key[0], key[1], mark)
        except ApiError:
            return
        log.info("scheduler: pod %s/%s unschedulable: %s", key[0], key[1], msg)
        self._event(pod, "FailedScheduling", msg, "Warning", component="default-scheduler")

    # ---- kubelet: pod lifecycle ------------------------------------------------------------------------
    def _write(self, sim: PodSim, mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
        try:
            written = self.api.write("pods", sim.key[0], sim.key[1], mutate)
        except ApiError:
            return None
        self.usage.sync(sim.key, written)
        return written

    def _node_ip(self, node: str) -> str:
        n = self.store.peek("nodes", "", node)
        for a in _dig(n or {}, "status", "addresses") or []:
            if a.get("type") == "InternalIP":
                return str(a.get("address"))
        return "10.0.0.1"

    def _accept(self, sim: PodSim) -> None:
        """First status the kubelet posts: Pending, ContainerCreating, startTime, IPs."""
        n = len(self._pods)
        host_ip = self._node_ip(sim.node)
        pod_ip = f"10.244.{(n // 250) % 250}.{n % 250 + 2}"

        def accept(p: dict[str, Any]) -> None:
            st = p.setdefault("status", {})
            st["phase"] = "Pending"
            st.setdefault("startTime", now_iso())
            st["hostIP"] = host_ip
            st["hostIPs"] = [{"ip": host_ip}]
            st["podIP"] = pod_ip
            st["podIPs"] = [{"ip": pod_ip}]
            set_condition(st, "PodReadyToStartContainers", "False")
            set_condition(st, "Initialized", "True")
            names = [c.get("name") for c in p["spec"].get("containers") or []]
            unready = f"containers with unready status: [{' '.join(names)}]"
            set_condition(st, "Ready", "False", "ContainersNotReady", unready)
            set_condition(st, "ContainersReady", "False", "ContainersNotReady", unready)
            st["containerStatuses"] = [self._waiting(c, "ContainerCreating") for c in p["spec"]["containers"]]
            inits = p["spec"].get("initContainers") or []
            if inits:
                now = now_iso()
                st["initContainerStatuses"] = [{
                    "name": c.get("name"), "image": c.get("image"), "imageID": "", "ready": True,
                    "restartCount": 0, "started": False, "containerID": f"containerd://{sim.uid[:8]}-init",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now,
                                             "finishedAt": now}}, "lastState": {}} for c in inits]
        if self._write(sim, accept) is None:
            return
        deadline = _dig(self.store.peek("pods", *sim.key) or {}, "spec", "activeDeadlineSeconds")
        if isinstance(deadline, int) and deadline > 0:
            self._after(sim, float(deadline), self._deadline, sim)
        self._after(sim, 0.0, self._prepare, sim)

    @staticmethod
    def _waiting(c: Mapping[str, Any], reason: str, message: str | None = None) -> dict[str, Any]:
        waiting: dict[str, Any] = {"reason": reason}
        if message:
            waiting["message"] = message
        return {"name": c.get("name"), "image": c.get("image"), "imageID": "", "ready": False, "restartCount": 0,
                "started": False, "state": {"waiting": waiting}, "lastState": {}}

    def _missing_refs(self, pod: Mapping[str, Any], volumes: bool) -> list[tuple[str, str]]:
        """(kind, name) of non-optional Secrets/ConfigMaps the pod needs that do not exist."""
        ns = str(meta_of(pod).get("namespace"))
        spec = pod.get("spec") or {}
        wanted: list[tuple[str, str, str]] = []
        if volumes:
            for vol in spec.get("volumes") or []:
                if isinstance(vol.get("secret"), dict) and not vol["secret"].get("optional"):
                    wanted.append(("secrets", str(vol["secret"].get("secretName")), str(vol.get("name"))))
                if isinstance(vol.get("configMap"), dict) and not vol["configMap"].get("optional"):
                    wanted.append(("configmaps", str(vol["configMap"].get("name")), str(vol.get("name"))))
                for src in _dig(vol, "projected", "sources") or []:
                    if isinstance(src.get("secret"), dict) and not src["secret"].get("optional"):
                        wanted.append(("secrets", str(src["secret"].get("name")), str(vol.get("name"))))
        else:
            for c in spec.get("containers") or []:
                for e in c.get("env") or []:
                    ref = _dig(e, "valueFrom", "secretKeyRef")
                    if isinstance(ref, dict) and not ref.get("optional"):
                        wanted.append(("secrets", str(ref.get("name")), str(c.get("name"))))
                    ref = _dig(e, "valueFrom", "configMapKeyRef")
                    if isinstance(ref, dict) and not ref.get("optional"):
                        wanted.append(("configmaps", str(ref.get("name")), str(c.get("name"))))
                for e in c.get("envFrom") or []:
                    for kind, plural in (("secretRef", "secrets"), ("configMapRef", "configmaps")):
                        ref = e.get(kind)
                        if isinstance(ref, dict) and not ref.get("optional"):
                            wanted.append((plural, str(ref.get("name")), str(c.get("name"))))
        return [(plural, name) for plural, name, _ in wanted if self.store.peek(plural, ns, name) is None]

    def _prepare(self, sim: PodSim) -> None:
        """Mount volumes: a missing Secret keeps the pod in ContainerCreating (FailedMount)."""
        pod = self.store.peek("pods", *sim.key)
        if pod is None:
            return
        missing = self._missing_refs(pod, volumes=True)
        if missing:
            if sim.state != "mount":
                sim.state = "mount"
                plural, name = missing[0]
                kind = "secret" if plural == "secrets" else "configmap"
                self._event(pod, "FailedMount", f'MountVolume.SetUp failed for volume "{name}" : {kind} "{name}" '
                            "not found", "Warning", host=sim.node)
            self._after(sim, self.retry_period, self._prepare, sim)
            return
        self.secret_mounts.mount(sim.key, sim.uid, pod, lambda ns, name: self.store.peek("secrets", ns, name))
        sim.state = "pulling"
        images = sorted({str(c.get("image")) for c in _dig(pod, "spec", "containers") or []})
        self._event(pod, "Pulling", f'Pulling image "{images[0] if images else ""}"', host=sim.node)
        pull = max((s.pull for s in sim.scenarios.values() if isinstance(s, Scenario)), default=0.0)
        self._after(sim, pull, self._pulled, sim)

    def _pulled(self, sim: PodSim) -> None:
        pod = self.store.peek("pods", *sim.key)
        if pod is None:
            return
        failing = [c for c in _dig(pod, "spec", "containers") or []
                   if isinstance(sim.scenarios.get(str(c.get("name"))), Scenario)
                   and sim.scenarios[str(c.get("name"))].pull_error]  # type: ignore[union-attr]
        if failing:
            self._pull_failed(sim, "ErrImagePull")
            return
        self._event(pod, "Pulled", "Container image already present on machine", host=sim.node)
        self._create(sim)

    def _pull_failed(self, sim: PodSim, reason: str) -> None:
        pod = self.store.peek("pods", *sim.key)
        if pod is None:
            return
        sim.state = "pulling"

        def fail(p: dict[str, Any]) -> None:
            statuses = []
            for c in p["spec"]["containers"]:
                sc = sim.scenarios.get(str(c.get("name")))
                image = c.get("image")
                if isinstance(sc, Scenario) and sc.pull_error:
                    msg = (f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and '
                           f'unpack image "{image}": failed to resolve reference "{image}": {image}: not found'
                           if reason == "ErrImagePull" else f'Back-off pulling image "{image}"')
                    statuses.append(self._waiting(c, reason, msg))
                else:
                    statuses.append(self._waiting(c, "ContainerCreating"))
            p["status"]["containerStatuses"] = statuses
        self._write(sim, fail)
        image = next((c.get("image") for c in _dig(pod, "spec", "containers") or []), "")
        if reason == "ErrImagePull":
            self._event(pod, "Failed", f'Failed to pull image "{image}": not found', "Warning", host=sim.node)
            self._after(sim, 0.5, self._pull_failed, sim, "ImagePullBackOff")
        else:
            self._event(pod, "BackOff", f'Back-off pulling image "{image}"', "Normal", host=sim.node)
            sim.backoff = min(sim.backoff * 2, 300.0)
            self._after(sim, sim.backoff, self._pull_failed, sim, "ErrImagePull")

    def _create(self, sim: PodSim) -> None:
        """Create containers: env from a missing Secret or a bad scenario stops here."""
        pod = self.store.peek("pods", *sim.key)
        if pod is None:
            return
        missing = self._missing_refs(pod, volumes=False)
        errors: dict[str, tuple[str, str]] = {}
        for c in _dig(pod, "spec", "containers") or []:
            name = str(c.get("name"))
            sc = sim.scenarios.get(name)
            if isinstance(sc, ScenarioError):
                errors[name] = ("CreateContainerError", f"ce-k8s sim: {sc}")
            elif isinstance(sc, Scenario) and sc.config_error:
                errors[name] = ("CreateContainerConfigError", sc.config_error)
        if missing:
            plural, ref = missing[0]
            kind = "secret" if plural == "secrets" else "configmap"
            for c in _dig(pod, "spec", "containers") or []:
                errors.setdefault(str(c.get("name")), ("CreateContainerConfigError", f'{kind} "{ref}" not found'))
        if errors:
            first = next(iter(errors.values()))
            if sim.state != "config":
                sim.state = "config"

                def block(p: dict[str, Any]) -> None:
                    p["status"]["containerStatuses"] = [
                        self._waiting(c, *errors[str(c.get("name"))]) if str(c.get("name")) in errors
                        else self._waiting(c, "ContainerCreating") for c in p["spec"]["containers"]]
                self._write(sim, block)
                self._event(pod, "Failed", f"Error: {first[1]}", "Warning", host=sim.node)
            if missing:
                self._after(sim, self.retry_period, self._create, sim)
            return
        self._start(sim)

    def _secrets_changed(self, ns: str) -> None:
        for sim in list(self._pods.values()):
            if sim.key[0] == ns and sim.state in ("mount", "config"):
                sim.cancel()
                if sim.state == "mount":
                    self._prepare(sim)
                else:
                    self._create(sim)

    def _start(self, sim: PodSim) -> None:
        pod = self.store.peek("pods", *sim.key)
        if pod is None:
            return
        sim.state = "running"
        started = now_iso()

        def run(p: dict[str, Any]) -> None:
            st = p["status"]
            st["phase"] = "Running"
            statuses = []
            for i, c in enumerate(p["spec"]["containers"]):
                statuses.append({
                    "name": c.get("name"), "image": c.get("image"),
                    "imageID": f"sim.ce-k8s.io/{c.get('image')}@sha256:{'0' * 64}",
                    "containerID": f"containerd://{sim.uid.replace('-', '')}{i:02d}",
                    "ready": True, "restartCount": 0, "started": True,
                    "state": {"running": {"startedAt": started}}, "lastState": {}})
            st["containerStatuses"] = statuses
            for ctype in ("PodReadyToStartContainers", "ContainersReady", "Ready"):
                set_condition(st, ctype, "True")
        running = self._write(sim, run)
        if running is None:
            return
        self.usage.start(sim.key, sim.uid, sim.node, running)
        log.info("kubelet: pod %s/%s running on %s", sim.key[0], sim.key[1], sim.node)
        self._event(pod, "Started", "Started container", host=sim.node)
        for c in _dig(pod, "spec", "containers") or []:
            name = str(c.get("name"))
            sc = sim.scenarios.get(name)
            if isinstance(sc, Scenario):
                self._log(sim, name, sc.output)
        self._schedule_ends(sim, pod)

    def _schedule_ends(self, sim: PodSim, pod: Mapping[str, Any]) -> None:
        """Arm each running container's exit, OOM and node-pressure eviction timers."""
        for c in _dig(pod, "spec", "containers") or []:
            name = str(c.get("name"))
            sc = sim.scenarios.get(name)
            if not isinstance(sc, Scenario):
                continue
            ends: list[tuple[float, int, str]] = []
            if sc.run is not None:
                ends.append((sc.run, sc.exit_code, "Completed" if sc.exit_code == 0 else "Error"))
            if sc.oom_after is not None:
                ends.append((sc.oom_after, 137, "OOMKilled"))
            if ends:
                when, code, reason = min(ends)
                self._after(sim, when, self._exit, sim, name, code, reason)
            if sc.evict_after is not None:
                self._after(sim, sc.evict_after, self._evict_pressure, sim, name)

    def _log(self, sim: PodSim, container: str, output: list[tuple[str, str]]) -> None:
        if not output:
            return
        lines = []
        for stream, text in output:
            for line in text.splitlines() or [""]:
                lines.append((_now_nano(), stream, line + "\n"))
        with self.store.lock:
            self.store.logs.setdefault((sim.key[0], sim.key[1], container), []).extend(lines)

    def _terminated(self, c: Mapping[str, Any], prev: Mapping[str, Any] | None, code: int, reason: str,
                    message: str | None = None) -> dict[str, Any]:
        started = _dig(prev or {}, "state", "running", "startedAt")
        term: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now_iso()}
        if message:
            term["message"] = message
        if prev and prev.get("containerID"):
            term["containerID"] = prev.get("containerID")
        out = dict(prev) if prev else self._waiting(c, "ContainerCreating")
        out.update({"ready": False, "started": False, "state": {"terminated": term}})
        return out

    def _exit(self, sim: PodSim, container: str, code: int, reason: str) -> None:
        def finish(p: dict[str, Any]) -> None:
            st = p["status"]
            statuses = st.get("containerStatuses") or []
            st["containerStatuses"] = [self._terminated(c, cs, code, reason) if cs.get("name") == container else cs
                                       for c, cs in zip(p["spec"]["containers"], statuses, strict=False)]
            self._settle(st, p["spec"])
        self._write(sim, finish)
        log.info("kubelet: pod %s/%s container %s exited %d (%s)", sim.key[0], sim.key[1], container, code, reason)

    @staticmethod
    def _settle(st: dict[str, Any], spec: Mapping[str, Any]) -> None:
        """Pod phase from container states (restartPolicy Never: terminal once all have exited)."""
        statuses = st.get("containerStatuses") or []
        if not statuses or not all("terminated" in (cs.get("state") or {}) for cs in statuses):
            return
        codes = [cs["state"]["terminated"].get("exitCode", 0) for cs in statuses]
        st["phase"] = "Succeeded" if all(c == 0 for c in codes) else "Failed"
        for ctype in ("Ready", "ContainersReady"):
            set_condition(st, ctype, "False", "PodCompleted")
        set_condition(st, "PodReadyToStartContainers", "False")

    def _kill_all(self, st: dict[str, Any], spec: Mapping[str, Any], code: int, reason: str) -> None:
        statuses = st.get("containerStatuses") or []
        out = []
        for c, cs in zip(spec.get("containers") or [], statuses, strict=False):
            if "terminated" in (cs.get("state") or {}):
                out.append(cs)
            elif "running" in (cs.get("state") or {}):
                out.append(self._terminated(c, cs, code, reason))
            else:
                out.append(self._terminated(c, cs, 137, "ContainerStatusUnknown",
                                            "The container could not be located when the pod was terminated"))
        st["containerStatuses"] = out

    def _deadline(self, sim: PodSim) -> None:
        pod = self.store.peek("pods", *sim.key)
        if pod is None or _dig(pod, "status", "phase") in TERMINAL_PHASES or sim.state == "terminating":
            return
        sim.cancel()
        sim.state = "done"
        msg = "Pod was active on the node longer than the specified deadline"

        def fail(p: dict[str, Any]) -> None:
            st = p["status"]
            self._kill_all(st, p["spec"], 137, "Error")
            st["phase"] = "Failed"
            st["reason"] = "DeadlineExceeded"
            st["message"] = msg
            for ctype in ("Ready", "ContainersReady"):
                set_condition(st, ctype, "False", "PodFailed")
        self._write(sim, fail)
        self._event(pod, "DeadlineExceeded", msg, "Warning", host=sim.node)

    def _evict_pressure(self, sim: PodSim, container: str) -> None:
        pod = self.store.peek("pods", *sim.key)
        if pod is None or _dig(pod, "status", "phase") in TERMINAL_PHASES:
            return
        sim.cancel()
        sim.state = "done"
        msg = ("The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
               f"Container {container} was using 2Gi, request is 0, has larger consumption of memory. ")

        def evict(p: dict[str, Any]) -> None:
            st = p["status"]
            set_condition(st, "DisruptionTarget", "True", "TerminationByKubelet", msg)
            self._kill_all(st, p["spec"], 137, "Error")
            st["phase"] = "Failed"
            st["reason"] = "Evicted"
            st["message"] = msg
            for ctype in ("Ready", "ContainersReady"):
                set_condition(st, ctype, "False", "PodFailed")
        self._write(sim, evict)
        self._event(pod, "Evicted", msg, "Warning", host=sim.node)

    def _terminate(self, sim: PodSim) -> None:
        """Graceful deletion seen: SIGTERM, wait, mark the containers exited, confirm the delete."""
        pod = self.store.peek("pods", *sim.key)
        if pod is None:
            return
        sim.cancel()
        was = sim.state
        sim.state = "terminating"
        if was != "running":
            self._after(sim, 0.0, self._confirm_delete, sim)
            return
        grace = meta_of(pod).get("deletionGracePeriodSeconds")
        grace_s = float(grace) if isinstance(grace, int) else 30.0
        ignore = any(isinstance(s, Scenario) and s.ignore_sigterm for s in sim.scenarios.values())
        wait = grace_s if ignore else min(grace_s, self.kill_time)
        self._event(pod, "Killing", "Stopping container", host=sim.node)

        def stopped() -> None:
            def kill(p: dict[str, Any]) -> None:
                st = p["status"]
                statuses = st.get("containerStatuses") or []
                out = []
                for c, cs in zip(p["spec"]["containers"], statuses, strict=False):
                    sc = sim.scenarios.get(str(c.get("name")))
                    code = 137 if ignore or not isinstance(sc, Scenario) else sc.term_exit
                    if "running" in (cs.get("state") or {}):
                        out.append(self._terminated(c, cs, code, "Error"))
                    else:
                        out.append(cs)
                st["containerStatuses"] = out
                self._settle(st, p["spec"])
            self._write(sim, kill)
            self._confirm_delete(sim)
        self._after(sim, wait, stopped)

    def _confirm_delete(self, sim: PodSim) -> None:
        try:
            self.api.delete("pods", sim.key[0], sim.key[1], {"gracePeriodSeconds": 0,
                                                             "preconditions": {"uid": sim.uid}})
        except ApiError as e:
            log.debug("kubelet delete %s/%s: %s", *sim.key, e.message)

    # ---- nodes -----------------------------------------------------------------------------------------
    def _set_ready(self, node: str, ready: bool | None) -> None:
        def mark(n: dict[str, Any]) -> None:
            st = n.setdefault("status", {})
            for ctype, reason, msg in _PRESSURE:
                if ready is None:
                    set_condition(st, ctype, "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
                else:
                    set_condition(st, ctype, "False", reason, msg)
            if ready is None:
                set_condition(st, "Ready", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
            else:
                set_condition(st, "Ready", "True" if ready else "False", "KubeletReady" if ready else "KubeletNotReady",
                              "kubelet is posting ready status" if ready else "container runtime is down")
        try:
            self.api.write("nodes", None, node, mark)
        except ApiError as e:
            log.debug("node %s: %s", node, e.message)

    def _set_taint(self, node: str, taint: dict[str, str], present: bool) -> None:
        def edit(n: dict[str, Any]) -> None:
            spec = n.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or []
                      if not (t.get("key") == taint["key"] and t.get("effect") == taint["effect"])]
            if present:
                taints.append(dict(taint, timeAdded=now_iso()) if taint["effect"] == "NoExecute" else dict(taint))
            if taints:
                spec["taints"] = taints
            else:
                spec.pop("taints", None)
        self.api.write("nodes", None, node, edit, status=False)

    def _set_cordon(self, node: str, on: bool) -> None:
        def edit(n: dict[str, Any]) -> None:
            if on:
                n.setdefault("spec", {})["unschedulable"] = True
            else:
                n.setdefault("spec", {}).pop("unschedulable", None)
        self.api.write("nodes", None, node, edit, status=False)
        self._set_taint(node, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}, on)

    def _pods_on(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.store.peek_list("pods") if _dig(p, "spec", "nodeName") == node]

    def _drain(self, node: str) -> list[str]:
        self._set_cordon(node, True)
        evicted = []
        for pod in self._pods_on(node):
            if _dig(pod, "status", "phase") in TERMINAL_PHASES or meta_of(pod).get("deletionTimestamp"):
                continue
            ns, name = self._key(pod)
            try:
                self.api.evict(ns, name, {"apiVersion": "policy/v1", "kind": "Eviction",
                                          "metadata": {"name": name, "namespace": ns}})
                evicted.append(name)
            except ApiError as e:
                log.debug("drain %s: evict %s/%s: %s", node, ns, name, e.message)
        return evicted

    def _lose(self, node: str) -> None:
        if node in self._lost:
            return
        self._lost.add(node)
        self._set_ready(node, None)
        self._set_taint(node, {"key": UNREACHABLE, "effect": "NoSchedule"}, True)
        self._set_taint(node, {"key": UNREACHABLE, "effect": "NoExecute"}, True)
        timers = self._lost_timers.setdefault(node, [])
        for pod in self._pods_on(node):
            key = self._key(pod)
            sim = self._pods.get(key)
            if sim is not None:
                sim.cancel()
                sim.state = "frozen"
            if _dig(pod, "status", "phase") in TERMINAL_PHASES:
                continue
            # The node lifecycle controller's MarkPodsNotReady: Ready goes False, reason kept.
            self._mark_not_ready(key)
            wait = 300.0
            for t in _dig(pod, "spec", "tolerations") or []:
                if t.get("key") == UNREACHABLE and t.get("effect") in (None, "NoExecute"):
                    wait = float(t["tolerationSeconds"]) if t.get("tolerationSeconds") is not None else float("inf")
            if wait != float("inf"):
                uid = str(meta_of(pod).get("uid"))
                timers.append(self.loop.call_later(wait * self.time_scale, self._node_lost_pod, node, key, uid))
        log.info("node %s lost", node)

    def _mark_not_ready(self, key: Key) -> None:
        """Ready=False on a lost node's pod, as the node lifecycle controller writes it (the
        condition's reason untouched): a reader of Ready sees the pod is not serving."""
        def not_ready(p: dict[str, Any]) -> None:
            for cond in _dig(p, "status", "conditions") or []:
                if cond.get("type") == "Ready" and cond.get("status") != "False":
                    cond["status"] = "False"
                    cond["lastTransitionTime"] = now_iso()
        try:
            self.api.write("pods", key[0], key[1], not_ready)
        except ApiError as e:
            log.debug("node lost %s/%s: %s", *key, e.message)

    def _unconfirmable(self, pod: Mapping[str, Any]) -> bool:
        """Whether a deleted pod's kubelet cannot confirm the kill (its node is lost): the pod
        then stays Terminating past its grace period, as on a real cluster (Api.grace_holds)."""
        return _dig(pod, "spec", "nodeName") in self._lost

    def _node_lost_pod(self, node: str, key: Key, uid: str) -> None:
        """The taint manager's eviction, as kube-controller-manager's taint-eviction-controller
        does it: DisruptionTarget, then a graceful delete. Nothing else touches the pod: with no
        kubelet to kill the containers and confirm, it stays Running with a deletionTimestamp
        until the node is back or someone force-deletes it (finding 5 of
        docs/real-kubernetes.md, tests/real/test_emulator_parity.py)."""
        pod = self.store.peek("pods", *key)
        if pod is None or meta_of(pod).get("uid") != uid or node not in self._lost:
            return

        def lost(p: dict[str, Any]) -> None:
            set_condition(p.setdefault("status", {}), "DisruptionTarget", "True", "DeletionByTaintManager",
                          "Taint manager: deleting due to NoExecute taint")
        try:
            self.api.write("pods", key[0], key[1], lost)
            self._event(pod, "TaintManagerEviction", f"Marking for deletion Pod {key[0]}/{key[1]}",
                        component="taint-eviction-controller")
            self.api.delete("pods", key[0], key[1], {"preconditions": {"uid": uid}})
        except ApiError as e:
            log.debug("node lost %s/%s: %s", *key, e.message)

    def _restore(self, node: str) -> None:
        if node not in self._lost:
            return
        self._lost.discard(node)
        for t in self._lost_timers.pop(node, []):
            t.cancel()
        self._set_taint(node, {"key": UNREACHABLE, "effect": "NoSchedule"}, False)
        self._set_taint(node, {"key": UNREACHABLE, "effect": "NoExecute"}, False)
        self._set_ready(node, True)
        for pod in self._pods_on(node):
            key = self._key(pod)
            sim = self._pods.pop(key, None)
            if sim is not None:
                sim.cancel()
            if _dig(pod, "status", "phase") in TERMINAL_PHASES:
                continue
            if _dig(pod, "status", "phase") == "Running" and not meta_of(pod).get("deletionTimestamp"):
                # The containers kept running while the node was cut off: resume their clocks.
                fresh = PodSim(key, str(meta_of(pod).get("uid")), node, self._scenarios(pod), state="running")
                self._pods[key] = fresh
                self._schedule_ends(fresh, pod)
            else:
                self._observe(key)
        log.info("node %s restored", node)
