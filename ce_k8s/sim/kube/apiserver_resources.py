"""The emulated API server's handlers for the resource verbs: get, list, create, update, patch,
delete and deletecollection, and watch streams.

Why a part of its own: the router (apiserver.py) decides which request this is, counts it and
injects the faults that come before an answer; these handlers turn a routed request into a call of
:class:`Api` and its answer into HTTP, including the faults that act on the answer itself (a lost
answer after the write, a watch cut mid-stream) and the watch's bookmarks.
"""

from __future__ import annotations

import asyncio
import json

import yaml
from aiohttp import web

from ce_k8s.sim.kube import faults as fault_kinds
from ce_k8s.sim.kube.api import Api
from ce_k8s.sim.kube.apiserver_http import PATCH_TYPES, Route, flag, int_param, reply
from ce_k8s.sim.kube.errors import ApiError, bad_request, method_not_allowed
from ce_k8s.sim.kube.faults import Faults
from ce_k8s.sim.kube.resources import ResourceInfo
from ce_k8s.sim.kube.selectors import SelectorError, make_filter
from ce_k8s.sim.kube.store import GoneError


class ResourceHandlers:
    """The resource verbs and watches over ``api``, with ``faults`` and watch bookmarks every
    ``bookmark_interval`` seconds."""

    def __init__(self, api: Api, faults: Faults, bookmark_interval: float) -> None:
        self.api = api
        self.faults = faults
        self.bookmark_interval = bookmark_interval

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

    async def serve(self, request: web.BaseRequest, route: Route, verb: str) -> web.StreamResponse:
        """One routed request of a resource verb other than watch, answered from :class:`Api`."""
        api = self.api
        q = request.query
        info, ns, name, sub = route.info, route.namespace, route.name, route.sub
        dry_run = q.get("dryRun") == "All"
        plural = info.plural
        if sub not in (None, "status", "eviction", "binding") or (sub and plural != "pods" and sub != "status") \
                or (sub == "status" and not info.has_status):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if verb == "get":
            assert name is not None
            return reply(api.get(plural, ns, name))
        if verb == "list":
            if sub:
                raise method_not_allowed()
            return reply(api.list(plural, ns, q.get("labelSelector"), q.get("fieldSelector"),
                                  int_param(q, "limit"), q.get("continue")))
        if verb == "create":
            body = await self._body(request)
            if name is None:
                return reply(api.create(plural, ns, body, dry_run=dry_run), 201)
            if sub == "eviction" and ns:
                return reply(api.evict(ns, name, body), 201)
            if sub == "binding" and ns:
                return reply(api.bind(ns, name, body), 201)
            raise method_not_allowed()
        if verb == "update":
            if name is None:
                raise method_not_allowed()
            body = await self._body(request)
            return reply(api.replace(plural, ns, name, body, sub, dry_run=dry_run))
        if verb == "patch":
            if name is None:
                raise method_not_allowed()
            ctype = request.content_type
            ptype = PATCH_TYPES.get(ctype)
            if ptype is None:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                               f"accepted media types include: {', '.join(PATCH_TYPES)}")
            body = await self._body(request, yaml_ok=ptype == "apply")
            if ptype == "apply" and api.store.peek(plural, ns or "" if info.namespaced else "", name) is None:
                if isinstance(body, dict):
                    body.setdefault("metadata", {})["name"] = name
                return reply(api.create(plural, ns, body, dry_run=dry_run), 201)
            return reply(api.patch(plural, ns, name, ptype, body, sub, dry_run=dry_run))
        if verb in ("delete", "deletecollection"):
            if sub:
                raise method_not_allowed()
            body = await self._body(request)
            opts: dict[str, object] = dict(body) if isinstance(body, dict) else {}
            grace = int_param(q, "gracePeriodSeconds")
            if grace is not None and "gracePeriodSeconds" not in opts:
                opts["gracePeriodSeconds"] = grace
            if q.get("propagationPolicy") and "propagationPolicy" not in opts:
                opts["propagationPolicy"] = q["propagationPolicy"]
            if name is None:
                return reply(api.delete_collection(plural, ns, q.get("labelSelector"), q.get("fieldSelector"),
                                                   opts))
            answer, code = api.delete(plural, ns, name, opts, dry_run=dry_run)
            return reply(answer, code)
        raise method_not_allowed()

    async def lose_answer(self, request: web.BaseRequest) -> None:
        """The write is applied; now make sure the client never gets the answer."""
        if self.faults.timeout_mode == "hang":
            await asyncio.sleep(self.faults.hang_seconds)
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError

    async def watch(self, request: web.BaseRequest, route: Route) -> web.StreamResponse:
        """A watch stream from ``resourceVersion`` on, with bookmarks, ``timeoutSeconds`` and the
        injected cuts; 410 Expired (as an ERROR event) for a version no longer in the history."""
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
        since = int_param(q, "resourceVersion")
        timeout = int_param(q, "timeoutSeconds")
        bookmarks = flag(q, "allowWatchBookmarks")
        ns = route.namespace if info.namespaced else None
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Cache-Control": "no-cache, private"})
        resp.enable_chunked_encoding()
        try:
            watcher = self.api.store.open_watch(info.plural, ns, pred, since)
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
            self.api.store.close_watch(watcher)
        return resp

    @staticmethod
    def _abort(request: web.BaseRequest) -> None:
        """Cut the connection mid-stream (no terminating chunk): what a dropped watch looks like."""
        if request.transport is not None:
            request.transport.abort()

    def _bookmark(self, info: ResourceInfo) -> bytes:
        obj = {"kind": info.kind, "apiVersion": info.api_version,
               "metadata": {"resourceVersion": str(self.api.store.resource_version)}}
        return json.dumps({"type": "BOOKMARK", "object": obj}, separators=(",", ":")).encode() + b"\n"
