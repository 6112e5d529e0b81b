"""`ce-k8s demo --kube real --condor real --factory` with a share of its pilots on the real node.

No emulator on the pilots' path: the factory schedd submits over HTCondor-C to the real CE (HTCondor
25 with HTCondor-CE's own configuration), the real job router routes, the agent (its ServiceAccount
token only, SIGKILLed once mid-run) makes the pods, and the pilots sent to the real node run their
own glidein script in a container there; its output comes back to the factory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_pilots_on_the_real_node_run_their_own_script_and_their_output_reaches_the_factory(real_kube, tmp_path):
    state = tmp_path / "condor"
    proc = subprocess.run(
        [sys.executable, "-m", "ce_k8s.cli", "demo", "--kube", "real", "--kube-state", str(real_kube.state_dir),
         "--condor", "real", "--state", str(state), "--factory", "--pilots", "4", "--real-node-share", "0.5",
         "--json", "--timeout", "240"],
        capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert (summary["completed"], summary["lost"], summary["duplicate_pods"]) == (4, 0, 0), summary
    assert (summary["pods_left"], summary["secrets_left"]) == (0, 0), summary
    real = summary["real_node"]
    assert real["pilots"] == 2 and real["completed"] == 2, real
    # What the glidein printed in its container (node, uid) reached the factory's output file.
    assert real["stdout_returned"] == real["stderr_returned"] == real["exit_codes_right"] == 2, real
    assert real["pods_seen"] == 2 and real["create_to_running_s"]["max"] < 30, real
