"""The real control plane as the test bed's Kubernetes: what `TestBed` and the demos read of it.

The emulated bed reads its numbers from inside the emulator (a store listener counts pod
creations, `/_sim/stats` counts calls). A real API server has no such door, so this adapter gets
the same numbers from the outside, the way an operator would:

* **Pod creations and duplicates**: a watch (admin credentials) on the pods labelled
  `app.kubernetes.io/managed-by=ce-k8s`, resumed from its last resourceVersion and relisted after a
  410; every new uid counts once (`PodTracker`'s rules: a name created twice, or two live pods of
  one job, is a duplicate).
* **API calls of the agent**: the API server's own audit log, written for the agent's
  ServiceAccount only (`<state>/audit.log`, policy in ce_k8s.real.kube.kube), counted by verb and
  resource: exactly what the agent asked, nothing the controllers or kwok did.
* **Objects left**: a LIST of managed pods and Secrets.

Faults cannot be injected into a real server: `faults` is a disabled stand-in, and a bed asked for
a fault rate on real Kubernetes refuses (the emulator stays for that).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ce_k8s.real.kube.kube import AGENT_NAMESPACE, AGENT_SA, RealKube, RealKubeError

log = logging.getLogger(__name__)

MANAGED = "app.kubernetes.io/managed-by=ce-k8s"
AGENT_USER = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SA}"


@dataclass
class _Event:
    type: str
    obj: dict[str, Any]


class PodWatch:
    """Feeds a PodTracker from a real watch; each pod uid is ADDED once, however often relisted."""

    def __init__(self, core, tracker) -> None:
        self.core = core
        self.tracker = tracker
        self.uids: set[str] = set()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="real-kube-pod-watch", daemon=True)
        self.synced = threading.Event()

    def start(self) -> None:
        self.thread.start()
        if not self.synced.wait(30):
            raise RealKubeError("the pod watch of the test bed did not sync in 30 s")

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(10)

    def _feed(self, kind: str, obj: dict[str, Any]) -> None:
        uid = (obj.get("metadata") or {}).get("uid") or ""
        if kind == "ADDED" or (kind == "MODIFIED" and uid not in self.uids):
            if uid in self.uids:
                kind = "MODIFIED"
            self.uids.add(uid)
            if kind == "MODIFIED":   # first seen as MODIFIED (after a relist gap): it was added
                self.tracker("pods", _Event("ADDED", obj))
        self.tracker("pods", _Event(kind, obj))

    def _run(self) -> None:
        rv = ""
        while not self.stop_event.is_set():
            try:
                if not rv:
                    resp = self.core.list_pod_for_all_namespaces(label_selector=MANAGED, _preload_content=False,
                                                                 _request_timeout=30)
                    doc = json.loads(resp.data)
                    for item in doc.get("items") or []:
                        self._feed("ADDED" if item["metadata"]["uid"] not in self.uids else "MODIFIED", item)
                    rv = doc["metadata"]["resourceVersion"]
                    self.synced.set()
                resp = self.core.list_pod_for_all_namespaces(
                    label_selector=MANAGED, watch=True, resource_version=rv, allow_watch_bookmarks=True,
                    timeout_seconds=30, _preload_content=False, _request_timeout=60)
                for line in resp:
                    if self.stop_event.is_set():
                        break
                    ev = json.loads(line)
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        rv = ""          # 410 Gone: relist
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._feed(ev["type"], obj)
                resp.release_conn()
            except Exception as exc:  # the API server restarting in a test: resume
                log.debug("pod watch: %s", exc)
                if self.stop_event.wait(0.5):
                    return


class Faults:
    """A disabled stand-in: a real API server does not inject faults."""

    rate_429 = rate_500 = rate_timeout = 0.0
    injected: Counter[str] = Counter()

    def configure(self, **rates: float) -> None:
        if any(rates.get(k) for k in ("rate_429", "rate_500", "rate_timeout", "cut_rate")):
            raise RealKubeError("fault injection needs the emulator (ce-k8s demo without --kube real)")


class RealKubeServer:
    """The bits of `ApiServer` the bed uses, for a real control plane that is up (`RealKube.up`)."""

    def __init__(self, env: RealKube) -> None:
        from kubernetes import client
        from kubernetes.config import new_client_from_config

        st = env.state()
        if st is None:
            raise RealKubeError("the real control plane is not up: `ce-k8s testbed real-kube up`")
        self.env = env
        self.url = st.server
        self.time_scale = st.time_scale
        self.faults = Faults()
        self.admin_client = new_client_from_config(config_file=str(env.admin_kubeconfig))
        self.admin_core = client.CoreV1Api(self.admin_client)
        self._audit_offset = 0
        self._calls: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self.watch: PodWatch | None = None

    def start_tracking(self, tracker=None) -> None:
        """Count pod creations from now on, into `tracker` (a new PodTracker when None)."""
        from ce_k8s.sim.testbed import PodTracker

        self.tracker = tracker if tracker is not None else PodTracker()
        self.reset_calls()
        self.watch = PodWatch(self.admin_core, self.tracker)
        self.watch.start()

    def stats(self) -> dict[str, object]:
        """The shape of the emulator's `/_sim/stats` that the real-HTCondor demo reads."""
        return {"pods": self.tracker.as_dict(), "pods_left": self.managed_count("pods"),
                "secrets_left": self.managed_count("secrets")}

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        with contextlib.suppress(Exception):
            self.admin_client.close()

    @property
    def agent_config(self) -> str:
        """The agent's knobs this Kubernetes needs (TestBed appends them to its overlay): usage read
        from the kubelets directly, which the API server cannot proxy to on loopback, trusting the
        stub's certificate (docs/accounting.md)."""
        return f"CE_K8S_USAGE_SOURCE = kubelet\nCE_K8S_KUBELET_CA = {self.env.kubelet_ca}\n"

    def write_kubeconfig(self, path: str | Path) -> str:
        """The agent's kubeconfig: its ServiceAccount's token, never the admin's."""
        shutil.copy(self.env.kubeconfig, path)
        Path(path).chmod(0o600)
        return str(path)

    # -- calls, from the audit log ---------------------------------------------------------------
    def _read_audit(self) -> None:
        path = self.env.state_dir / "audit.log"
        with self._lock:
            try:
                with open(path, "rb") as f:
                    f.seek(self._audit_offset)
                    data = f.read()
            except FileNotFoundError:
                return
            end = data.rfind(b"\n") + 1
            self._audit_offset += end
            for line in data[:end].splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if (ev.get("user") or {}).get("username") != AGENT_USER:
                    continue
                stage = ev.get("stage")
                verb = ev.get("verb") or "?"
                if stage != ("ResponseStarted" if verb == "watch" else "ResponseComplete"):
                    continue
                ref = ev.get("objectRef") or {}
                resource = ref.get("resource") or ev.get("requestURI", "?")
                if ref.get("subresource"):
                    resource += "/" + ref["subresource"]
                self._calls[(verb, resource)] += 1

    @property
    def calls(self) -> Counter[tuple[str, str]]:
        """The agent's API calls by (verb, resource) since the last `reset_calls`."""
        self._read_audit()
        return Counter(self._calls)

    def reset_calls(self) -> None:
        self._read_audit()
        self._calls.clear()

    # -- objects ------------------------------------------------------------------------------
    def managed_count(self, resource: str) -> int:
        if resource == "pods":
            items = self.admin_core.list_pod_for_all_namespaces(label_selector=MANAGED, _request_timeout=30).items
        else:
            items = self.admin_core.list_secret_for_all_namespaces(label_selector=MANAGED,
                                                                    _request_timeout=30).items
        return len(items)

    def prepare_namespace(self, name: str) -> None:
        """A pilot namespace as a site makes one: the shipped Role and RoleBinding copied into it
        (containers/k8s/overlays/example-site), with the pilot namespace's PodSecurity labels."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        with contextlib.suppress(ApiException):
            self.admin_core.create_namespace({"metadata": {"name": name, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest"}}})
        rbac = client.RbacAuthorizationV1Api(self.admin_client)
        role = rbac.read_namespaced_role(AGENT_SA, "ce-k8s-pilots")
        binding = rbac.read_namespaced_role_binding(AGENT_SA, "ce-k8s-pilots")
        for obj, create in ((role, rbac.create_namespaced_role), (binding, rbac.create_namespaced_role_binding)):
            obj.metadata = client.V1ObjectMeta(name=AGENT_SA, namespace=name, labels=obj.metadata.labels)
            with contextlib.suppress(ApiException):
                create(name, obj)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:     # the ServiceAccount admission waits for `default`
            try:
                self.admin_core.read_namespaced_service_account("default", name)
                return
            except ApiException:
                time.sleep(0.2)
        raise RealKubeError(f"namespace {name}: no default ServiceAccount after 60 s")
