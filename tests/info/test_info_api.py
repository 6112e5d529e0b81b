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
