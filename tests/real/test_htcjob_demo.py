"""`ce-k8s demo htcjob`, the documented command, as a user runs it: the `queue: 3` HTCJob from
submitted to completed on the real control plane and the real schedd, per-proc exit codes and
output, and the rows `kubectl get htcjobs` showed on the way. Its own module, so that no other
real-HTCondor bed is up (the demo brings its own up and down); the control plane is the session's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ce_k8s.demos import htcjobdemo

pytestmark = pytest.mark.slow


def test_the_documented_command_runs_queue_3_to_completion(real_kube):
    proc = subprocess.run([str(Path(sys.prefix) / "bin" / "ce-k8s"), "demo", "htcjob", "--json",
                           "--kube-state", str(real_kube.state_dir)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["ok"] and result["phase"] == "Completed"
    assert result["exit_codes"] == {"0": 0, "1": 0, "2": 0}
    assert len(result["clusters_with_uid"]) == 1 and result["owners"] == ["htcuser"]
    assert {"0.stdout", "1.stderr", "2.result.txt"} <= set(result["output_keys"])
    rows = [line for line in proc.stderr.splitlines() if line.startswith("demo htcjob: +")]
    phases = [line.split()[4] for line in rows]          # "demo htcjob: +1.2s  demo  <PHASE>  3 ..."
    assert phases[-1] == "Completed" and len(phases) >= 2, rows
    assert "proc 2 ran as htcuser" in proc.stderr
    # the demo's own directories (its HTCondor bed's state, the work area) go with a run that succeeded
    assert not htcjobdemo.CONDOR_STATE.exists() and not htcjobdemo.WORK.exists()
