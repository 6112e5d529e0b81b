"""The kubelet's side of each bound pod in the simulator: from the first status to the last.

Why a part of its own: what happens to a pod once it is on a node (the kubelet's pod workers and
status manager, the container runtime and its logs) is the largest concern of the kubelet
simulator (kubelet.py) and needs nothing of the scheduler or of the node lifecycle. It plays
ContainerCreating, missing Secrets (FailedMount / CreateContainerConfigError), image pull errors
and back-off, Running with the containers' output in the pods/log store, Succeeded/Failed with exit
codes, OOMKilled, activeDeadlineSeconds (DeadlineExceeded), node-pressure eviction (Evicted) and
graceful deletion (SIGTERM, the grace period, the kubelet's confirming delete), each step on a timer
of the pod's scenario (scenario.py) run through the kubelet's ``after``.

Also here: the small things the simulator's parts share (the pod's key, ``dig``, :class:`PodSim`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ce_k8s.sim.kube.api import TERMINAL_PHASES, Api, meta_of, now_iso, set_condition
from ce_k8s.sim.kube.errors import ApiError
from ce_k8s.sim.kube.kubelet_secrets import SecretMounts
from ce_k8s.sim.kube.kubelet_stats import UsageMeter
from ce_k8s.sim.kube.scenario import Scenario, ScenarioError

log = logging.getLogger(__name__)

Key = tuple[str, str]


def _now_nano() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def dig(obj: Mapping[str, Any], *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, or None where a step is missing or not a mapping."""
    cur: Any = obj
    for p in path:
        cur = cur.get(p) if isinstance(cur, Mapping) else None
    return cur


def pod_key(pod: Mapping[str, Any]) -> Key:
    """(namespace, name) of a pod."""
    m = meta_of(pod)
    return (str(m.get("namespace") or ""), str(m.get("name")))


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


AfterFn = Callable[..., None]      # Kubelet._after(sim, sim_seconds, fn, *args)
EventFn = Callable[..., None]      # Kubelet._event(obj, reason, message, ...)


class PodLifecycle:
    """The kubelet's pod workers: every status a bound pod's containers go through.

    ``pods`` is the simulator's table of the pods it runs (shared, not copied); ``after`` arms
    a step that is dropped when the pod is gone or replaced; ``event`` records an Event.
    """

    def __init__(self, api: Api, pods: dict[Key, PodSim], usage: UsageMeter, secret_mounts: SecretMounts,
                 after: AfterFn, event: EventFn, retry_period: float, kill_time: float) -> None:
        self.api = api
        self.store = api.store
        self._pods = pods
        self.usage = usage
        self.secret_mounts = secret_mounts
        self._after = after
        self._event = event
        self.retry_period = retry_period
        self.kill_time = kill_time

    def _write(self, sim: PodSim, mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
        try:
            written = self.api.write("pods", sim.key[0], sim.key[1], mutate)
        except ApiError:
            return None
        self.usage.sync(sim.key, written)
        return written

    def _node_ip(self, node: str) -> str:
        n = self.store.peek("nodes", "", node)
        for a in dig(n or {}, "status", "addresses") or []:
            if a.get("type") == "InternalIP":
                return str(a.get("address"))
        return "10.0.0.1"

    def accept(self, sim: PodSim) -> None:
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
        deadline = dig(self.store.peek("pods", *sim.key) or {}, "spec", "activeDeadlineSeconds")
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
                for src in dig(vol, "projected", "sources") or []:
                    if isinstance(src.get("secret"), dict) and not src["secret"].get("optional"):
                        wanted.append(("secrets", str(src["secret"].get("name")), str(vol.get("name"))))
        else:
            for c in spec.get("containers") or []:
                for e in c.get("env") or []:
                    ref = dig(e, "valueFrom", "secretKeyRef")
                    if isinstance(ref, dict) and not ref.get("optional"):
                        wanted.append(("secrets", str(ref.get("name")), str(c.get("name"))))
                    ref = dig(e, "valueFrom", "configMapKeyRef")
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
        images = sorted({str(c.get("image")) for c in dig(pod, "spec", "containers") or []})
        self._event(pod, "Pulling", f'Pulling image "{images[0] if images else ""}"', host=sim.node)
        pull = max((s.pull for s in sim.scenarios.values() if isinstance(s, Scenario)), default=0.0)
        self._after(sim, pull, self._pulled, sim)

    def _pulled(self, sim: PodSim) -> None:
        pod = self.store.peek("pods", *sim.key)
        if pod is None:
            return
        failing = [c for c in dig(pod, "spec", "containers") or []
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
        image = next((c.get("image") for c in dig(pod, "spec", "containers") or []), "")
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
        for c in dig(pod, "spec", "containers") or []:
            name = str(c.get("name"))
            sc = sim.scenarios.get(name)
            if isinstance(sc, ScenarioError):
                errors[name] = ("CreateContainerError", f"ce-k8s sim: {sc}")
            elif isinstance(sc, Scenario) and sc.config_error:
                errors[name] = ("CreateContainerConfigError", sc.config_error)
        if missing:
            plural, ref = missing[0]
            kind = "secret" if plural == "secrets" else "configmap"
            for c in dig(pod, "spec", "containers") or []:
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

    def secrets_changed(self, ns: str) -> None:
        """Retry the pods of ``ns`` that wait for a Secret or ConfigMap (a mount or a container's env)."""
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
        for c in dig(pod, "spec", "containers") or []:
            name = str(c.get("name"))
            sc = sim.scenarios.get(name)
            if isinstance(sc, Scenario):
                self._log(sim, name, sc.output)
        self.schedule_ends(sim, pod)

    def schedule_ends(self, sim: PodSim, pod: Mapping[str, Any]) -> None:
        """Arm each running container's exit, OOM and node-pressure eviction timers."""
        for c in dig(pod, "spec", "containers") or []:
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
        started = dig(prev or {}, "state", "running", "startedAt")
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
        if pod is None or dig(pod, "status", "phase") in TERMINAL_PHASES or sim.state == "terminating":
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
        if pod is None or dig(pod, "status", "phase") in TERMINAL_PHASES:
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

    def terminate(self, sim: PodSim) -> None:
        """Graceful deletion seen: SIGTERM, wait, mark the containers exited, confirm the delete."""
        pod = self.store.peek("pods", *sim.key)
        if pod is None:
            return
        sim.cancel()
        was = sim.state
        sim.state = "terminating"
        if was != "running":
            self._after(sim, 0.0, self.confirm_delete, sim)
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
            self.confirm_delete(sim)
        self._after(sim, wait, stopped)

    def confirm_delete(self, sim: PodSim) -> None:
        """The kubelet's final delete of a pod whose containers are gone (grace 0, this uid only)."""
        try:
            self.api.delete("pods", sim.key[0], sim.key[1], {"gracePeriodSeconds": 0,
                                                             "preconditions": {"uid": sim.uid}})
        except ApiError as e:
            log.debug("kubelet delete %s/%s: %s", *sim.key, e.message)
