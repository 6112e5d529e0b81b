"""The cluster's disruptions in the emulated bed: pilots marked `evicted` lose their first pod.

An eviction is the cluster's doing (a drain, an admin), so it goes through policy/v1 Eviction
with the site's rights, never the agent's. Kept apart from `TestBed` (ce_k8s.sim.testbed): it
acts on the cluster the bed runs on (the emulator's store when the bed can read it, the API
otherwise), while the bed only drives its daemons.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ce_k8s.sim.condor.schedd import Schedd, eval_str
from ce_k8s.sim.factoryside import Outcome

#: The annotation the agent puts on each pod: the CE job's GlobalJobId (ce_k8s.pods.builder).
GJID_ANNOTATION = "ce-k8s.htcondor.org/global-job-id"


class Disruptions:
    """Evicts the running pod of each pilot marked `evicted`, once. The server and the two API
    clients are read through callables because the bed makes them in `start`, after this part."""

    def __init__(self, schedd: Schedd, outcomes: dict[str, Outcome], evicted: set[str],
                 server: Callable[[], Any], core: Callable[[], Any], evict_core: Callable[[], Any]) -> None:
        self.schedd = schedd
        self.outcomes = outcomes
        self.evicted = evicted
        self.server = server
        self.core = core
        self.evict_core = evict_core

    def turn(self) -> None:
        """Evict the first pod of each pilot marked ``evicted`` once it runs (policy/v1 Eviction,
        so the pod gets the DisruptionTarget condition); API faults just delay it a tick.

        The pod's own phase decides, as in the real-HTCondor demo (ce_k8s.demos.condordemo), not the
        CE job's status: under injected faults and agent restarts the CE may learn of the start
        only after a short pilot has ended, and the eviction never happened (a CI flake)."""
        from kubernetes.client.rest import ApiException

        for job, out in list(self.outcomes.items()):     # a soak submits between turns
            if not out.pilot.evicted or job in self.evicted or out.status != "queued":
                continue
            source = self.schedd.get(job)
            gjid = eval_str(source, "GlobalJobId") if source is not None else None
            pod = self._find_running_pod(gjid) if gjid else None
            if pod is None:
                continue
            name, ns = pod
            body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
            try:
                self.evict_core().create_namespaced_pod_eviction(name, ns, body, _request_timeout=5)
            except ApiException as exc:
                if exc.status != 404:
                    continue
            except Exception:  # an injected timeout or applied-then-lost answer: did it apply?
                if not self._disrupted(name, ns):
                    continue
            self.evicted.add(job)      # once per pilot, whatever the answer said

    def _disrupted(self, name: str, ns: str) -> bool:
        """Whether the pod is gone or carries DisruptionTarget (an eviction whose answer was lost applied)."""
        def disrupted(pod: dict[str, Any] | None) -> bool:
            return pod is None or any(c.get("type") == "DisruptionTarget"
                                      for c in (pod.get("status") or {}).get("conditions") or [])

        if not hasattr(self.server(), "store"):
            from kubernetes.client.rest import ApiException
            try:
                pod = self.core().read_namespaced_pod(name, ns, _request_timeout=5)
            except ApiException as exc:
                return exc.status == 404
            return disrupted({"status": {"conditions": [{"type": c.type} for c in pod.status.conditions or []]}})
        return bool(self.server().call(lambda: disrupted(self.server().store.peek("pods", ns, name))))

    def _find_running_pod(self, gjid: str) -> tuple[str, str] | None:
        """The Running pod of the CE job whose GlobalJobId is `gjid` (the agent's annotation), if any."""
        def running(obj: Any) -> tuple[str, str] | None:
            if not isinstance(obj, dict):
                obj = {"metadata": obj.metadata.to_dict(), "status": obj.status.to_dict()}
            meta, status = obj.get("metadata") or {}, obj.get("status") or {}
            if (meta.get("annotations") or {}).get(GJID_ANNOTATION) == gjid and status.get("phase") == "Running":
                return meta.get("name", ""), meta.get("namespace", "")
            return None

        if not hasattr(self.server(), "store"):  # no store access: ask the API (one list call)
            pods = self.core().list_pod_for_all_namespaces(label_selector="app.kubernetes.io/managed-by=ce-k8s",
                                                          _request_timeout=5).items
            return next((found for p in pods if (found := running(p))), None)
        return self.server().call(lambda: next((found for p in self.server().store.peek_list("pods")
                                              if (found := running(p))), None))
