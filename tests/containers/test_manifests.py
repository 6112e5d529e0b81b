"""The Kubernetes manifests under containers/k8s: schema-valid, and secure by construction.

References: htcondor-ce.md §1.2 (one port, 9619, shared_port; daemons of a CE), §1.3 (config
layout: site overrides in /etc/condor-ce/config.d/99-local.conf), htcondor-ce.md §2 (auth: signing key in
/etc/condor-ce/passwords.d/POOL, host certificate); Kubernetes pod priority and
preemption (priority, disruption); docs/design.md Decision 7 (explicit securityContext, non-root pilots, safety).
"""

from __future__ import annotations

import base64
import copy
import re

import kubernetes_validate
import pytest
import yaml
from containers_helpers import K8S, KUSTOMIZATIONS, find, one

K8S_VERSION = "1.37.0"
PILOTS = "ce-k8s-pilots"
SYSTEM = "ce-k8s-system"


def _all_yaml_files() -> list:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_every_rendered_object_validates_strictly(rendered, rel):
    """Each kustomization renders with `kubectl kustomize` and every object passes the strict
    Kubernetes schema (unknown fields are errors)."""
    docs = rendered[rel]
    assert docs, f"{rel} rendered nothing"
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_yaml_file_validates_strictly_including_examples():
    """Files not listed in a kustomization (secret.example.yaml) must still be valid objects."""
    files = _all_yaml_files()
    assert any(p.name == "secret.example.yaml" for p in files)
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_strict_validation_rejects_a_misspelt_field(site):
    """The validator is not a no-op: a typo in a container field is caught."""
    sts = copy.deepcopy(one(site, "StatefulSet", "ce-k8s-ce"))
    sts["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_pilot_namespace_enforces_restricted_pod_security(site):
    """Pilots run untrusted payloads: PSA `restricted` is enforced, not just warned (docs/design.md Decision 7)."""
    labels = one(site, "Namespace", PILOTS)["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


def test_ce_namespace_enforces_at_least_baseline(site):
    """The CE needs root + setuid capabilities (all in `baseline`), nothing beyond it."""
    labels = one(site, "Namespace", SYSTEM)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"


def test_network_policy_denies_all_ingress_and_limits_egress(rendered, site):
    """Pilots accept no connections (they reach their pool through CCB) and talk out only on DNS,
    80, 443, 9618 and 9619 in the base; a site overlay may add ports, never ingress."""
    for docs in (rendered["base"], site):
        pol = one(docs, "NetworkPolicy", "ce-k8s-pilots", PILOTS)
        spec = pol["spec"]
        assert spec["podSelector"] == {}, "must select every pod in the namespace"
        assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
        assert spec.get("ingress", []) == []
    base = one(rendered["base"], "NetworkPolicy", "ce-k8s-pilots", PILOTS)["spec"]
    ports = {(p["protocol"], p["port"]) for rule in base["egress"] for p in rule["ports"]}
    assert ports == {("UDP", 53), ("TCP", 53), ("TCP", 80), ("TCP", 443), ("TCP", 9618), ("TCP", 9619)}
    assert all("to" not in rule for rule in base["egress"]), "the listed ports go anywhere"


def test_priority_class_is_preemptible_and_never_preempts(site):
    """Pilots are opportunistic: low priority, preemptionPolicy Never (Kubernetes "Non-preempting PriorityClass")."""
    pc = one(site, "PriorityClass", "ce-k8s-pilot")
    assert pc["value"] < 0
    assert pc["preemptionPolicy"] == "Never"
    assert pc["globalDefault"] is False


def test_quota_and_limit_range_guard_the_pilot_namespace(site):
    quota = one(site, "ResourceQuota", "ce-k8s-pilots", PILOTS)["spec"]["hard"]
    assert {"pods", "requests.cpu", "requests.memory"} <= set(quota)
    assert quota["pods"] == "800", "the overlay's site size is applied"
    lr = one(site, "LimitRange", "ce-k8s-pilots", PILOTS)["spec"]["limits"][0]
    assert lr["type"] == "Container" and "max" in lr and "defaultRequest" in lr


def test_rbac_has_no_wildcards_and_no_escalation_verbs(site):
    """Least privilege: no '*' anywhere, no escalate/bind/impersonate, no access to RBAC itself."""
    for kind in ("Role", "ClusterRole"):
        for role in find(site, kind):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule.get(field, []), f"{kind} {role['metadata']['name']}: wildcard {field}"
                assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
                assert "rbac.authorization.k8s.io" not in rule["apiGroups"]
                assert "resourceNames" not in rule or rule["resourceNames"]


def test_secrets_are_only_writable_in_the_pilot_namespace(site):
    """The agent writes per-pilot Secrets; it may never read Secrets, nor touch them cluster-wide."""
    for role in find(site, "ClusterRole"):
        for rule in role["rules"]:
            assert "secrets" not in rule["resources"], "a ClusterRole must not grant Secrets"
    role = one(site, "Role", "ce-k8s-agent", PILOTS)
    secret_verbs = {v for r in role["rules"] if "secrets" in r["resources"] for v in r["verbs"]}
    assert secret_verbs and not {"get", "list", "watch"} & secret_verbs


def _ce_pod(site) -> dict:
    return one(site, "StatefulSet", "ce-k8s-ce", SYSTEM)["spec"]["template"]["spec"]


def test_ce_is_a_single_replica_statefulset_with_a_retained_spool(site):
    """The job queue lives in the spool: one replica, a PVC template mounted at /var/lib/condor-ce,
    retained when the StatefulSet is deleted or scaled (htcondor-ce.md §1.3 spool layout)."""
    sts = one(site, "StatefulSet", "ce-k8s-ce", SYSTEM)["spec"]
    assert sts["replicas"] == 1
    assert sts["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    claims = {c["metadata"]["name"]: c for c in sts["volumeClaimTemplates"]}
    assert claims["state"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claims["state"]["spec"]["resources"]["requests"]["storage"] == "100Gi"
    ce = next(c for c in _ce_pod(site)["containers"] if c["name"] == "ce")
    mounts = {m["mountPath"]: m for m in ce["volumeMounts"]}
    assert mounts["/var/lib/condor-ce"]["name"] == "state"
    assert mounts["/var/log/condor-ce"]["name"] == "state"
    volumes = {v["name"] for v in _ce_pod(site)["volumes"]}
    assert "state" not in volumes, "the spool must come from the claim template, not an emptyDir"


def test_ce_security_context_is_root_with_only_the_needed_capabilities(site):
    """HTCondor-CE needs root to switch to mapped accounts (htcondor-ce.md §2.3); everything else
    is dropped, privilege escalation is off and the root filesystem is read-only."""
    pod = _ce_pod(site)
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert "hostNetwork" not in pod and "hostPID" not in pod and "hostIPC" not in pod
    for c in pod["initContainers"] + pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["privileged"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert set(sc["capabilities"]["add"]) <= {"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"}
        assert c["resources"]["requests"], f"{c['name']} has no resource requests"
        assert "memory" in c["resources"]["limits"]
    ce = next(c for c in pod["containers"] if c["name"] == "ce")
    assert {"SETUID", "SETGID"} <= set(ce["securityContext"]["capabilities"]["add"])


def test_ce_serves_one_port_9619_through_a_load_balancer(site):
    """Every CE daemon is behind shared_port on 9619 (htcondor-ce.md §1.2): one container port,
    one Service port."""
    pod = _ce_pod(site)
    ports = [p for c in pod["containers"] for p in c.get("ports", [])]
    assert ports == [{"name": "condor", "containerPort": 9619, "protocol": "TCP"}]
    svc = one(site, "Service", "ce-k8s-ce", SYSTEM)["spec"]
    assert svc["type"] == "LoadBalancer"
    assert [(p["port"], p["targetPort"]) for p in svc["ports"]] == [(9619, "condor")]
    assert svc["externalTrafficPolicy"] == "Local"
    headless = one(site, "Service", "ce-k8s-ce-headless", SYSTEM)["spec"]
    assert headless["clusterIP"] == "None"
    assert one(site, "StatefulSet", "ce-k8s-ce", SYSTEM)["spec"]["serviceName"] == "ce-k8s-ce-headless"


def test_ce_probes_liveness_by_tcp_and_readiness_by_asking_the_schedd(site):
    """Liveness must not kill a busy CE (TCP on shared_port); readiness asks the schedd."""
    ce = next(c for c in _ce_pod(site)["containers"] if c["name"] == "ce")
    assert ce["livenessProbe"]["tcpSocket"]["port"] == "condor"
    assert ce["startupProbe"]["tcpSocket"]["port"] == "condor"
    cmd = ce["readinessProbe"]["exec"]["command"]
    assert cmd[0].endswith("condor_ce_ping") and "SCHEDD" in cmd


def test_signing_key_and_host_cert_come_from_secrets(site):
    """The IDTOKEN signing key is mounted from a Secret at /etc/condor-ce/passwords.d/POOL (never
    baked into the image, unlike the seed's pool password); the host certificate likewise."""
    pod = _ce_pod(site)
    volumes = {v["name"]: v for v in pod["volumes"]}
    ce = next(c for c in pod["containers"] if c["name"] == "ce")
    mounts = {m["mountPath"]: m for m in ce["volumeMounts"]}
    key = mounts["/etc/condor-ce/passwords.d/POOL"]
    assert volumes[key["name"]]["secret"]["secretName"] == "ce-k8s-signing-key"
    assert volumes[key["name"]]["secret"]["defaultMode"] == 0o400
    hostkey = mounts["/etc/grid-security/hostkey.pem"]
    items = {i["path"]: i for i in volumes[hostkey["name"]]["secret"]["items"]}
    assert volumes[hostkey["name"]]["secret"]["secretName"] == "ce-k8s-hostcert"
    assert items["hostkey.pem"]["mode"] == 0o400
    secret_paths = ("/etc/condor-ce/passwords.d", "/etc/grid")
    assert all(m.get("readOnly") for p, m in mounts.items() if p.startswith(secret_paths))
    prepare = next(c for c in pod["initContainers"] if c["name"] == "prepare")
    assert "--require=/etc/condor-ce/passwords.d/POOL" in prepare["command"]


def test_site_config_is_mounted_as_99_local_from_a_hashed_configmap(site):
    """Site overrides are /etc/condor-ce/config.d/99-local.conf (htcondor-ce.md §1.3); the
    ConfigMap name carries a content hash, so editing it rolls the CE pod."""
    pod = _ce_pod(site)
    ce = next(c for c in pod["containers"] if c["name"] == "ce")
    mount = next(m for m in ce["volumeMounts"] if m["mountPath"] == "/etc/condor-ce/config.d/99-local.conf")
    cm_name = next(v for v in pod["volumes"] if v["name"] == mount["name"])["configMap"]["name"]
    cm = one(site, "ConfigMap", "ce-k8s-local-config", SYSTEM)
    assert cm["metadata"]["name"] == cm_name and cm_name != "ce-k8s-local-config"
    conf = cm["data"]["99-local.conf"]
    assert re.search(r"^NETWORK_HOSTNAME = ce01\.grid\.example\.edu$", conf, re.M), "overlay's file replaced the base"
    assert re.search(r"^CE_K8S_NAMESPACE = ce-k8s-pilots$", conf, re.M)
    aliases = pod["hostAliases"][0]
    assert aliases == {"ip": "127.0.0.1", "hostnames": ["ce01.grid.example.edu"]}


def test_overlay_points_every_ce_container_at_the_site_registry(site):
    pod = _ce_pod(site)
    images = {c["image"] for c in pod["initContainers"] + pod["containers"]}
    assert images == {"registry.example.edu/grid/ce-k8s-ce:0.1.0"}


def test_no_secret_data_in_the_repository_beyond_placeholders():
    """Only secret.example.yaml may hold Secret objects, and only PLACEHOLDER values; no file under
    containers/ may contain PEM private keys or token-like blobs."""
    for path in _all_yaml_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "Secret":
                continue
            assert path.name == "secret.example.yaml", f"{path}: Secret outside the example file"
            values = list((doc.get("stringData") or {}).values())
            values += [base64.b64decode(v).decode() for v in (doc.get("data") or {}).values()]
            assert values and all(v.startswith("PLACEHOLDER") for v in values), f"{path}: real-looking data"
    pem_key = re.compile(r"-----BEGIN (?:RSA |EC |ENCRYPTED )?PRIVATE KEY-----")
    jwt = re.compile(r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.")
    for path in (K8S.parent).rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not pem_key.search(text), f"{path}: private key material"
            assert not jwt.search(text), f"{path}: token-like data"


def test_generators_never_produce_secrets(rendered):
    """Key material is created out of band; no kustomization here generates a Secret."""
    for rel, docs in rendered.items():
        assert not find(docs, "Secret"), f"{rel} renders a Secret"


def test_example_overlay_keeps_every_base_and_ce_object(rendered, site):
    """The overlay adds site settings; it must not drop a security object of the base."""
    def ids(docs):
        return {(d["kind"], d["metadata"].get("namespace"), re.sub(r"-[a-z0-9]{10}$", "", d["metadata"]["name"]))
                for d in docs}
    assert ids(rendered["base"]) | ids(rendered["ce"]) == ids(site)
