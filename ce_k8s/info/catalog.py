"""Catalog entries from configuration: one `EntrySpec` per enabled Kubernetes route.

Everything about an `OSG_ResourceCatalog` entry that does not depend on the cluster comes from
here: a representative pilot is routed with the real routing engine and built into a Pod with the
real pod builder, so the advertised shape is what the route really makes; the settings a route
cannot express come from `CE_K8S_INFO_*` knobs or `ce_k8s_info_*` route macros
(docs/information-provider.md, "A catalog entry" and "Catalog settings a route cannot express").
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ce_k8s.info.capacity import PodShape, cores, megabytes
from ce_k8s.info.health import WARNING, Health
from ce_k8s.info.quantity import CPU, MEMORY

if TYPE_CHECKING:  # pragma: no cover - typing only
    import classad2

    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.condor.routing import Route, RouterConfig
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915")
_VO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_WORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}$")


# --------------------------------------------------------------------------------------------
# Per-route catalog settings


def route_setting(cfg: CondorConfig, route: Route | None, name: str) -> str | None:
    """A catalog setting for ``route``: knob, route macro, site knob, in that order.

    ``CE_K8S_INFO_<route>_<NAME>`` lets a site override a packaged route without editing it;
    a macro ``ce_k8s_info_<name>`` in the route body keeps the setting next to the route;
    ``CE_K8S_INFO_<NAME>`` is the site default.
    """
    if route is not None:
        value = cfg.get(f"CE_K8S_INFO_{route.name}_{name}")
        if value is not None and value.strip():
            return value.strip()
        macro = route.assignments().get(f"ce_k8s_info_{name}".lower())
        if macro is not None and macro.strip():
            return _expand(cfg, macro.strip())
    value = cfg.get(f"CE_K8S_INFO_{name}")
    return value.strip() if value is not None and value.strip() else None


def _expand(cfg: CondorConfig, text: str) -> str:
    if "$" not in text:
        return text
    from ce_k8s.condor.transform import MacroSet, expand_macros

    try:
        return expand_macros(text, MacroSet(cfg))
    except Exception as exc:  # a bad macro in a catalog setting must not kill the whole ad
        raise ValueError(f"cannot expand {text!r}: {exc}") from None


def _bool(text: str | None, default: bool, what: str) -> bool:
    if text is None:
        return default
    word = text.strip().lower()
    if word in ("true", "yes", "1", "on", "t", "y"):
        return True
    if word in ("false", "no", "0", "off", "f", "n"):
        return False
    raise ValueError(f"{what} = {text!r} is not a boolean")


def _int(text: str | None, default: int | None, what: str, low: int = 0) -> int | None:
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{what} = {text!r} is not an integer") from None
    if value < low:
        raise ValueError(f"{what} = {value} must be at least {low}")
    return value


def plain_word(text: str | None, what: str) -> str | None:
    if text is None:
        return None
    value = text.strip().strip('"')
    if not _WORD_RE.match(value):
        raise ValueError(f"{what} = {text!r} must be a plain word ([A-Za-z0-9_.:/@+-])")
    return value


def _vo_list(text: str | None, what: str) -> list[str] | None:
    if text is None:
        return None
    vos = []
    for raw in re.split(r"[\s,]+", text.strip()):
        vo = raw.strip().strip('"').lower()
        if not vo:
            continue
        if vo != "*" and not _VO_RE.match(vo):
            raise ValueError(f"{what}: {raw!r} is not a VO name")
        if vo not in vos:
            vos.append(vo)
    return sorted(vos)


# --------------------------------------------------------------------------------------------
# Route → pilot shape


# What a GlideinWMS pilot looks like when it reaches the router (htcondor-ce.md §6.3), without
# the request attributes (xcount, maxMemory, maxWallTime), so the route's defaults apply.
_PROBE_BASE = """\
MyType = "Job"
ClusterId = 1
ProcId = 0
JobUniverse = 5
JobStatus = 1
QDate = 0
EnteredCurrentStatus = 0
Owner = "ce-k8s-info"
User = "ce-k8s-info@probe"
GlobalJobId = "ce-k8s-info#1.0#0"
Cmd = "/usr/bin/true"
TransferExecutable = false
Arguments = ""
Iwd = "/"
Out = "_condor_stdout"
Err = "_condor_stderr"
RequestCpus = 1
RequestDisk = 0
"""
_PROBE_GLOBAL_JOB_ID = "ce-k8s-info#1.0#0"
# Tried in order; the first one the route's REQUIREMENTS accepts is the route's representative
# pilot, so a GPU route is probed with a GPU pilot and a whole-node route with a whole-node one.
_PROBE_VARIANTS: tuple[tuple[str, str], ...] = (
    ("cpu", ""),
    ("gpu", "RequestGPUs = 1\n"),
    ("whole-node", "WantWholeNode = true\n"),
    ("whole-node-gpu", "WantWholeNode = true\nRequestGPUs = 1\n"),
)


def _probe_ads(cfg: CondorConfig, route: Route) -> list[tuple[str, classad2.ClassAd]]:
    import classad2

    extra = route_setting(cfg, route, "PROBE")
    if extra is not None:
        # An admin-supplied representative pilot (old ClassAd syntax, `;` or newline separated).
        text = _PROBE_BASE + extra.replace(";", "\n") + "\n"
        return [("configured", classad2.parseOne(text, classad2.ParserType.Old))]
    return [(name, classad2.parseOne(_PROBE_BASE + more, classad2.ParserType.Old))
            for name, more in _PROBE_VARIANTS]


@dataclass
class EntrySpec:
    """Everything about one catalog entry that comes from configuration, not from the cluster."""

    route: str
    name: str
    shape: PodShape
    cpus: int
    memory_mb: int
    gpus: int
    max_wall_time: int
    whole_node: bool
    queue: str | None
    allowed_vos: list[str] | None
    os: str | None
    require_singularity: bool
    send_tests: bool
    headroom_pilots: int
    max_pilots_cap: int | None
    probe: str
    pod: Mapping[str, object] | None = None  # the pod as the builder made it (asked to admission, provider.py)
    refusal: str | None = None  # why admission refuses that pod now (then the route can take no more pilots)
    refused_by_quota: bool = False  # ... because a ResourceQuota is full (normal: no WARNING)


def _is_kubernetes(routed: classad2.ClassAd, settings: Settings) -> bool:
    """Whether the hooks treat the route's jobs as Kubernetes jobs: the routed ad's GridResource
    starts with the words of CE_K8S_GRID_RESOURCE (docs/routes.md "CEs with other backends"; the
    same parser and rule as the update hook). A `batch slurm` route gets no entry even when a
    transform gives its jobs `K8s*` attributes; a `batch k8s` route gets one even with no `SET K8s*`."""
    from ce_k8s.condor.wire import sprint_ad
    from ce_k8s.hooks._common import ad_grid_resource, grid_resource_matches

    found = ad_grid_resource(sprint_ad(routed).encode("utf-8", "surrogateescape"))
    return grid_resource_matches(found, settings.grid_resource)


def entry_specs(cfg: CondorConfig, router: RouterConfig, settings: Settings, health: Health) -> list[EntrySpec]:
    """One spec per enabled Kubernetes route (its routed pilot's GridResource, see ``_is_kubernetes``)."""
    from ce_k8s.condor.wire import evaluate_ad
    from ce_k8s.pods.builder import build_manifests
    from ce_k8s.pods.errors import PodBuildError

    specs: list[EntrySpec] = []
    for problem in router.errors:
        health.report(WARNING, f"route configuration: {problem}")
    for route in router.routes:
        try:
            publish = _bool(route_setting(cfg, route, "PUBLISH"), True, f"CE_K8S_INFO_{route.name}_PUBLISH")
            if not publish:
                continue
            probes = _probe_ads(cfg, route)
        except Exception as exc:
            health.report(WARNING, f"route {route.name}: {exc}")
            continue
        chosen = next(((n, p) for n, p in probes if route.matches(p)), None)
        if chosen is None:
            log.info("route %s: REQUIREMENTS reject every probe pilot; using the %s probe", route.name, probes[0][0])
            chosen = probes[0]
        probe_name, probe = chosen
        routed = router.route_job(probe, route)
        if routed.failed:
            health.report(WARNING, f"route {route.name}: routing the probe pilot failed: {'; '.join(routed.errors)}")
            continue
        if not _is_kubernetes(routed.ad, settings):
            log.info("route %s: GridResource does not start with CE_K8S_GRID_RESOURCE %r; not a Kubernetes "
                     "route, no catalog entry", route.name, settings.grid_resource)
            continue
        values = evaluate_ad(routed.ad)
        # The translate hook stamps the source job's identity; the probe never went through it.
        values.setdefault("K8sSourceGlobalJobId", _PROBE_GLOBAL_JOB_ID)
        try:
            built = build_manifests(values, settings)
        except PodBuildError as exc:
            health.report(WARNING, f"route {route.name}: its pods cannot be built: {exc}")
            continue
        shape = PodShape.from_pod(built.pod, settings.namespace)
        try:
            specs.append(_spec(cfg, route, shape, values, settings, probe_name))
            specs[-1].pod = built.pod
        except ValueError as exc:
            health.report(WARNING, f"route {route.name}: {exc}")
    names = [s.name for s in specs]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        health.report(WARNING, f"two routes publish the catalog entry name {dup!r}; keeping the first")
    seen: set[str] = set()
    unique = []
    for s in specs:
        if s.name not in seen:
            seen.add(s.name)
            unique.append(s)
    return unique


def _spec(cfg: CondorConfig, route: Route, shape: PodShape, values: Mapping[str, object],
          settings: Settings, probe_name: str) -> EntrySpec:
    knob = f"CE_K8S_INFO_{route.name}_"
    gpu_names = set(gpu_resources(cfg, settings))
    gpu_attr = values.get("K8sGpuResource")
    if isinstance(gpu_attr, str):
        gpu_names.add(gpu_attr)
    # The wall time the pod is given (activeDeadlineSeconds, from BatchRuntime) is the limit.
    minutes = shape.active_deadline // 60 if shape.active_deadline else settings.default_walltime
    whole = values.get("WantWholeNode") is True
    queue = plain_word(route_setting(cfg, route, "QUEUE"), knob + "QUEUE")
    if queue is None:
        batch_queue = values.get("BatchQueue")
        if isinstance(batch_queue, str) and batch_queue.strip():
            queue = plain_word(batch_queue, f"route {route.name} BatchQueue")
    return EntrySpec(
        route=route.name,
        name=plain_word(route_setting(cfg, route, "NAME"), knob + "NAME") or route.name,
        shape=shape,
        cpus=max(cores(shape.requests.get(CPU, 0)), 1),
        memory_mb=megabytes(shape.requests.get(MEMORY, 0)),
        gpus=sum(v for k, v in shape.requests.items() if k in gpu_names),
        max_wall_time=minutes,
        whole_node=whole,
        queue=queue,
        allowed_vos=_vo_list(route_setting(cfg, route, "ALLOWED_VOS"), knob + "ALLOWED_VOS"),
        os=plain_word(route_setting(cfg, route, "OS"), knob + "OS"),
        require_singularity=_bool(route_setting(cfg, route, "REQUIRE_SINGULARITY"), True,
                                  knob + "REQUIRE_SINGULARITY"),
        send_tests=_bool(route_setting(cfg, route, "SEND_TESTS"), True, knob + "SEND_TESTS"),
        headroom_pilots=_int(route_setting(cfg, route, "HEADROOM_PILOTS"), 0, knob + "HEADROOM_PILOTS") or 0,
        max_pilots_cap=min(
            x for x in (_int(route_setting(cfg, route, "MAX_PILOTS"), None, knob + "MAX_PILOTS"),
                        route.max_jobs) if x is not None
        ),
        probe=probe_name,
    )


def gpu_resources(cfg: CondorConfig, settings: Settings) -> list[str]:
    text = cfg.get("CE_K8S_INFO_GPU_RESOURCES")
    names = [w for w in re.split(r"[\s,]+", text or "") if w] or list(DEFAULT_GPU_RESOURCES)
    if settings.gpu_resource not in names:
        names.append(settings.gpu_resource)
    return names
