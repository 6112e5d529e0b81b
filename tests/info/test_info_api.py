"""The API path against the Kubernetes API emulator (ce_k8s.sim.kube.apiserver) with the real client.

Paged LISTs (`limit`/`continue`) must return every object; the command reports source "api" and
fresh figures (issue 6: "with neither option it asks the agent ... and falls back to the API").
"""

from __future__ import annotations

from ce_k8s.info.snapshot import snapshot_from_api
from ce_k8s.sim.kube.apiserver import ApiServer

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
    emulator admits it unchanged, so the entries are as before. A pod admission refuses makes its
    route advertise only what it has: for a LimitRange maximum (as the real API server words it)
    with a WARNING naming it, for a full quota silently (being full is normal)."""
    from ce_k8s.info import admission, provider

    limit = "pods 'x' is forbidden: maximum cpu usage per Container is 4, but limit is 8"
    quota = "pods 'x' is forbidden: exceeded quota: q, requested: limits.ephemeral-storage=10Gi"
    refuse = {}

    def refusing(kubeconfig, pods, timeout=10.0):
        pods = list(pods)
        results = admission.admit_dry_run(kubeconfig, pods, timeout)
        assert len(pods) >= 2 and all(r.pod is not None for r in results)   # the emulator admits them all
        routes = [p["metadata"]["labels"]["ce-k8s.htcondor.org/route"] for p in pods]
        return [refuse.get(route, result) for route, result in zip(routes, results, strict=True)]

    with ApiServer.running(nodes="cpu:3x16c64g:label=pool=cpu") as srv:
        srv.api.create("namespaces", None, {"metadata": {"name": "ce-k8s"}})   # the pilots' namespace
        out, _ = run_info(capsys, "--config", TEST_CONFIG, "--kubeconfig", srv.kubeconfig_path)
        admitted = {e["Name"]: e["MaxPilots"] for e in parse(out)["OSG_ResourceCatalog"]}
        target = max(admitted, key=lambda name: admitted[name])
        monkeypatch.setattr(provider, "admit_dry_run", refusing)
        refuse[target] = admission.Admission(refusal=limit)
        by_limit, _ = run_info(capsys, "--config", TEST_CONFIG, "--kubeconfig", srv.kubeconfig_path)
        refuse[target] = admission.Admission(refusal=quota, quota=True)
        by_quota, _ = run_info(capsys, "--config", TEST_CONFIG, "--kubeconfig", srv.kubeconfig_path)
        assert not srv.api.list("pods", None)["items"]        # dry runs: nothing was created
    assert parse(out).eval("Status") == "OK" and admitted[target] > 0
    for text in (by_limit, by_quota):
        assert {e["Name"]: e["MaxPilots"] for e in parse(text)["OSG_ResourceCatalog"]} == {**admitted, target: 0}
    assert parse(by_limit)["K8sInfoStatus"] == "WARNING"
    assert f"route {target}: the API server refuses its pods: pods 'x' is forbidden" in parse(by_limit)["K8sInfoError"]
    assert parse(by_quota)["K8sInfoStatus"] == "OK"
