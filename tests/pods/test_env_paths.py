"""Environment values naming spooled files point at the pod's copies (htcondor-ce.md §6.3, §7.3).

GlideinWMS passes `IDTOKENS_FILE=<spool path>` in `Environment`; the spool does not exist in the pod,
the file is linked into the scratch directory instead.
"""

from __future__ import annotations

from podads import SPOOL_DIR, routed_pilot

from ce_k8s.pods.builder import SCRATCH_DIR, build_manifests
from ce_k8s.pods.jobad import JobAd


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_spool_path_in_environment_becomes_scratch_path(settings):
    ad = routed_pilot(Environment=f"IDTOKENS_FILE={SPOOL_DIR}/idtoken.tok OTHER=/var/lib/elsewhere/x")
    env = _env(build_manifests(JobAd(ad), settings).pod)
    assert env["IDTOKENS_FILE"] == f"{SCRATCH_DIR}/idtoken.tok"
    assert env["OTHER"] == "/var/lib/elsewhere/x"


def test_another_jobs_spool_path_is_left_alone(settings):
    other = SPOOL_DIR.replace("cluster1234567.proc3", "cluster1234567.proc4").replace("/3/", "/4/")
    ad = routed_pilot(Environment=f"IDTOKENS_FILE={other}/idtoken.tok")
    env = _env(build_manifests(JobAd(ad), settings).pod)
    assert env["IDTOKENS_FILE"] == f"{other}/idtoken.tok"
