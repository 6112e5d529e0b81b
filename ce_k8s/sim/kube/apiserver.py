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
are in docs/testbed.md. The HTTP layer here only parses requests, counts calls, injects faults
and serialises answers; the semantics live in :mod:`ce_k8s.sim.kube.api`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml
from aiohttp import web

from ce_k8s.sim.kube import faults as fault_kinds
from ce_k8s.sim.kube.api import (
    LOG_STREAM_MODES,
    AccessRule,
    Api,
    ApiOptions,
    log_lines_of,
    meta_of,
    pod_log_stream,
)
from ce_k8s.sim.kube.errors import ApiError, bad_request, method_not_allowed
from ce_k8s.sim.kube.faults import Faults
from ce_k8s.sim.kube.resources import (
    BY_GROUP_PLURAL,
    SERVER_VERSION,
    ResourceInfo,
    api_group_doc,
    api_group_list_doc,
    api_versions_doc,
    openapi_v3_doc,
    openapi_v3_group_versions,
    resource_list_doc,
)
from ce_k8s.sim.kube.selectors import SelectorError, make_filter
from ce_k8s.sim.kube.store import GoneError, Store

__all__ = ["AccessRule", "Api", "ApiError", "ApiServer", "Faults", "Store"]

log = logging.getLogger(__name__)

MAX_BODY = 3 * 1024 * 1024
_PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


@dataclass
class _Route:
    """A parsed resource URL."""

    info: ResourceInfo
    namespace: str | None
    name: str | None
    sub: str | None
    watch_path: bool


def _json(body: object, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=_encode(body), status=status, content_type="application/json", headers=headers)


def _encode(body: object) -> bytes:
    """Compact JSON of a reply body.

    Why msgspec: a 500-pod LIST page is ~3 MB of JSON, and the stdlib encoder spent a core-second
    per 20,000 pods on it, on the two cores the client under test shares with the emulator. The
    stdlib stays as the fallback for anything msgspec will not encode.
    """
    try:
        return msgspec.json.encode(body)
    except (TypeError, ValueError, OverflowError):
        return json.dumps(body, separators=(",", ":")).encode()


def _error(e: ApiError) -> web.Response:
    return _json(e.status(), e.code, e.headers)


def _int_param(q: Mapping[str, str], key: str) -> int | None:
    raw = q.get(key)
    if raw in (None, ""):
        return None
    try:
        return int(str(raw))
    except ValueError as e:
        raise bad_request(f"invalid {key} {raw!r}: must be an integer") from e


def _true(q: Mapping[str, str], key: str) -> bool:
    return str(q.get(key, "")).lower() in ("true", "1")


class ApiServer:
    """The emulator: store + semantics + HTTP + (optionally) the kubelet/scheduler simulator."""

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

    # ---- HTTP -------------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        transport = request.transport
        if transport is not None and transport not in self._transports:
            self._transports.add(transport)
            self.connections += 1
        try:
            return await self._dispatch(request)
        except ApiError as e:
            return _error(e)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except web.HTTPRequestEntityTooLarge:
            return _error(ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY}"))
        except Exception as e:
            log.exception("emulator error on %s %s", request.method, request.path_qs)
            return _error(ApiError(500, "InternalError", f"Internal error occurred: {type(e).__name__}: {e}"))

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

    def _parse(self, parts: list[str]) -> _Route | None:
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
        return _Route(info, namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None,
                      watch_path)

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        method = request.method
        if not parts:
            return _json({"paths": ["/api", "/api/v1", "/apis", "/version"]})
        if parts[0] == "_sim" and self._stats is not None:
            if parts == ["_sim", "stats"] and method == "GET":
                return _json(self.stats())
            return _error(ApiError(404, "NotFound", "the server could not find the requested resource"))
        if method == "GET":
            doc = self._discovery(parts)
            if doc is not None:
                return _json(doc)
            if parts[0] in ("healthz", "livez", "readyz"):
                return web.Response(text="ok")
            if parts[0] == "openapi":
                return self._openapi(parts)
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) >= 5 and parts[4] == "proxy":
            return await self._node_proxy(request, parts[3], "/".join(parts[5:]))
        route = self._parse(parts)
        if route is None:
            return _error(ApiError(404, "NotFound", "the server could not find the requested resource"))
        q = request.query
        info = route.info
        watch = route.watch_path or _true(q, "watch")
        verb = self._verb(method, route, watch)
        res_key = info.plural + (f"/{route.sub}" if route.sub else "")
        self._count(verb, res_key)
        delay = self.faults.delay()
        if delay:
            await asyncio.sleep(delay)
        assert self.api is not None
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
            return await self._watch(request, route)
        if route.sub == "log":
            return await self._log(request, route)
        response = await self._serve(request, route, verb)
        if fault == fault_kinds.TIMEOUT:
            await self._lose_answer(request)
        return response

    @staticmethod
    def _verb(method: str, route: _Route, watch: bool) -> str:
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

    async def _lose_answer(self, request: web.BaseRequest) -> None:
        """The write is applied; now make sure the client never gets the answer."""
        if self.faults.timeout_mode == "hang":
            await asyncio.sleep(self.faults.hang_seconds)
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError

    async def _body(self, request: web.BaseRequest, yaml_ok: bool = False) -> object:
        raw = await request.read()
        if not raw:
            return None
        try:
            if yaml_ok:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise bad_request(f"the body of the request was in an unknown format: {e}") from e

    async def _serve(self, request: web.BaseRequest, route: _Route, verb: str) -> web.StreamResponse:
        api = self.api
        assert api is not None
        q = request.query
        info, ns, name, sub = route.info, route.namespace, route.name, route.sub
        dry_run = q.get("dryRun") == "All"
        plural = info.plural
        if sub not in (None, "status", "eviction", "binding") or (sub and plural != "pods" and sub != "status") \
                or (sub == "status" and not info.has_status):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if verb == "get":
            assert name is not None
            return _json(api.get(plural, ns, name))
        if verb == "list":
            if sub:
                raise method_not_allowed()
            return _json(api.list(plural, ns, q.get("labelSelector"), q.get("fieldSelector"),
                                  _int_param(q, "limit"), q.get("continue")))
        if verb == "create":
            body = await self._body(request)
            if name is None:
                return _json(api.create(plural, ns, body, dry_run=dry_run), 201)
            if sub == "eviction" and ns:
                return _json(api.evict(ns, name, body), 201)
            if sub == "binding" and ns:
                return _json(api.bind(ns, name, body), 201)
            raise method_not_allowed()
        if verb == "update":
            if name is None:
                raise method_not_allowed()
            body = await self._body(request)
            return _json(api.replace(plural, ns, name, body, sub, dry_run=dry_run))
        if verb == "patch":
            if name is None:
                raise method_not_allowed()
            ctype = request.content_type
            ptype = _PATCH_TYPES.get(ctype)
            if ptype is None:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                               f"accepted media types include: {', '.join(_PATCH_TYPES)}")
            body = await self._body(request, yaml_ok=ptype == "apply")
            if ptype == "apply" and api.store.peek(plural, ns or "" if info.namespaced else "", name) is None:
                if isinstance(body, dict):
                    body.setdefault("metadata", {})["name"] = name
                return _json(api.create(plural, ns, body, dry_run=dry_run), 201)
            return _json(api.patch(plural, ns, name, ptype, body, sub, dry_run=dry_run))
        if verb in ("delete", "deletecollection"):
            if sub:
                raise method_not_allowed()
            body = await self._body(request)
            opts: dict[str, object] = dict(body) if isinstance(body, dict) else {}
            grace = _int_param(q, "gracePeriodSeconds")
            if grace is not None and "gracePeriodSeconds" not in opts:
                opts["gracePeriodSeconds"] = grace
            if q.get("propagationPolicy") and "propagationPolicy" not in opts:
                opts["propagationPolicy"] = q["propagationPolicy"]
            if name is None:
                return _json(api.delete_collection(plural, ns, q.get("labelSelector"), q.get("fieldSelector"),
                                                   opts))
            answer, code = api.delete(plural, ns, name, opts, dry_run=dry_run)
            return _json(answer, code)
        raise method_not_allowed()

    def _openapi(self, parts: list[str]) -> web.Response:
        # kubectl (create/apply without --validate=false) asks /openapi/v3 whether the server
        # validates fields itself: it looks for a PATCH operation tagged with the kind's
        # x-kubernetes-group-version-kind that takes a fieldValidation query parameter. Saying yes
        # makes it send ?fieldValidation=Strict instead of downloading the full v2 schema, which
        # this emulator does not have.
        if parts == ["openapi", "v3"]:
            return _json({"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash=ce-k8s-sim"}
                                    for gv in openapi_v3_group_versions()}})
        if len(parts) >= 4 and parts[:2] == ["openapi", "v3"]:
            doc = openapi_v3_doc("/".join(parts[2:]))
            if doc is not None:
                return _json(doc)
        return _error(ApiError(404, "NotFound", "the server could not find the requested resource"))

    # ---- watch ------------------------------------------------------------------------------------
    async def _watch(self, request: web.BaseRequest, route: _Route) -> web.StreamResponse:
        q = request.query
        info = route.info
        if route.sub:
            raise method_not_allowed()
        fsel = q.get("fieldSelector")
        if route.name:
            fsel = ",".join(x for x in (fsel, f"metadata.name={route.name}") if x)
        try:
            pred = make_filter(q.get("labelSelector"), fsel, info.plural)
        except SelectorError as e:
            raise bad_request(str(e)) from e
        since = _int_param(q, "resourceVersion")
        timeout = _int_param(q, "timeoutSeconds")
        bookmarks = _true(q, "allowWatchBookmarks")
        ns = route.namespace if info.namespaced else None
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Cache-Control": "no-cache, private"})
        resp.enable_chunked_encoding()
        try:
            watcher = self.store.open_watch(info.plural, ns, pred, since)
        except GoneError as e:
            await resp.prepare(request)
            err = ApiError(410, "Expired", str(e))
            await resp.write(json.dumps({"type": "ERROR", "object": err.status()}).encode() + b"\n")
            await resp.write_eof()
            return resp
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + timeout if timeout else None
        cut_after = self.faults.cut_after
        cut_at = start + cut_after if cut_after else None
        next_bookmark = start + self.bookmark_interval
        try:
            await resp.prepare(request)
            while True:
                now = loop.time()
                ends = [t for t in (deadline, cut_at) if t is not None]
                if bookmarks:
                    ends.append(next_bookmark)
                wait = max(0.0, min(ends) - now) if ends else None
                try:
                    line = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    now = loop.time()
                    if cut_at is not None and now >= cut_at:
                        self.faults._count(fault_kinds.CUT)
                        self._abort(request)
                        return resp
                    if deadline is not None and now >= deadline:
                        if bookmarks:
                            await resp.write(self._bookmark(info))
                        break
                    if bookmarks and now >= next_bookmark:
                        await resp.write(self._bookmark(info))
                        next_bookmark = now + self.bookmark_interval
                    continue
                if line is None:
                    break
                chunk = [line]
                cut = self.faults.cut_watch_now(info.plural) if (self.faults.cut_rate or self.faults.scripted) \
                    else False
                while not cut and not watcher.queue.empty() and len(chunk) < 256:
                    nxt = watcher.queue.get_nowait()
                    if nxt is None:
                        watcher.queue.put_nowait(None)
                        break
                    chunk.append(nxt)
                    if self.faults.cut_rate or self.faults.scripted:
                        cut = self.faults.cut_watch_now(info.plural)
                await resp.write(b"".join(chunk))
                if cut:
                    self._abort(request)
                    return resp
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self.store.close_watch(watcher)
        return resp

    @staticmethod
    def _abort(request: web.BaseRequest) -> None:
        """Cut the connection mid-stream (no terminating chunk): what a dropped watch looks like."""
        if request.transport is not None:
            request.transport.abort()

    def _bookmark(self, info: ResourceInfo) -> bytes:
        obj = {"kind": info.kind, "apiVersion": info.api_version,
               "metadata": {"resourceVersion": str(self.store.resource_version)}}
        return json.dumps({"type": "BOOKMARK", "object": obj}, separators=(",", ":")).encode() + b"\n"

    # ---- nodes/proxy: the kubelet's Summary API ----------------------------------------------------
    async def _node_proxy(self, request: web.BaseRequest, node: str, path: str) -> web.StreamResponse:
        """``GET /api/v1/nodes/{node}/proxy/stats/summary``: the kubelet's stats/v1alpha1 Summary
        (ce_k8s.sim.kube.kubelet_stats). The API server authorises it as ``get`` on ``nodes/proxy``
        (a cluster-scoped subresource), so with RBAC enforced and no rule for it, or with the
        kubelet's ``usage.denied`` switch on, the answer is the real server's 403.
        """
        self._count("get", "nodes/proxy")
        assert self.api is not None
        denied = self.kubelet is not None and self.kubelet.usage.denied
        if denied or (self._options.enforce_rbac and not self.api.allowed("get", "nodes/proxy", "", "")):
            raise ApiError(403, "Forbidden",
                           f'nodes "{node}" is forbidden: User "{self._options.user}" cannot get resource '
                           '"nodes/proxy" in API group "" at the cluster scope', {"name": node, "kind": "nodes"})
        if request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if self.store.peek("nodes", "", node) is None:
            raise ApiError(404, "NotFound", f'nodes "{node}" not found', {"name": node, "kind": "nodes"})
        if path.rstrip("/") != "stats/summary":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        doc = self.kubelet.summary(node) if self.kubelet is not None else None
        if doc is None:
            # What the API server answers when it cannot reach the node's kubelet.
            raise ApiError(503, "ServiceUnavailable", f'error trying to reach service: dial tcp: node "{node}" '
                           "is not reachable")
        return _json(doc)

    # ---- pods/log ---------------------------------------------------------------------------------
    async def _log(self, request: web.BaseRequest, route: _Route) -> web.StreamResponse:
        api = self.api
        assert api is not None
        if route.info.plural != "pods" or not route.name or not route.namespace or request.method != "GET":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        q = request.query
        ns, name = route.namespace, route.name
        tail = _int_param(q, "tailLines")
        limit = _int_param(q, "limitBytes")
        since = _int_param(q, "sinceSeconds")
        stream = pod_log_stream(self._options.log_streams, name, q.get("stream"), tail, limit, since)
        pod = api.get("pods", ns, name)
        container = self._log_container(pod, q.get("container"))
        if not (pod.get("spec") or {}).get("nodeName"):
            # No kubelet to ask yet: kube-apiserver's podLogLocation returns no location and the
            # answer is 200 with an empty body (tests/real/test_emulator_parity.py).
            return web.Response(body=b"", status=200, content_type="text/plain")
        self._check_log_ready(pod, container)
        stamps = _true(q, "timestamps")
        if _true(q, "previous"):
            raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
        key = (ns, name, container)

        def render(lines: list[tuple[str, str, str]]) -> bytes:
            lines = log_lines_of(lines, stream)
            if since is not None:
                cutoff = time.time() - since
                lines = [x for x in lines if _ts_epoch(x[0]) >= cutoff]
            return "".join((f"{ts} {text}" if stamps else text) for ts, _, text in lines).encode()

        # tailLines counts lines of the combined log: validation allows it only with stream All.
        lines = list(self.store.logs.get(key, ()))
        if tail is not None:
            lines = lines[-tail:] if tail else []
        body = render(lines)
        # limitBytes counts the bytes of the selected stream (timestamps included), as the kubelet
        # stops writing to that stream's writer; with `follow` it ends the stream too.
        left = limit if limit is not None else -1
        if left >= 0:
            body = body[:left]
            left -= len(body)
        if not _true(q, "follow"):
            return web.Response(body=body, content_type="text/plain")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(body)
        sent = len(self.store.logs.get(key, ()))
        try:
            while left != 0:
                await asyncio.sleep(0.02)
                current = self.store.logs.get(key, [])
                if len(current) > sent:
                    more = render(current[sent:])
                    if left > 0:
                        more = more[:left]
                        left -= len(more)
                    if more:
                        await resp.write(more)
                    sent = len(current)
                pod_now = self.store.peek("pods", ns, name)
                if pod_now is None or _container_state(pod_now, container) == "terminated" or (
                        self._stopping is not None and self._stopping.is_set()):
                    break
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    @staticmethod
    def _log_container(pod: Mapping[str, Any], wanted: str | None) -> str:
        name = meta_of(pod).get("name")
        spec = pod.get("spec") or {}
        names = [str(c.get("name")) for c in spec.get("containers") or []]
        inits = [str(c.get("name")) for c in spec.get("initContainers") or []]
        if wanted:
            if wanted not in names + inits:
                raise bad_request(f"container {wanted} is not valid for pod {name}")
            return wanted
        if len(names) != 1:
            raise bad_request(f"a container name must be specified for pod {name}, choose one of: "
                              f"[{' '.join(names)}]" + (f" or one of the init containers: [{' '.join(inits)}]"
                                                         if inits else ""))
        return names[0]

    @staticmethod
    def _check_log_ready(pod: Mapping[str, Any], container: str) -> None:
        name = meta_of(pod).get("name")
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        statuses += (pod.get("status") or {}).get("initContainerStatuses") or []
        for cs in statuses:
            if cs.get("name") == container:
                waiting = (cs.get("state") or {}).get("waiting")
                if waiting and not cs.get("lastState", {}).get("terminated"):
                    reason = waiting.get("reason", "ContainerCreating")
                    # The kubelet's words (validateContainerLogStatus, pkg/kubelet/kubelet_pods.go).
                    if reason == "ErrImagePull":
                        reason = "image can't be pulled"
                    elif reason == "ImagePullBackOff":
                        reason = "trying and failing to pull image"
                    raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: {reason}')
                return
        raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating')


def _container_state(pod: Mapping[str, Any], container: str) -> str | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            state = cs.get("state") or {}
            return next(iter(state), None)
    return None


def _ts_epoch(ts: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp with nanoseconds (our log stamps)."""
    import datetime as dt

    base, _, frac = ts.rstrip("Z").partition(".")
    t = dt.datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
    return t + (float("0." + frac) if frac else 0.0)
