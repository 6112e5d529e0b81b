"""The agent's Prometheus metrics (`prometheus-client`), served on `CE_K8S_METRICS_ADDRESS`.

Why these: they answer the questions a CE admin has when pilots stall (issue 8): how many pods
sit in which phase per route (is a route starved?), how long creates and deletes take (is the API
server or our QPS budget the bottleneck?), which API calls fail and how (quota 403, 429, 5xx,
timeouts), what the hooks ask and what they get (`denied`, `busy` mean pilots get no status
sync), and whether the watch cache is fresh (`ce_k8s_cache_age_seconds` growing = the watch is
stuck and every update answers from stale data). Agent restarts show as a change of
`process_start_time_seconds` (the standard process collector) and `ce_k8s_agent_start_time_seconds`.

Each agent has its own `CollectorRegistry`, so in-process agents (tests, the demo) never share or
collide. The hot path only does `child.inc()` on pre-bound counters (~0.2 µs); pod gauges are
computed from the cache when Prometheus scrapes, never on the update path. Labels hold only
route names, phases, verbs and HTTP codes: never job text, never credentials.
"""

from __future__ import annotations

import logging
import time
from collections import Counter as _Tally
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ce_k8s.agent.options import parse_address

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def error_code(exc: BaseException) -> str:
    """The `code` label of an API failure: the HTTP status, else the kind of transport failure."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status:
        return str(status)
    name = type(exc).__name__.lower()
    if "timeout" in name or "timedout" in name:
        return "timeout"
    if "gone" in name:
        return "410"
    return "connection" if "connection" in name or "protocol" in name or "maxretry" in name else "other"


class _CacheCollector(Collector):
    """Pods by phase and route, cache size and age: read from the watch cache at scrape time."""

    def __init__(self, pods: Callable[[], Iterable], last_event: Callable[[], float],
                 extra: Callable[[], dict[str, float]]) -> None:
        self._pods = pods
        self._last_event = last_event
        self._extra = extra

    def collect(self):
        tally: _Tally[tuple[str, str]] = _Tally()
        for pod in list(self._pods()):
            phase = "Terminating" if pod.deleting and not pod.finished else pod.phase
            tally[(phase, pod.route)] += 1
        g = GaugeMetricFamily("ce_k8s_pods", "Pods of this CE in the agent's watch cache, by phase and route",
                              labels=["phase", "route"])
        for phase in PHASES:                      # the usual phases always exist, so alerts can use them
            if not any(k[0] == phase for k in tally):
                g.add_metric([phase, ""], 0)
        for (phase, route), n in sorted(tally.items()):
            g.add_metric([phase, route], n)
        yield g
        last = self._last_event()
        yield GaugeMetricFamily("ce_k8s_cache_age_seconds",
                                "Seconds since the last watch event, bookmark or LIST (-1 before the first LIST)",
                                value=round(time.time() - last, 3) if last else -1.0)
        for name, (help_text, value) in self._extra().items():
            yield GaugeMetricFamily(name, help_text, value=value)


class AgentMetrics:
    """Counters, histograms and gauges of one agent; `serve(address)` exposes them over HTTP."""

    def __init__(self, pods: Callable[[], Iterable] = tuple, last_event: Callable[[], float] = lambda: 0.0,
                 extra: Callable[[], dict[str, tuple[str, float]]] = dict) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        self.start_time = Gauge("ce_k8s_agent_start_time_seconds", "When this agent process started (epoch)",
                                registry=r)
        self.start_time.set(time.time())
        self.hook_requests = Counter("ce_k8s_hook_requests", "Hook requests by verb and reply status",
                                     ["verb", "result"], registry=r)
        self.api_errors = Counter("ce_k8s_api_errors", "Failed Kubernetes API calls by verb, resource and code",
                                  ["verb", "resource", "code"], registry=r)
        self.create_seconds = Histogram("ce_k8s_pod_create_seconds",
                                        "Pod creation: POST of the pod until the API server answered",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.delete_seconds = Histogram("ce_k8s_pod_delete_seconds", "Pod deletion: DELETE of the pod and its Secret",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.pods_created = Counter("ce_k8s_pods_created", "Pods created (adopted ones not included)", registry=r)
        self.pods_adopted = Counter("ce_k8s_pods_adopted", "Pods found existing at create time and adopted",
                                    registry=r)
        self.pods_deleted = Counter("ce_k8s_pods_deleted", "Pods deleted by the agent", ["why"], registry=r)
        self.outputs = Counter("ce_k8s_pod_outputs", "Pod logs saved for finalize, by result",
                               ["result"], registry=r)
        self.relists = Counter("ce_k8s_cache_relists", "Full LISTs of the pods (start, 410 Gone)", registry=r)
        self.credential_refreshes = Counter("ce_k8s_credential_refreshes",
                                            "Secrets patched with a renewed proxy or token of a running pilot",
                                            registry=r)
        self.api_warnings = Counter("ce_k8s_api_warnings",
                                    "Warning headers of the API server's answers to pod and Secret writes, each "
                                    "once per pod, by resource and kind (ce_k8s.agent.apiwarnings)",
                                    ["resource", "kind"], registry=r)
        self.credential_failures = Counter("ce_k8s_credential_refresh_failures",
                                           "Failed credential refreshes (retried), by why: read, api, internal",
                                           ["why"], registry=r)
        r.register(_CacheCollector(pods, last_event, extra))
        self._hook_children: dict[tuple[str, str], object] = {}
        self._server = None
        self._thread = None
        self.address: tuple[str, int] | None = None

    # -- hot path --------------------------------------------------------------------------------

    def hook(self, verb: str, result: str) -> None:
        """Count one hook request (pre-bound child per (verb, result): no label lookup per call)."""
        child = self._hook_children.get((verb, result))
        if child is None:
            child = self._hook_children[(verb, result)] = self.hook_requests.labels(verb, result)
        child.inc()

    def api_error(self, verb: str, resource: str, exc: BaseException) -> None:
        self.api_errors.labels(verb, resource, error_code(exc)).inc()

    # -- exposition ------------------------------------------------------------------------------

    def render(self) -> bytes:
        """The text exposition format, as a scrape returns it."""
        return generate_latest(self.registry)

    def serve(self, address: str) -> tuple[str, int] | None:
        """Serve `/metrics` on `host:port` in a daemon thread; None (and a warning) if that fails.

        A metrics endpoint that cannot bind must not stop the agent: the hooks matter more.
        """
        from prometheus_client import start_http_server

        host, port = parse_address(address)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            log.warning("event=metrics-off address=%s error=%r", address, exc.strerror or str(exc))
            return None
        bound = self._server.server_address
        self.address = (str(bound[0]), int(bound[1]))
        log.info("event=metrics-serving address=%s:%d", *self.address)
        return self.address

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
