"""The API path against the Kubernetes API emulator (ce_k8s.sim.apiserver) with the real client.

Paged LISTs (`limit`/`continue`) must return every object; the command reports source "api" and
fresh figures (issue 6: "with neither option it asks the agent ... and falls back to the API").
"""

from __future__ import annotations

from ce_k8s.info.snapshot import snapshot_from_api
from ce_k8s.sim.apiserver import ApiServer

from .conftest import NOW, TEST_CONFIG, parse, run_info


def test_api_snapshot_pages_and_command(capsys):
    with ApiServer.running(nodes="cpu:3x16c64g") as srv:
        snap = snapshot_from_api(srv.kubeconfig_path, timeout=10, page_size=2)  # forces a continue token
        assert sorted(n.name for n in snap.nodes) == ["cpu-1", "cpu-2", "cpu-3"]
        assert snap.source.startswith("api http://127.0.0.1:")
        out, code = run_info(capsys, "--config", TEST_CONFIG, "--kubeconfig", srv.kubeconfig_path)
    ad = parse(out)
    assert code == 0 and ad.eval("Status") == "OK" and ad["K8sInfoSource"] == "api"
    assert (ad["K8sCpusTotal"], ad["K8sNodesSchedulable"]) == (48, 3)
    assert ad["K8sInfoUpdated"] >= NOW  # the time of the LIST, not --now


def test_admission_dry_run_shapes_and_refuses(capsys, monkeypatch):
    """On the API path each route's pod is put to admission as a dry run (nothing is created): the
    emulator admits it unchanged, so the entries are as before; a pod admission refuses for a reason
    other than quota (here: a LimitRange maximum, as the real API server words it) makes its route
    advertise none and the run a WARNING, while a quota refusal is left to the quota arithmetic."""
    from ce_k8s.info import admission, provider

    limit = "pods 'x' is forbidden: maximum cpu usage per Container is 4, but limit is 8"
    target = []

    def refusing(kubeconfig, pods, timeout=10.0):
        pods = list(pods)
        results = admission.admit_dry_run(kubeconfig, pods, timeout)
        assert len(pods) >= 2 and all(r.pod is not None for r in results)   # the emulator admits them all
        routes = [p["metadata"]["labels"]["ce-k8s.htcondor.org/route"] for p in pods]
        return [admission.Admission(refusal=limit) if r == target[0] else
                admission.Admission(refusal="exceeded quota: q", quota=True) for r in routes]

    with ApiServer.running(nodes="cpu:3x16c64g:label=pool=cpu") as srv:
        srv.api.create("namespaces", None, {"metadata": {"name": "ce-k8s"}})   # the pilots' namespace
        out, _ = run_info(capsys, "--config", TEST_CONFIG, "--kubeconfig", srv.kubeconfig_path)
        admitted = {e["Name"]: e["MaxPilots"] for e in parse(out)["OSG_ResourceCatalog"]}
        target.append(max(admitted, key=lambda name: admitted[name]))
        monkeypatch.setattr(provider, "admit_dry_run", refusing)
        refused, _ = run_info(capsys, "--config", TEST_CONFIG, "--kubeconfig", srv.kubeconfig_path)
        assert not srv.api.list("pods", None)["items"]        # dry runs: nothing was created
    assert parse(out).eval("Status") == "OK" and admitted[target[0]] > 0
    after = parse(refused)
    assert {e["Name"]: e["MaxPilots"] for e in after["OSG_ResourceCatalog"]} == {**admitted, target[0]: 0}
    assert after["K8sInfoStatus"] == "WARNING"
    assert f"route {target[0]}: the API server refuses its pods: pods 'x' is forbidden" in after["K8sInfoError"]
