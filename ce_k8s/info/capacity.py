"""Pure capacity arithmetic over a cluster snapshot: what the cluster can still take, per pod shape.

Everything here is a function of its arguments (no I/O, no clock), so the information provider's
answer for a given snapshot is reproducible and testable. Every figure is an integer in the
kube-scheduler's own units (``ce_k8s.info.quantity`` converts once, exactly), so floats never enter
the arithmetic, ``0.1 + 0.2`` CPUs cannot drift and an unchanged cluster always yields an unchanged ad.

The placement rules mirror the scheduler's filter plugins that matter for a pilot pod:
NodeUnschedulable (cordon), TaintToleration (``NoSchedule``/``NoExecute``), NodeAffinity
(``nodeSelector`` + required node affinity) and NodeResourcesFit (allocatable minus the requests
of pods bound to the node that are not finished). Pod (anti-)affinity and topology spread are not
modelled: pilots do not use them, and other tenants' use of them only affects their own pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ce_k8s.info.quantity import CPU, MEMORY, pod_resources
from ce_k8s.info.snapshot import ClusterSnapshot, Node, Pod, Quota

PODS = "pods"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "ce-k8s"
CE_LABEL = "ce-k8s.htcondor.org/ce"
ROUTE_LABEL = "ce-k8s.htcondor.org/route"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
MIB = 1024 * 1024


# --------------------------------------------------------------------------------------------
# Placement predicates


def tolerates(tolerations: Iterable[Mapping[str, object]], key: str, value: str, effect: str) -> bool:
    """Whether any toleration tolerates the taint (k8s ``Toleration.ToleratesTaint``)."""
    for t in tolerations:
        t_effect = t.get("effect") or ""
        if t_effect and t_effect != effect:
            continue
        t_key = t.get("key") or ""
        operator = t.get("operator") or "Equal"
        if not t_key:
            if operator == "Exists":
                return True
            continue
        if t_key != key:
            continue
        if operator == "Exists":
            return True
        if operator == "Equal" and (t.get("value") or "") == value:
            return True
    return False


def _expression_matches(expr: Mapping[str, object], labels: Mapping[str, str]) -> bool:
    key = str(expr.get("key") or "")
    op = expr.get("operator")
    values = [str(v) for v in (expr.get("values") or ())]  # type: ignore[union-attr]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False  # unknown operator: the API would have rejected it; never match


def node_selector_term_matches(term: Mapping[str, object], node: Node) -> bool:
    """One ``nodeSelectorTerm``: all expressions and fields must match; an empty term matches nothing."""
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not exprs and not fields:
        return False
    for expr in exprs:  # type: ignore[union-attr]
        if not _expression_matches(expr, node.labels):
            return False
    for expr in fields:  # type: ignore[union-attr]
        if expr.get("key") != "metadata.name" or not _expression_matches(
            {**expr, "key": "metadata.name"}, {"metadata.name": node.name}
        ):
            return False
    return True


@dataclass(frozen=True)
class PodShape:
    """What placement and quota need to know about one pilot pod, taken from its manifest."""

    namespace: str
    requests: Mapping[str, int]
    limits: Mapping[str, int] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[Mapping[str, object], ...] | None = None
    tolerations: tuple[Mapping[str, object], ...] = ()
    priority_class: str | None = None
    active_deadline: int | None = None  # activeDeadlineSeconds; set = the quota scope "Terminating"
    labels: Mapping[str, str] = field(default_factory=dict)  # the pod's labels (route, CE, managed-by)

    @classmethod
    def from_pod(cls, pod: Mapping[str, object], default_namespace: str = "default") -> PodShape:
        """Build the shape from a Pod manifest (what ``ce_k8s.pods.builder`` produces)."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        assert isinstance(meta, Mapping) and isinstance(spec, Mapping)
        requests, limits = pod_resources(spec)
        requests = {k: v for k, v in requests.items() if v > 0}
        requests[PODS] = 1
        affinity = spec.get("affinity") or {}
        terms: tuple[Mapping[str, object], ...] | None = None
        node_aff = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
        if isinstance(node_aff, Mapping):
            required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")
            if isinstance(required, Mapping):
                terms = tuple(t for t in (required.get("nodeSelectorTerms") or ()) if isinstance(t, Mapping))
        return cls(
            namespace=str(meta.get("namespace") or default_namespace),
            requests=requests,
            limits=limits,
            node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
            required_terms=terms,
            tolerations=tuple(t for t in (spec.get("tolerations") or ()) if isinstance(t, Mapping)),
            priority_class=spec.get("priorityClassName") or None,  # type: ignore[arg-type]
            active_deadline=_int_or_none(spec.get("activeDeadlineSeconds")),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        )

    @property
    def terminating(self) -> bool:
        return self.active_deadline is not None

    @property
    def best_effort(self) -> bool:
        return not any(v for k, v in self.requests.items() if k != PODS) and not any(self.limits.values())


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def node_is_schedulable(node: Node) -> bool:
    """Ready and not cordoned: the nodes the CE-level totals are taken over."""
    return node.ready and not node.unschedulable


def node_admits(node: Node, shape: PodShape) -> str | None:
    """None when a pod of ``shape`` may be placed on ``node`` (resources aside), else why not."""
    if not node.ready:
        return "not Ready"
    if node.unschedulable and not tolerates(shape.tolerations, UNSCHEDULABLE_TAINT, "", "NoSchedule"):
        return "cordoned"
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not tolerates(
            shape.tolerations, taint.key, taint.value, taint.effect
        ):
            return f"untolerated taint {taint.key}:{taint.effect}"
    for k, v in shape.node_selector.items():
        if node.labels.get(k) != v:
            return f"nodeSelector {k}={v}"
    if shape.required_terms is not None and not any(
        node_selector_term_matches(t, node) for t in shape.required_terms
    ):
        return "required node affinity"
    return None


def fits_count(free: Mapping[str, int], requests: Mapping[str, int]) -> int:
    """How many pods with ``requests`` fit into ``free`` (identical pods: per-node floor is optimal)."""
    n: int | None = None
    for r, need in requests.items():
        if need <= 0:
            continue
        k = max(free.get(r, 0), 0) // need
        if n is None or k < n:
            n = k
            if n == 0:
                return 0
    return n if n is not None else 0


# --------------------------------------------------------------------------------------------
# Quota


def _quota_scope_matches(quota: Quota, shape: PodShape) -> bool:
    for scope in quota.scopes:
        if scope == "Terminating" and not shape.terminating:
            return False
        if scope == "NotTerminating" and shape.terminating:
            return False
        if scope == "BestEffort" and not shape.best_effort:
            return False
        if scope == "NotBestEffort" and shape.best_effort:
            return False
        if scope == "CrossNamespacePodAffinity":
            return False  # pilots carry no pod affinity terms
        if scope == "PriorityClass" and not shape.priority_class:
            return False
    for expr in quota.scope_selector:
        name = expr.get("scopeName")
        if name == "PriorityClass":
            labels = {"pc": shape.priority_class} if shape.priority_class else {}
            if not _expression_matches({**expr, "key": "pc"}, labels):
                return False
        elif name in ("Terminating", "NotTerminating", "BestEffort", "NotBestEffort"):
            flag = {
                "Terminating": shape.terminating,
                "NotTerminating": not shape.terminating,
                "BestEffort": shape.best_effort,
                "NotBestEffort": not shape.best_effort,
            }[str(name)]
            if (expr.get("operator") == "Exists") != flag:
                return False
        else:
            return False
    return True


# Quota admission insists that every container states cpu/memory when a quota tracks them (the
# pod evaluator's "backward compatibility requirement"); other resources are simply not charged.
_MUST_SPECIFY = frozenset({CPU, MEMORY, "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"})


def _quota_demand(key: str, shape: PodShape) -> int | None:
    """What one pilot charges against quota key ``key``; None if the key does not concern pods."""
    if key in (PODS, "count/pods"):
        return 1
    if key.startswith("requests."):
        return shape.requests.get(key[len("requests."):], 0)
    if key.startswith("limits."):
        return shape.limits.get(key[len("limits."):], 0)
    if key in (CPU, MEMORY, "ephemeral-storage"):
        return shape.requests.get(key, 0)
    return None


def quota_room(quotas: Iterable[Quota], shape: PodShape, used_fallback: Mapping[str, int]) -> tuple[int | None, str]:
    """How many more pilots of ``shape`` the namespace's ResourceQuotas admit (None = unlimited).

    Uses each quota's ``status.used`` (the quota controller's figure, which also counts pods that are
    admitted but not yet scheduled); ``used_fallback`` (summed from the snapshot's pods) stands in
    when a hand-made or brand-new quota has no status yet. A quota that tracks cpu or memory
    rejects a pod that does not state them, so it then admits zero.
    """
    room: int | None = None
    why = ""
    for q in quotas:
        if q.namespace != shape.namespace or not _quota_scope_matches(q, shape):
            continue
        for key, hard in sorted(q.hard.items()):
            demand = _quota_demand(key, shape)
            if demand is None:
                continue
            if demand == 0:
                if key in _MUST_SPECIFY:
                    return 0, f"quota {q.name} tracks {key} but the pilot does not set it"
                continue
            used = q.used.get(key) if q.used is not None and key in q.used else used_fallback.get(key, 0)
            n = max(hard - used, 0) // demand
            if room is None or n < room:
                room, why = n, f"quota {q.name} {key}"
    return room, why


def namespace_usage(pods: Iterable[Pod], namespace: str) -> dict[str, int]:
    """Quota usage of a namespace summed from its non-finished pods (fallback for quota status)."""
    used: dict[str, int] = {}
    for p in pods:
        if p.namespace != namespace or p.phase in FINISHED_PHASES:
            continue
        used[PODS] = used.get(PODS, 0) + 1
        used["count/pods"] = used.get("count/pods", 0) + 1
        for k, v in p.requests.items():
            used["requests." + k] = used.get("requests." + k, 0) + v
            if k in (CPU, MEMORY, "ephemeral-storage"):
                used[k] = used.get(k, 0) + v
        for k, v in p.limits.items():
            used["limits." + k] = used.get("limits." + k, 0) + v
    return used


# --------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class ClusterTotals:
    """CE-level figures over schedulable (Ready, uncordoned) nodes, in scheduler units."""

    nodes_total: int
    nodes_schedulable: int
    cpu_milli_total: int
    cpu_milli_free: int
    memory_total: int
    memory_free: int
    gpus_total: int
    gpus_free: int
    pilots_running: int
    pilots_pending: int


@dataclass(frozen=True)
class RouteCapacity:
    """What the cluster can hold for one route's pilot shape right now."""

    eligible_nodes: int  # nodes a pilot of this shape may be placed on (resources aside)
    fit_now: int  # more pilots that fit on those nodes now (per-node packing)
    placed: int  # this route's pilots already bound to a node and not finished
    pending: int  # this route's pilots not yet bound
    quota_room: int | None  # more pilots the namespace quota admits (None = no quota)
    quota_reason: str
    headroom: int  # configured autoscaler headroom that was added
    max_pilots: int  # placed + min(fit_now + headroom, quota_room), capped
    largest_node_cpus: int  # whole cores allocatable on the biggest eligible node
    exclusions: Mapping[str, int]  # reason -> number of nodes excluded for it


def is_ours(pod: Pod, ce_label: str | None) -> bool:
    """Our pilots: managed-by=ce-k8s and, when this CE's label value is known, that label.

    The label value is taken from a manifest our own builder produced (it is sanitised there), so
    two CEs sharing a cluster do not count each other's pilots.
    """
    if pod.labels.get(MANAGED_BY_LABEL) != MANAGED_BY_VALUE:
        return False
    return ce_label is None or pod.labels.get(CE_LABEL) == ce_label


class CapacityModel:
    """Per-node free resources computed once from a snapshot, then queried per route shape."""

    def __init__(self, snapshot: ClusterSnapshot, gpu_resources: Iterable[str], ce_label: str | None = None):
        self.snapshot = snapshot
        self.gpu_resources = frozenset(gpu_resources)
        self.ce_label = ce_label
        used: dict[str, dict[str, int]] = {}
        # One pass over the pods: node usage, and our pilots per route label (placed, pending).
        self._ours: dict[str, list[int]] = {}
        self._ours_phase: dict[str, int] = {}
        for p in snapshot.pods:
            if p.phase in FINISHED_PHASES:
                continue
            if p.labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE and is_ours(p, ce_label):
                counts = self._ours.setdefault(p.labels.get(ROUTE_LABEL, ""), [0, 0])
                counts[0 if p.node_name is not None else 1] += 1
                self._ours_phase[p.phase] = self._ours_phase.get(p.phase, 0) + 1
            if p.node_name is None:
                continue
            u = used.get(p.node_name)
            if u is None:
                u = used[p.node_name] = {PODS: 0}
            u[PODS] += 1
            for k, v in p.requests.items():
                u[k] = u.get(k, 0) + v
        self.free: dict[str, dict[str, int]] = {}
        for n in snapshot.nodes:
            u = used.get(n.name, {})
            self.free[n.name] = {k: v - u.get(k, 0) for k, v in n.allocatable.items()}
        self._ns_usage: dict[str, dict[str, int]] = {}

    def totals(self) -> ClusterTotals:
        cpu_t = cpu_f = mem_t = mem_f = gpu_t = gpu_f = 0
        schedulable = 0
        for n in self.snapshot.nodes:
            if not node_is_schedulable(n):
                continue
            schedulable += 1
            free = self.free[n.name]
            cpu_t += n.allocatable.get(CPU, 0)
            cpu_f += max(free.get(CPU, 0), 0)
            mem_t += n.allocatable.get(MEMORY, 0)
            mem_f += max(free.get(MEMORY, 0), 0)
            for g in self.gpu_resources:
                gpu_t += n.allocatable.get(g, 0)
                gpu_f += max(free.get(g, 0), 0)
        running = self._ours_phase.get("Running", 0)
        pending = self._ours_phase.get("Pending", 0)
        return ClusterTotals(
            nodes_total=len(self.snapshot.nodes),
            nodes_schedulable=schedulable,
            cpu_milli_total=cpu_t,
            cpu_milli_free=cpu_f,
            memory_total=mem_t,
            memory_free=mem_f,
            gpus_total=gpu_t,
            gpus_free=gpu_f,
            pilots_running=running,
            pilots_pending=pending,
        )

    def namespace_usage(self, namespace: str) -> dict[str, int]:
        if namespace not in self._ns_usage:
            self._ns_usage[namespace] = namespace_usage(self.snapshot.pods, namespace)
        return self._ns_usage[namespace]

    def route_capacity(self, shape: PodShape, headroom: int = 0, cap: int | None = None) -> RouteCapacity:
        """Capacity for the pilots of one route, whose pod is ``shape``.

        The route's own pilots are recognised by the route label of ``shape`` (the builder's
        sanitised value), so they are counted exactly as the agent labelled them.

        ``MaxPilots`` is what factories use as the entry's total glidein limit (OSG_autoconf), so it
        counts the route's pilots already placed plus those that still fit, not just the free slots:
        a cluster full of our own pilots keeps advertising that many instead of dropping to zero and
        making the factory oscillate. Pending, unbound pilots are not added (they do not fit yet).
        """
        eligible = 0
        fit = 0
        largest = 0
        exclusions: dict[str, int] = {}
        for n in self.snapshot.nodes:
            why = node_admits(n, shape)
            if why is not None:
                key = why.split(" ", 1)[0] if why.startswith("untolerated") else why
                exclusions[key] = exclusions.get(key, 0) + 1
                continue
            eligible += 1
            fit += fits_count(self.free[n.name], shape.requests)
            largest = max(largest, n.allocatable.get(CPU, 0) // 1000)
        route_label = shape.labels.get(ROUTE_LABEL)
        placed, pending = self._ours.get(route_label, [0, 0]) if route_label is not None else (0, 0)
        quotas = [q for q in self.snapshot.quotas if q.namespace == shape.namespace]
        fallback = self.namespace_usage(shape.namespace) if any(q.used is None for q in quotas) else {}
        room, why = quota_room(quotas, shape, fallback)
        more = fit + max(headroom, 0)
        if room is not None:
            more = min(more, room)
        total = placed + more
        if cap is not None:
            total = min(total, max(cap, 0))
        return RouteCapacity(
            eligible_nodes=eligible,
            fit_now=fit,
            placed=placed,
            pending=pending,
            quota_room=room,
            quota_reason=why,
            headroom=max(headroom, 0),
            max_pilots=total,
            largest_node_cpus=largest,
            exclusions=exclusions,
        )


def cores(milli: int) -> int:
    """Whole cores (floor) from millicores, for attributes advertised as integers."""
    return milli // 1000


def megabytes(n_bytes: int) -> int:
    """HTCondor "MB" (MiB, floor) from bytes."""
    return n_bytes // MIB
