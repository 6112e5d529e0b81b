"""A Kubernetes API server emulator on 127.0.0.1 for the official client, kubectl and our agent.

Public API (documented in docs/testbed.md)::

    from ce_k8s.sim.kube.apiserver import ApiServer, Faults
    with ApiServer.running(nodes="cpu:3x16c64g", faults=Faults(seed=1), time_scale=0.01) as srv:
        srv.url                 # "http://127.0.0.1:PORT"
        srv.kubeconfig_path     # a kubeconfig pointing at it (namespace "default")
        srv.store.get("pods", "default", "p1")      # thread-safe deep copies for assertions
        srv.calls[("create", "pods")]               # API calls by (verb, resource[/subresource])
        srv.faults.inject("500", verb="create", resource="pods")
        srv.kubelet.lose_node("cpu-1")              # see ce_k8s.sim.kube.kubelet
        srv.call(fn, *args)                         # run fn on the server loop (writes)
        srv.wait_for(lambda: ..., timeout=5)

Why not a kmock subclass: kmock 0.8 scans every stored object on each write, keeps every request
in a log that each new request is matched against, has no PUT, deleteCollection, paging,
resourceVersion semantics, status subresource or namespaces resource, and answers 200 to creates
(docs/design.md "kmock 0.8, measured"). Fixing all of that means replacing its store, router and
watch, so this is a small aiohttp server of our own over an indexed store; the measured numbers
are in docs/testbed.md. The HTTP layer here only routes requests, counts calls and injects the
faults that come before an answer; the resource verbs and watches are answered by
:mod:`ce_k8s.sim.kube.apiserver_resources`, pods/log and the nodes/proxy Summary API by
:mod:`ce_k8s.sim.kube.apiserver_kubelet`, and the semantics live in :mod:`ce_k8s.sim.kube.api`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from ce_k8s.sim.kube import faults as fault_kinds
from ce_k8s.sim.kube.api import LOG_STREAM_MODES, AccessRule, Api, ApiOptions
from ce_k8s.sim.kube.apiserver_http import MAX_BODY, Route, error_reply, flag, reply
from ce_k8s.sim.kube.apiserver_kubelet import KubeletEndpoints
from ce_k8s.sim.kube.apiserver_resources import ResourceHandlers
from ce_k8s.sim.kube.errors import ApiError
from ce_k8s.sim.kube.faults import Faults
from ce_k8s.sim.kube.resources import (
    BY_GROUP_PLURAL,
    SERVER_VERSION,
    api_group_doc,
    api_group_list_doc,
    api_versions_doc,
    openapi_v3_doc,
    openapi_v3_group_versions,
    resource_list_doc,
)
from ce_k8s.sim.kube.store import Store

__all__ = ["AccessRule", "Api", "ApiError", "ApiServer", "Faults", "Store"]

log = logging.getLogger(__name__)


class ApiServer:
    """The emulator: store + semantics + HTTP + (optionally) the kubelet/scheduler simulator.

    This class starts and stops it and routes each request; `resources` (apiserver_resources.py)
    and `kubelet_endpoints` (apiserver_kubelet.py) answer them once it has started.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, nodes: object = None,
                 faults: Faults | None = None, time_scale: float = 1.0, kubelet: bool = True,
                 history_size: int = 10_000, rules: list[AccessRule | Mapping[str, object]] | None = None,
                 enforce_rbac: bool = False, seed: int = 0, bookmark_interval: float = 1.0,
                 kubelet_options: Mapping[str, Any] | None = None, namespace: str = "default",
                 max_events: int = 5000, log_streams: str = "forbid") -> None:
        self.host = host
        self.port = port
        self.nodes_spec = nodes
        self.faults = faults or Faults(seed=seed)
        self.time_scale = time_scale
        self.want_kubelet = kubelet
        self.bookmark_interval = bookmark_interval
        self.kubelet_options = dict(kubelet_options or {})
        self.default_namespace = namespace
        self.store = Store(history_size=history_size)
        self._options = ApiOptions(time_scale=time_scale, seed=seed, enforce_rbac=enforce_rbac, max_events=max_events,
                                   log_streams=log_streams,
                                   rules=[r if isinstance(r, AccessRule) else AccessRule.from_dict(r)
                                          for r in rules] if rules is not None else [AccessRule()])
        self.api: Api | None = None
        self.kubelet: Any = None
        self.resources: ResourceHandlers | None = None
        self.kubelet_endpoints: KubeletEndpoints | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.url = ""
        self.kubeconfig_path = ""
        self._calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self._calls_lock = threading.Lock()
        self._runner: web.ServerRunner | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._stats: Callable[[], Mapping[str, object]] | None = None
        # TCP connections clients opened (a client that keeps its connections alive opens few).
        self.connections = 0
        self._transports: weakref.WeakSet[object] = weakref.WeakSet()

    @property
    def log_streams(self) -> str:
        """What pods/log does with `stream=`: "split", "forbid" or "ignore" (docs/testbed.md)."""
        return self._options.log_streams

    @log_streams.setter
    def log_streams(self, mode: str) -> None:
        # Thread-safe enough: one attribute, read once per pods/log request.
        if mode not in LOG_STREAM_MODES:
            raise ValueError(f"log_streams must be one of {', '.join(LOG_STREAM_MODES)}, not {mode!r}")
        self._options.log_streams = mode

    # ---- lifecycle on a running loop ------------------------------------------------------------
    async def start(self) -> None:
        """Start serving on the current event loop (and the kubelet simulator if enabled)."""
        self.loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.api = Api(self.store, self._options, self.loop)
        self.resources = ResourceHandlers(self.api, self.faults, self.bookmark_interval)
        self.kubelet_endpoints = KubeletEndpoints(self.api, self._options, lambda: self.kubelet, self._count,
                                                  self._stopping)
        loop = self.loop

        def make_request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
            # The real server accepts request bodies up to 3 MiB (aiohttp's default is 1 MiB).
            return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY)

        server = web.Server(self._handle, request_factory=make_request, access_log=None, handler_cancellation=True)
        self._runner = web.ServerRunner(server, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        sockets = self._runner.addresses
        self.port = int(sockets[0][1])
        self.url = f"http://{self.host}:{self.port}"
        if self.want_kubelet:
            from ce_k8s.sim.kube.kubelet import Kubelet  # local: the kubelet imports this module's types

            self.kubelet = Kubelet(self.api, nodes=self.nodes_spec, time_scale=self.time_scale,
                                   **self.kubelet_options)
            self.kubelet.start()
        elif self.nodes_spec is not None:
            self._static_nodes()
        log.info("API emulator serving on %s", self.url)

    def _static_nodes(self) -> None:
        """Without the kubelet simulator, explicitly requested nodes are still registered (Ready),
        so capacity readers see a cluster; nothing is scheduled onto them."""
        from ce_k8s.sim.kube.api import set_condition
        from ce_k8s.sim.kube.cluster import parse_nodes

        assert self.api is not None
        spec = self.nodes_spec
        specs = parse_nodes(spec) if isinstance(spec, str) else list(spec)  # type: ignore[call-overload]
        for i, ns in enumerate(specs):
            node = ns.manifest(i)
            set_condition(node["status"], "Ready", "True", "KubeletReady", "kubelet is posting ready status")
            self.api.create("nodes", None, node)

    async def stop(self) -> None:
        """Stop the kubelet, end every watch and close the listener."""
        if self._stopping is not None:
            self._stopping.set()
        if self.kubelet is not None:
            self.kubelet.stop()
        for ws in list(self.store._watchers.values()):
            for w in list(ws):
                w.queue.put_nowait(None)
        if self.api is not None:
            self.api.cancel_timers()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- lifecycle in a background thread -------------------------------------------------------
    @classmethod
    @contextlib.contextmanager
    def running(cls, **kwargs: Any) -> Iterator[ApiServer]:
        """Run a server in a daemon thread for synchronous code; yields it once it is serving."""
        srv = cls(**kwargs)
        srv.start_thread()
        try:
            yield srv
        finally:
            srv.stop_thread()

    def start_thread(self, timeout: float = 10.0) -> None:
        """Start the server loop in a daemon thread and write a kubeconfig."""
        ready = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            try:
                await self.start()
            except BaseException as e:  # report start-up errors to the caller's thread
                failure.append(e)
                ready.set()
                return
            ready.set()
            assert self._stopping is not None
            await self._stopping.wait()
            await self.stop()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), name="ce-k8s-apiserver", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("API emulator did not start")
        if failure:
            raise failure[0]
        self._tmpdir = tempfile.TemporaryDirectory(prefix="ce-k8s-sim-")
        self.kubeconfig_path = self.write_kubeconfig(Path(self._tmpdir.name) / "kubeconfig")

    def stop_thread(self, timeout: float = 10.0) -> None:
        """Stop a server started with :meth:`start_thread`."""
        if self.loop is not None and self._stopping is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout)
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    # ---- helpers for tests and tools --------------------------------------------------------------
    def write_kubeconfig(self, path: str | os.PathLike[str], namespace: str | None = None) -> str:
        """Write a kubeconfig (token user, as lightkube insists on a user) and return its path."""
        cfg = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "ce-k8s-sim", "cluster": {"server": self.url}}],
            "contexts": [{"name": "ce-k8s-sim", "context": {"cluster": "ce-k8s-sim", "user": "ce-k8s-sim",
                                                            "namespace": namespace or self.default_namespace}}],
            "current-context": "ce-k8s-sim",
            "users": [{"name": "ce-k8s-sim", "user": {"token": "ce-k8s-sim-token"}}],
        }
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(cfg, sort_keys=False))
        p.chmod(0o600)
        return str(p)

    @property
    def calls(self) -> collections.Counter[tuple[str, str]]:
        """A snapshot of API calls counted by (verb, resource), e.g. ("create", "pods")."""
        with self._calls_lock:
            return collections.Counter(self._calls)

    def reset_calls(self) -> None:
        """Forget the counted calls."""
        with self._calls_lock:
            self._calls.clear()

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 10.0, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on the server loop (where all writes must happen)."""
        assert self.loop is not None
        try:
            if asyncio.get_running_loop() is self.loop:
                return fn(*args, **kwargs)
        except RuntimeError:
            pass

        async def run() -> Any:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def wait_for(self, predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.01) -> Any:
        """Poll ``predicate`` until truthy (exceptions count as false); raise TimeoutError after ``timeout``.

        The default is generous on purpose: it bounds a wait that should end in milliseconds,
        and on a two-core machine under a CPU hog such a wait has taken over 5 s.
        """
        deadline = time.monotonic() + timeout
        last_exc: BaseException | None = None
        while True:
            try:
                value = predicate()
                if value:
                    return value
            except Exception as e:
                last_exc = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout}s" + (f" (last error: {last_exc!r})"
                                                                             if last_exc else ""))
            time.sleep(interval)

    def enable_stats(self, extra: Callable[[], Mapping[str, object]] | None = None) -> None:
        """Serve ``GET /_sim/stats``: the counted API calls plus ``extra()`` (run on the loop).

        Why: a benchmark that runs the emulator in its own process (so it does not share a GIL with
        the router emulator) still needs the server-side counters. The path is outside every
        Kubernetes API path, read-only, not counted as an API call, and absent unless enabled.
        """
        self._stats = extra or (lambda: {})

    def stats(self) -> dict[str, object]:
        """What ``GET /_sim/stats`` answers: {"calls": [[verb, resource, n], ...], "connections": n,
        **extra()}."""
        doc: dict[str, object] = {"calls": [[verb, res, n] for (verb, res), n in sorted(self.calls.items())],
                                  "connections": self.connections}
        if self._stats is not None:
            doc.update(self._stats())
        return doc

    def _count(self, verb: str, resource: str) -> None:
        with self._calls_lock:
            self._calls[(verb, resource)] += 1

    # ---- HTTP: routing -----------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        transport = request.transport
        if transport is not None and transport not in self._transports:
            self._transports.add(transport)
            self.connections += 1
        try:
            return await self._dispatch(request)
        except ApiError as e:
            return error_reply(e)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except web.HTTPRequestEntityTooLarge:
            return error_reply(ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY}"))
        except Exception as e:
            log.exception("emulator error on %s %s", request.method, request.path_qs)
            return error_reply(ApiError(500, "InternalError", f"Internal error occurred: {type(e).__name__}: {e}"))

    def _discovery(self, parts: list[str]) -> dict[str, object] | None:
        if parts in (["version"],):
            return dict(SERVER_VERSION)
        if parts == ["api"]:
            return api_versions_doc()
        if parts == ["apis"]:
            return api_group_list_doc()
        if len(parts) == 2 and parts[0] == "api":
            return resource_list_doc("", parts[1])
        if len(parts) == 2 and parts[0] == "apis":
            return api_group_doc(parts[1])
        if len(parts) == 3 and parts[0] == "apis":
            return resource_list_doc(parts[1], parts[2])
        return None

    def _parse(self, parts: list[str]) -> Route | None:
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        watch_path = False
        if rest and rest[0] == "watch":
            watch_path, rest = True, rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            cand = BY_GROUP_PLURAL.get((group, rest[2]))
            if cand is not None and cand.namespaced:
                namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            return None
        info = BY_GROUP_PLURAL.get((group, rest[0]))
        if info is None or info.version != version:
            return None
        return Route(info, namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None,
                      watch_path)

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        method = request.method
        if not parts:
            return reply({"paths": ["/api", "/api/v1", "/apis", "/version"]})
        if parts[0] == "_sim" and self._stats is not None:
            if parts == ["_sim", "stats"] and method == "GET":
                return reply(self.stats())
            return error_reply(ApiError(404, "NotFound", "the server could not find the requested resource"))
        if method == "GET":
            doc = self._discovery(parts)
            if doc is not None:
                return reply(doc)
            if parts[0] in ("healthz", "livez", "readyz"):
                return web.Response(text="ok")
            if parts[0] == "openapi":
                return self._openapi(parts)
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) >= 5 and parts[4] == "proxy":
            assert self.kubelet_endpoints is not None
            return await self.kubelet_endpoints.node_proxy(request, parts[3], "/".join(parts[5:]))
        route = self._parse(parts)
        if route is None:
            return error_reply(ApiError(404, "NotFound", "the server could not find the requested resource"))
        q = request.query
        info = route.info
        watch = route.watch_path or flag(q, "watch")
        verb = self._verb(method, route, watch)
        res_key = info.plural + (f"/{route.sub}" if route.sub else "")
        self._count(verb, res_key)
        delay = self.faults.delay()
        if delay:
            await asyncio.sleep(delay)
        assert self.api is not None and self.resources is not None and self.kubelet_endpoints is not None
        if self._options.enforce_rbac and not self.api.allowed(verb, res_key, info.group, route.namespace or ""):
            raise ApiError(403, "Forbidden",
                           f'{info.plural} is forbidden: User "{self._options.user}" cannot {verb} resource '
                           f'"{res_key}" in API group "{info.group}"'
                           + (f' in the namespace "{route.namespace}"' if route.namespace else " at the cluster scope"),
                           {"kind": info.plural})
        fault = self.faults.decide(verb, res_key)
        if fault == fault_kinds.THROTTLE:
            secs = int(self.faults.retry_after)
            raise ApiError(429, "TooManyRequests", "Too many requests, please try again later.",
                           {"causes": [{"reason": "TooManyRequests"}], "retryAfterSeconds": secs},
                           headers={"Retry-After": str(secs)})
        if fault == fault_kinds.ERROR:
            raise ApiError(500, "InternalError", "Internal error occurred: injected fault (ce-k8s sim)")
        if watch:
            return await self.resources.watch(request, route)
        if route.sub == "log":
            return await self.kubelet_endpoints.log(request, route)
        response = await self.resources.serve(request, route, verb)
        if fault == fault_kinds.TIMEOUT:
            await self.resources.lose_answer(request)
        return response

    @staticmethod
    def _verb(method: str, route: Route, watch: bool) -> str:
        if method == "GET":
            if watch:
                return "watch"
            return "get" if route.name else "list"
        if method == "POST":
            return "create"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        if method == "DELETE":
            return "delete" if route.name else "deletecollection"
        return method.lower()

    def _openapi(self, parts: list[str]) -> web.Response:
        # kubectl (create/apply without --validate=false) asks /openapi/v3 whether the server
        # validates fields itself: it looks for a PATCH operation tagged with the kind's
        # x-kubernetes-group-version-kind that takes a fieldValidation query parameter. Saying yes
        # makes it send ?fieldValidation=Strict instead of downloading the full v2 schema, which
        # this emulator does not have.
        if parts == ["openapi", "v3"]:
            return reply({"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash=ce-k8s-sim"}
                                    for gv in openapi_v3_group_versions()}})
        if len(parts) >= 4 and parts[:2] == ["openapi", "v3"]:
            doc = openapi_v3_doc("/".join(parts[2:]))
            if doc is not None:
                return reply(doc)
        return error_reply(ApiError(404, "NotFound", "the server could not find the requested resource"))
