"""The information provider against the real kube-scheduler: advertised `MaxPilots` vs pods placed.

    python bench/info_vs_scheduler.py [--state DIR] [--down]

For each shipped route (routes/*.conf) `ce-k8s info` is run against the real control plane of
`ce-k8s testbed real-kube` with the agent's kubeconfig (the shipped RBAC's rights), and its
`MaxPilots` is compared with what the real kube-scheduler does with that route's pods: the pilot a
factory builds from the entry (OSG_autoconf: `+xcount = CPUs`, `+maxMemory = Memory`, ...) is routed
with the real routing engine and built into a Pod with the real pod builder, and copies of that Pod
(no `run=` word: on kwok they run until deleted) are created until the scheduler leaves some Pending
(PodScheduled=False, Unschedulable) or the namespace's ResourceQuota refuses one. The placed ones
are counted and deleted. Why: the provider's placement model (taints, selectors, cordons, per-node
fit, quota) is a re-implementation of the scheduler's filters, and only the real scheduler can say
whether it is right; tests/real/test_info_vs_scheduler.py runs the same comparison under the
conditions that matter (taints, cordons, quotas, other tenants' pods, Terminating pods).

The bed is the one in `--state` (brought up with the default node shapes when it is not up; `--down`
stops it afterwards). Prints one line per route: advertised, placed, pending, refused at admission.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_LABEL = "ivs.ce-k8s.io/run"  # marks the pods a comparison created, so it deletes only those
EXAMPLES = ROOT / "examples"


# --------------------------------------------------------------------------------------------
# What the provider says


def info_ad(kubeconfig: str | Path, config: str | None = None) -> dict[str, object]:
    """The ad `ce-k8s info --kubeconfig` prints (in-process, as the cron runs it); CRITICAL fails."""
    import classad2

    from ce_k8s.info import provider

    args = argparse.Namespace(config=config, kubeconfig=str(kubeconfig), cluster_snapshot=None, now=None)
    text, code = provider.compute(args)
    ad = classad2.parseOne(text, classad2.ParserType.Old)
    if code != 0 or ad.get("K8sInfoStatus") == "CRITICAL":
        raise RuntimeError(f"ce-k8s info failed: {ad.get('K8sInfoError')}")
    return dict(ad)


def advertise(kubeconfig: str | Path, config: str | None = None) -> dict[str, dict[str, object]]:
    """The catalog entries `ce-k8s info --kubeconfig` prints, by name."""
    return {str(e["Name"]): dict(e) for e in info_ad(kubeconfig, config)["OSG_ResourceCatalog"]}


# --------------------------------------------------------------------------------------------
# The pod a factory's pilot for an entry becomes


def factory_pilot(entry: dict[str, object]):
    """The pilot a factory entry made from ``entry`` by OSG_autoconf submits (an example pilot's
    identity, the entry's shape): the same construction as tests/info/test_info_roundtrip.py."""
    from ce_k8s.condor.wire import parse_job_ads

    vos = entry.get("AllowedVOs") or []
    example = "pilot-cms-token.ad" if list(vos) == ["cms"] else "pilot-1core.ad"  # type: ignore[call-overload]
    job = parse_job_ads((EXAMPLES / example).read_text())[0]
    for attr in ("xcount", "maxMemory", "maxWallTime", "RequestGPUs", "WantWholeNode", "queue"):
        if attr in job:
            del job[attr]
    if "CPUs" in entry:
        job["xcount"] = entry["CPUs"]
    if "Memory" in entry:
        job["maxMemory"] = entry["Memory"]
    job["maxWallTime"] = entry["MaxWallTime"]
    if "GPUs" in entry:
        job["RequestGPUs"] = entry["GPUs"]
    if entry.get("WholeNode"):
        job["WantWholeNode"] = True
    if "Queue" in entry:
        job["queue"] = entry["Queue"]
    return job


def route_pod(name: str, entry: dict[str, object], config: str | None = None) -> dict:
    """The Pod that entry ``name``'s pilot becomes: routed by the real routing engine (it must land on
    route ``name``), built by the real pod builder, as `ce-k8s route --jobads X --json` shows it."""
    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.condor.routing import RouterConfig
    from ce_k8s.condor.wire import evaluate_ad
    from ce_k8s.pods.builder import build_manifests
    from ce_k8s.settings import Settings

    cfg = CondorConfig.load(config)
    router = RouterConfig.from_config(cfg)
    settings = Settings.from_config(cfg)
    pilot = factory_pilot(entry)
    route = router.choose_route(pilot)
    if route is None or route.name != name:
        raise RuntimeError(f"the pilot of entry {name} is routed to {route and route.name}")
    values = evaluate_ad(router.route_job(pilot, route).ad)
    values.setdefault("K8sSourceGlobalJobId", "ivs#1.0#0")
    return build_manifests(values, settings).pod


# --------------------------------------------------------------------------------------------
# What the scheduler does


@dataclass
class Placement:
    created: int = 0
    placed: int = 0     # bound to a node by the scheduler
    pending: int = 0    # left Pending: PodScheduled=False, Unschedulable
    refused: int = 0    # refused at admission (the ResourceQuota, a LimitRange)
    refusal: str = ""


def core_api(kubeconfig: str | Path):
    from kubernetes import client
    from kubernetes.config import new_client_from_config

    return client.CoreV1Api(new_client_from_config(config_file=str(kubeconfig)))


def _copies(pod: dict, run: str, start: int, count: int) -> list[dict]:
    out = []
    for i in range(start, start + count):
        p = copy.deepcopy(pod)
        meta = p["metadata"]
        meta["name"] = f"ivs-{run}-{i}"
        meta.setdefault("labels", {})[RUN_LABEL] = run
        out.append(p)
    return out


def _create(core, manifests: list[dict], placement: Placement) -> None:
    """Create in parallel (4 threads: the API server shares 2 cores with everything else); a pod
    admission refuses (403: the ResourceQuota, a LimitRange, ...) is counted as refused, anything
    else fails the run."""
    from kubernetes.client.rest import ApiException

    def one(m: dict) -> str | None:
        try:
            core.create_namespaced_pod(m["metadata"]["namespace"], m)
            return None
        except ApiException as exc:
            if exc.status == 403:
                return json.loads(exc.body or "{}").get("message", "forbidden")
            raise

    with ThreadPoolExecutor(4) as pool:
        for why in pool.map(one, manifests):
            placement.created += why is None
            if why is not None:
                placement.refused += 1
                placement.refusal = why


def _settled(core, namespace: str, run: str) -> tuple[int, int, int]:
    """(placed, pending-unschedulable, undecided) of one run's pods."""
    placed = pending = undecided = 0
    for p in core.list_namespaced_pod(namespace, label_selector=f"{RUN_LABEL}={run}").items:
        if p.spec.node_name:
            placed += 1
            continue
        conds = {c.type: c for c in (p.status.conditions or ())}
        sched = conds.get("PodScheduled")
        if sched is not None and sched.status == "False" and sched.reason == "Unschedulable":
            pending += 1
        else:
            undecided += 1
    return placed, pending, undecided


def place(core, pod: dict, run: str, first: int, step: int = 4, timeout: float = 180.0) -> Placement:
    """Create copies of ``pod`` until the scheduler leaves one Pending or quota refuses one.

    ``first`` copies go in one batch (the advertised figure plus a margin keeps it to one batch when
    the provider is right), then ``step`` at a time while every copy was placed.
    """
    namespace = pod["metadata"]["namespace"]
    result = Placement()
    batch = max(first, 1)
    deadline = time.monotonic() + timeout
    while True:
        _create(core, _copies(pod, run, result.created + result.refused, batch), result)
        while True:
            placed, pending, undecided = _settled(core, namespace, run)
            if not undecided:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{undecided} pods of run {run} neither placed nor Unschedulable")
            time.sleep(0.3)
        result.placed, result.pending = placed, pending
        if pending or result.refused:
            return result
        batch = step


def delete_run(core, namespace: str, run: str, timeout: float = 120.0) -> None:
    """Delete one run's pods and wait until they are gone (kwok removes a deleted pod at once)."""
    core.delete_collection_namespaced_pod(namespace, label_selector=f"{RUN_LABEL}={run}", grace_period_seconds=0)
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(namespace, label_selector=f"{RUN_LABEL}={run}").items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of run {run} still there after {timeout:.0f} s")
        time.sleep(0.3)


def run_name(entry: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", entry.lower()).strip("-")


@dataclass
class Comparison:
    entry: str
    advertised: int
    placement: Placement
    advertised_after: int   # MaxPilots once the placed pilots run (they count as the route's own)
    ours_after: int = 0     # K8sPilotsRunning + K8sPilotsPending then: every copy created, placed or not


class NodesFlapped(RuntimeError):
    """A node was NotReady at some point of a comparison, so its two figures describe two clusters."""


def node_health(core, ignore: Iterable[str] = ()) -> tuple[frozenset[tuple[str, int, str]], list[str]]:
    """(the node controller's NodeNotReady events of Nodes, as (node, count, last time); the nodes
    not Ready now or tainted unreachable/not-ready), leaving out the nodes in ``ignore`` (a node a
    test loses on purpose).

    Why: on a loaded 2-core machine kwok's heartbeats can come later than the bed's node-monitor
    grace period (8 s), and the node controller then marks every node NotReady for a moment and
    taints it: for that moment the scheduler places nothing there and the provider does not count
    it. A comparison during which this happened compares two different clusters; it is retried.
    """
    events = core.list_event_for_all_namespaces(field_selector="reason=NodeNotReady,involvedObject.kind=Node")
    ignore = set(ignore)
    sig = frozenset((e.involved_object.name, e.count or 1, str(e.last_timestamp or e.event_time))
                    for e in events.items if e.involved_object.name not in ignore)
    bad = []
    for n in core.list_node().items:
        if n.metadata.name in ignore:
            continue
        ready = {c.type: c.status for c in n.status.conditions or ()}.get("Ready")
        taints = {t.key for t in n.spec.taints or ()}
        if ready != "True" or taints & {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"}:
            bad.append(n.metadata.name)
    return sig, bad


def wait_nodes_ready(core, ignore: Iterable[str] = (), timeout: float = 120.0) -> frozenset[tuple[str, int, str]]:
    """Wait until every node is Ready and untainted by the node controller; the event signature then."""
    deadline = time.monotonic() + timeout
    while True:
        sig, bad = node_health(core, ignore)
        if not bad:
            return sig
        if time.monotonic() > deadline:
            raise NodesFlapped(f"nodes not Ready after {timeout:.0f} s: {bad}")
        time.sleep(1)


def compare(admin: str | Path, agent: str | Path, name: str, entries: dict[str, dict[str, object]] | None = None,
            margin: int = 3, keep: bool = False, ignore: Iterable[str] = ()) -> Comparison:
    """One route: advertised MaxPilots, then the scheduler's count for its pods; pods deleted after
    (unless ``keep``). ``advertised_after`` is the provider's figure with the placed pods running:
    MaxPilots counts the route's placed pilots, so a full pool keeps advertising what it holds.
    Raises NodesFlapped when a node (other than those in ``ignore``) was NotReady at some moment in
    between (see ``node_health``)."""
    core = core_api(admin)
    before = wait_nodes_ready(core, ignore)
    entries = entries if entries is not None else advertise(agent)
    entry = entries[name]
    pod = route_pod(name, entry)
    run = run_name(name)
    advertised = int(entry["MaxPilots"])  # type: ignore[call-overload]
    try:
        placement = place(core, pod, run, advertised + margin)
        ad = info_ad(agent)
        after = next(int(e["MaxPilots"]) for e in ad["OSG_ResourceCatalog"] if e["Name"] == name)  # type: ignore[union-attr]
        ours = int(ad["K8sPilotsRunning"]) + int(ad["K8sPilotsPending"])  # type: ignore[call-overload]
        sig, bad = node_health(core, ignore)
        if sig != before or bad:
            raise NodesFlapped(f"{name}: nodes went NotReady during the comparison ({bad or 'and back'})")
    finally:
        if not keep:
            delete_run(core, pod["metadata"]["namespace"], run)
    return Comparison(name, advertised, placement, after, ours)


def compare_stable(admin: str | Path, agent: str | Path, name: str, attempts: int = 4,
                   before_each=None, **kw) -> Comparison:
    """``compare`` again (fresh figures) while nodes flapped in the middle of it; ``before_each``
    restores what a flap may have cost (the taint manager evicts pods of a node NotReady for 10 s)."""
    for attempt in range(attempts):
        if before_each is not None:
            before_each()
        try:
            return compare(admin, agent, name, **kw)
        except NodesFlapped as exc:
            print(f"retrying ({attempt + 1}/{attempts}): {exc}", file=sys.stderr, flush=True)
    raise NodesFlapped(f"{name}: nodes flapped in each of {attempts} attempts")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", default="/var/tmp/ce-k8s-real-kube-info",
                        help="the real control plane's state directory (brought up when it is not up)")
    parser.add_argument("--down", action="store_true", help="stop the control plane afterwards")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from ce_k8s.real.kube.kube import RealKube

    bed = RealKube(args.state)
    if not bed.status().get("up"):
        bed.up(progress=lambda m: print(f"real-kube: {m}", file=sys.stderr, flush=True))
    try:
        rows = []
        for name in sorted(advertise(bed.kubeconfig)):
            t0 = time.monotonic()
            c = compare_stable(bed.admin_kubeconfig, bed.kubeconfig, name)
            rows.append({"entry": name, "advertised": c.advertised, "placed": c.placement.placed,
                         "pending": c.placement.pending, "refused_at_admission": c.placement.refused,
                         "advertised_with_them_running": c.advertised_after,
                         "seconds": round(time.monotonic() - t0, 1)})
            print(f"{name}: advertised {c.advertised}, placed {c.placement.placed}", file=sys.stderr, flush=True)
    finally:
        if args.down:
            bed.down(progress=lambda m: print(f"real-kube: {m}", file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print("| entry | MaxPilots advertised | placed by kube-scheduler | left Pending | refused at admission "
              "| MaxPilots with them running |\n|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['entry']} | {r['advertised']} | {r['placed']} | {r['pending']} | {r['refused_at_admission']} "
                  f"| {r['advertised_with_them_running']} |")
    return 0 if all(r["advertised"] == r["placed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
