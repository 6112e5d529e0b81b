"""The node side of the kubelet simulator: node status, cordon and drain, node loss and return.

Why a part of its own: what happens to a node as a whole (the kubelet's node status, `kubectl
cordon`/`drain`, and the node lifecycle controller with its taint manager when a node stops
reporting) concerns every pod on it but none of their container states, which stay with the pod
lifecycle (kubelet_pods.py). A lost node's pods freeze with Ready=False; after their unreachable
toleration (default 300 s simulated) the taint manager marks them DisruptionTarget and deletes
them, and they stay Running and Terminating until the node is back, as on a real cluster where no
kubelet can confirm the kill.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ce_k8s.sim.kube.api import TERMINAL_PHASES, Api, meta_of, now_iso, set_condition
from ce_k8s.sim.kube.errors import ApiError
from ce_k8s.sim.kube.kubelet_pods import EventFn, Key, PodSim, dig, pod_key
from ce_k8s.sim.kube.kubelet_scheduler import UNSCHEDULABLE_TAINT
from ce_k8s.sim.kube.scenario import Scenario, ScenarioError

log = logging.getLogger(__name__)

UNREACHABLE = "node.kubernetes.io/unreachable"
_PRESSURE = (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
             ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
             ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))


class NodeLifecycle:
    """Node conditions and taints, drains, and lost nodes with the pods on them.

    ``pods`` is the simulator's table of the pods it runs (shared); ``observe`` hands a pod back
    to the simulator to be looked at afresh, ``scenarios`` gives a pod's container scenarios and
    ``schedule_ends`` re-arms a running pod's end timers (a restored node's pods resume).
    """

    def __init__(self, api: Api, pods: dict[Key, PodSim], time_scale: float, event: EventFn,
                 observe: Callable[[Key], None],
                 scenarios: Callable[[Mapping[str, Any]], dict[str, Scenario | ScenarioError]],
                 schedule_ends: Callable[[PodSim, Mapping[str, Any]], None]) -> None:
        self.api = api
        self.store = api.store
        self.loop = api.loop
        self.time_scale = time_scale
        self._pods = pods
        self._event = event
        self._observe = observe
        self._scenarios = scenarios
        self._schedule_ends = schedule_ends
        self.lost: set[str] = set()
        self._lost_timers: dict[str, list[asyncio.TimerHandle]] = {}

    def cancel_timers(self) -> None:
        """Stop every pending taint-manager eviction (the simulator stops)."""
        for timers in self._lost_timers.values():
            for t in timers:
                t.cancel()

    def set_ready(self, node: str, ready: bool | None) -> None:
        """Post the node's conditions: Ready True or False, or Unknown (``None``) for a lost node."""
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

    def set_cordon(self, node: str, on: bool) -> None:
        """Set or clear spec.unschedulable and the unschedulable taint."""
        def edit(n: dict[str, Any]) -> None:
            if on:
                n.setdefault("spec", {})["unschedulable"] = True
            else:
                n.setdefault("spec", {}).pop("unschedulable", None)
        self.api.write("nodes", None, node, edit, status=False)
        self._set_taint(node, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}, on)

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to ``node``."""
        return [p for p in self.store.peek_list("pods") if dig(p, "spec", "nodeName") == node]

    def drain(self, node: str) -> list[str]:
        """Cordon, then evict every live pod on the node; returns their names."""
        self.set_cordon(node, True)
        evicted = []
        for pod in self.pods_on(node):
            if dig(pod, "status", "phase") in TERMINAL_PHASES or meta_of(pod).get("deletionTimestamp"):
                continue
            ns, name = pod_key(pod)
            try:
                self.api.evict(ns, name, {"apiVersion": "policy/v1", "kind": "Eviction",
                                          "metadata": {"name": name, "namespace": ns}})
                evicted.append(name)
            except ApiError as e:
                log.debug("drain %s: evict %s/%s: %s", node, ns, name, e.message)
        return evicted

    def lose(self, node: str) -> None:
        """The node stops reporting (see `Kubelet.lose_node`)."""
        if node in self.lost:
            return
        self.lost.add(node)
        self.set_ready(node, None)
        self._set_taint(node, {"key": UNREACHABLE, "effect": "NoSchedule"}, True)
        self._set_taint(node, {"key": UNREACHABLE, "effect": "NoExecute"}, True)
        timers = self._lost_timers.setdefault(node, [])
        for pod in self.pods_on(node):
            key = pod_key(pod)
            sim = self._pods.get(key)
            if sim is not None:
                sim.cancel()
                sim.state = "frozen"
            if dig(pod, "status", "phase") in TERMINAL_PHASES:
                continue
            # The node lifecycle controller's MarkPodsNotReady: Ready goes False, reason kept.
            self._mark_not_ready(key)
            wait = 300.0
            for t in dig(pod, "spec", "tolerations") or []:
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
            for cond in dig(p, "status", "conditions") or []:
                if cond.get("type") == "Ready" and cond.get("status") != "False":
                    cond["status"] = "False"
                    cond["lastTransitionTime"] = now_iso()
        try:
            self.api.write("pods", key[0], key[1], not_ready)
        except ApiError as e:
            log.debug("node lost %s/%s: %s", *key, e.message)

    def unconfirmable(self, pod: Mapping[str, Any]) -> bool:
        """Whether a deleted pod's kubelet cannot confirm the kill (its node is lost): the pod
        then stays Terminating past its grace period, as on a real cluster (Api.grace_holds)."""
        return dig(pod, "spec", "nodeName") in self.lost

    def _node_lost_pod(self, node: str, key: Key, uid: str) -> None:
        """The taint manager's eviction, as kube-controller-manager's taint-eviction-controller
        does it: DisruptionTarget, then a graceful delete. Nothing else touches the pod: with no
        kubelet to kill the containers and confirm, it stays Running with a deletionTimestamp
        until the node is back or someone force-deletes it (finding 5 of
        docs/real-kubernetes.md, tests/real/test_emulator_parity.py)."""
        pod = self.store.peek("pods", *key)
        if pod is None or meta_of(pod).get("uid") != uid or node not in self.lost:
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

    def restore(self, node: str) -> None:
        """The node reports again (see `Kubelet.restore_node`)."""
        if node not in self.lost:
            return
        self.lost.discard(node)
        for t in self._lost_timers.pop(node, []):
            t.cancel()
        self._set_taint(node, {"key": UNREACHABLE, "effect": "NoSchedule"}, False)
        self._set_taint(node, {"key": UNREACHABLE, "effect": "NoExecute"}, False)
        self.set_ready(node, True)
        for pod in self.pods_on(node):
            key = pod_key(pod)
            sim = self._pods.pop(key, None)
            if sim is not None:
                sim.cancel()
            if dig(pod, "status", "phase") in TERMINAL_PHASES:
                continue
            if dig(pod, "status", "phase") == "Running" and not meta_of(pod).get("deletionTimestamp"):
                # The containers kept running while the node was cut off: resume their clocks.
                fresh = PodSim(key, str(meta_of(pod).get("uid")), node, self._scenarios(pod), state="running")
                self._pods[key] = fresh
                self._schedule_ends(fresh, pod)
            else:
                self._observe(key)
        log.info("node %s restored", node)
