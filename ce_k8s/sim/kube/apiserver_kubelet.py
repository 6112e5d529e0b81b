"""What the emulated API server answers on the kubelet's behalf: pods/log and the nodes/proxy
Summary API.

Why a part of its own: on a real cluster both requests are proxied by kube-apiserver to the
kubelet of the pod's node, and both answer from what the kubelet simulator keeps (the containers'
output in the store's log table, the usage meter) rather than from stored objects; their option
checks and error answers are the real server's and kubelet's (kube-apiserver's
ValidatePodLogOptions and podLogLocation, the kubelet's validateContainerLogStatus).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from ce_k8s.sim.kube.api import Api, ApiOptions, log_lines_of, meta_of, pod_log_stream
from ce_k8s.sim.kube.apiserver_http import Route, flag, int_param, reply
from ce_k8s.sim.kube.errors import ApiError, bad_request


class KubeletEndpoints:
    """pods/log and nodes/proxy over ``api``.

    ``options`` is the server's own (its ``log_streams`` may change while it runs); ``kubelet``
    returns the kubelet simulator, or None without one; ``count`` counts an API call;
    ``stopping`` is set when the server stops (a followed log ends).
    """

    def __init__(self, api: Api, options: ApiOptions, kubelet: Callable[[], Any],
                 count: Callable[[str, str], None], stopping: asyncio.Event | None) -> None:
        self.api = api
        self._options = options
        self._kubelet = kubelet
        self._count = count
        self._stopping = stopping

    async def node_proxy(self, request: web.BaseRequest, node: str, path: str) -> web.StreamResponse:
        """``GET /api/v1/nodes/{node}/proxy/stats/summary``: the kubelet's stats/v1alpha1 Summary
        (ce_k8s.sim.kube.kubelet_stats). The API server authorises it as ``get`` on ``nodes/proxy``
        (a cluster-scoped subresource), so with RBAC enforced and no rule for it, or with the
        kubelet's ``usage.denied`` switch on, the answer is the real server's 403.
        """
        self._count("get", "nodes/proxy")
        kubelet = self._kubelet()
        denied = kubelet is not None and kubelet.usage.denied
        if denied or (self._options.enforce_rbac and not self.api.allowed("get", "nodes/proxy", "", "")):
            raise ApiError(403, "Forbidden",
                           f'nodes "{node}" is forbidden: User "{self._options.user}" cannot get resource '
                           '"nodes/proxy" in API group "" at the cluster scope', {"name": node, "kind": "nodes"})
        if request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if self.api.store.peek("nodes", "", node) is None:
            raise ApiError(404, "NotFound", f'nodes "{node}" not found', {"name": node, "kind": "nodes"})
        if path.rstrip("/") != "stats/summary":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        doc = kubelet.summary(node) if kubelet is not None else None
        if doc is None:
            # What the API server answers when it cannot reach the node's kubelet.
            raise ApiError(503, "ServiceUnavailable", f'error trying to reach service: dial tcp: node "{node}" '
                           "is not reachable")
        return reply(doc)

    async def log(self, request: web.BaseRequest, route: Route) -> web.StreamResponse:
        """``GET .../pods/{name}/log``: the container's output as the kubelet serves it, options
        checked first (a bad one is a 422 even for a pod that does not exist), ``follow`` streamed
        until the container ends."""
        api = self.api
        if route.info.plural != "pods" or not route.name or not route.namespace or request.method != "GET":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        q = request.query
        ns, name = route.namespace, route.name
        tail = int_param(q, "tailLines")
        limit = int_param(q, "limitBytes")
        since = int_param(q, "sinceSeconds")
        stream = pod_log_stream(self._options.log_streams, name, q.get("stream"), tail, limit, since)
        pod = api.get("pods", ns, name)
        container = self._log_container(pod, q.get("container"))
        if not (pod.get("spec") or {}).get("nodeName"):
            # No kubelet to ask yet: kube-apiserver's podLogLocation returns no location and the
            # answer is 200 with an empty body (tests/real/test_emulator_parity.py).
            return web.Response(body=b"", status=200, content_type="text/plain")
        self._check_log_ready(pod, container)
        stamps = flag(q, "timestamps")
        if flag(q, "previous"):
            raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
        key = (ns, name, container)

        def render(lines: list[tuple[str, str, str]]) -> bytes:
            lines = log_lines_of(lines, stream)
            if since is not None:
                cutoff = time.time() - since
                lines = [x for x in lines if _ts_epoch(x[0]) >= cutoff]
            return "".join((f"{ts} {text}" if stamps else text) for ts, _, text in lines).encode()

        # tailLines counts lines of the combined log: validation allows it only with stream All.
        lines = list(self.api.store.logs.get(key, ()))
        if tail is not None:
            lines = lines[-tail:] if tail else []
        body = render(lines)
        # limitBytes counts the bytes of the selected stream (timestamps included), as the kubelet
        # stops writing to that stream's writer; with `follow` it ends the stream too.
        left = limit if limit is not None else -1
        if left >= 0:
            body = body[:left]
            left -= len(body)
        if not flag(q, "follow"):
            return web.Response(body=body, content_type="text/plain")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(body)
        sent = len(self.api.store.logs.get(key, ()))
        try:
            while left != 0:
                await asyncio.sleep(0.02)
                current = self.api.store.logs.get(key, [])
                if len(current) > sent:
                    more = render(current[sent:])
                    if left > 0:
                        more = more[:left]
                        left -= len(more)
                    if more:
                        await resp.write(more)
                    sent = len(current)
                pod_now = self.api.store.peek("pods", ns, name)
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
