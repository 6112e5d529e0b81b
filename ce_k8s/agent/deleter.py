"""The agent's delete of a pod: the bare call, and the three ways a path asks for it.

Every delete path (the cleanup hook, a hold, the creator's undo, the GC, the end of a release)
claims the pod in `deletions.Deletions` first, so each pod is deleted once (docs/agent.md
"Deleting a pod once"). Then:

* the cleanup hook waits for the answer, its own call's or another path's (`cleanup_delete`);
* a hold or the creator's undo queues it at the pod's next turn on the work queue (`delete_async`,
  effects.py), so it never runs beside the same pod's create;
* the GC makes the call on its own thread (`run_delete`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from kubernetes.client.exceptions import ApiException

from ce_k8s.agent.corecalls import drained
from ce_k8s.agent.logfmt import fields, short_error
from ce_k8s.pods.names import secret_name

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

    from ce_k8s.agent.corecalls import CoreCalls
    from ce_k8s.agent.deletions import Deletion, Deletions
    from ce_k8s.agent.effects import Effects
    from ce_k8s.agent.jobs import JobTable
    from ce_k8s.agent.metrics import AgentMetrics
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.ratelimit import TokenBucket
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)


class Deleter:
    """Deletes pods under the QPS budget, each once; see the module docstring."""

    def __init__(self, settings: Settings, calls: CoreCalls, core: CoreV1Api, bucket: TokenBucket,
                 stop_event: threading.Event, request_timeout: float, prom: AgentMetrics, metrics: dict[str, int],
                 deletions: Deletions, effects: Effects, jobs: JobTable) -> None:
        self.settings = settings
        self.calls = calls
        self.core = core
        self.bucket = bucket
        self.stop_event = stop_event
        self.request_timeout = request_timeout
        self.prom = prom
        self.metrics = metrics
        self.deletions = deletions
        self.effects = effects
        self.jobs = jobs

    def delete_wait(self) -> float:
        """How long a cleanup waits for another path's delete call: its two requests (pod, then
        Secret by name) and a token from the QPS bucket."""
        return 2 * self.request_timeout + 2 / max(self.settings.qps, 0.1)

    def cleanup_delete(self, name: str, namespace: str, uid: str | None, job: str, started: float) -> int:
        """The cleanup's delete of pod `name`: 1 if the pod existed, 0 if not. Raises on API errors.

        Another path (GC, hold, the creator's undo) may be deleting this very pod: then its call is
        this cleanup's one delete (deletions.py; docs/agent.md "Deleting a pod once"). A call still in
        flight is waited for; one that returned after this cleanup began is counted as the cleanup's;
        one that returned before (a repeated cleanup, a hold's delete) means the pod was already
        deleted: 0, with no call. A call still in flight after the wait raises TimeoutError, so the
        hook exits 1 and the router retries the cleanup.
        """
        for _ in range(3):
            deletion, mine = self.deletions.claim(name, uid)
            if mine:
                return self.run_delete(deletion, namespace, "cleanup", job)
            wait = self.delete_wait()
            if not self.deletions.wait(deletion, wait):
                raise TimeoutError(f"pod {name}: another delete of it is still in flight after {wait:.0f} s")
            if deletion.existed is not None:
                counted = int(deletion.existed and deletion.settled_at >= started)
                log.info("%s", fields(event="delete-shared", job=job, pod=name, namespace=namespace,
                                      existed=deletion.existed, counted=counted))
                return counted
            # the other path's call failed and gave its claim back: claim again
        raise TimeoutError(f"pod {name}: the other delete calls of it kept failing")

    def run_delete(self, deletion: Deletion, namespace: str, why: str, job: str | None = None) -> int:
        """Make the delete call of a claim this thread holds, and settle the claim either way."""
        existed: bool | None = None
        try:
            result = self.delete_pod(deletion.name, namespace, why=why, job=job)
            existed = bool(result)
            return result
        finally:
            self.deletions.settle(deletion, existed)

    def delete_pod(self, name: str, namespace: str, why: str = "cleanup", job: str | None = None) -> int:
        """Delete a pod; 1 if it existed, 0 if not. Raises on other API errors.

        The bare call: the agent's paths claim the pod first (`self.deletions`), so that no two of
        them delete the same pod.

        Only the pod: its sandbox Secret has an ownerReference to it, so Kubernetes' garbage
        collector removes the Secret (one API call per pilot saved). Never the other Secret
        volumes a pod mounts: a route may mount a shared site Secret through K8sVolumes. When the
        pod is already gone the sandbox Secret is deleted by name, in case its owner never existed.
        """
        existed = 0
        self.bucket.acquire(self.stop_event)
        t0 = time.monotonic()
        try:
            self.calls.delete_namespaced_pod(name, namespace, propagation_policy="Background",
                                             _preload_content=False, _request_timeout=self.request_timeout)
            existed = 1
            self.metrics["deletes"] += 1
        except ApiException as exc:
            if exc.status != 404:
                self.prom.api_error("delete", "pods", exc)
                raise
        except Exception as exc:
            self.prom.api_error("delete", "pods", exc)
            raise
        if not existed:
            self.bucket.acquire(self.stop_event)
            try:
                drained(self.core.delete_namespaced_secret(secret_name(name), namespace, _preload_content=False,
                                                           _request_timeout=self.request_timeout))
            except ApiException as exc:
                if exc.status != 404:
                    self.prom.api_error("delete", "secrets", exc)
                    raise
            except Exception as exc:
                self.prom.api_error("delete", "secrets", exc)
                raise
        if existed:
            self.prom.delete_seconds.observe(time.monotonic() - t0)
            self.prom.pods_deleted.labels(why).inc()
            log.info("%s", fields(event="pod-deleted", job=job or self.jobs.job_for(name), pod=name,
                                  namespace=namespace, why=why))
        return existed

    def delete_async(self, pod: PodInfo, why: str = "hold", job: str | None = None) -> None:
        """Delete `pod` (a PodInfo, or the creator's `_Named` for a pod it just made) at its next turn
        on the work queue (effects.py), unless another path is deleting or has deleted it. The claim
        is taken here, on the caller's thread, so that a cleanup or GC pass that comes before the
        turn sees it (deletions.py)."""
        if pod.deleting:
            return
        deletion, mine = self.deletions.claim(pod.name, pod.uid or None)
        if not mine:
            return

        def run() -> None:
            try:
                self.run_delete(deletion, pod.namespace, why, job)
            except Exception as exc:
                log.warning("%s", fields(event="delete-failed", job=job or self.jobs.job_for(pod.name), pod=pod.name,
                                         namespace=pod.namespace, error=short_error(exc)))

        if self.effects.queue.closed:         # stopping: give the claim back, the next agent decides
            self.deletions.settle(deletion, None)
            return
        self.effects.delete(pod.name, run)
