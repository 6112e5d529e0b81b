"""`ce-k8s info`, run by the CE schedd as a cron job: the cluster view, the ad, its output.

It prints `Attr = value` lines that the schedd merges into its own ad, which the CE collector
forwards to the central collectors (htcondor-ce.md §1.8, §3.3). What it prints is computed from
the cluster, not typed in by an admin: per route that makes pods, an `OSG_ResourceCatalog` pilot
entry whose shape comes from applying the route to a representative pilot and building the pod
exactly as the agent would (`ce_k8s.info.catalog`), and whose `MaxPilots` is how many such pods
the cluster holds now (`ce_k8s.info.capacity`).

Why each output rule (the schedd side is `CronJobOut::Output` + `ClassAdCronJob::ProcessOutput`):
* one attribute per line, `ad->Insert(line)`: a value may not span lines, so the catalog is
  printed on one line (the reader's line buffer is 64 KiB; we warn well before that);
* a line starting with `-` ends a record; a periodic job's lines are published at exit anyway,
  so no terminator is printed;
* the schedd *replaces* our ad with each run's output, and keeps the old one when a run prints
  nothing; so every run prints at least the health attributes, even when everything failed;
* but it merges that ad into its own, where an attribute a later run leaves out keeps its old
  value: on the real 25.14 schedd (`--ce-config stock`, docs/real-condor.md) the first run's
  "agent unreachable" (the agent was not up yet) stayed in the ad of an OK CE. So every run
  prints `K8sInfoError`, empty when nothing is wrong;
* the cron ad is published after `SCHEDD_ATTRS`, so it would override the CE's own health
  expressions (`05-ce-health-defaults.conf`). `IsOK`/`IsWarning`/`IsCritical`/`Status` are
  therefore printed as expressions that keep the CE's duty-cycle and file-transfer checks and add
  ours (`K8sInfoStatus`);
* output is sorted and contains nothing that changes when the cluster does not (the timestamp
  aside), so an unchanged cluster gives an unchanged ad and quiet factory-config diffs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import logging
import math
import re
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ce_k8s.info.admission import admit_dry_run
from ce_k8s.info.capacity import CapacityModel, PodShape, cores, fits_count, megabytes, node_admits
from ce_k8s.info.catalog import EntrySpec, entry_specs, gpu_resources, plain_word
from ce_k8s.info.health import CRITICAL, WARNING, Health
from ce_k8s.info.snapshot import (
    ClusterSnapshot,
    SnapshotError,
    SourceUnavailable,
    agent_offers_snapshots,
    load_snapshot_file,
    ping_agent,
    snapshot_from_agent,
    snapshot_from_api,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024 - 1  # CronJobOut's STDOUT_LINEBUF_SIZE
DEFAULT_BATCH_SYSTEM = "Kubernetes"
DEFAULT_MAX_AGE = 300
_SAFE_TEXT = re.compile(r"[^\x20-\x7e]")


class Expr(str):
    """Text printed as a ClassAd expression, not as a string literal (health attributes)."""


# --------------------------------------------------------------------------------------------
# Where the cluster view comes from


def load_cluster(args: argparse.Namespace, cfg: CondorConfig, settings: Settings, health: Health,
                 now: float) -> ClusterSnapshot | None:
    """The snapshot to advertise from, or None (then health is CRITICAL and nothing is fresh).

    ``--cluster-snapshot``: that file, as is (offline "what would we advertise").
    ``--kubeconfig``: the API only.
    Neither: the agent's cache; if the agent cannot give one, the API directly (agent down is a
    WARNING: capacity is still known, but no pilot can start until the agent is back).
    """
    timeout = _float_knob(cfg, "CE_K8S_INFO_API_TIMEOUT", 20.0)
    max_age = _float_knob(cfg, "CE_K8S_INFO_MAX_AGE", float(DEFAULT_MAX_AGE))
    if args.cluster_snapshot:
        try:
            return load_snapshot_file(args.cluster_snapshot)
        except SnapshotError as exc:
            health.report(CRITICAL, f"cluster snapshot unreadable: {exc}")
            return None
    if args.kubeconfig:
        return _from_api(args.kubeconfig, timeout, health, "")
    sock = settings.socket
    agent_timeout = _float_knob(cfg, "CE_K8S_INFO_AGENT_TIMEOUT", 5.0)
    agent_problem = ""
    try:
        if agent_offers_snapshots():
            snap = snapshot_from_agent(sock, agent_timeout)
            age = now - snap.taken_at if snap.taken_at is not None else 0.0
            if age <= max_age:
                return snap
            agent_problem = f"the agent's cluster view is {age:.0f}s old (limit {max_age:g}s)"
        else:
            ping_agent(sock, agent_timeout)
    except SourceUnavailable as exc:
        agent_problem = f"agent unreachable: {exc}"
    if agent_problem:
        health.report(WARNING, agent_problem)
    return _from_api(settings.kubeconfig or None, timeout, health, agent_problem)


def _from_api(kubeconfig: str | None, timeout: float, health: Health, context: str) -> ClusterSnapshot | None:
    try:
        return snapshot_from_api(kubeconfig, timeout=timeout)
    except SnapshotError as exc:
        health.report(CRITICAL, f"Kubernetes API unreachable: {exc}")
        return None


def admit(specs: list[EntrySpec], kubeconfig: str | None, timeout: float, health: Health) -> None:
    """Put each route's pod to the API server's admission (a dry run) and take its shape from the
    pod admission would store: LimitRange defaults, RuntimeClass overhead and webhooks included, as
    the scheduler and the quota will see it. A pod admission refuses makes its route advertise only
    the pilots it already has: factories must not be sent pilots whose pods cannot be created now.
    A full quota is the normal way to be full; any other refusal is a WARNING naming it. Both seen
    on the real control plane (docs/information-provider.md "Against the real scheduler"): a
    LimitRange maximum below the whole-node pilot refused every pod while both whole-node nodes
    were advertised, and a LimitRange default limit the builder does not state was charged by a
    quota that the pod as built does not touch. (A quota refusal hides the admitted shape, but
    then no pilot can be admitted anyway.)"""
    asked = [s for s in specs if s.pod is not None]
    for spec, result in zip(asked, admit_dry_run(kubeconfig, [s.pod for s in asked], timeout), strict=True):
        if result.pod is not None:
            spec.shape = PodShape.from_pod(result.pod, spec.shape.namespace)
        elif result.refusal is not None:
            spec.refusal, spec.refused_by_quota = result.refusal, result.quota
            if not result.quota:
                health.report(WARNING, f"route {spec.route}: the API server refuses its pods: {result.refusal}")


def _float_knob(cfg: CondorConfig, name: str, default: float) -> float:
    text = cfg.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        log.warning("%s = %r is not a number; using %g", name, text, default)
        return default
    return value if value > 0 and math.isfinite(value) else default


# --------------------------------------------------------------------------------------------
# The ad


def _health_exprs(cfg: CondorConfig) -> dict[str, object]:
    """The CE's health formula (05-ce-health-defaults.conf) with ours folded in.

    ``K8sInfoStatus`` is this run's verdict; ``K8sInfoStale`` (published by SCHEDD_ATTRS, see
    config.d/60-ce-k8s-info.conf) turns true at read time when runs stop updating the ad. The
    CE's load attributes are guarded with ``?: 0`` so a reader that lacks them gets a definite
    answer instead of UNDEFINED.
    """

    def threshold(name: str, default: float) -> str:
        return repr(_float_knob(cfg, name, default))

    dw, dc = threshold("DUTY_CYCLE_WARNING", 0.90), threshold("DUTY_CYCLE_CRITICAL", 0.95)
    fw, fc = threshold("FILE_XFER_LOAD_WARNING", 1.0), threshold("FILE_XFER_LOAD_CRITICAL", 2.0)

    def load(duty: str, xfer: str) -> str:
        return (f"(RecentDaemonCoreDutyCycle ?: 0) > {duty} || (FileTransferFileReadLoad_5m ?: 0) > {xfer}"
                f" || (FileTransferFileWriteLoad_1m ?: 0) > {xfer}")

    return {
        "IsWarning": Expr('K8sInfoStatus =?= "WARNING" || ' + load(dw, fw)),
        "IsCritical": Expr('K8sInfoStatus =?= "CRITICAL" || K8sInfoStale =?= true || ' + load(dc, fc)),
        "IsOK": Expr("!IsWarning && !IsCritical"),
        "Status": Expr('ifThenElse(IsOK, "OK", ifThenElse(IsCritical, "CRITICAL", '
                       'ifThenElse(IsWarning, "WARNING", "UNKNOWN")))'),
    }


def grid_resource(cfg: CondorConfig) -> str:
    """``condor <schedd name or FULL_HOSTNAME> <COLLECTOR_HOST>`` (01-ce-router-defaults.conf)."""
    fqdn = (cfg.get("FULL_HOSTNAME") or "").strip() or socket.getfqdn()
    name = (cfg.get("SCHEDD_NAME") or "").strip() or fqdn
    collector = (cfg.get("COLLECTOR_HOST") or "").strip() or f"{fqdn}:9619"
    return f"condor {name} {collector}"


def _schedd_attrs(cfg: CondorConfig) -> set[str]:
    return {w.lower() for w in re.split(r"[\s,]+", cfg.get("SCHEDD_ATTRS") or "") if w}


def catalog_entry(spec: EntrySpec, max_pilots: int) -> dict[str, object]:
    """One ``OSG_ResourceCatalog`` pilot entry (htcondor-ce.md §3.2; OSG_autoconf ``get_pilot``).

    ``GPUs`` only when the pilot gets GPUs: OSG_autoconf turns its mere presence into
    ``Request_GPUs`` and the GPU VO map. ``CPUs``/``Memory`` are left out of whole-node entries,
    as osg-configure does; ``EstimatedCPUs`` then tells the factory what a node gives.
    """
    entry: dict[str, object] = {
        "Name": spec.name,
        "IsPilotEntry": True,
        "MaxPilots": max_pilots,
        "MaxWallTime": spec.max_wall_time,
        "WholeNode": spec.whole_node,
        "RequireSingularity": spec.require_singularity,
        "SendTests": spec.send_tests,
        "EstimatedCPUs": spec.cpus,
    }
    if not spec.whole_node:
        entry["CPUs"] = spec.cpus
        entry["Memory"] = spec.memory_mb
    if spec.gpus:
        entry["GPUs"] = spec.gpus
    if spec.allowed_vos is not None:
        entry["AllowedVOs"] = list(spec.allowed_vos)
    if spec.os:
        entry["OS"] = spec.os
    if spec.queue:
        entry["Queue"] = spec.queue
    return entry


def build_ad(cfg: CondorConfig, settings: Settings, specs: list[EntrySpec], snapshot: ClusterSnapshot | None,
             health: Health, now: float, source: str) -> dict[str, object]:
    """All attributes of one run, as Python values (``Expr`` for expressions)."""
    attrs: dict[str, object] = {}
    batch = plain_word(cfg.get("CE_K8S_INFO_BATCH_SYSTEM"), "CE_K8S_INFO_BATCH_SYSTEM") or DEFAULT_BATCH_SYSTEM
    attrs["OSG_BatchSystems"] = batch
    if "grid_resource" not in _schedd_attrs(cfg):
        attrs["grid_resource"] = grid_resource(cfg)
    entries: list[dict[str, object]] = []
    if snapshot is not None:
        ce_label = next((s.shape.labels.get("ce-k8s.htcondor.org/ce") for s in specs), None)
        model = CapacityModel(snapshot, gpu_resources(cfg, settings), ce_label)
        totals = model.totals()
        attrs.update({
            "K8sCpusTotal": cores(totals.cpu_milli_total),
            "K8sCpusFree": cores(totals.cpu_milli_free),
            "K8sMemoryTotalMB": megabytes(totals.memory_total),
            "K8sMemoryFreeMB": megabytes(totals.memory_free),
            "K8sGpusTotal": totals.gpus_total,
            "K8sGpusFree": totals.gpus_free,
            "K8sNodesTotal": totals.nodes_total,
            "K8sNodesSchedulable": totals.nodes_schedulable,
            "K8sPilotsRunning": totals.pilots_running,
            "K8sPilotsPending": totals.pilots_pending,
            "K8sInfoUpdated": int(snapshot.taken_at if snapshot.taken_at is not None else now),
        })
        for spec in specs:
            extra = spec.headroom_pilots + _fraction_headroom(model, spec, settings.info_headroom)
            cap = model.route_capacity(spec.shape, headroom=extra, cap=spec.max_pilots_cap)
            if spec.refusal is not None:      # admission refuses its pods now: only those it has
                cap = dataclasses.replace(cap, max_pilots=min(cap.placed, cap.max_pilots))
            log.info(
                "route %s: %d eligible nodes, %d placed, %d fit now, quota room %s, headroom %d -> MaxPilots %d%s",
                spec.route, cap.eligible_nodes, cap.placed, cap.fit_now,
                "none" if cap.quota_room is None else cap.quota_room, cap.headroom, cap.max_pilots,
                f" (excluded: {dict(sorted(cap.exclusions.items()))})" if cap.exclusions else "",
            )
            entries.append(catalog_entry(spec, cap.max_pilots))
    else:
        # Nothing fresh is known: keep the entries (their shape is configuration, so factory
        # configs stay stable) but offer nothing, and say why.
        entries = [catalog_entry(spec, 0) for spec in specs]
    attrs["OSG_ResourceCatalog"] = sorted(entries, key=lambda e: str(e["Name"]))
    attrs["K8sInfoSource"] = source
    attrs["K8sInfoStatus"] = health.status
    attrs["K8sInfoError"] = _clean("; ".join(health.problems), 1000)   # "" clears an older one
    attrs.update(_health_exprs(cfg))
    return attrs


def _fraction_headroom(model: CapacityModel, spec: EntrySpec, fraction: float) -> int:
    """``CE_K8S_INFO_HEADROOM`` (a fraction): pilots an autoscaler could add, relative to the pool.

    The pool is what the route's eligible nodes hold when empty; with fraction 0.25 the route
    advertises a quarter of that on top of what fits now, so pending pilots make the autoscaler
    grow the pool. Zero eligible nodes give zero: use ``..._HEADROOM_PILOTS`` to scale from zero.
    """
    if fraction <= 0:
        return 0
    pool = sum(fits_count(n.allocatable, spec.shape.requests)
               for n in model.snapshot.nodes if node_admits(n, spec.shape) is None)
    return math.floor(pool * fraction)


def _clean(text: str, limit: int = 200) -> str:
    """Text safe inside an old-syntax string literal: printable ASCII, no quote, no backslash."""
    text = _SAFE_TEXT.sub("?", " ".join(str(text).split())).replace('"', "'").replace("\\", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# Rendering


def unparse(value: object) -> str:
    """One value in ClassAd syntax; lists and nested ads sorted/ordered deterministically."""
    if isinstance(value, Expr):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return '"' + _clean(value, 10_000) + '"'
    if isinstance(value, Mapping):
        inner = "; ".join(f"{k} = {unparse(v)}" for k, v in sorted(value.items(), key=lambda kv: kv[0].lower()))
        return f"[ {inner} ]" if inner else "[ ]"
    if isinstance(value, Iterable):
        items = ", ".join(unparse(v) for v in value)
        return f"{{ {items} }}" if items else "{ }"
    raise TypeError(f"cannot print {type(value).__name__} as a ClassAd value")


def render(attrs: Mapping[str, object]) -> str:
    """The schedd cron output: one `Attr = value` line per attribute, sorted case-insensitively."""
    lines = []
    for name in sorted(attrs, key=str.lower):
        line = f"{name} = {unparse(attrs[name])}"
        if len(line.encode()) > MAX_LINE:
            log.error("%s is %d bytes: the schedd reads at most %d per line; the value will be cut",
                      name, len(line.encode()), MAX_LINE)
        lines.append(line)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH",
                        help="condor_config file or config directory (default: the shipped configuration)")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", metavar="FILE", help="ask the Kubernetes API with this kubeconfig only")
    src.add_argument("--cluster-snapshot", metavar="FILE",
                     help="use a 'kubectl get nodes,pods,resourcequotas -A -o json' dump instead of the cluster")
    parser.add_argument("--now", type=float, metavar="EPOCH", help=argparse.SUPPRESS)


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Pause Python's cyclic collector while a cluster is loaded.

    Decoding 100,000 pods allocates millions of containers, and each allocation burst triggers a
    full collection that finds nothing (the objects form no cycles): measured in bench/bench_info.py,
    this halves the time of `ce-k8s info` on a 5,000-node cluster. Reference counting still frees
    everything; the collector resumes afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def compute(args: argparse.Namespace) -> tuple[str, int]:
    """(cron output, exit code). Never raises: a failure still yields a CRITICAL ad."""
    health = Health()
    now = args.now if getattr(args, "now", None) is not None else time.time()
    cfg = None
    try:
        from ce_k8s.condor.config import CondorConfig, ConfigError
        from ce_k8s.condor.routing import RouterConfig
        from ce_k8s.settings import Settings, SettingsError

        try:
            cfg = CondorConfig.load(args.config)
            settings = Settings.from_config(cfg)
            router = RouterConfig.from_config(cfg)
        except (ConfigError, SettingsError, OSError) as exc:
            health.report(CRITICAL, f"configuration: {exc}")
            return render(_minimal(health, cfg)), 1
        specs = entry_specs(cfg, router, settings, health)
        source = "file" if args.cluster_snapshot else "api" if args.kubeconfig else "agent"
        with _cyclic_gc_paused():
            snapshot = load_cluster(args, cfg, settings, health, now)
        if snapshot is not None:
            source = snapshot.source.split(" ", 1)[0] if not args.cluster_snapshot else "file"
            if source == "api":
                admit(specs, args.kubeconfig or settings.kubeconfig or None,
                      _float_knob(cfg, "CE_K8S_INFO_API_TIMEOUT", 20.0) / 2, health)
        return render(build_ad(cfg, settings, specs, snapshot, health, now, source)), 0
    except Exception as exc:  # last resort: never leave the previous (now stale) ad in place
        log.exception("info: unexpected failure")
        health.report(CRITICAL, f"internal error: {type(exc).__name__}: {exc}")
        return render(_minimal(health, cfg)), 1


def _minimal(health: Health, cfg: CondorConfig | None) -> dict[str, object]:
    attrs: dict[str, object] = {
        "K8sInfoStatus": health.status,
        "K8sInfoError": _clean("; ".join(health.problems), 1000),
        "OSG_ResourceCatalog": [],
    }
    if cfg is not None:
        attrs.update(_health_exprs(cfg))
    else:
        attrs.update({"IsOK": False, "IsWarning": False, "IsCritical": True, "Status": CRITICAL})
    return attrs


def run(args: argparse.Namespace) -> int:
    text, code = compute(args)
    sys.stdout.write(text)
    sys.stdout.flush()
    return code
