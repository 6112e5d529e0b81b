"""`ce-k8s demo --kube real --condor real --factory` with a share of its pilots on the real node, and
with `--pilot real` (the pilot image, the VO pool and its users' jobs: docs/demo.md "Real pilots").

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


def test_real_pilots_run_the_vo_users_jobs_and_leave_idle(real_kube, tmp_path):
    """`--pilot real` (issue 34): the factory's pilots, through the real CE and the agent, run the pilot
    image on the real node; their startds join the bed's VO pool and run its users' jobs; each pilot
    leaves idle (exit 0, seen by the factory) with its CPU in the CE's accounting."""
    users, pilots = 4, 2
    proc = subprocess.run(
        [sys.executable, "-m", "ce_k8s.cli", "demo", "--kube", "real", "--kube-state", str(real_kube.state_dir),
         "--condor", "real", "--state", str(tmp_path / "condor"), "--factory", "--pilot", "real",
         "--pilots", str(pilots), "--user-jobs", str(users), "--job-seconds", "5", "--json", "--timeout", "300"],
        capture_output=True, text=True, cwd=REPO, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert (summary["completed"], summary["lost"], summary["duplicate_pods"]) == (pilots, 0, 0), summary
    assert (summary["pods_left"], summary["secrets_left"]) == (0, 0), summary
    vo = summary["real_node"]
    assert vo["pilot_exit_codes"] == {"0": pilots} and vo["pilots_completed"] == pilots, vo
    assert vo["user_jobs"] == vo["user_jobs_completed"] == vo["user_jobs_exit_0"] == users, vo
    assert vo["user_outputs_returned"] == users, vo          # uid 1000, the pod's hostname, back to the user
    nodes = set(real_kube.real_node_names())
    for job in vo["jobs"]:
        assert job["pod"] in vo["jobs_per_pilot"] and job["node"] in nodes and job["exit_code"] == 0, job
        assert job["submit_to_start_s"] is not None and job["submit_to_start_s"] >= 0, job
    assert sum(vo["jobs_per_pilot"].values()) == users and len(vo["jobs_per_pilot"]) <= pilots, vo
    assert vo["pilot_cpu_s_accounted"]["known"] == pilots and vo["pilot_cpu_s_accounted"]["total"] > 0, vo
    assert not (tmp_path / "condor").exists(), "the demo made its HTCondor bed's directory and keeps it after success"
