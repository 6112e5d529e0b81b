"""The agent watches exactly the pods its CE makes, by the name the CE's schedd advertises.

With no `CE_K8S_CE_NAME`, `Settings.ce_name` is the schedd's Name (docs/install.md, "Settings the
CE already has"); the builder labels pods with it and the agent's watch selects on it, so the two
must agree, and a second CE on the same host name but with its own `SCHEDD_NAME` must not match.
"""

from __future__ import annotations

from ce_k8s.agent.agent import label_selector
from ce_k8s.condor.config import CondorConfig
from ce_k8s.pods.builder import build_manifests
from ce_k8s.settings import Settings

CE = """\
SPOOL = /var/lib/condor-ce/spool
FULL_HOSTNAME = ce01.example.edu
COLLECTOR_HOST = ce01.example.edu:9619
CE_K8S_IMAGE = pilot:1
"""
JOB = {
    "ClusterId": 7, "ProcId": 0, "Owner": "cms", "Cmd": "/bin/true", "JobUniverse": 9,
    "GridResource": "batch k8s", "RequestCpus": 1, "RequestMemory": 1024, "BatchRuntime": 3600,
    "Iwd": "/var/lib/condor-ce/spool/7/0/cluster7.proc0.subproc0",
    "K8sSourceGlobalJobId": "ce01.example.edu#7.0#1760000000", "TransferExecutable": False,
}


def selects(selector: str, labels: dict[str, str]) -> bool:
    """An equality-based label selector (`k=v,k2=v2`) against a pod's labels."""
    return all(labels.get(k) == v for k, _, v in (term.partition("=") for term in selector.split(",")))


def settings(extra: str = "") -> Settings:
    return Settings.from_config(CondorConfig.from_text(CE + extra, "ce.conf"))


def test_the_watch_selects_the_pods_the_builder_labels_with_the_schedd_name():
    for extra in ("", "SCHEDD_NAME = ce-k8s-a\n"):
        s = settings(extra)
        labels = build_manifests(JOB, s).pod["metadata"]["labels"]
        assert selects(label_selector(s.ce_name), labels), (extra, s.ce_name, labels)


def test_a_second_schedd_on_the_host_does_not_see_the_first_ones_pods():
    first, second = settings(), settings("SCHEDD_NAME = ce-k8s-b\n")
    assert (first.ce_name, second.ce_name) == ("ce01.example.edu", "ce-k8s-b@ce01.example.edu")
    labels = build_manifests(JOB, first).pod["metadata"]["labels"]
    assert not selects(label_selector(second.ce_name), labels)
