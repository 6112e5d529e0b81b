"""`ce-k8s info`'s MaxPilots against the real kube-scheduler (issue 25, item 5).

For each shipped route the provider's figure (run with the agent's kubeconfig: the shipped RBAC's
rights) is compared with the number of that route's pods the real scheduler places on the kwok
nodes (bench/info_vs_scheduler.py does the creating and counting). The provider claims exactness
for what it models -- cordons, NoSchedule/NoExecute taints, nodeSelector and required node affinity,
per-node fit of every requested resource (extended ones included), other tenants' running and
Terminating pods, ResourceQuota room -- so there the figures must be equal, and equal to the figure
the nodes of this module give (the docs/information-provider.md table). With the pilots running,
MaxPilots must still be what they hold (the route's placed pilots count), so a full pool does not
advertise zero.

The module runs on a control plane of its own (``bed``), not the session's: there other tests' pods
hold cores of the same nodes and use the same pilots' namespace, so neither figure could be known
in advance (the module used to stop asserting them then). Its nodes (``NODES``): 3 CPU nodes of 64
cores, 2 GPU nodes of 32 cores and 4 GPUs tainted ``nvidia.com/gpu``, 2 whole-node nodes, and the
tainted spare node every bed has; no real node. The "busy" cases fill the untainted nodes with other
tenants' pods first, so a 1-core route places 4 pods a node and not 64.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.config import new_client_from_config

from ce_k8s.real.kube.kube import SPARE_NODE, RealKube
from ce_k8s.sim.kube.cluster import parse_nodes

from .conftest import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import info_vs_scheduler as ivs

REPO = Path(__file__).resolve().parents[2]
PILOTS_NS = "ce-k8s-pilots"
TENANT_NS = "ivs-tenant"
# This module's bed: the shapes of the default nodes (ce_k8s.real.kube.kube.DEFAULT_NODES), fewer CPU nodes.
NODES = ("cpu:3x64c256g,"
         "gpu:2x32c256g4gpu:taint=nvidia.com/gpu:NoSchedule:label=nvidia.com/gpu.present=true,"
         "wholenode:2x64c256g:label=ce-k8s.htcondor.org/pool=wholenode")


def _pool(name: str) -> list[str]:
    return [n.name for n in parse_nodes(NODES) if n.name.rsplit("-", 1)[0] == name]


CPU_NODES, GPU_NODES, WHOLE_NODES = _pool("cpu"), _pool("gpu"), _pool("wholenode")
SPARE = parse_nodes(SPARE_NODE)[0].name
UNTAINTED = CPU_NODES + WHOLE_NODES      # where the 1-core routes go (the GPU and spare nodes are tainted)
GPUS_A_NODE = 4
FILL_CORES = 60                          # what the busy cases' tenants hold of each untainted node's 64
LEFT = 64 - FILL_CORES
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def bed():
    """A control plane of this module's own (ce_k8s.real.kube.kube, up in about 10 s), so nothing but this
    module's cases places pods on its nodes; no real node (it is tainted for every route anyway).
    CE_K8S_REAL_KUBE_TEST_STATE is not used here: a bed kept up has other pods on other nodes. The
    reaper takes the bed down if this run dies without doing it (ce_k8s.real.reaper)."""
    if os.geteuid() != 0:
        pytest.fail("the real-Kubernetes tests need root (CI runs as root); see docs/real-kubernetes.md")
    kube = RealKube(Path("/var/tmp") / f"ce-k8s-ivs-tests-{os.getpid()}")

    def progress(message: str) -> None:
        print(f"ivs-kube: {message}", flush=True)

    try:
        kube.up(nodes=NODES, progress=progress, real_nodes=0, owner_pid=os.getpid())
        yield kube
    finally:
        kube.down(progress=progress)
        shutil.rmtree(kube.state_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def core(bed):
    """The site's hands on this module's bed (the admin kubeconfig); its nodes are NODES and the spare."""
    api = new_client_from_config(config_file=str(bed.admin_kubeconfig))
    core = client.CoreV1Api(api)
    assert sorted(n.metadata.name for n in core.list_node().items) == sorted(
        CPU_NODES + GPU_NODES + WHOLE_NODES + [SPARE])
    yield core
    api.close()


def _bound_pods(core) -> list[str]:
    return [f"{p.metadata.namespace}/{p.metadata.name}" for p in core.list_pod_for_all_namespaces().items
            if p.spec.node_name and p.status.phase not in ("Succeeded", "Failed")
            and p.metadata.namespace != "kube-system"]


@pytest.fixture(autouse=True)
def _empty_bed(core):
    """Each case starts with nothing on the nodes: what the case before made goes within moments
    (its pods are deleted with grace 0); a pod still there would change both figures, so it fails."""
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not _bound_pods(core), timeout=60, what="the pods of the case before gone")
    left = _bound_pods(core)
    assert not left, f"pods of the case before still hold nodes: {left[:5]}"


def _compare(bed, name: str, before_each=None, **kw) -> ivs.Comparison:
    """The comparison for one route, again when a node flapped NotReady in the middle of it (the
    loaded 2-core machine can delay kwok's heartbeats past the bed's grace period)."""
    return ivs.compare_stable(bed.admin_kubeconfig, bed.kubeconfig, name, before_each=before_each, **kw)


def _assert_exact(c: ivs.Comparison) -> None:
    assert (c.advertised, c.placement.placed) == (c.placement.placed, c.placement.placed), c
    assert c.placement.pending or c.placement.refused, c       # the scheduler was really pushed past it
    assert c.advertised_after == c.placement.placed, c        # the running pilots are still advertised
    assert c.ours_after >= c.placement.created, c             # and counted (Pending ones too)


def _assert_figure(c: ivs.Comparison, want: int) -> None:
    """The figure of the docs table, which this module's nodes give: advertised and placed alike."""
    assert (c.advertised, c.placement.placed) == (want, want), c


def tenant_pod(name: str, node: str | None, cpu: str, memory: str = "1Gi", gpus: int = 0,
               annotations: dict[str, str] | None = None, finalizers: list[str] | None = None,
               tolerations: list[dict] | None = None, namespace: str = TENANT_NS) -> dict:
    """Another tenant's pod, bound to ``node`` (no scheduler involved: what it holds is the point)."""
    limits = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    spec: dict = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                  "containers": [{"name": "c", "image": "registry.example.org/tenant:1",
                                  "resources": {"requests": dict(limits), "limits": limits}}]}
    if node:
        spec["nodeName"] = node
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {},
                         "finalizers": finalizers or [], "labels": {"ivs.ce-k8s.io/tenant": "1"}},
            "spec": spec}


def _running(core, namespace: str, names: list[str]) -> None:
    wait_for(lambda: all(core.read_namespaced_pod(n, namespace).status.phase == "Running" for n in names),
             timeout=90, what=f"{names} Running")


def _drop_finalizers(core, namespace: str) -> None:
    for p in core.list_namespaced_pod(namespace, label_selector="ivs.ce-k8s.io/tenant=1").items:
        if p.metadata.finalizers:
            with contextlib.suppress(ApiException):
                core.patch_namespaced_pod(p.metadata.name, namespace, {"metadata": {"finalizers": None}})


class Busy:
    """Other tenants' pods: 60 of the 64 cores of every untainted node, 3 of gpu-1's 4 GPUs."""

    def __init__(self, core) -> None:
        self.core = core
        self.fillers = {f"fill-{n}": tenant_pod(f"fill-{n}", n, str(FILL_CORES)) for n in UNTAINTED}
        gpu = GPU_NODES[0]
        self.fillers[f"fill-{gpu}"] = tenant_pod(f"fill-{gpu}", gpu, "4", gpus=GPUS_A_NODE - 1,
                                                 tolerations=[GPU_TOLERATION])

    def refill(self) -> None:
        """Create the fillers that are not there (a node NotReady for 10 s has its pods evicted)."""
        have = {p.metadata.name for p in self.core.list_namespaced_pod(TENANT_NS).items
                if not p.metadata.deletion_timestamp}
        for name, body in self.fillers.items():
            if name not in have:
                with contextlib.suppress(ApiException):
                    self.core.create_namespaced_pod(TENANT_NS, body)
        _running(self.core, TENANT_NS, list(self.fillers))


@pytest.fixture
def busy(core):
    core.create_namespace({"metadata": {"name": TENANT_NS}})
    try:
        b = Busy(core)
        b.refill()
        yield b
    finally:
        _drop_finalizers(core, TENANT_NS)
        _drop_finalizers(core, PILOTS_NS)
        core.delete_namespace(TENANT_NS, grace_period_seconds=0)
        core.delete_collection_namespaced_pod(PILOTS_NS, label_selector="ivs.ce-k8s.io/tenant=1",
                                              grace_period_seconds=0)
        wait_for(lambda: not _namespace_exists(core, TENANT_NS), timeout=120, what="the tenant namespace gone")


def _namespace_exists(core, name: str) -> bool:
    try:
        core.read_namespace(name)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


@contextlib.contextmanager
def cordoned(core, node: str):
    core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        yield
    finally:
        core.patch_node(node, {"spec": {"unschedulable": None}})


@contextlib.contextmanager
def quota(core, name: str, hard: dict[str, str], namespace: str = PILOTS_NS):
    """A ResourceQuota next to the shipped one, once the quota controller has filled its status."""
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": name}, "spec": {"hard": hard}})
    try:
        wait_for(lambda: core.read_namespaced_resource_quota(name, namespace).status.used is not None,
                 what=f"quota {name} status")
        yield
    finally:
        core.delete_namespaced_resource_quota(name, namespace)


# --------------------------------------------------------------------------------------------
# An empty cluster: taints, selectors and extended resources


def test_gpu_and_whole_node_routes_on_the_empty_cluster(bed):
    """GPU_Pilots: the tainted pool's 8 GPUs, nothing else (the toleration and the selector); the
    whole-node route: one pod per node of its pool (2)."""
    gpu = _compare(bed, "GPU_Pilots")
    whole = _compare(bed, "WholeNode_Pilots")
    _assert_exact(gpu)
    _assert_exact(whole)
    _assert_figure(gpu, GPUS_A_NODE * len(GPU_NODES))
    _assert_figure(whole, len(WHOLE_NODES))


# --------------------------------------------------------------------------------------------
# A busy cluster: other tenants, a cordon, Terminating and finished pods


def test_busy_cluster_with_a_cordoned_node(bed, busy):
    """4 cores left on each untainted node, cpu-3 cordoned: 4 nodes x 4 one-core pilots (16); gpu-1
    has one GPU left (5 GPU pilots); no node is empty enough for a whole-node pilot."""
    want = {"Pilots": LEFT * (len(UNTAINTED) - 1), "CMS_Pilots": LEFT * (len(UNTAINTED) - 1),
            "GPU_Pilots": 1 + GPUS_A_NODE * (len(GPU_NODES) - 1), "WholeNode_Pilots": 0}
    with cordoned(busy.core, CPU_NODES[-1]):
        for name, figure in want.items():
            c = _compare(bed, name, busy.refill)
            _assert_exact(c)
            _assert_figure(c, figure)


def test_terminating_and_finished_pods(bed, busy):
    """A Terminating pod (held by a finalizer) still holds its node's resources for the scheduler, and
    for the provider; a finished one holds nothing for either: 5 nodes x 4 cores - 2 = 18."""
    core = busy.core
    held_node, done_node = CPU_NODES[0], CPU_NODES[1]
    core.create_namespaced_pod(TENANT_NS, tenant_pod("held", held_node, "2", finalizers=["ivs.ce-k8s.io/hold"]))
    core.create_namespaced_pod(TENANT_NS, tenant_pod("done", done_node, "3",
                                                     annotations={"kwok.ce-k8s.io/run-for": "1s"}))
    _running(core, TENANT_NS, ["held"])
    core.delete_namespaced_pod("held", TENANT_NS)
    wait_for(lambda: core.read_namespaced_pod("held", TENANT_NS).metadata.deletion_timestamp, what="held Terminating")
    wait_for(lambda: core.read_namespaced_pod("done", TENANT_NS).status.phase == "Succeeded", what="done finished")
    held = core.read_namespaced_pod("held", TENANT_NS)
    assert held.status.phase == "Running" and held.spec.node_name == held_node
    c = _compare(bed, "Pilots", busy.refill)
    _assert_exact(c)
    _assert_figure(c, LEFT * len(UNTAINTED) - 2)


# --------------------------------------------------------------------------------------------
# Quota


def test_a_quota_that_binds_first(bed, busy):
    """A second quota on the pilots' namespace with room for 10 cores binds before the nodes (20):
    the 11th pod is refused at admission, and MaxPilots is 10."""
    assert LEFT * len(UNTAINTED) > 10                  # the nodes alone would take more
    with quota(busy.core, "ivs-tight", {"requests.cpu": "10"}):
        c = _compare(bed, "Pilots", busy.refill)
        assert c.placement.refused and "exceeded quota" in c.placement.refusal
        _assert_exact(c)
        _assert_figure(c, 10)


def test_limitrange_defaults_and_a_terminating_pod_on_a_lost_node(bed, busy):
    """A hand-made pod in the pilots' namespace that states no resources gets the shipped LimitRange's
    defaults (1 core, 2Gi): the quota charges them and its node holds them. A pod of the namespace on
    the spare node, which is then lost, is Terminating (the taint manager's eviction) and still
    charged by the quota: the quota controller releases a Terminating pod only when it recounts the
    namespace after the pod's grace period (a later event in the namespace, or its 5-minute resync).
    The provider and admission both read the quota's status, so they agree either way: 12 - 3 = 9
    (the nodes would take 19)."""
    core = busy.core
    bare = tenant_pod("bare", CPU_NODES[0], "1", namespace=PILOTS_NS)
    del bare["spec"]["containers"][0]["resources"]
    _restricted(bare)
    spare = tenant_pod("on-spare", SPARE, "2", namespace=PILOTS_NS)
    _restricted(spare)
    core.create_namespaced_pod(PILOTS_NS, bare)
    core.create_namespaced_pod(PILOTS_NS, spare)
    _running(core, PILOTS_NS, ["bare", "on-spare"])
    got = core.read_namespaced_pod("bare", PILOTS_NS).spec.containers[0].resources
    assert (got.requests["cpu"], got.requests["memory"]) == ("1", "2Gi")
    with quota(core, "ivs-tight", {"requests.cpu": "12"}):
        wait_for(lambda: core.read_namespaced_resource_quota("ivs-tight", PILOTS_NS).status.used.get("requests.cpu")
                 == "3", what="the quota charging both pods")
        bed.lose_spare_node()
        try:
            wait_for(lambda: core.read_namespaced_pod("on-spare", PILOTS_NS).metadata.deletion_timestamp,
                     timeout=120, what="the lost node's pod Terminating")
            assert core.read_namespaced_pod("on-spare", PILOTS_NS).status.phase == "Running"
            c = _compare(bed, "Pilots", busy.refill, ignore={SPARE})
        finally:
            bed.return_spare_node()
    assert "used: requests.cpu=12, limited: requests.cpu=12" in c.placement.refusal
    _assert_exact(c)
    _assert_figure(c, 12 - 3)


def test_entries_sharing_a_pool_each_advertise_all_of_it(bed, busy):
    """Pilots and CMS_Pilots take the same nodes: each advertises the whole free pool (16 on the busy
    cluster, cpu-3 cordoned), exactly what the scheduler gives that route alone; the sum over the two
    (32) is no bound. Once Pilots holds the pool, CMS_Pilots advertises 0 and Pilots its 16."""
    with cordoned(busy.core, CPU_NODES[-1]):
        pilots = _compare(bed, "Pilots", busy.refill, keep=True)
        try:
            _assert_exact(pilots)
            _assert_figure(pilots, LEFT * (len(UNTAINTED) - 1))
            cms = _compare(bed, "CMS_Pilots", busy.refill)
            _assert_exact(cms)
            _assert_figure(cms, 0)
        finally:
            ivs.delete_run(busy.core, PILOTS_NS, ivs.run_name("Pilots"))


def _restricted(pod: dict) -> None:
    """What the pilots' namespace's PodSecurity level (restricted) demands of a pod."""
    pod["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    pod["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False,
                                                       "capabilities": {"drop": ["ALL"]}}
    if pod["spec"].get("nodeName") == SPARE:
        pod["spec"]["tolerations"] = [{"key": "ce-k8s.test/spare", "operator": "Exists", "effect": "NoSchedule"}]


# --------------------------------------------------------------------------------------------
# Admission that changes or refuses the pilot's pod


def test_a_limitrange_that_refuses_the_pilot(bed, core):
    """A site's LimitRange whose maximum is smaller than the whole-node pilot (64 cores): admission
    refuses every one of the route's pods, so the route can take none and must advertise none.
    (Before the provider asked the API server to admit its pilot (a dry run), it advertised the two
    whole-node nodes: factories sent pilots whose pods could never be created.)"""
    core.create_namespaced_limit_range(PILOTS_NS, {
        "metadata": {"name": "ivs-small"},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "32"}}]}})
    try:
        c = _compare(bed, "WholeNode_Pilots")
        ad = ivs.info_ad(bed.kubeconfig)
    finally:
        core.delete_namespaced_limit_range("ivs-small", PILOTS_NS)
    assert ad["K8sInfoStatus"] == "WARNING"
    assert "route WholeNode_Pilots: the API server refuses its pods" in ad["K8sInfoError"]
    assert c.placement.refused and "maximum cpu usage per Container is 32" in c.placement.refusal, c
    _assert_exact(c)
    _assert_figure(c, 0)
    again = _compare(bed, "WholeNode_Pilots")   # the LimitRange gone: the pool again
    _assert_exact(again)
    _assert_figure(again, len(WHOLE_NODES))


def test_limitrange_defaults_of_the_pilots_own_pod_count_against_quota(bed, core):
    """The builder states no ephemeral-storage limit; a site's LimitRange gives every container one
    (10Gi) and a quota caps limits.ephemeral-storage at 50Gi: admission charges 10Gi a pod, so 5 GPU
    pilots and not the pool's 8. (The pod as built charges nothing there: before the dry run the
    provider advertised 8 and factories were sent 3 pilots admission refused.)"""
    assert GPUS_A_NODE * len(GPU_NODES) > 5            # the nodes alone would take more
    core.create_namespaced_limit_range(PILOTS_NS, {
        "metadata": {"name": "ivs-eph"},
        "spec": {"limits": [{"type": "Container", "default": {"ephemeral-storage": "10Gi"}}]}})
    try:
        with quota(core, "ivs-eph", {"limits.ephemeral-storage": "50Gi"}):
            c = _compare(bed, "GPU_Pilots")
    finally:
        core.delete_namespaced_limit_range("ivs-eph", PILOTS_NS)
    assert c.placement.refused and "exceeded quota: ivs-eph" in c.placement.refusal, c
    _assert_exact(c)
    _assert_figure(c, 50 // 10)


def test_runtimeclass_overhead(bed, core, monkeypatch):
    """A route whose pods name a RuntimeClass with a pod overhead (30 cores, e.g. a VM sandbox): the
    RuntimeClass admission adds the overhead to each pod, the scheduler counts it, so a 32-core GPU
    node takes one GPU pilot and not four (2 in all). The route is the shipped GPU route plus
    `SET K8sRuntimeClass` (through HTCondor's `_CONDOR_` environment override)."""
    route = (REPO / "routes" / "20-gpu.conf").read_text()
    body = route.split("@=jrt\n", 1)[1].split("@jrt", 1)[0]
    monkeypatch.setenv("_CONDOR_JOB_ROUTER_ROUTE_GPU_Pilots", body + '    SET K8sRuntimeClass "ivs-overhead"\n')
    node_api = client.NodeV1Api(core.api_client)
    node_api.create_runtime_class({"metadata": {"name": "ivs-overhead"}, "handler": "runc",
                                   "overhead": {"podFixed": {"cpu": "30", "memory": "1Gi"}}})
    try:
        c = _compare(bed, "GPU_Pilots")
    finally:
        node_api.delete_runtime_class("ivs-overhead")
    _assert_exact(c)
    _assert_figure(c, len(GPU_NODES))
