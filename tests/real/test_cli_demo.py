"""What `ce-k8s demo` hands the real beds, and where the real-Kubernetes bed finds the site's manifests.

No daemon runs here: the real HTCondor bed is replaced by a stand-in that records how it was asked
for, so the flag's path is checked in every run (the bed itself is judged in tests/real/condor/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ce_k8s.demos import cli_demo
from ce_k8s.real.condor.condor import RealCondorError
from ce_k8s.real.kube import kube


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_demo.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_demo_asks_for_the_htcondor_version_it_was_given(monkeypatch, tmp_path):
    asked = {}

    def fake_bed(state, **kw):
        asked.update(kw, state=state)
        raise RealCondorError("stand-in: no daemons in this test")

    monkeypatch.setattr("ce_k8s.real.condor.stockce.real_condor", fake_bed)
    for version in ("23", "25"):
        args = _args("--condor", "real", "--htcondor", version, "--state", str(tmp_path))
        assert cli_demo.run(args) == 2          # the bed's error is reported, not raised
        assert asked["htcondor"] == version and asked["kube_server"] is None
        assert asked["ce_config"] is None        # the bed's choice: HTCondor-CE's own files on 25 (stockce)
    assert _args().htcondor == "25"
    cli_demo.run(_args("--condor", "real", "--ce-config", "bed", "--state", str(tmp_path)))
    assert asked["ce_config"] == "bed"


def test_manifests_come_from_the_tree_else_from_the_installed_share(monkeypatch, tmp_path):
    assert kube.base_manifests() == kube.REPO / "containers" / "k8s" / "base"
    monkeypatch.setattr(kube, "REPO", tmp_path)          # as when ce-k8s is installed, not run from a checkout
    assert kube.base_manifests() == Path(sys.prefix) / "share" / "ce-k8s" / "containers" / "k8s" / "base"
