"""The kube-scheduler part of the kubelet simulator: which node a pending pod is bound to, or why none.

Why a part of its own: placing pods is a concern of its own with state of its own (the scheduling
queues, what each node has been charged, the parsed allocatable and the per-signature filter
verdicts), and the kubelet simulator (kubelet.py) only tells it what it saw: a pod to queue, a pod
placed on a node, a pod gone. It reproduces the kube-scheduler filters NodeUnschedulable,
TaintToleration (NoSchedule/NoExecute), NodeAffinity (nodeSelector and required node affinity) and
NodeResourcesFit (requests vs allocatable incl. extended resources and pod count), with the
scheduler's "0/3 nodes are available: …" message, and binds through :meth:`Api.bind` like the real
scheduler. Unschedulable pods are retried when resources are freed or nodes change (the real
scheduler's queues).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ce_k8s.quantity import decode_quantity, milli_value
from ce_k8s.sim.kube.api import TERMINAL_PHASES, Api, meta_of, set_condition
from ce_k8s.sim.kube.errors import ApiError
from ce_k8s.sim.kube.kubelet_pods import Key, dig, pod_key
from ce_k8s.sim.kube.quantity import pod_resources

log = logging.getLogger(__name__)

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
_ZERO = 0
_UNRESOLVABLE = "Preemption is not helpful for scheduling"
_NO_VICTIMS = "No preemption victims found for incoming pod"

EventFn = Callable[..., None]


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
    selector = dig(pod, "spec", "nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    terms = dig(pod, "spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
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


class Scheduler:
    """Scheduling queues and node accounting of the simulated cluster, on the server's loop.

    ``event`` records an Event (the kubelet's switch for them applies); ``is_running`` says
    whether the simulator still reacts (a pass queued before its stop does nothing).
    """

    def __init__(self, api: Api, event: EventFn, is_running: Callable[[], bool]) -> None:
        self.api = api
        self.store = api.store
        self.loop = api.loop
        self._event = event
        self._is_running = is_running
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
        self._pass_pending = False

    # ---- what the kubelet simulator tells it -------------------------------------------------------
    def queue(self, key: Key) -> None:
        """A pending pod with no node: into the active queue, unless it waits as unschedulable."""
        if key not in self._unschedulable:
            self._active[key] = None
            self.kick()

    def placed(self, key: Key, node: str, pod: Mapping[str, Any]) -> None:
        """A pod bound to ``node``: out of the queues, its requests charged to the node."""
        self._active.pop(key, None)
        self._unschedulable.pop(key, None)
        if key not in self._charged:
            self._charge(key, node, self._requests(key, pod))

    def drop(self, key: Key) -> None:
        """A finished pod: its requests freed (which retries the unschedulable), out of the queues."""
        self._uncharge(key)
        self._active.pop(key, None)
        self._unschedulable.pop(key, None)

    def forget(self, key: Key) -> None:
        """A pod gone from the store: as `drop`, and its signature forgotten."""
        self.drop(key)
        self._sig.pop(key, None)

    # ---- the scheduling pass -----------------------------------------------------------------------
    def kick(self, full: bool = False) -> None:
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
        if not self._is_running():
            return
        nodes = [n for n in self.store.peek_list("nodes")]
        memo: dict[str, str] = {}
        batch = list(self._active)
        self._active.clear()
        for key in batch:
            pod = self.store.peek("pods", *key)
            if pod is None or dig(pod, "spec", "nodeName") or meta_of(pod).get("deletionTimestamp") \
                    or dig(pod, "status", "phase") in TERMINAL_PHASES:
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
        tolerations = dig(pod, "spec", "tolerations") or []
        why = ""
        if dig(node, "spec", "unschedulable") and not tolerates(
                tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
            why = "node(s) were unschedulable"
        else:
            bad = [t for t in dig(node, "spec", "taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")
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
        for res, raw in (dig(node, "status", "allocatable") or {}).items():
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
        self.kick(full=True)

    def _mark_unschedulable(self, pod: Mapping[str, Any], msg: str) -> None:
        for c in dig(pod, "status", "conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message") == msg:
                return
        key = pod_key(pod)

        def mark(p: dict[str, Any]) -> None:
            set_condition(p.setdefault("status", {}), "PodScheduled", "False", "Unschedulable", msg)
        try:
            self.api.write("pods", key[0], key[1], mark)
        except ApiError:
            return
        log.info("scheduler: pod %s/%s unschedulable: %s", key[0], key[1], msg)
        self._event(pod, "FailedScheduling", msg, "Warning", component="default-scheduler")
