"""Property: any attribute values give a schema-valid, sanitised pod or a PodBuildError (issue 3 "Done when").

The JSON-valued route attributes (K8sAffinity, K8sVolumes, K8sPodPatch) are fuzzed as text: their
inner Kubernetes structure is the admin's and is checked by the API server at create time
(admission-denied hold); their outer shape is checked by the builder and covered in test_builder.
"""

from __future__ import annotations

import json

import kubernetes_validate
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from podads import SPOOL, pilot_files, routed_pilot

from ce_k8s.pods.builder import build_manifests
from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.k8svalues import is_env_name, is_qualified_name
from ce_k8s.pods.names import is_dns_label, is_label_value
from ce_k8s.settings import Settings

SETTINGS = Settings(spool=SPOOL, ce_name="ce.example.edu", collector_host="ce.example.edu:9619")

any_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=40) | st.sampled_from(
    ["", " ", "\n", "'", '"', "''", "$(HOME)", "a=b", "-1", "1e400", "{}", "[]", "null", "Always", "request",
     "none", "1.5", "nvidia.com/gpu", "ok-name", "A=1 B='two words'", "x\x00y"]
)
scalar = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | any_text
value = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
    max_leaves=6,
)
FUZZED = [
    "RequestCpus", "RequestMemory", "RequestDisk", "RequestGPUs", "BatchRuntime", "maxWallTime", "WantWholeNode",
    "K8sWholeNodeCpus", "K8sWholeNodeMemory", "K8sWholeNodeGpus", "Arguments", "Args", "Environment", "Env",
    "Owner", "RouteName", "RoutedFromJobId", "K8sSourceGlobalJobId", "K8sNamespace", "K8sImage",
    "K8sImagePullPolicy", "K8sServiceAccount", "K8sAutomountToken", "K8sPriorityClass", "K8sRuntimeClass",
    "K8sNodeSelector", "K8sTolerations", "K8sLabels", "K8sAnnotations", "K8sGpuResource", "K8sCpuLimit", "K8sEnv",
    "Cmd", "TransferInput", "x509userproxy", "x509userproxysubject", "orig_AuthTokenIssuer", "Iwd", "K8sPodName",
    "K8sAttempt", "TransferExecutable", "ScitokensFile",
]
JSON_ATTRS = ["K8sAffinity", "K8sVolumes", "K8sPodPatch"]


def _no_unescaped_dollar(text: str) -> bool:
    return "$" not in text.replace("$$", "")


def check_sanitised(pod: dict) -> None:
    meta, spec = pod["metadata"], pod["spec"]
    assert is_dns_label(meta["name"]) and is_dns_label(meta["namespace"])
    for key, val in meta["labels"].items():
        assert is_qualified_name(key) and is_label_value(val)
    for key, val in meta["annotations"].items():
        assert is_qualified_name(key)
        if key.startswith("ce-k8s.htcondor.org/"):
            assert "\n" not in val and val.isprintable()
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    pilot = spec["containers"][0]
    for word in pilot["command"] + pilot["args"]:
        assert _no_unescaped_dollar(word) and "\x00" not in word
    for env in pilot["env"]:
        assert is_env_name(env["name"])
        if "value" in env:
            assert _no_unescaped_dollar(env["value"]) and "\x00" not in env["value"]
            env["value"].encode("utf-8")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(FUZZED), value, max_size=6),
    st.dictionaries(st.sampled_from(JSON_ATTRS), any_text, max_size=2),
    st.integers(min_value=0, max_value=3),
    st.booleans(),
)
def test_builder_returns_valid_pod_or_pod_build_error(fuzzed, json_attrs, attempt, with_files):
    ad = routed_pilot()
    ad.update(fuzzed)
    ad.update(json_attrs)
    try:
        built = build_manifests(ad, SETTINGS, pilot_files() if with_files else None, attempt=attempt)
    except PodBuildError as exc:
        assert exc.code and exc.message
        event(f"held: {exc.code}")
        return
    event("built")
    kubernetes_validate.validate(built.pod, "1.30", strict=True)
    if built.secret is not None:
        kubernetes_validate.validate(built.secret, "1.30", strict=True)
    check_sanitised(built.pod)
    json.dumps(built.pod)  # serialisable as the API request body


TEXT_ATTRS = ["Arguments", "Args", "Environment", "Env", "Owner", "RouteName", "x509userproxysubject",
              "orig_AuthTokenSubject", "orig_AuthTokenIssuer", "K8sSourceGlobalJobId", "RoutedFromJobId"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(TEXT_ATTRS), any_text, max_size=4),
    st.dictionaries(any_text, any_text, max_size=3),
    st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True), any_text, max_size=3),
)
def test_free_text_is_carried_safely(text_attrs, label_values, env_values):
    """Job text (args, env, owner, DNs, ids) and route label/env values: built and sanitised, or held."""
    ad = routed_pilot()
    ad.update(text_attrs)
    ad["K8sLabels"] = {f"example.org/k{i}": v for i, v in enumerate(label_values.values())}
    ad["K8sAnnotations"] = {f"example.org/k{i}": v for i, v in enumerate(label_values)}
    ad["K8sEnv"] = env_values
    try:
        built = build_manifests(ad, SETTINGS, pilot_files())
    except PodBuildError as exc:
        event(f"held: {exc.code}")
        assert exc.code in {"bad-arguments", "bad-environment", "missing-job-id", "bad-k8s-value",
                            "sandbox-path-outside-spool"}  # RoutedFromJobId names the spool dir
        return
    event("built")
    kubernetes_validate.validate(built.pod, "1.30", strict=True)
    check_sanitised(built.pod)
