"""The Slurm hand-over scripts in containers/slurm/, run for real against the API emulator.

The BeBiDa scheme (docs/operations.md): slurmctld's PrologSlurmctld takes the job's nodes from Kubernetes and
EpilogSlurmctld gives them back. `scontrol` and `squeue` are replaced by tiny stand-ins on PATH
that print what slurmctld's tools would; everything else (bash, the `ce-k8s` console script, the
emulator) is real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from ops_helpers import NAMESPACE, REPO

SLURM = REPO / "containers" / "slurm"
CE_K8S = str(Path(sys.executable).parent / "ce-k8s")


@pytest.fixture
def slurm_env(host, tmp_path):
    """The environment slurmctld would give the scripts, with stand-in scontrol/squeue."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] || exit 2\n'
                                     'printf "%s\\n" $FAKE_HOSTNAMES\n')
    (bindir / "squeue").write_text('#!/bin/sh\nprintf "%s\\n" $FAKE_SQUEUE\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    return {
        "PATH": f"{bindir}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "cpu-[1-2]",
        "FAKE_HOSTNAMES": "cpu-1 cpu-2", "FAKE_SQUEUE": "4242",
        "CE_K8S_BIN": CE_K8S, "CE_K8S_KUBECONFIG": host.kubeconfig, "CE_K8S_LOG": "cat",
        "CE_K8S_GRACE": "0", "CE_K8S_EVICT_TIMEOUT": "5",
    }


def run_script(name: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(SLURM / name)], env=env, capture_output=True, text=True, timeout=timeout)


def unschedulable(host, node: str) -> bool:
    return bool(host.server.store.get("nodes", "", node)["spec"].get("unschedulable"))


def test_scripts_are_executable_bash_without_syntax_errors():
    for name in ("prolog-slurmctld.sh", "epilog-slurmctld.sh"):
        path = SLURM / name
        assert os.access(path, os.X_OK) and not path.stat().st_mode & 0o022
        assert path.read_text().startswith("#!/bin/bash\n")
        subprocess.run(["bash", "-n", str(path)], check=True)


def test_prolog_hands_the_allocation_over_and_epilog_gives_it_back(host, slurm_env):
    """Nodes Kubernetes does not know (HPC-only) are skipped without failing the job."""
    where = host.submit(1).get("K8sNodeName")
    slurm_env["FAKE_HOSTNAMES"] = "cpu-1 cpu-2 hpc-only-1"
    started = time.monotonic()
    done = run_script("prolog-slurmctld.sh", slurm_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 30
    assert "ce-k8s nodes reclaim: node cpu-1: cordoned" in done.stdout
    assert "ce-k8s nodes reclaim: node cpu-2: cordoned" in done.stdout
    assert "ce-k8s nodes reclaim: node hpc-only-1: not a Kubernetes node; nothing to do" in done.stdout
    assert unschedulable(host, "cpu-1") and unschedulable(host, "cpu-2") and not unschedulable(host, "cpu-3")
    # a pilot that ran on the allocation is idle again for the factory, as a new attempt; elsewhere it runs on
    ad = host.update(1)
    if where in ("cpu-1", "cpu-2"):
        assert (ad.get("K8sAttempt"), ad.get("JobStatus"), ad.get("GridJobStatus")) == (1, 1, "PENDING")
    else:
        assert (ad.get("K8sAttempt"), ad.get("JobStatus")) == (0, 2)

    done = run_script("epilog-slurmctld.sh", slurm_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not unschedulable(host, "cpu-1") and not unschedulable(host, "cpu-2")
    assert sorted(line for line in done.stdout.splitlines() if "uncordoned" in line) == [
        "ce-k8s nodes release: node cpu-1: uncordoned", "ce-k8s nodes release: node cpu-2: uncordoned"]


def test_epilog_keeps_a_node_another_slurm_job_still_uses(host, slurm_env):
    assert run_script("prolog-slurmctld.sh", slurm_env).returncode == 0
    env = dict(slurm_env, FAKE_SQUEUE="4242 4343")
    done = run_script("epilog-slurmctld.sh", env)
    assert done.returncode == 0
    assert "job 4242: node cpu-1: still used by Slurm job(s) 4343 ; not released" in done.stdout
    assert unschedulable(host, "cpu-1") and unschedulable(host, "cpu-2")


@pytest.mark.parametrize("strict, expected", [("0", 0), ("1", 1)])
def test_prolog_strict_mode_fails_the_job_when_a_node_is_not_free(host, slurm_env, strict, expected):
    from test_nodes import raw_pilot

    raw_pilot(host, "stubborn", "cpu-1", "run=forever ignore-sigterm", grace=3000)
    host.server.wait_for(lambda: host.server.store.get("pods", NAMESPACE, "stubborn")["status"].get("phase")
                         == "Running")
    env = dict(slurm_env, FAKE_HOSTNAMES="cpu-1", CE_K8S_EVICT_TIMEOUT="0.5", CE_K8S_STRICT=strict)
    done = run_script("prolog-slurmctld.sh", env)
    assert done.returncode == expected
    assert "job 4242: node cpu-1: pilots still terminating; the job starts anyway" in done.stdout


def test_prolog_reports_api_failures(host, slurm_env, tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text(open(host.kubeconfig).read().replace(host.server.url, "http://127.0.0.1:9"))
    env = dict(slurm_env, CE_K8S_KUBECONFIG=str(bad), FAKE_HOSTNAMES="cpu-1", CE_K8S_STRICT="1")
    done = run_script("prolog-slurmctld.sh", env)
    assert done.returncode == 1
    assert "node cpu-1: hand-over failed (exit 1)" in done.stdout


def test_handover_rbac_grants_exactly_what_the_nodes_command_calls():
    """containers/slurm/rbac.yaml vs a static scan of ce_k8s/ops/nodes.py (the agent's scanner)."""
    sys.path.insert(0, str(REPO / "tests" / "containers"))
    from containers_rbac_scan import Permission, required_permissions, scan_tree

    needed = {Permission(p.group, p.resource, p.verb, True)
              for p in required_permissions(scan_tree(REPO, ["ce_k8s/ops/nodes.py"]))}
    docs = [d for d in yaml.safe_load_all((SLURM / "rbac.yaml").read_text()) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.32", strict=True)
    [role] = [d for d in docs if d["kind"] == "ClusterRole"]
    granted = {Permission(g, r, v, True) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert needed == granted
    [binding] = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert not any(d["kind"] in ("Role", "RoleBinding") for d in docs)
