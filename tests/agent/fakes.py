"""In-memory collaborators for the agent: its decisions tested without an API server.

Why: most agent tests are about what the agent decides (the update reply for a pod's state, a
cleanup that releases or deletes, the adoption of a released pod, the GC's victims), not about
HTTP. `Agent` takes its collaborators (`core`, `calls`, `cache`, `clock`), so a test can give it:

* `FakeApi` — the CoreCalls and CoreV1Api methods the agent calls, answered from dicts and counted
  as the emulator counts them (`api.calls[("create", "pods")]`), every pod change told to the cache
  as the watch would tell it (`ADDED`/`MODIFIED`/`DELETED` lines through `PodCache.apply_line`), with
  the Events (`record_event`) and pod logs (`logs`, `log_streams`) the emulator would answer;
* `memory_cache` — the real `PodCache`, never started: listed (empty) at once, fed only by those
  lines, with its listeners and tombstones as in production;
* `FakeClock` — the verbs' and the GC's `time.time()`, moved by the test (`clock.advance(s)`);
* `QueuedPool` — the agent's I/O pool (the saves of finished pods' logs), run when the test says;
* `run_effects` — the work queue's turns (creates, queued deletes, refreshes) and the pool's
  jobs run on the test's thread, so a test says when the effects happen instead of waiting.

`fake_agent(settings)` puts them together and starts no thread (no watch, no workers, no socket,
no GC loop). See docs/agent.md "Testing the agent's decisions".
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future

from kubernetes.client.exceptions import ApiException
from urllib3 import HTTPHeaderDict

from ce_k8s.agent.agent import Agent, label_selector
from ce_k8s.agent.cache import PodCache
from ce_k8s.agent.sourceprobe import GONE, FixedProbe

START = 1_760_000_000.0      # the fake clock's first reading (2025-10-09T08:53:20Z)


class FakeClock:
    """A `time.time()` that moves only when the test says so."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class FakeResponse:
    """Just enough of a urllib3 response: `.data`, `.headers`, `.read()` (corecalls.drained)."""

    def __init__(self, obj: object, headers: dict[str, str] | None = None) -> None:
        self.data = json.dumps(obj).encode()
        self.headers = HTTPHeaderDict(headers or {})      # a test may add `Warning` fields
        self.status = 200

    def read(self, cache_content: bool = False) -> bytes:
        return self.data


def api_error(status: int, message: str = "") -> ApiException:
    """An ApiException as the client raises it for an error answer (a Status body with `message`)."""
    exc = ApiException(status=status, reason=message or str(status))
    exc.body = json.dumps({"kind": "Status", "code": status, "message": message})
    return exc


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class FakeApi:
    """The pod, Secret, log and Event calls of `CoreCalls` and `CoreV1Api` on dicts; see the module docstring.

    `fail[(verb, resource)]` is a list of exceptions the next such calls raise, one per call, before
    anything is stored (a refused or lost request). `watch(kind, pod)` is told of every pod change.
    """

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.pods: dict[str, dict] = {}
        self.secrets: dict[str, dict] = {}
        # pod name -> its pilot's log lines, in the order written: [("stdout" | "stderr", bytes), ...]
        self.logs: dict[str, list[tuple[str, bytes]]] = {}
        # What the server does with `stream=` on pods/log (as the emulator's `log_streams`): "split"
        # (Kubernetes >= 1.32 with PodLogsQuerySplitStreams), "forbid" (the gate off: a 422).
        self.log_streams = "split"
        self.events: list[dict] = []                       # core/v1 Events, as the kubelet and scheduler write them
        self.calls: Counter[tuple[str, str]] = Counter()
        self.fail: dict[tuple[str, str], list[BaseException]] = {}
        self.watch: Callable[[str, dict], None] = lambda kind, pod: None
        self._rv = 100

    def _call(self, verb: str, resource: str) -> None:
        self.calls[(verb, resource)] += 1
        pending = self.fail.get((verb, resource))
        if pending:
            raise pending.pop(0)

    def _version(self) -> str:
        self._rv += 1
        return str(self._rv)

    # -- pods --------------------------------------------------------------------------------------

    def create_namespaced_pod(self, namespace: str, body: dict, dry_run: str | None = None, **_) -> FakeResponse:
        self._call("create", "pods")
        name = body["metadata"]["name"]
        if name in self.pods:
            raise api_error(409, f'pods "{name}" already exists')
        pod = copy.deepcopy(body)
        meta = pod["metadata"]
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_iso(self.clock()))
        pod.setdefault("status", {"phase": "Pending"})
        if dry_run:
            return FakeResponse(pod)
        meta["resourceVersion"] = self._version()
        self.pods[name] = pod
        self.watch("ADDED", pod)
        return FakeResponse(pod)

    def read_namespaced_pod(self, name: str, namespace: str, **_) -> FakeResponse:
        self._call("get", "pods")
        if name not in self.pods:
            raise api_error(404, f'pods "{name}" not found')
        return FakeResponse(self.pods[name])

    def delete_namespaced_pod(self, name: str, namespace: str, propagation_policy: str | None = None,
                              **_) -> FakeResponse:
        """Gone at once (no kubelet, no finalizers), with its owned Secret (the garbage collector)."""
        self._call("delete", "pods")
        if name not in self.pods:
            raise api_error(404, f'pods "{name}" not found')
        self.remove(name)
        return FakeResponse({"kind": "Status", "status": "Success"})

    def remove(self, name: str) -> None:
        """Pod `name` deleted by someone else (an admin, the node, the Eviction API): no agent call.
        The watch sees it as kube-apiserver shows a pod deleted with no grace left: MODIFIED with
        its deletionTimestamp, then DELETED (tests/real/test_emulator_parity.py)."""
        pod = self.pods[name]
        pod["metadata"].update(deletionTimestamp=_iso(self.clock()), deletionGracePeriodSeconds=0,
                               resourceVersion=self._version())
        self.watch("MODIFIED", pod)
        del self.pods[name]
        uid = pod["metadata"]["uid"]
        for key in [k for k, s in self.secrets.items()
                    if any(o.get("uid") == uid for o in s["metadata"].get("ownerReferences") or ())]:
            del self.secrets[key]
        self.watch("DELETED", pod)

    def set_status(self, name: str, status: dict) -> dict:
        """What the kubelet would do: a new status for pod `name`, seen by the watch."""
        pod = self.pods[name]
        pod["status"] = status
        pod["metadata"]["resourceVersion"] = self._version()
        self.watch("MODIFIED", pod)
        return pod

    def evict(self, name: str) -> None:
        """What the policy/v1 Eviction API does: the DisruptionTarget condition, then the delete
        (the watch sees both)."""
        pod = self.pods[name]
        status = dict(pod.get("status") or {})
        status["conditions"] = [*(status.get("conditions") or []), {
            "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting"}]
        self.set_status(name, status)
        self.remove(name)

    def record_event(self, name: str, reason: str, message: str, uid: str = "") -> None:
        """What the scheduler or kubelet does: an Event about pod `name` (which need not exist any
        more: Events outlive their pod by an hour). No agent call."""
        self.events.append({
            "metadata": {"name": f"{name}.{len(self.events):016x}", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": "default", "name": name,
                               "uid": uid},
            "reason": reason, "message": message, "type": "Normal"})

    def list_namespaced_event(self, namespace: str, field_selector: str | None = None,
                              limit: int | None = None, **_) -> FakeResponse:
        """The Events of `namespace` matching `field_selector` (`a.b=v` terms joined by commas, as
        the agent asks `involvedObject.kind=Pod,involvedObject.name=NAME`), at most `limit`."""
        self._call("list", "events")
        terms = [term.split("=", 1) for term in (field_selector or "").split(",") if term]

        def field(event: dict, path: str) -> object:
            for key in path.split("."):
                event = event.get(key) if isinstance(event, dict) else None
            return event

        items = [e for e in self.events if e["metadata"]["namespace"] == namespace
                 and all(str(field(e, path)) == value for path, value in terms)]
        return FakeResponse({"items": items[:limit] if limit else items})

    def read_namespaced_pod_log(self, name: str, namespace: str, stream: str | None = None,
                                limit_bytes: int | None = None, **_) -> FakeResponse:
        """The pilot's log: one stream with `stream=Stdout|Stderr` where the server splits them,
        else both interleaved; `stream=` refused (422) before the pod is looked up where it does not."""
        self._call("get", "pods/log")
        if stream is not None and self.log_streams == "forbid":
            raise api_error(422, "PodLogOptions \"\" is invalid: stream: Forbidden: may not be specified")
        if name not in self.pods:
            raise api_error(404, f'pods "{name}" not found')
        wanted = {"Stdout": ("stdout",), "Stderr": ("stderr",)}.get(stream or "", ("stdout", "stderr"))
        resp = FakeResponse({})
        resp.data = b"".join(text for which, text in self.logs.get(name, ()) if which in wanted)[:limit_bytes]
        return resp

    # -- secrets -----------------------------------------------------------------------------------

    def create_namespaced_secret(self, namespace: str, body: dict, **_) -> FakeResponse:
        self._call("create", "secrets")
        name = body["metadata"]["name"]
        if name in self.secrets:
            raise api_error(409, f'secrets "{name}" already exists')
        self.secrets[name] = copy.deepcopy(body)
        return FakeResponse(body)

    def patch_namespaced_secret(self, name: str, namespace: str, body: dict, **_) -> FakeResponse:
        self._call("patch", "secrets")
        if name not in self.secrets:
            raise api_error(404, f'secrets "{name}" not found')
        secret = self.secrets[name]
        secret.setdefault("data", {}).update(body.get("data") or {})
        if "ownerReferences" in (body.get("metadata") or {}):
            secret["metadata"]["ownerReferences"] = body["metadata"]["ownerReferences"]
        return FakeResponse(secret)

    def delete_namespaced_secret(self, name: str, namespace: str, **_) -> FakeResponse:
        self._call("delete", "secrets")
        if self.secrets.pop(name, None) is None:
            raise api_error(404, f'secrets "{name}" not found')
        return FakeResponse({"kind": "Status", "status": "Success"})


class QueuedPool(Executor):
    """An executor whose jobs wait until `run()` runs them on the caller's thread."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future, Callable, tuple, dict]] = []
        self.closed = False

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if self.closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future = Future()
        self.jobs.append((future, fn, args, kwargs))
        return future

    def run(self) -> int:
        """Run the waiting jobs (and those they submit); how many ran."""
        ran = 0
        while self.jobs:
            future, fn, args, kwargs = self.jobs.pop(0)
            try:
                future.set_result(fn(*args, **kwargs))
            except Exception as exc:
                future.set_exception(exc)
            ran += 1
        return ran

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.closed = True
        if cancel_futures:
            self.jobs.clear()


def memory_cache(ce_name: str) -> PodCache:
    """The agent's PodCache with no API behind it: listed (empty) now, fed by `feed`."""
    cache = PodCache(None, label_selector(ce_name))
    cache.ready.set()
    return cache


def feed(cache: PodCache, kind: str, pod: dict) -> None:
    """One watch line, as the API server would stream it."""
    cache.apply_line(json.dumps({"type": kind, "object": pod}).encode())


def run_effects(agent: Agent, limit: int = 1000) -> int:
    """Run every due turn of the agent's work queue on this thread (creates, queued deletes,
    refreshes), then the I/O pool's jobs (log saves); the number of turns run. A turn that backs
    off comes back later, not here."""
    queue = agent.effects.queue
    turns = 0
    while turns < limit:
        name = queue.get_nowait()
        if name is None:
            if isinstance(agent.pool, QueuedPool):
                agent.pool.run()
            return turns
        try:
            agent.effects._turn(name)
        finally:
            queue.done(name)
        turns += 1
    raise AssertionError(f"the work queue did not drain in {limit} turns")


def fake_agent(settings, *, api: FakeApi | None = None, clock: FakeClock | None = None, **kwargs) -> Agent:
    """An agent on `FakeApi` and a memory cache, not started (no watch, no workers, no socket):
    `agent.handle` answers at once, `run_effects(agent)` makes its writes. `agent.api` is the
    FakeApi, `agent.clock` the FakeClock. Given the `api` of an earlier agent, this is that agent
    restarted: same cluster, same clock, same journal on disk, a new memory, the pods relisted.
    Its source probe answers "gone" unless given one (as conftest.new_agent's)."""
    if api is not None:
        clock = api.clock
    clock = clock or FakeClock()
    api = api or FakeApi(clock)
    cache = memory_cache(settings.ce_name)
    for pod in api.pods.values():        # the relist of a (re)started agent
        feed(cache, "ADDED", pod)
    api.watch = lambda kind, pod: feed(cache, kind, pod)
    kwargs.setdefault("source_probe", FixedProbe(GONE))
    agent = Agent(settings, None, core=api, calls=api, cache=cache, pool=QueuedPool(), clock=clock, **kwargs)
    agent.api = api
    agent.clock = clock
    return agent
