"""The real API server's `Warning` headers on a pilot's pod, read by the agent with its own token.

kube-apiserver v1.37 admits a pod and says in `Warning: 299 - "text"` headers what it thinks is
wrong with it (pkg/api/pod/warnings.go, the PodSecurity admission's `warn` level, strict decoding
of unknown fields). docs/agent.md "API server warnings" decides, per kind, what the agent does:
log it once per pod with the job id (`event=api-warning`) and count it, always; name it in the
routed job's `K8sPodReason` where the pod will not do what the route meant; never hold the pilot.
Each test here makes the real server send one kind for a pilot's pod, through the in-process agent
on its ServiceAccount's token (tests/real/conftest.py `running_agent`).
"""

from __future__ import annotations

import json
import logging

import classad2
import pytest

from ce_k8s.agent.apiwarnings import NOTE_PREFIX
from ce_k8s.agent.logfmt import parse as parse_line

from .conftest import running_agent, wait_for
from .test_lifecycle import pilot, read_pod, status_is, until

PSA = "pod-security.kubernetes.io/"


@pytest.fixture
def bed(real_kube, pilot_namespace, caplog):
    caplog.set_level(logging.INFO, logger="ce_k8s")
    with running_agent(real_kube, pilot_namespace) as (agent, settings, root):
        yield agent, settings, root


def api_warnings(caplog, job: str) -> list[dict[str, str]]:
    """The agent's `api-warning` lines about routed job `job`."""
    lines = [parse_line(r.getMessage()) for r in caplog.records if r.getMessage().startswith("event=api-warning ")]
    return [e for e in lines if e.get("job") == job]


def routed_job(ad) -> str:
    return f"{ad['ClusterId']}.{ad['ProcId']}"


def test_a_pod_security_warn_level_is_logged_once_and_the_pilot_runs(bed, admin_core, pilot_namespace, caplog):
    """A namespace that enforces `baseline` and warns at `restricted` (the PodSecurity admission's
    EvaluatePod: warnings, not denials) admits a pilot whose route mounts an NFS software area, a
    volume type `restricted` forbids: the agent logs the real server's warning once and the pilot
    runs as built, with nothing about it in the job (the pod is what the route meant)."""
    agent, settings, _ = bed
    admin_core.patch_namespace(pilot_namespace, {"metadata": {"labels": {
        PSA + "enforce": "baseline", PSA + "warn": "restricted", PSA + "warn-version": "latest"}}})
    patch = [{"op": "add", "path": "/spec/volumes/-",
              "value": {"name": "cvmfs", "nfs": {"server": "nfs.example.org", "path": "/cvmfs", "readOnly": True}}},
             {"op": "add", "path": "/spec/containers/0/volumeMounts/-",
              "value": {"name": "cvmfs", "mountPath": "/cvmfs", "readOnly": True}}]
    ad = pilot(settings, pilot_namespace, K8sPodPatch=json.dumps(patch))
    until(agent, ad, status_is(2), "the pilot running")
    assert ad["K8sNodeName"] and ad["K8sPodReason"] == "", dict(ad)
    pod = read_pod(admin_core, pilot_namespace, ad["K8sPodName"])
    assert any(v.nfs is not None for v in pod.spec.volumes)            # admitted as built
    for _ in range(3):
        until(agent, ad, status_is(2), "the pilot still running")
    (line,) = api_warnings(caplog, routed_job(ad))
    assert line["text"].startswith('would violate PodSecurity "restricted:latest": ') and '"nfs"' in line["text"]
    assert (line["pod"], line["resource"], line["kind"], line["effect"]) == (ad["K8sPodName"], "pods",
                                                                            "pod-security", "runs")
    assert agent.prom.api_warnings.labels("pods", "pod-security")._value.get() == 1


def test_a_field_the_server_does_not_know_is_dropped_and_named_while_the_pilot_runs(bed, admin_core,
                                                                                    pilot_namespace, caplog):
    """A route's patch with a misspelt field (`resource` for `resources`): the server's default
    `fieldValidation=Warn` drops it and says so. The pilot runs without it, and `K8sPodReason`
    names what was dropped for as long as it runs, so condor_ce_q shows it."""
    agent, settings, _ = bed
    patch = [{"op": "add", "path": "/spec/containers/0/resource", "value": {"limits": {"cpu": "2"}}}]
    ad = pilot(settings, pilot_namespace, cluster=4712, K8sPodPatch=json.dumps(patch))
    until(agent, ad, status_is(2), "the pilot running")
    text = 'unknown field "spec.containers[0].resource"'
    assert ad["K8sPodReason"] == NOTE_PREFIX + text, dict(ad)
    assert "HoldReason" not in ad
    (line,) = api_warnings(caplog, routed_job(ad))
    assert (line["text"], line["kind"], line["effect"]) == (text, "unknown-field", "ignored")
    stored = admin_core.api_client.sanitize_for_serialization(read_pod(admin_core, pilot_namespace, ad["K8sPodName"]))
    assert "resource" not in stored["spec"]["containers"][0]


def test_a_deprecated_node_label_no_node_carries_is_named_while_the_pilot_waits(bed, admin_core, pilot_namespace,
                                                                               caplog):
    """`failure-domain.beta.kubernetes.io/zone` is deprecated (pkg/api/node/util.go) and set by
    no kubelet without a cloud provider: a pilot routed with it in its node selector waits with
    the scheduler's reason and the server's warning in `K8sPodReason`, is not held, and runs as
    soon as a node carries the label, its reason then empty as for any running pilot. The beta
    `os`/`arch` labels, deprecated too, a real v1.37 kubelet still sets (the real node here)."""
    agent, settings, _ = bed
    real = admin_core.list_node(label_selector="ce-k8s.test/real-node=true").items
    assert real and all(n.metadata.labels.get("beta.kubernetes.io/arch") == n.metadata.labels["kubernetes.io/arch"]
                        for n in real)
    zone = "failure-domain.beta.kubernetes.io/zone"
    ad = pilot(settings, pilot_namespace, cluster=4713,
               K8sNodeSelector=classad2.ExprTree(f"[ '{zone}' = \"zone-warn\" ]"))
    until(agent, ad, lambda a: "didn't match Pod's node affinity/selector" in (a.get("K8sPodReason") or ""),
          "the scheduler's reason")
    reason = ad["K8sPodReason"]
    assert reason.startswith("Unschedulable: 0/") and reason.endswith(
        f'; {NOTE_PREFIX}spec.nodeSelector[{zone}]: deprecated since v1.17; use "topology.kubernetes.io/zone" '
        "instead"), reason
    assert ad["JobStatus"] == 1 and "HoldReason" not in ad
    (line,) = api_warnings(caplog, routed_job(ad))
    assert (line["kind"], line["effect"]) == ("deprecated-node-label", "placement")
    node = admin_core.list_node(label_selector="sim.ce-k8s.io/pool=cpu").items[0].metadata.name
    admin_core.patch_node(node, {"metadata": {"labels": {zone: "zone-warn"}}})
    try:
        until(agent, ad, status_is(2), "the pilot running once a node carries the label")
        assert ad["K8sNodeName"] == node and ad["K8sPodReason"] == "", dict(ad)
    finally:
        admin_core.patch_node(node, {"metadata": {"labels": {zone: None}}})
    wait_for(lambda: zone not in (admin_core.read_node(node).metadata.labels or {}), what="the label removed")
