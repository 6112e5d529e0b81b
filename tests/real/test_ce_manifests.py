"""The CE's own Kubernetes manifests (containers/k8s: base, ce, the example site's overlay), judged
by the real control plane: the nearest real thing to issue 34's "the CE itself in a pod" that this
machine allows (docs/deploy-kubernetes.md says why the CE cannot run in a pod here).

Until now only our API emulator and schema checks read these files (tests/containers/). Here the
real kube-apiserver takes the whole overlay (a server-side dry run: the bed's own base stays as
it is for the other tests), and the real StatefulSet controller makes the CE's pod from it, which
the `ce-k8s-system` namespace's PodSecurity admission (`baseline` enforced, `restricted` warned)
and the ServiceAccount admission must let through; the real scheduler says why it waits (no
storage provisioner here), and deleting the StatefulSet keeps the job queue's volume claim
(`persistentVolumeClaimRetentionPolicy: Retain`), as the manifest promises.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "containers" / "k8s" / "overlays" / "example-site"
CE_NS, CE_STS = "ce-k8s-system", "ce-k8s-ce"
CE_POD, CE_CLAIM = f"{CE_STS}-0", f"state-{CE_STS}-0"


@pytest.fixture
def overlay_objects(real_kube) -> list[dict]:
    """The overlay as kustomize renders it (the `kubectl kustomize` a site reviews first)."""
    out = real_kube.kubectl("kustomize", str(OVERLAY)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_the_example_sites_overlay_is_accepted_whole_by_the_real_api_server(real_kube, overlay_objects):
    """Every object of the overlay passes the real server's schema, defaulting and admission
    (server-side apply, dry run: nothing of the bed changes)."""
    # --force-conflicts: the bed applied the base client-side (kubectl apply -k), so a server-side
    # apply conflicts with that field manager over fields such as the LimitRange's; in a dry run
    # it takes nothing from anyone.
    proc = real_kube.kubectl("apply", "--server-side", "--force-conflicts", "--dry-run=server", "-k", str(OVERLAY),
                             check=False)
    assert proc.returncode == 0, proc.stderr
    applied = [line for line in proc.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len(overlay_objects), (proc.stdout, [o["kind"] for o in overlay_objects])
    kinds = {o["kind"] for o in overlay_objects}
    assert {"StatefulSet", "Service", "ConfigMap", "Namespace", "ServiceAccount", "Role", "RoleBinding",
            "ClusterRole", "ClusterRoleBinding", "NetworkPolicy", "ResourceQuota", "LimitRange",
            "PriorityClass"} <= kinds, kinds


def test_the_real_statefulset_controller_makes_the_ce_pod_and_its_namespace_admits_it(real_kube, admin_core,
                                                                                       overlay_objects, tmp_path):
    """The CE's StatefulSet, as the example site renders it, applied for real: the controller
    creates the pod `ce-k8s-ce-0` and its volume claim, so PodSecurity `baseline` and the
    ServiceAccount admission let the pod through (they would refuse its creation otherwise); the
    `restricted` warnings name why the CE is not a restricted pod (it starts condor_master as root
    with the capabilities HTCondor needs to switch users). No storage provisioner here: the real
    scheduler keeps the pod Pending and says why; no image is ever pulled. Deleting the StatefulSet
    keeps the claim (the job queue), as its retention policy says."""
    sts = next(o for o in overlay_objects if o["kind"] == "StatefulSet")
    path = tmp_path / "statefulset.yaml"
    path.write_text(yaml.safe_dump(sts))
    try:
        proc = real_kube.kubectl("apply", "--server-side", "-f", str(path), check=False)
        assert proc.returncode == 0, proc.stderr
        warned = proc.stderr
        assert 'would violate PodSecurity "restricted:latest"' in warned, warned
        assert "runAsNonRoot" in warned and "capabilities" in warned, warned
        pod = wait_for(lambda: next((p for p in admin_core.list_namespaced_pod(CE_NS).items
                                     if p.metadata.name == CE_POD), None), 60,
                       what="the StatefulSet controller to create the CE's pod",
                       on_timeout=lambda: real_kube.kubectl("get", "events", "-n", CE_NS, check=False).stdout)
        assert pod.spec.service_account_name == "ce-k8s-agent"
        assert [c.name for c in pod.spec.containers] == ["ce"] and pod.spec.init_containers[0].name == "prepare"
        claim = admin_core.read_namespaced_persistent_volume_claim(CE_CLAIM, CE_NS)
        assert claim.spec.storage_class_name == "fast-replicated"
        assert claim.spec.resources.requests["storage"] == "100Gi"

        def unschedulable():
            p = admin_core.read_namespaced_pod(CE_POD, CE_NS)
            return next((c for c in p.status.conditions or [] if c.type == "PodScheduled" and c.status == "False"),
                        None)
        why = wait_for(unschedulable, 60, what="the scheduler's reason for the CE's pod")
        assert "PersistentVolumeClaim" in why.message, why.message
        assert admin_core.read_namespaced_pod(CE_POD, CE_NS).status.phase == "Pending"
        real_kube.kubectl("delete", "statefulset", CE_STS, "-n", CE_NS, "--wait=true", "--timeout=60s")
        wait_for(lambda: not [p for p in admin_core.list_namespaced_pod(CE_NS).items if p.metadata.name == CE_POD],
                 60, what="the CE's pod gone with its StatefulSet")
        assert admin_core.read_namespaced_persistent_volume_claim(CE_CLAIM, CE_NS).metadata.deletion_timestamp \
            is None, "deleting the StatefulSet must keep the job queue's claim"
    finally:
        real_kube.kubectl("delete", "statefulset", CE_STS, "-n", CE_NS, "--ignore-not-found", check=False)
        real_kube.kubectl("delete", "pvc", CE_CLAIM, "-n", CE_NS, "--ignore-not-found", "--wait=false", check=False)



def test_a_split_suite_s_kwok_only_bed_has_kwok_nodes_only(real_kube, real_node_wanted, request):
    """This module runs in the kwok-only worker when the suite is split (tests/conftest.py); that
    worker's bed must have no real node: one real node at a time on the machine (seen: both
    workers' beds had one, and before the sysctl ledger their overlapping lives left the host's
    sysctls changed). In one process the bed has one when any selected test needs it."""
    if getattr(request.config, "workerinput", {}).get("ce_k8s_two_rooms"):
        assert real_node_wanted is False
    assert bool(real_kube.real_node_names()) is real_node_wanted
