"""The manifests against the API emulator (ce_k8s/sim/kube/apiserver.py): applied with kubectl, and
the RBAC enforced while ce-k8s's own code runs.

The emulator serves the kinds the agent uses (pods, secrets, configmaps, serviceaccounts, nodes,
namespaces, resourcequotas, events); the others in our manifests are cluster plumbing it does not
implement, so they are checked by schema and by the static tests only (see UNSERVED).
References: htcondor-ce.md §2 (signing key and host certificate Secrets), docs/security.md
(least privilege).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from containers_helpers import KUBECTL, REPO, find, kustomize, one
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from ce_k8s.sim.kube.apiserver import ApiServer
from ce_k8s.sim.kube.resources import RESOURCES

#: Kinds in our manifests that the emulator does not serve, and why that is acceptable: none of
#: them is read or written by ce-k8s's code; their correctness is covered by the strict schema
#: validation and the security/RBAC tests in test_manifests.py and test_rbac.py.
UNSERVED = {
    "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",  # authorization objects (RBAC is
    # emulated by rules: see test_rbac_from_the_manifests_is_enough_for_the_info_provider)
    "PriorityClass", "NetworkPolicy", "LimitRange",  # scheduler / CNI / admission plumbing
    "StatefulSet", "Service",  # workload controllers and networking: no controller in the emulator
}
DOC = REPO / "docs" / "deploy-kubernetes.md"


def _served_kinds() -> set[str]:
    return {r.kind for r in RESOURCES}


@pytest.fixture
def kubectl(tmp_path):
    """Run kubectl against a fresh emulator, with its own discovery cache."""
    with ApiServer.running(kubelet=False) as srv:
        env = {**os.environ, "KUBECONFIG": srv.kubeconfig_path, "KUBECACHEDIR": str(tmp_path / "cache")}

        def run(*args: str, stdin: str | None = None, check: bool = True, cwd: Path = REPO):
            proc = subprocess.run([KUBECTL, f"--cache-dir={tmp_path / 'cache'}", *args], input=stdin,
                                  capture_output=True, text=True, env=env, timeout=60, cwd=cwd)
            if check:
                assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
            return proc

        run.srv = srv
        run.env = env
        yield run


def test_unserved_kinds_are_exactly_the_documented_ones(site):
    """If the emulator learns a kind, it must be applied here too (this list shrinks)."""
    kinds = {d["kind"] for d in site}
    assert kinds - _served_kinds() == UNSERVED
    assert kinds & _served_kinds() == {"Namespace", "ServiceAccount", "ResourceQuota", "ConfigMap"}


def test_server_side_apply_of_the_site_overlay(kubectl, site):
    """`kubectl apply --server-side` of the rendered overlay (the kinds the emulator serves) is
    accepted, idempotent, and leaves the objects as written: PSA labels, quota, generated configs."""
    served = yaml.safe_dump_all([d for d in site if d["kind"] in _served_kinds()])
    for _ in range(2):
        out = kubectl("apply", "--server-side", "-f", "-", stdin=served).stdout
        assert out.count("serverside-applied") == 7
    store = kubectl.srv.store
    pilots = store.get("namespaces", None, "ce-k8s-pilots")
    assert pilots["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    quota = store.get("resourcequotas", "ce-k8s-pilots", "ce-k8s-pilots")
    assert quota["spec"]["hard"]["pods"] == "800"
    assert store.get("serviceaccounts", "ce-k8s-system", "ce-k8s-agent") is not None
    cm_name = next(d for d in site if d["kind"] == "ConfigMap" and "local-config" in d["metadata"]["name"])
    stored = store.get("configmaps", "ce-k8s-system", cm_name["metadata"]["name"])
    assert "NETWORK_HOSTNAME = ce01.grid.example.edu" in stored["data"]["99-local.conf"]


def test_an_unserved_kind_is_refused_not_ignored(kubectl, site):
    """So a green apply above really means the served subset was stored, nothing silently dropped."""
    role = yaml.safe_dump(next(d for d in site if d["kind"] == "Role"))
    proc = kubectl("apply", "--server-side", "-f", "-", stdin=role, check=False)
    assert proc.returncode != 0


def _rules_from_manifests(docs: list[dict]) -> list[dict]:
    """The emulator's access rules from our Role (its namespace only) and ClusterRole (all)."""
    rules = []
    for role in find(docs, "Role"):
        for r in role["rules"]:
            rules.append({"verbs": r["verbs"], "resources": r["resources"], "apiGroups": r["apiGroups"],
                          "namespaces": [role["metadata"]["namespace"]]})
    for role in find(docs, "ClusterRole"):
        for r in role["rules"]:
            rules.append({"verbs": r["verbs"], "resources": r["resources"], "apiGroups": r["apiGroups"]})
    return rules


def test_rbac_from_the_manifests_is_enough_for_the_info_provider(rendered):
    """With the emulator enforcing exactly our RBAC, the information provider's API snapshot works,
    and what the manifests do not grant is refused with 403."""
    from ce_k8s.info.snapshot import snapshot_from_api

    rules = _rules_from_manifests(rendered["base"])
    with ApiServer.running(rules=rules, enforce_rbac=True, nodes="cpu:2x16c64g") as srv:
        # The namespace is the cluster admin's doing (base/namespaces.yaml), not the agent's.
        srv.call(srv.api.create, "namespaces", None, one(rendered["base"], "Namespace", "ce-k8s-pilots"))
        snap = snapshot_from_api(srv.kubeconfig_path, timeout=10)
        assert len(snap.nodes) == 2
        api = client.CoreV1Api(config.new_client_from_config(config_file=srv.kubeconfig_path))
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": [{"name": "c", "image": "x"}]}}
        api.create_namespaced_pod("ce-k8s-pilots", pod)
        for call in (lambda: api.create_namespaced_pod("default", pod),
                     lambda: api.read_namespaced_secret("s", "ce-k8s-pilots"),
                     lambda: api.list_namespaced_secret("ce-k8s-pilots"),
                     lambda: api.patch_node("cpu-1", {"spec": {"unschedulable": True}})):
            with pytest.raises(ApiException) as err:
                call()
            assert err.value.status == 403


# --- docs/deploy-kubernetes.md: every command shown is run here --------------------------------

COMMAND = re.compile(r"^\$ (.+)$", re.M)


def _doc_commands() -> list[str]:
    return COMMAND.findall(DOC.read_text())


def test_every_doc_command_is_classified():
    """Each `$ ` command in the deployment guide is either run against the emulator below, or is a
    render/file command run here, or is explicitly marked as needing a real cluster."""
    for cmd in _doc_commands():
        assert cmd in EMULATOR_COMMANDS or cmd.endswith("# real cluster"), f"untested doc command: {cmd}"


EMULATOR_COMMANDS = [
    "kubectl kustomize containers/k8s/overlays/example-site > ce-k8s.yaml",
    "head -c 64 /dev/urandom > POOL",
    "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=ce01.grid.example.edu "
    "-keyout hostkey.pem -out hostcert.pem",
    "kubectl apply --server-side -f ce-k8s.yaml",
    "kubectl -n ce-k8s-system create secret generic ce-k8s-signing-key --from-file=POOL=POOL "
    "--dry-run=client -o yaml | kubectl apply --server-side -f -",
    "kubectl -n ce-k8s-system create secret tls ce-k8s-hostcert --cert=hostcert.pem --key=hostkey.pem "
    "--dry-run=client -o yaml | kubectl apply --server-side -f -",
    "kubectl -n ce-k8s-system get secrets",
    "rm -f POOL hostkey.pem",
]


def test_doc_commands_run_in_order_against_the_emulator(kubectl, tmp_path):
    """The guide's commands, in its order, in a scratch directory with the repository linked in.
    `kubectl apply` of the whole rendering is run with the emulator's unserved kinds filtered out
    (UNSERVED above says why); everything else runs exactly as written."""
    assert shutil.which("openssl"), "openssl is needed to make a test host certificate"
    work = tmp_path / "work"
    work.mkdir()
    (work / "containers").symlink_to(REPO / "containers")
    documented = [c for c in _doc_commands() if not c.endswith("# real cluster")]
    assert documented == EMULATOR_COMMANDS, "the guide's order changed: update EMULATOR_COMMANDS"
    for cmd in EMULATOR_COMMANDS:
        if cmd.startswith("kubectl apply"):
            docs = [d for d in yaml.safe_load_all((work / "ce-k8s.yaml").read_text()) if d]
            served = yaml.safe_dump_all([d for d in docs if d["kind"] in _served_kinds()])
            kubectl("apply", "--server-side", "-f", "-", stdin=served, cwd=work)
            continue
        proc = subprocess.run(cmd, shell=True, cwd=work, env=kubectl.env, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, f"{cmd}: {proc.stderr}"
    store = kubectl.srv.store
    key = store.get("secrets", "ce-k8s-system", "ce-k8s-signing-key")
    assert key is not None and "POOL" in key["data"]
    tls = store.get("secrets", "ce-k8s-system", "ce-k8s-hostcert")
    assert tls["type"] == "kubernetes.io/tls" and {"tls.crt", "tls.key"} <= set(tls["data"])
    assert not (work / "POOL").exists() and not (work / "hostkey.pem").exists(), "key files are removed"
    assert kustomize("overlays/example-site") == [d for d in yaml.safe_load_all((work / "ce-k8s.yaml").read_text())
                                                  if d]
