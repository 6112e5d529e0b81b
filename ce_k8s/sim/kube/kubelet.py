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
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ce_k8s.sim.kube.api import TERMINAL_PHASES, Api, meta_of
from ce_k8s.sim.kube.cluster import DEFAULT_NODES, NodeSpec, parse_nodes
from ce_k8s.sim.kube.errors import ApiError
from ce_k8s.sim.kube.kubelet_nodes import NodeLifecycle
from ce_k8s.sim.kube.kubelet_pods import Key, PodLifecycle, PodSim, dig, pod_key
from ce_k8s.sim.kube.kubelet_scheduler import Scheduler
from ce_k8s.sim.kube.kubelet_secrets import SecretMounts
from ce_k8s.sim.kube.kubelet_stats import UsageMeter
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


class Kubelet:
    """Scheduler + kubelets of all nodes + node lifecycle controller, on the server's loop.

    This class takes the store's events in and holds the pods it runs; the work is done by its
    parts: `scheduler` (kubelet_scheduler.py), `pod_lifecycle` (kubelet_pods.py) and
    `node_lifecycle` (kubelet_nodes.py).
    """

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
        self._thread_id: int | None = None
        self._running = False
        # What each pod's Secret volumes show its containers (kubelet_secrets.py).
        self.secret_mounts = SecretMounts()
        # What the containers use, for the Summary API (kubelet_stats.py, docs/accounting.md).
        self.usage = UsageMeter()
        self._started_at = time.time()
        self.scheduler = Scheduler(api, self._event, lambda: self._running)
        self.pod_lifecycle = PodLifecycle(api, self._pods, self.usage, self.secret_mounts, self._after, self._event,
                                          retry_period=retry_period, kill_time=kill_time)
        self.node_lifecycle = NodeLifecycle(api, self._pods, time_scale, self._event, self._observe,
                                            self._scenarios, self.pod_lifecycle.schedule_ends)

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Register nodes, subscribe to store events and adopt existing pods (loop thread)."""
        self._thread_id = threading.get_ident()
        self._running = True
        for i, spec in enumerate(self.node_specs):
            self._register(spec, i)
        self.store.add_listener(self._on_event)
        self.api.grace_holds.append(self.node_lifecycle.unconfirmable)
        for pod in list(self.store.peek_list("pods")):
            self._observe(pod_key(pod))

    def stop(self) -> None:
        """Stop reacting and cancel every timer."""
        self._running = False
        self.store.remove_listener(self._on_event)
        if self.node_lifecycle.unconfirmable in self.api.grace_holds:
            self.api.grace_holds.remove(self.node_lifecycle.unconfirmable)
        for sim in self._pods.values():
            sim.cancel()
        self.node_lifecycle.cancel_timers()

    def _register(self, spec: NodeSpec, index: int) -> None:
        if self.store.peek("nodes", "", spec.name) is None:
            self.api.create("nodes", None, spec.manifest(index))
        self.node_lifecycle.set_ready(spec.name, True)

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
        self._in_loop(self.node_lifecycle.set_cordon, node, True)

    def uncordon(self, node: str) -> None:
        """``kubectl uncordon`` (any thread)."""
        self._in_loop(self.node_lifecycle.set_cordon, node, False)

    def drain(self, node: str) -> list[str]:
        """``kubectl drain``: cordon, then evict every live pod on the node; returns their names."""
        return self._in_loop(self.node_lifecycle.drain, node)  # type: ignore[no-any-return]

    def summary(self, node: str) -> dict[str, Any] | None:
        """The Summary API document of `node` (stats/v1alpha1), or None when the node is unknown or lost
        (the API server's proxy then fails: the kubelet does not answer). Any thread."""
        return self._in_loop(self._summary, node)  # type: ignore[no-any-return]

    def _summary(self, node: str) -> dict[str, Any] | None:
        if node in self.node_lifecycle.lost or self.store.peek("nodes", "", node) is None:
            return None
        return self.usage.summary(node, self.node_lifecycle.pods_on(node), self._started_at)

    def lose_node(self, node: str) -> None:
        """The node stops reporting: Ready=Unknown, unreachable taints, its pods freeze with
        Ready=False; after their unreachable toleration (default 300 s simulated) the taint
        manager marks them DisruptionTarget and deletes them, and they stay Running and
        Terminating until `restore_node` (as on a real cluster: nobody can confirm the kill)."""
        self._in_loop(self.node_lifecycle.lose, node)

    def restore_node(self, node: str) -> None:
        """The node comes back: Ready=True, taints removed, surviving pods resume."""
        self._in_loop(self.node_lifecycle.restore, node)

    def mounted_files(self, namespace: str, pod: str, volume: str | None = None) -> dict[str, bytes] | None:
        """What the pod's containers read in a Secret volume now (default: its first one): file path
        → contents; None before the volume is mounted or once the pod is gone. Any thread."""
        return self._in_loop(self.secret_mounts.files, (namespace, pod), volume)  # type: ignore[no-any-return]

    # ---- event intake --------------------------------------------------------------------------------
    def _on_event(self, resource: str, ev: WatchEvent) -> None:
        if not self._running:
            return
        if resource == "pods":
            key = pod_key(ev.obj)
            if ev.type == "DELETED":
                self.loop.call_soon(self._forget, key, str(meta_of(ev.obj).get("uid")))
            else:
                self.loop.call_soon(self._observe, key)
        elif resource == "nodes":
            if ev.type == "ADDED" and not any(c.get("type") == "Ready"
                                              for c in dig(ev.obj, "status", "conditions") or []):
                self.loop.call_soon(self.node_lifecycle.set_ready, str(meta_of(ev.obj).get("name")), True)
            self.scheduler.kick(full=True)
        elif resource == "secrets" and ev.type != "DELETED":
            ns = str(meta_of(ev.obj).get("namespace"))
            self.secret_mounts.secret_changed(ns, str(meta_of(ev.obj).get("name")), ev.obj)
            self.loop.call_soon(self.pod_lifecycle.secrets_changed, ns)

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
        phase = dig(pod, "status", "phase")
        node = dig(pod, "spec", "nodeName")
        deleting = bool(meta_of(pod).get("deletionTimestamp"))
        if phase in TERMINAL_PHASES:
            self.scheduler.drop(key)
            if sim is not None:
                if deleting and sim.state != "terminating" and node not in self.node_lifecycle.lost:
                    sim.cancel()
                    sim.state = "terminating"
                    self._after(sim, 0.0, self.pod_lifecycle.confirm_delete, sim)
                elif sim.state != "terminating":
                    sim.cancel()
                    sim.state = "done"
            return
        if not node:
            if deleting or dig(pod, "spec", "schedulerName") not in (None, "default-scheduler"):
                return
            self.scheduler.queue(key)
            return
        self.scheduler.placed(key, str(node), pod)
        if node in self.node_lifecycle.lost:
            if sim is None:
                self._pods[key] = PodSim(key, uid, str(node), self._scenarios(pod), state="frozen")
            return
        if sim is None:
            sim = PodSim(key, uid, str(node), self._scenarios(pod), backoff=self.image_pull_backoff)
            self._pods[key] = sim
            self.pod_lifecycle.accept(sim)
        if deleting and sim.state not in ("terminating",):
            self.pod_lifecycle.terminate(sim)

    def _forget(self, key: Key, uid: str) -> None:
        self.usage.forget(key, uid)
        self.secret_mounts.forget(key, uid)
        sim = self._pods.get(key)
        if sim is not None and sim.uid == uid:
            sim.cancel()
            del self._pods[key]
        if self.store.peek("pods", *key) is None:
            self.scheduler.forget(key)

    def _scenarios(self, pod: Mapping[str, Any]) -> dict[str, Scenario | ScenarioError]:
        out: dict[str, Scenario | ScenarioError] = {}
        for c in dig(pod, "spec", "containers") or []:
            try:
                out[str(c.get("name"))] = scenario_for(pod, c, self.default_scenario)
            except ScenarioError as e:
                out[str(c.get("name"))] = e
        return out

    # ---- the parts' shared services ---------------------------------------------------------------------
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
