"""Usage of every pilot attempt, from Kubernetes, for the CE's history (GRACC) and APEL.

A site must account for every pilot it runs (docs/accounting.md). Per attempt (one pod) ce-k8s
knows from the pod itself: start and end (the pilot container's `startedAt`/`finishedAt`), hence
the wall time; the cores and memory it requested; the node. CPU time and memory use come from the
kubelet's Summary API (stats/v1alpha1): the containers' `cpu.usageCoreNanoSeconds` (cumulative CPU
time) and `memory.rssBytes` / `memory.workingSetBytes` / `memory.usageBytes`. The summary has no
peak memory, so the peak is the largest value seen.

Where the Summary is read (`CE_K8S_USAGE_SOURCE`, docs/accounting.md "Where the numbers come from"):

* `kubelet` (the default): each node's kubelet endpoint directly,
  `GET https://<InternalIP, else Hostname>:<daemonEndpoints.kubeletEndpoint.Port>/stats/summary`,
  with the agent's own credentials (the bearer token of its kubeconfig or in-cluster account). A
  kubelet in webhook mode asks the API server a TokenReview and a SubjectAccessReview for `get` on
  `nodes/stats` (kubelet pkg/kubelet/server/auth.go maps `/stats/*` to the `stats` subresource):
  a grant that shows stats and nothing else. Its serving certificate is verified against
  `CE_K8S_KUBELET_CA`, else the cluster CA of the agent's credentials, unless
  `CE_K8S_KUBELET_INSECURE` (warned once: many kubelets serve self-signed certificates).
* `proxy`: through the API server's node proxy, `GET /api/v1/nodes/{node}/proxy/stats/summary`,
  RBAC `get` on `nodes/proxy`. That grant reaches every kubelet endpoint of every node (exec,
  attach, run, logs, configz: docs/security.md), so the shipped RBAC no longer has it; it is for
  sites whose CE cannot reach the kubelets.
* `none`: no reads; CPU time unknown, no grant needed.

Wall time (docs/accounting.md "Wall time and the CPU bound"): the container timestamps have whole
seconds (a real kubelet writes RFC 3339 without a fraction, and the API server keeps whole seconds),
so a pilot that started and ended within one second shows `startedAt == finishedAt`. An attempt
that ran is charged at least that second, never 0. A CPU time above wall × cores is the finer
evidence that the truncated timestamps hid up to a second: the wall is then one second longer. CPU
time that even that cannot explain (a pod without a CPU limit that used more than it requested) is
capped at wall × cores, and the record and the log say so, with the kubelet's figure. When the wall
gets a second the timestamps hid, so does the end (CompletionDate - JobStartDate stays the wall).
The unit stays the second because APEL's script reads `RemoteWallClockTime` with `%lld`: a fraction would reach its
batch record as 0.

When it is read: every `interval` seconds for the nodes that run our pods (one request per node,
whatever its pod count), at once when a pod starts terminating (a deleted pod's stats vanish with
it), and once more when it has finished (the final cumulative CPU). A pod that ends between two
reads and is deleted before the final one keeps the last value read: CPU time is then a lower
bound, never more than the kubelet reported.

A real kubelet's Summary has live containers only (its stats come from the container's cgroup):
once the pilot container has exited, the final read finds nothing of it (finding 6 of issue 25,
docs/real-kubernetes.md). The attempt then keeps the last sample, which is a lower bound, and says
so (`K8sCpuLowerBound = true`, event `cpu-lower-bound`); with no sample at all its CPU time is
unknown, never a known 0.

When the site does not grant the source's permission (`nodes/stats` for the kubelet, `nodes/proxy`
for the proxy; a kubelet that refuses the token answers 401), the first refusal is logged once
(event `usage-forbidden`) and CPU is *unknown*, not 0: the routed job gets no `RemoteUserCpu`, it
gets `K8sCpuUsageKnown = false`, and the history file says the same (docs/accounting.md on what
APEL makes of it). The grant is tried again every hour.

Node benchmark (APEL's scaling): the node label or annotation `ce-k8s.htcondor.org/apel-scaling`
(a number, e.g. `1.12`) becomes `MachineAttrApelScaling0`, the annotation
`ce-k8s.htcondor.org/apel-specs` (e.g. `HEPscore23=15.2,HEPSPEC=14.37`) becomes
`MachineAttrApelSpecs0 = [HEPscore23 = 15.2; HEPSPEC = 14.37]`: the attributes HTCondor-CE's APEL
script reads (`APEL_SCALING_ATTR`, `APEL_SPEC_ATTR`). Nodes are listed (RBAC `list` on `nodes`,
already granted) at most every ten minutes.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes.client.exceptions import ApiException

from ce_k8s.agent.corecalls import CoreCalls
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.hooks._common import unquote
from ce_k8s.quantity import quantity_float

log = logging.getLogger(__name__)

SUMMARY_PATH = "/api/v1/nodes/{name}/proxy/stats/summary"   # CE_K8S_USAGE_SOURCE = proxy: get nodes/proxy
KUBELET_SUMMARY_PATH = "/stats/summary"                      # on the kubelet itself: get nodes/stats
KUBELET_DEFAULT_PORT = 10250                                 # a node that does not say its kubelet's port
SOURCE_KUBELET, SOURCE_PROXY, SOURCE_NONE = "kubelet", "proxy", "none"
# The RBAC (resource, subresource) each source needs, for logs, metrics and `ce-k8s doctor`.
SOURCE_GRANT = {SOURCE_KUBELET: "nodes/stats", SOURCE_PROXY: "nodes/proxy"}
SCALING_KEY = "ce-k8s.htcondor.org/apel-scaling"
SPECS_KEY = "ce-k8s.htcondor.org/apel-specs"
DEFAULT_INTERVAL = 60.0
FORBIDDEN_RETRY = 3600.0
NODES_REFRESH = 600.0
COALESCE = 0.2          # seconds a final read waits for others on the same node
SETTLE_WAIT = 30.0      # seconds a completion may wait for its attempt's final read

# Where an attempt's wall time comes from (history `K8sWallClockSource`; docs/accounting.md).
WALL_TIMESTAMPS = "timestamps"      # finishedAt - startedAt, whole seconds
WALL_MINIMUM = "minimum"            # both in the same second: the attempt ran, so it is charged that second
WALL_CPU = "cpu"                    # one second more than the timestamps: the CPU time proves it ran that long


@dataclass(slots=True)
class AttemptUsage:
    """What the summary showed for one pod (all of its containers summed)."""

    uid: str
    node: str
    cpu_ns: int | None = None       # last cumulative CPU time seen (usageCoreNanoSeconds)
    rss_peak: int = 0               # bytes, the largest rssBytes seen
    working_set_peak: int = 0
    usage_peak: int = 0             # usageBytes (resident + page cache): what ImageSize reports
    sampled: float = 0.0            # time.time() of the last sample
    final: bool = False             # the read after the pod finished was done (or is impossible)
    ended: float | None = None      # time.time() the watch saw it deleted (when it never terminated)
    finish_seen: float = 0.0        # time.time() the watch saw it finished or deleted
    seen_after_finish: bool = False  # a read begun after `finish_seen` still showed it: its CPU is final


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One finished attempt, as accounting sees it (the source of both the routed-job attributes
    and the per-job history file)."""

    pod: PodInfo
    start: int
    end: int
    wall: float
    cpu_seconds: float | None       # None: unknown (no summary read, or the grant is missing)
    rss_kib: int
    image_kib: int
    cores: int
    memory_mb: int
    outcome: str                    # completed, failed, evicted, deleted
    scaling: float | None
    specs: dict[str, float]
    wall_source: str = WALL_TIMESTAMPS  # which rule gave `wall` (`charge`)
    cpu_reported: float | None = None   # the kubelet's CPU seconds when `cpu_seconds` was capped to wall × cores
    # The CPU time is the last sample taken while the pod ran, not a reading after its end (a real
    # kubelet's Summary forgets an exited container): the attempt used at least that much.
    cpu_lower_bound: bool = False


def attempt_wall(start: int, end: int) -> tuple[float, str]:
    """(wall seconds, source) of an attempt whose pilot container ran from `start` to `end`
    (epoch seconds, truncated as the kubelet's timestamps are). Never 0: a container that started
    and ended within one second ran, and APEL reads the attribute as an integer (`%lld`)."""
    whole = max(end - start, 0)
    if whole == 0:
        return 1.0, WALL_MINIMUM
    return float(whole), WALL_TIMESTAMPS


def charge(start: int, end: int, cpu: float | None, cores: int) -> tuple[float, str, float | None, float | None]:
    """(wall, wall source, CPU seconds, the kubelet's CPU seconds if they were capped) of an attempt.

    Invariants (docs/accounting.md "Wall time and the CPU bound"): the wall is at least one second,
    and the CPU is never more than wall × `cores`. Both timestamps are truncated to the second, so
    the attempt ran for less than `end - start + 1` seconds: when the CPU needs that extra second,
    the wall gets it (WALL_CPU). What even that cannot explain is capped, and returned as reported.
    """
    wall, source = attempt_wall(start, end)
    if cpu is None or cpu <= wall * cores:
        return wall, source, cpu, None
    longest = float(max(end - start, 0) + 1)
    if cpu <= longest * cores:
        return longest, WALL_CPU, cpu, None
    return wall, source, wall * cores, cpu


def _max_seen(old: int, new: object) -> int:
    return max(old, int(new)) if isinstance(new, int | float) and not isinstance(new, bool) else old


def parse_specs(text: str) -> dict[str, float]:
    """`HEPscore23=15.2,HEPSPEC=14.37` → {name: value}; words that are not `name=number` are skipped."""
    out: dict[str, float] = {}
    for word in text.replace(";", ",").split(","):
        name, _, value = word.strip().partition("=")
        try:
            number = float(value)
        except ValueError:
            continue
        if name.strip() and math.isfinite(number):
            out[name.strip()] = number
    return out


def outcome_of(pod: PodInfo) -> str:
    """completed / failed / evicted / deleted: why the attempt ended (history `K8sAttemptOutcome`)."""
    if pod.disrupted or pod.reason in ("Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown"):
        return "evicted"
    if pod.phase == "Succeeded":
        return "completed"
    if pod.phase == "Failed":
        return "failed"
    return "deleted"


class KubeletError(Exception):
    """A kubelet's refusal or failure of one Summary read (`status` 0: no HTTP answer at all)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}" if status else reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class KubeletEndpoint:
    """Where a node's kubelet listens, from the Node object (what the API server's proxy would use)."""

    address: str
    port: int

    def url(self, path: str) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"https://{host}:{self.port}{path}"


def kubelet_endpoint(node: dict) -> KubeletEndpoint | None:
    """The kubelet endpoint of a Node object: its InternalIP (else its Hostname) and
    `status.daemonEndpoints.kubeletEndpoint.Port` (the kubelet's default 10250 when absent), the
    order the API server's own `--kubelet-preferred-address-types` uses on most clusters."""
    status = node.get("status") or {}
    addresses = [a for a in status.get("addresses") or () if isinstance(a, dict) and a.get("address")]
    address = next((str(a["address"]) for kind in ("InternalIP", "Hostname")
                    for a in addresses if a.get("type") == kind), None)
    if address is None:
        return None
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    return KubeletEndpoint(address, int(port) if isinstance(port, int) and 0 < port < 65536 else KUBELET_DEFAULT_PORT)


@dataclass
class KubeletClient:
    """GETs on kubelets' own HTTPS endpoints with the agent's credentials (CE_K8S_USAGE_SOURCE=kubelet).

    The credentials are those of the agent's API client: its bearer token (re-read before each
    request through the client's refresh hook, so a rotated in-cluster token is followed) and, when
    the kubeconfig has one, its client certificate. The kubelet's serving certificate is verified
    against `ca` (CE_K8S_KUBELET_CA), else the cluster CA of the same configuration; `insecure`
    (CE_K8S_KUBELET_INSECURE) skips that, for kubelets with self-signed serving certificates, and is
    logged once as a warning: the token then goes to whoever answers at the node's address.
    """

    configuration: object
    ca: str = ""
    insecure: bool = False
    _ctx: ssl.SSLContext | None = field(default=None, repr=False)

    def context(self) -> ssl.SSLContext:
        if self._ctx is None:
            conf = self.configuration
            if self.insecure:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                log.warning("%s", fields(
                    event="kubelet-tls-unverified",
                    why="CE_K8S_KUBELET_INSECURE: kubelets' serving certificates are not verified "
                        "(set CE_K8S_KUBELET_CA to the CA that signed them instead)"))
            else:
                ctx = ssl.create_default_context(cafile=self.ca or getattr(conf, "ssl_ca_cert", None) or None)
            cert, key = getattr(conf, "cert_file", None), getattr(conf, "key_file", None)
            if cert and key:
                ctx.load_cert_chain(cert, key)
            self._ctx = ctx
        return self._ctx

    def authorization(self) -> str | None:
        """The Authorization header the API client itself would send (its `auth_settings`, which
        run the client's token refresh hook: an in-cluster token is re-read as it rotates)."""
        settings = getattr(self.configuration, "auth_settings", None)
        value = None
        for auth in (settings() if settings is not None else {}).values():
            if auth.get("in") == "header" and str(auth.get("key", "")).lower() == "authorization":
                value = auth.get("value")
        if value and not value.lower().startswith("bearer "):
            value = "Bearer " + value
        return value or None

    def get(self, endpoint: KubeletEndpoint, path: str, timeout: float) -> bytes:
        """The body of a 200 answer; KubeletError otherwise (401/403 with the kubelet's words)."""
        headers = {"Accept": "application/json"}
        token = self.authorization()
        if token:
            headers["Authorization"] = token
        conn = http.client.HTTPSConnection(endpoint.address, endpoint.port, timeout=timeout, context=self.context())
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        except ssl.SSLCertVerificationError as exc:
            raise KubeletError(0, f"TLS: {exc.verify_message or exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise KubeletError(0, f"{type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if resp.status != 200:
            raise KubeletError(resp.status, body[:200].decode("utf-8", "replace").strip() or resp.reason)
        return body


class UsageCollector:
    """Samples the Summary API for our running pods and settles each attempt when its pod ends.

    `on_final(record)` runs (on the collector's thread) once per attempt whose pod ran; the agent
    writes the history file there. `pods()` gives the watch cache's live pods. `source` is
    CE_K8S_USAGE_SOURCE (module docstring); `kubelet_ca` / `kubelet_insecure` are used by the
    `kubelet` source only.
    """

    def __init__(self, api_client, core_api, pods: Callable[[], list[PodInfo]], *, interval: float = DEFAULT_INTERVAL,
                 request_timeout: float = 10.0, acquire: Callable[[], None] | None = None,
                 on_final: Callable[[AttemptRecord], None] | None = None,
                 on_error: Callable[[str, str, BaseException], None] | None = None,
                 source: str = SOURCE_KUBELET, kubelet_ca: str = "", kubelet_insecure: bool = False) -> None:
        if source not in (SOURCE_KUBELET, SOURCE_PROXY, SOURCE_NONE):
            raise ValueError(f"unknown usage source {source!r}")
        self.source = source
        self.grant = SOURCE_GRANT.get(source, "")
        self.kubelet = (KubeletClient(getattr(api_client, "configuration", None), kubelet_ca, kubelet_insecure)
                        if source == SOURCE_KUBELET else None)
        self.calls = CoreCalls(api_client)
        self.core = core_api
        self.pods = pods
        self.interval = interval
        self.request_timeout = request_timeout
        self.acquire = acquire or (lambda: None)
        self.on_final = on_final
        self.on_error = on_error
        self.usage: dict[str, AttemptUsage] = {}      # pod name -> usage
        self.records: dict[str, AttemptRecord] = {}   # pod name -> settled attempt
        self.forbidden_since: float | None = None
        self.summaries = 0                            # summary requests answered (tests, metrics)
        self._nodes: dict[str, tuple[float | None, dict[str, float]]] = {}
        self._endpoints: dict[str, KubeletEndpoint] = {}   # node -> its kubelet (source `kubelet`)
        self._tls_said = False
        self._nodes_at = 0.0
        self._nodes_forbidden = False
        self._finals: dict[str, PodInfo] = {}
        self._settling: set[str] = set()             # pods being settled right now (one thread each)
        self._node_read: dict[str, float] = {}       # node -> time.time() of its last good read
        self._queued: dict[str, float] = {}          # pod name -> when an update first waited for it
        self._urgent: set[str] = set()                # nodes to read now (a pod there is terminating)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self.source == SOURCE_NONE:
            log.info("%s", fields(event="usage-off", why="CE_K8S_USAGE_SOURCE = none: CPU time and memory "
                                                         "are accounted as unknown"))
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ce-k8s-usage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)

    # -- events from the watch (cheap: runs on the watch thread) --------------------------------

    def pod_changed(self, pod: PodInfo | None, gone: bool = False) -> None:
        """A watch event about `pod` (`gone`: the DELETED event)."""
        if pod is None or not pod.name:
            return
        with self._lock:
            if pod.name in self.records or pod.name in self._finals:
                return
            u = self.usage.get(pod.name)
            if u is None or u.uid != pod.uid:
                if pod.started_at is None:
                    return                # not started (yet, or ever): nothing used, nothing to account
                u = self.usage[pod.name] = AttemptUsage(pod.uid, pod.node)
            if gone and u.ended is None:
                u.ended = time.time()
            if pod.finished or gone:
                u.finish_seen = time.time()
                self._finals[pod.name] = pod
            elif pod.deleting:
                self._urgent.add(pod.node)
            else:
                return
        self._wake.set()

    def record(self, name: str) -> AttemptRecord | None:
        """The settled attempt of pod `name`, or None while it is not settled."""
        return self.records.get(name)

    def settled(self, pod: PodInfo, now: float | None = None, gone: bool = False) -> bool:
        """Whether the attempt of `pod` is settled, or never will be (it never ran, or settling has
        taken over `SETTLE_WAIT` seconds: a completion is never held back for accounting for long)."""
        if pod.name in self.records or pod.started_at is None:
            return True
        now = time.time() if now is None else now
        if pod.name not in self._finals:
            self.pod_changed(pod, gone=gone)     # an update may come before the watch event
        queued = self._queued.setdefault(pod.name, now)
        return now - queued >= SETTLE_WAIT

    def forget(self, keep: set[str]) -> None:
        """Drop what is known about pods not in `keep` (GC: the pods are long gone)."""
        with self._lock:
            for name in [n for n in self.usage if n not in keep and n not in self._finals]:
                del self.usage[name]
            for name in [n for n in self.records if n not in keep]:
                del self.records[name]
            for name in [n for n in self._queued if n not in keep]:
                del self._queued[name]

    # -- the reading thread ---------------------------------------------------------------------

    def _run(self) -> None:
        next_poll = time.monotonic() + min(self.interval, 5.0)
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_poll - time.monotonic()))
            if self._stop.is_set():
                break
            if self._wake.is_set():
                self._wake.clear()
                self._stop.wait(COALESCE)     # let the other pods of a burst join this read
            try:
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.interval
                    self.poll()
                self.settle()
            except Exception as exc:  # never let accounting stop the agent
                log.exception("%s", fields(event="usage-failed", error=f"{type(exc).__name__}: {exc}"))

    def poll(self) -> None:
        """One read per node running our pods; plus the nodes with a terminating pod."""
        nodes = {p.node for p in self.pods() if p.node and p.phase == "Running"}
        with self._lock:
            nodes |= self._urgent
            self._urgent.clear()
        for node in sorted(nodes):
            self.read_summary(node)

    def settle(self) -> None:
        """Final reads for the pods that ended (one read per node), then their records."""
        with self._lock:
            finals = dict(self._finals)
            urgent = set(self._urgent)
            self._urgent.clear()
        by_node: dict[str, list[PodInfo]] = {}
        for pod in finals.values():
            by_node.setdefault(pod.node, []).append(pod)
        for node in sorted(urgent - set(by_node)):
            self.read_summary(node)
        for node, pods in by_node.items():
            seen = max((self.usage[p.name].finish_seen for p in pods if p.name in self.usage), default=0.0)
            if node and self._node_read.get(node, 0.0) <= seen:
                self.read_summary(node)
            for pod in pods:
                self._settle_one(pod)

    def settle_pod(self, pod: PodInfo) -> AttemptRecord | None:
        """Settle one finished pod now, on the caller's thread (the agent does it before it saves a
        completed pod's log, so a completion is reported with its usage): one Summary read of its
        node, unless a read of that node came after the pod was seen finished."""
        if pod.name not in self.records:
            self.pod_changed(pod)
            u = self.usage.get(pod.name)
            if u is not None and pod.node and self._node_read.get(pod.node, 0.0) <= u.finish_seen:
                self.read_summary(pod.node)
            self._settle_one(pod)
        return self.records.get(pod.name)

    def _settle_one(self, pod: PodInfo) -> None:
        with self._lock:
            # The collector thread and an output-saving worker may both get here for one pod: only
            # one of them settles it (and so writes its history file).
            if pod.name in self.records or pod.name in self._settling or pod.started_at is None:
                self._finals.pop(pod.name, None)
                return
            self._settling.add(pod.name)
            u = self.usage.get(pod.name) or AttemptUsage(pod.uid, pod.node)
            u.final = True
            self._finals.pop(pod.name, None)
        try:
            record = self.build(pod, u)
            if record is None:
                return
            self.records[pod.name] = record
        finally:
            with self._lock:
                self._settling.discard(pod.name)
        if self.on_final is not None:
            try:
                self.on_final(record)
            except Exception as exc:
                log.warning("%s", fields(event="history-write-failed", pod=pod.name,
                                         error=f"{type(exc).__name__}: {exc}"))

    def build(self, pod: PodInfo, u: AttemptUsage) -> AttemptRecord | None:
        """The attempt's record; None when the pilot container never started (nothing was used)."""
        start = pod.started_at
        if start is None:
            return None
        end = pod.finished_at
        if end is None:
            end = int(u.ended or time.time())
        end = max(end, start)
        scaling, specs = self.node_benchmark(pod.node)
        cores = max(1, math.ceil(pod.cpu_request - 1e-9)) if pod.cpu_request else 1
        wall, source, cpu, reported = charge(start, end, None if u.cpu_ns is None else u.cpu_ns / 1e9, cores)
        lower = cpu is not None and not u.seen_after_finish
        if lower:
            # A real kubelet's Summary forgets an exited container (finding 6): what we have is the
            # last sample taken while it ran, so the attempt used at least that much.
            log.info("%s", fields(event="cpu-lower-bound", pod=pod.name, node=pod.node, cpu_s=round(cpu or 0.0, 1),
                                  sampled_before_end_s=round(max(0.0, (u.finish_seen or time.time()) - u.sampled), 1)))
        if source != WALL_TIMESTAMPS:
            # The wall has the second the truncated `finishedAt` hid: so has the end, which keeps
            # CompletionDate - JobStartDate == RemoteWallClockTime (the true end is before end + 1).
            end = start + int(wall)
        return AttemptRecord(
            pod=pod, start=start, end=end, wall=wall, cpu_seconds=cpu,
            rss_kib=math.ceil(u.rss_peak / 1024), image_kib=math.ceil(max(u.usage_peak, u.working_set_peak) / 1024),
            cores=cores, memory_mb=math.ceil(pod.memory_request / 2**20) if pod.memory_request else 0,
            outcome=outcome_of(pod), scaling=scaling, specs=specs, wall_source=source, cpu_reported=reported,
            cpu_lower_bound=lower)

    def read_summary(self, node: str) -> bool:
        """One Summary API read of `node` from the configured source, folded into the pods' usage;
        False when it failed (or the source is `none`)."""
        now = time.time()
        if self.source == SOURCE_NONE or not node:
            return False
        if self.forbidden_since is not None and now - self.forbidden_since < FORBIDDEN_RETRY:
            return False
        try:
            data = self._fetch_kubelet(node) if self.kubelet is not None else self._fetch_proxy(node)
        except (ApiException, KubeletError) as exc:
            self._error("get", self.grant, exc)
            if exc.status in (401, 403):
                # 401: a kubelet that does not take the token (no webhook authentication); 403: the
                # grant is missing (the API server's RBAC, or the kubelet's SubjectAccessReview).
                if self.forbidden_since is None:
                    log.warning("%s", fields(
                        event="usage-forbidden", node=node, source=self.source, status=exc.status,
                        why=f"the agent may not get {self.grant}: CPU time is accounted as unknown "
                            "(grant it: docs/accounting.md)"))
                self.forbidden_since = now
            elif isinstance(exc, KubeletError) and exc.reason.startswith("TLS:") and not self._tls_said:
                self._tls_said = True
                log.warning("%s", fields(
                    event="usage-read-failed", node=node, source=self.source, error=exc.reason,
                    why="the kubelet's serving certificate is not trusted: set CE_K8S_KUBELET_CA, or "
                        "CE_K8S_KUBELET_INSECURE = true (docs/accounting.md)"))
            else:
                log.info("%s", fields(event="usage-read-failed", node=node, source=self.source,
                                      status=exc.status or None, error=getattr(exc, "reason", None) or None))
            return False
        except Exception as exc:
            self._error("get", self.grant, exc)
            log.info("%s", fields(event="usage-read-failed", node=node, source=self.source, error=type(exc).__name__))
            return False
        if self.forbidden_since is not None:
            log.info("%s", fields(event="usage-allowed", node=node))
            self.forbidden_since = None
        try:
            doc = json.loads(data)
        except ValueError:
            return False
        self.summaries += 1
        self._node_read[node] = now
        self.fold(node, doc, now)
        return True

    def _fetch_proxy(self, node: str) -> bytes:
        """The Summary through the API server's node proxy (get nodes/proxy)."""
        self.acquire()
        resp = self.calls.request("GET", SUMMARY_PATH, {"name": node}, None, None, self.request_timeout)
        return resp.data

    def _fetch_kubelet(self, node: str) -> bytes:
        """The Summary from the node's kubelet itself (get nodes/stats). No API token bucket: the
        request goes to the kubelet (which asks the API server its reviews, cached by the kubelet)."""
        assert self.kubelet is not None
        endpoint = self.endpoint(node)
        if endpoint is None:
            raise KubeletError(0, "no kubelet address (the node is unknown, or has no InternalIP or Hostname)")
        return self.kubelet.get(endpoint, KUBELET_SUMMARY_PATH, self.request_timeout)

    def endpoint(self, node: str) -> KubeletEndpoint | None:
        """The kubelet endpoint of `node`, from the node list the benchmarks come from."""
        if node not in self._endpoints:
            self.node_benchmark(node)
        return self._endpoints.get(node)

    def fold(self, node: str, doc: dict, now: float) -> None:
        """Take one Summary document's numbers for the pods we track on `node`."""
        with self._lock:
            for ps in doc.get("pods") or ():
                ref = ps.get("podRef") or {}
                u = self.usage.get(str(ref.get("name") or ""))
                if u is None or u.uid != ref.get("uid") or u.node != node:
                    continue
                cpu = 0
                seen = False
                rss = ws = used = 0
                for cs in ps.get("containers") or ():
                    c_cpu = (cs.get("cpu") or {}).get("usageCoreNanoSeconds")
                    if isinstance(c_cpu, int | float):
                        cpu += int(c_cpu)
                        seen = True
                    mem = cs.get("memory") or {}
                    rss += int(mem.get("rssBytes") or 0)
                    ws += int(mem.get("workingSetBytes") or 0)
                    used += int(mem.get("usageBytes") or 0)
                if seen and (u.cpu_ns is None or cpu >= u.cpu_ns):
                    u.cpu_ns = cpu          # cumulative: never go back (a restarted container resets it)
                if seen and u.finish_seen and now >= u.finish_seen:
                    u.seen_after_finish = True   # read after its end: the final figure, not a bound
                u.rss_peak = _max_seen(u.rss_peak, rss)
                u.working_set_peak = _max_seen(u.working_set_peak, ws)
                u.usage_peak = _max_seen(u.usage_peak, used)
                u.sampled = now

    def _error(self, verb: str, resource: str, exc: BaseException) -> None:
        if self.on_error is not None:
            try:
                self.on_error(verb, resource, exc)
            except Exception:  # noqa: S110 - metrics must never break accounting
                pass

    # -- node benchmarks ------------------------------------------------------------------------

    def node_benchmark(self, node: str) -> tuple[float | None, dict[str, float]]:
        """(APEL scaling factor, APEL specs) the site set on `node` (module docstring)."""
        now = time.time()
        if not self._nodes_forbidden and (now - self._nodes_at > NODES_REFRESH or node not in self._nodes):
            self._nodes_at = now
            try:
                self.acquire()
                resp = self.core.list_node(_preload_content=False, _request_timeout=self.request_timeout)
                items = json.loads(resp.data).get("items") or []
            except ApiException as exc:
                self._error("list", "nodes", exc)
                if exc.status == 403:
                    self._nodes_forbidden = True
                    log.warning("%s", fields(event="node-benchmarks-unreadable", why="nodes list forbidden"))
                items = []
            except Exception as exc:
                self._error("list", "nodes", exc)
                items = []
            for item in items:
                meta = item.get("metadata") or {}
                labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
                raw = labels.get(SCALING_KEY) or notes.get(SCALING_KEY)
                scaling = quantity_float(raw)
                if scaling is not None and not (math.isfinite(scaling) and scaling > 0):
                    scaling = None
                self._nodes[str(meta.get("name") or "")] = (scaling, parse_specs(str(notes.get(SPECS_KEY) or "")))
                endpoint = kubelet_endpoint(item)
                if endpoint is not None:
                    self._endpoints[str(meta.get("name") or "")] = endpoint
        return self._nodes.get(node, (None, {}))


# -- what the routed job and the history file get ----------------------------------------------

def routed_attrs(record: AttemptRecord) -> dict[str, object]:
    """The standard HTCondor attributes of this attempt for the routed job's update (HTCondor units:
    seconds as reals for the wall and CPU times, epoch seconds for dates, KiB for ResidentSetSize
    and ImageSize, MiB for MemoryProvisioned). `RemoteUserCpu`/`RemoteSysCpu` only when known."""
    attrs: dict[str, object] = {
        "JobCurrentStartDate": record.start, "LastRemoteHost": record.pod.node,
        "ResidentSetSize": record.rss_kib, "ResidentSetSize_RAW": record.rss_kib,
        "ImageSize": record.image_kib, "ImageSize_RAW": record.image_kib,
        "CpusProvisioned": record.cores, "K8sCpuUsageKnown": record.cpu_seconds is not None,
    }
    if record.cpu_seconds is not None:
        attrs["K8sCpuLowerBound"] = record.cpu_lower_bound
    if record.memory_mb:
        attrs["MemoryProvisioned"] = record.memory_mb
    if record.cpu_seconds is not None:
        attrs["RemoteUserCpu"] = round(record.cpu_seconds, 3)
        attrs["RemoteSysCpu"] = 0.0
    return attrs


def history_ad(record: AttemptRecord, ce_name: str, identity: dict[str, str] | None = None,
               routed_job: str = "") -> dict[str, object]:
    """The per-job history ad of one attempt: every attribute condor_batch_blah.py reads, defined.

    `GlobalJobId` is `<CE name>#<pod name>#<pod creation time>`: the schedd's `name#cluster.proc#time`
    shape, unique per attempt (the pod name carries the source job and the attempt number). CPU
    time unknown → `RemoteUserCpu = 0.0` with `K8sCpuUsageKnown = false`: the APEL batch record
    needs a number in that column (an undefined one drops the field and breaks the record), and
    0.0 is what HTCondor's own history holds for a grid job nobody reported usage for.
    `K8sWallClockSource` names the rule that gave the wall time, and `K8sCpuCapped` whether the CPU
    time was capped to wall × cores (then `K8sCpuReported` is the kubelet's figure; `charge`).
    """
    pod = record.pod
    cluster, _, proc = (pod.source_job or "").partition(".")
    identity = identity or {}
    ad: dict[str, object] = {
        "GlobalJobId": f"{ce_name}#{pod.name}#{pod.created or record.start}",
        "ClusterId": int(cluster) if cluster.isdigit() else 0,
        "ProcId": int(proc) if proc.isdigit() else 0,
        "Owner": pod.owner or "unknown",
        "RoutedFromJobId": pod.source_job or "",
        "JobUniverse": 9,
        "JobStatus": 4 if record.outcome == "completed" else 3,
        "QDate": pod.created or record.start,
        "JobStartDate": record.start,
        "JobCurrentStartDate": record.start,
        "CompletionDate": record.end,
        "EnteredCurrentStatus": record.end,
        "RemoteWallClockTime": record.wall,
        "RemoteUserCpu": round(record.cpu_seconds, 3) if record.cpu_seconds is not None else 0.0,
        "RemoteSysCpu": 0.0,
        "K8sCpuUsageKnown": record.cpu_seconds is not None,
        "K8sWallClockSource": record.wall_source,
        "K8sCpuCapped": record.cpu_reported is not None,
        "K8sCpuLowerBound": record.cpu_seconds is not None and record.cpu_lower_bound,
        "ResidentSetSize_RAW": record.rss_kib,
        "ResidentSetSize": record.rss_kib,
        "ImageSize_RAW": record.image_kib,
        "ImageSize": record.image_kib,
        "RequestCpus": record.cores,
        "CpusProvisioned": record.cores,
        "RequestMemory": record.memory_mb,
        "MemoryProvisioned": record.memory_mb,
        "LastRemoteHost": pod.node,
        "K8sNodeName": pod.node,
        "K8sPodName": pod.name,
        "K8sPodNamespace": pod.namespace,
        "K8sPodUid": pod.uid,
        "K8sAttempt": pod.attempt,
        "K8sAttemptOutcome": record.outcome,
        "RouteName": pod.route,
    }
    if routed_job:
        ad["K8sRoutedJobId"] = routed_job
    if record.cpu_reported is not None:
        ad["K8sCpuReported"] = round(record.cpu_reported, 3)
    if pod.exit_code is not None:
        ad["ExitCode"] = pod.exit_code
    if record.scaling is not None:
        ad["MachineAttrApelScaling0"] = record.scaling
    if record.specs:
        ad["MachineAttrApelSpecs0"] = dict(record.specs)
    for name in IDENTITY_ATTRS:
        # The blah record reads orig_AuthToken*: HTCondor-CE keeps the submitter's token there; a
        # routed ad that has only AuthToken* (no such transform) gives those.
        value = identity.get(name.lower()) or identity.get(name.lower().removeprefix("orig_"))
        value = unquote(value) if value else None
        if value:
            ad[name] = value
    return ad


# The identity attributes the APEL blah record reads (userDN, userFQAN), kept from the routed ad.
IDENTITY_ATTRS = ("x509userproxysubject", "x509UserProxyFirstFQAN", "x509UserProxyVOName",
                  "orig_AuthTokenSubject", "orig_AuthTokenIssuer", "orig_AuthTokenGroups")
IDENTITY_WANTED = frozenset({a.lower() for a in IDENTITY_ATTRS}
                            | {a.lower().removeprefix("orig_") for a in IDENTITY_ATTRS})

