"""Routed ad → Pod + Secret, one rule per test (issue 3; htcondor-ce.md §1.5, §6; docs/design.md Decisions 1, 5-8).

Every manifest a test builds successfully is validated against the Kubernetes OpenAPI schema.
"""

from __future__ import annotations

import base64
import json

import kubernetes_validate
import pytest
from podads import GJID, pilot_files, routed_pilot

from ce_k8s.pods.builder import (
    SANDBOX_DIR,
    SCRATCH_DIR,
    BuiltPod,
    build_manifests,
    owner_reference,
    redact_secret,
)
from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.names import pod_name
from ce_k8s.settings import Settings

K8S_VERSION = "1.30"


def valid(obj: dict) -> dict:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    return obj


def build(settings: Settings, files=None, attempt: int = 0, **overrides) -> BuiltPod:
    built = build_manifests(routed_pilot(**overrides), settings, files, attempt=attempt)
    valid(built.pod)
    if built.secret is not None:
        valid(built.secret)
    return built


def fails(settings: Settings, code: str, files=None, **overrides) -> PodBuildError:
    with pytest.raises(PodBuildError) as info:
        build_manifests(routed_pilot(**overrides), settings, files)
    assert info.value.code == code, info.value
    return info.value


def main(built: BuiltPod) -> dict:
    return built.pod["spec"]["containers"][0]


def env_of(built: BuiltPod) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in main(built)["env"]}


# -- a whole GlideinWMS pilot ------------------------------------------------------------------------

def test_glideinwms_pilot_pod(settings):
    """htcondor-ce.md §6.3 pilot → a schema-valid pod with the job's name, namespace, labels and annotations."""
    built = build(settings, pilot_files())
    pod = built.pod
    assert built.name == pod["metadata"]["name"] == pod_name(GJID, 0)
    assert built.namespace == pod["metadata"]["namespace"] == "ce-k8s-pilots"
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "ce-k8s",
        "ce-k8s.htcondor.org/ce": "ce.example.edu",
        "ce-k8s.htcondor.org/route": "K8s_Pilots",
        "ce-k8s.htcondor.org/job": "1234567.3",
        "ce-k8s.htcondor.org/owner": "osg01",
        "ce-k8s.htcondor.org/attempt": "0",
    }
    notes = pod["metadata"]["annotations"]
    assert notes["ce-k8s.htcondor.org/global-job-id"] == GJID
    assert notes["ce-k8s.htcondor.org/routed-from"] == "1234567.3"
    assert notes["ce-k8s.htcondor.org/owner"] == "osg01"
    assert notes["ce-k8s.htcondor.org/credential-subject"] == "pilot-subject"
    assert notes["ce-k8s.htcondor.org/credential-issuer"] == "https://scitokens.org/osg-connect"
    assert main(built)["command"] == [f"{SANDBOX_DIR}/glidein_startup.sh"]
    assert main(built)["args"][:4] == ["-v", "std", "-name", "gfactory_instance"]
    assert main(built)["workingDir"] == SCRATCH_DIR


def test_safety_defaults(settings):
    """Decision 7: non-root, no escalation, caps dropped, RuntimeDefault, Never, no SA token."""
    built = build(settings, pilot_files())
    spec = built.pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    psc = spec["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == settings.run_as_user != 0
    assert psc["fsGroup"] == settings.run_as_group
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"] + spec["initContainers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


# -- resources ------------------------------------------------------------------------------------

def test_cpu_memory_disk(settings):
    """RequestCpus → cpu, RequestMemory MB → memory request = limit (Mi), RequestDisk KiB → ephemeral-storage."""
    res = main(build(settings, RequestCpus=8, RequestMemory=16000, RequestDisk=1048576))["resources"]
    assert res["requests"] == {"cpu": "8", "memory": "16000Mi", "ephemeral-storage": "1048576Ki"}
    assert res["limits"] == {"cpu": "8", "memory": "16000Mi"}


def test_fractional_cpus_and_limit_policy(settings):
    """K8sCpuLimit: request (limit = request), none (no limit), or a factor."""
    assert main(build(settings, RequestCpus=1.5))["resources"]["requests"]["cpu"] == "1500m"
    assert "cpu" not in main(build(settings, K8sCpuLimit="none"))["resources"]["limits"]
    assert main(build(settings, RequestCpus=4, K8sCpuLimit="1.5"))["resources"]["limits"]["cpu"] == "6"
    fails(settings, "bad-k8s-value", K8sCpuLimit="half")


def test_defaults_without_requests(settings):
    """No RequestCpus/RequestMemory: 1 core and the CE's 2000 MB default (htcondor-ce.md §1.5)."""
    res = main(build(settings, RequestCpus=None, RequestMemory=None, RequestDisk=None))["resources"]
    assert res["requests"] == {"cpu": "1", "memory": "2000Mi"}


def test_gpus(settings):
    """RequestGPUs → the GPU resource (default nvidia.com/gpu), requests = limits."""
    res = main(build(settings, RequestGPUs=2))["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "2"
    res = main(build(settings, RequestGPUs=1, K8sGpuResource="amd.com/gpu"))["resources"]
    assert res["limits"]["amd.com/gpu"] == "1" and "nvidia.com/gpu" not in res["limits"]
    assert "nvidia.com/gpu" not in main(build(settings, RequestGPUs=0))["resources"]["requests"]
    fails(settings, "bad-k8s-value", RequestGPUs=1, K8sGpuResource="gpu with spaces")


def test_whole_node(settings):
    """WantWholeNode → the route's node shape, not the job's requests."""
    res = main(build(settings, WantWholeNode=True, K8sWholeNodeCpus=64, K8sWholeNodeMemory=250000,
                     K8sWholeNodeGpus=4))["resources"]
    assert res["requests"]["cpu"] == "64" and res["requests"]["memory"] == "250000Mi"
    assert res["limits"]["nvidia.com/gpu"] == "4"
    fails(settings, "bad-whole-node", WantWholeNode=True)


@pytest.mark.parametrize(("attr", "value", "code"), [
    ("RequestCpus", -1, "bad-request-cpus"),
    ("RequestCpus", 0, "bad-request-cpus"),
    ("RequestCpus", 10**9, "bad-request-cpus"),
    ("RequestCpus", "8", "bad-request-cpus"),
    ("RequestCpus", True, "bad-request-cpus"),
    ("RequestCpus", float("nan"), "bad-request-cpus"),
    ("RequestMemory", -2000, "bad-request-memory"),
    ("RequestMemory", 10**12, "bad-request-memory"),
    ("RequestDisk", -1, "bad-request-disk"),
    ("RequestGPUs", 1.5, "bad-request-gpus"),
    ("RequestGPUs", 1000, "bad-request-gpus"),
    ("BatchRuntime", 0, "bad-walltime"),
    ("BatchRuntime", 10**12, "bad-walltime"),
])
def test_unusable_requests(settings, attr, value, code):
    """Issue 3 'Bad input': negative or absurd requests are holds with their own code."""
    fails(settings, code, **{attr: value})


def test_walltime(settings):
    """BatchRuntime (s), else maxWallTime (min), else CE_K8S_DEFAULT_WALLTIME (min) → activeDeadlineSeconds."""
    assert build(settings, BatchRuntime=7200).pod["spec"]["activeDeadlineSeconds"] == 7200
    assert build(settings, BatchRuntime=None, maxWallTime=90).pod["spec"]["activeDeadlineSeconds"] == 5400
    assert build(settings, BatchRuntime=None, maxWallTime=None).pod["spec"]["activeDeadlineSeconds"] == 4320 * 60


# -- what runs -----------------------------------------------------------------------------------

def test_arguments_exec_form_and_dollar_escaping(settings):
    """Arguments (V2) become args verbatim, never via a shell; `$` doubled against $(VAR) expansion."""
    c = main(build(settings, Arguments="-x 'two words' '$(HOME)' 'it''s' ;rm -rf /"))
    assert c["args"] == ["-x", "two words", "$$(HOME)", "it's", ";rm", "-rf", "/"]
    assert c["command"] == [f"{SANDBOX_DIR}/glidein_startup.sh"]
    assert c["command"][0] not in ("sh", "/bin/sh", "bash", "/bin/bash") and "-c" not in c["command"]


def test_old_args_syntax(settings):
    """Without Arguments, the old Args (V1, whitespace-separated) is used."""
    assert main(build(settings, Arguments=None, Args="-a  'b c'"))["args"] == ["-a", "'b", "c'"]


def test_bad_arguments(settings):
    fails(settings, "bad-arguments", Arguments="-x 'unterminated")


def test_executable_from_image(settings):
    """TransferExecutable = false: Cmd must be an absolute path inside the image."""
    c = main(build(settings, TransferExecutable=False, Cmd="/usr/local/bin/pilot"))
    assert c["command"] == ["/usr/local/bin/pilot"]
    fails(settings, "missing-executable", TransferExecutable=False, Cmd="pilot")


def test_environment_sources_and_precedence(settings):
    """Collector host < job Environment < CE_K8S_PILOT_ENV < K8sEnv < credential paths (htcondor-ce.md §1.5 Env)."""
    s = Settings(spool=settings.spool, collector_host="ce.example.edu:9619", pilot_env={"A": "site", "B": "site"})
    built = build(s, pilot_files(), Environment="A=job C=job X509_USER_PROXY=/factory/path",
                  K8sEnv={"B": "route", "D": 4})
    env = env_of(built)
    assert env["CONDORCE_COLLECTOR_HOST"] == "ce.example.edu:9619"
    assert (env["A"], env["B"], env["C"], env["D"]) == ("site", "route", "job", "4")
    assert env["X509_USER_PROXY"] == f"{SANDBOX_DIR}/x509up_u1234"
    assert env["TMPDIR"] == SCRATCH_DIR
    assert env["CE_K8S_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}


@pytest.mark.parametrize(("overrides", "seconds"), [
    ({"BatchRuntime": 5400}, 5400),
    ({"BatchRuntime": None, "maxWallTime": 90}, 5400),
])
def test_the_pods_deadline_is_in_its_environment_and_only_ours(settings, overrides, seconds):
    """CE_K8S_DEADLINE_SECONDS = activeDeadlineSeconds (the pilot retires by it, docs/pilot.md); a job's
    or a route's value of the same name does not replace it."""
    built = build(settings, Environment="CE_K8S_DEADLINE_SECONDS=99999", K8sEnv={"CE_K8S_DEADLINE_SECONDS": 1},
                  **overrides)
    assert built.pod["spec"]["activeDeadlineSeconds"] == seconds
    names = [e["name"] for e in main(built)["env"]]
    assert names.count("CE_K8S_DEADLINE_SECONDS") == 1
    assert env_of(built)["CE_K8S_DEADLINE_SECONDS"] == str(seconds)


def test_job_collector_host_and_no_collector(settings):
    """The job's own CONDORCE_COLLECTOR_HOST (from the CE's Env transform) is kept; none when disabled."""
    env = env_of(build(Settings(spool=settings.spool, collector_host="x:1"), Environment="CONDORCE_COLLECTOR_HOST=y:2"))
    assert env["CONDORCE_COLLECTOR_HOST"] == "y:2"
    env = env_of(build(Settings(spool=settings.spool, collector_host=""), Environment="A=1"))
    assert "CONDORCE_COLLECTOR_HOST" not in env


def test_old_env_and_token_file(settings):
    """Old Env (';'-separated) is read; a spooled token is named by BEARER_TOKEN_FILE."""
    env = env_of(build(settings, Environment=None, Env="A=1;B=$(x)", ScitokensFile="bearer.tok"))
    assert env["A"] == "1" and env["B"] == "$$(x)"
    assert env["BEARER_TOKEN_FILE"] == f"{SANDBOX_DIR}/bearer.tok"


@pytest.mark.parametrize("overrides", [
    {"Environment": "NOEQUALS"},
    {"Environment": "'1BAD NAME=x'"},
    {"Environment": "A=x\x00y"},
    {"K8sEnv": {"A": [1, 2]}},
])
def test_bad_environment(settings, overrides):
    err = fails(settings, "bad-environment" if "Environment" in overrides else "bad-k8s-value", **overrides)
    assert err.message


# -- sandbox Secret ----------------------------------------------------------------------------------

def test_secret_contents_and_mount(settings):
    """Decision 6: one Secret, base64 data, mounted read-only with defaultMode 0400, exe 0550."""
    built = build(settings, pilot_files())
    secret = built.secret
    assert secret["metadata"]["name"] == built.name + "-sandbox"
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "ce-k8s"
    assert base64.b64decode(secret["data"]["x509up_u1234"]) == pilot_files()["x509up_u1234"]
    vol = next(v for v in built.pod["spec"]["volumes"] if v["name"] == "sandbox")
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    assert vol["secret"]["defaultMode"] == 256
    assert {i["key"]: i["mode"] for i in vol["secret"]["items"]} == {
        "glidein_startup.sh": 0o550, "x509up_u1234": 0o400, "idtoken.tok": 0o400, "url_dirs.desc": 0o400}
    mount = next(m for m in main(built)["volumeMounts"] if m["name"] == "sandbox")
    assert mount == {"name": "sandbox", "mountPath": SANDBOX_DIR, "readOnly": True}
    assert "ln" == built.pod["spec"]["initContainers"][0]["command"][0]
    assert [i.key for i in built.sandbox] == list(secret["data"])
    # credentials never in env or spec text
    text = json.dumps(built.pod)
    assert "BEGIN CERTIFICATE" not in text and "eyJhbGciOi" not in text


def test_dry_run_and_redaction(settings):
    """files=None (ce-k8s route) shows placeholders; redact_secret hides real data but keeps sizes."""
    dry = build(settings, None)
    assert set(dry.secret["data"].values()) == {"<redacted>"}
    real = build(settings, pilot_files())
    red = redact_secret(real.secret)
    assert red["data"]["x509up_u1234"] == f"<redacted {len(pilot_files()['x509up_u1234'])} bytes>"
    assert real.secret["data"]["x509up_u1234"] != red["data"]["x509up_u1234"]  # the original is untouched
    assert redact_secret(None) is None


def test_sandbox_size_limit(settings):
    """Over CE_K8S_SECRET_MAX_BYTES in total → sandbox-too-large, not a truncated pod."""
    files = pilot_files() | {"url_dirs.desc": b"x" * (1024 * 1024)}
    err = fails(settings, "sandbox-too-large", files=files)
    assert "1048576" in err.message
    small = Settings(spool=settings.spool, secret_max_bytes=10)
    with pytest.raises(PodBuildError) as info:
        build_manifests(routed_pilot(), small, pilot_files())
    assert info.value.code == "sandbox-too-large"


def test_unread_file(settings):
    files = pilot_files()
    del files["idtoken.tok"]
    fails(settings, "sandbox-file-missing", files=files)


def test_no_sandbox_no_secret(settings):
    """Nothing to ship (image executable, no proxy, no inputs) → no Secret, no init container."""
    built = build(settings, TransferExecutable=False, Cmd="/bin/pilot", x509userproxy=None, TransferInput=None)
    assert built.secret is None and "initContainers" not in built.pod["spec"]


def test_owner_reference():
    """The agent sets this on the Secret once the pod has a uid (GC deletes the Secret with the pod)."""
    assert owner_reference("ce-1-0-a0-x", "uid-1") == {"apiVersion": "v1", "kind": "Pod", "name": "ce-1-0-a0-x",
                                                       "uid": "uid-1"}


# -- identity ------------------------------------------------------------------------------------

def test_attempts_and_hook_name(settings):
    """K8sPodName is used for its own attempt; later attempts derive from K8sSourceGlobalJobId (decision 5)."""
    assert build(settings, K8sPodName="ce-given-a0-x", K8sAttempt=0).name == "ce-given-a0-x"
    later = build(settings, attempt=2, K8sPodName="ce-given-a0-x", K8sAttempt=0)
    assert later.name == pod_name(GJID, 2)
    assert later.pod["metadata"]["labels"]["ce-k8s.htcondor.org/attempt"] == "2"
    fails(settings, "missing-job-id", K8sSourceGlobalJobId=None, GlobalJobId=None)
    fails(settings, "bad-k8s-value", K8sPodName="Not_A_Label")


def test_labels_are_sanitised_and_ours_win(settings):
    """Label values are sanitised; K8sLabels cannot override ce-k8s's identity labels."""
    built = build(settings, Owner="user@example.org", K8sLabels={"team": "a b", "app.kubernetes.io/managed-by": "x"})
    labels = built.pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "ce-k8s"
    assert labels["ce-k8s.htcondor.org/owner"].startswith("user_example.org-")
    assert labels["team"].startswith("a_b-")
    fails(settings, "bad-k8s-value", K8sLabels={"bad key!": "x"})


def test_annotations_are_single_line(settings):
    """A DN with a newline cannot inject lines into annotations."""
    built = build(settings, orig_AuthTokenSubject=None, x509userproxysubject="/CN=a\nfake: 1")
    assert built.pod["metadata"]["annotations"]["ce-k8s.htcondor.org/credential-subject"] == "/CN=a fake: 1"


# -- K8s* route attributes -------------------------------------------------------------------------

def test_route_attributes(settings):
    """Every K8s* attribute of docs/internals.md reaches the pod spec."""
    built = build(
        settings,
        K8sNamespace="cms",
        K8sImage="registry.example.org/cms/pilot@sha256:" + "a" * 64,
        K8sImagePullPolicy="Always",
        K8sServiceAccount="cms-pilot",
        K8sPriorityClass="pilot-high",
        K8sRuntimeClass="gvisor",
        K8sNodeSelector={"node.kubernetes.io/pool": "cpu", "zone": "a"},
        K8sTolerations=[{"key": "dedicated", "operator": "Equal", "value": "pilots", "effect": "NoSchedule"},
                        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}],
        K8sAffinity=json.dumps({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]}}}),
        K8sAnnotations={"example.org/ticket": "CE-42"},
        K8sVolumes=json.dumps({"volumes": [{"name": "cvmfs", "hostPath": {"path": "/cvmfs", "type": "Directory"}}],
                               "volumeMounts": [{"name": "cvmfs", "mountPath": "/cvmfs", "readOnly": True}]}),
    )
    spec = built.pod["spec"]
    assert built.namespace == "cms" and built.pod["metadata"]["namespace"] == "cms"
    assert main(built)["imagePullPolicy"] == "Always"
    assert spec["serviceAccountName"] == "cms-pilot" and spec["automountServiceAccountToken"] is True
    assert spec["priorityClassName"] == "pilot-high" and spec["runtimeClassName"] == "gvisor"
    assert spec["nodeSelector"] == {"node.kubernetes.io/pool": "cpu", "zone": "a"}
    assert spec["tolerations"][1] == {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
    assert "nodeAffinity" in spec["affinity"]
    assert built.pod["metadata"]["annotations"]["example.org/ticket"] == "CE-42"
    assert {"name": "cvmfs", "mountPath": "/cvmfs", "readOnly": True} in main(built)["volumeMounts"]
    assert built.secret["metadata"]["namespace"] == "cms"


def test_service_account_without_token(settings):
    built = build(settings, K8sServiceAccount="sa", K8sAutomountToken=False)
    assert built.pod["spec"]["automountServiceAccountToken"] is False


def test_image_from_settings_and_missing(settings):
    s = Settings(spool=settings.spool, image="site/pilot:1")
    assert main(build(s, K8sImage=None))["image"] == "site/pilot:1"
    fails(settings, "missing-image", K8sImage=None)
    fails(settings, "bad-image", K8sImage="bad image")


@pytest.mark.parametrize("overrides", [
    {"K8sNamespace": "Bad_Namespace"},
    {"K8sNamespace": 42},
    {"K8sImagePullPolicy": "Sometimes"},
    {"K8sServiceAccount": "no spaces allowed"},
    {"K8sPriorityClass": "UPPER"},
    {"K8sNodeSelector": "pool=cpu"},
    {"K8sNodeSelector": {"pool": "not a label value"}},
    {"K8sTolerations": [{"key": "k", "effect": "Sometimes"}]},
    {"K8sTolerations": [{"key": "k", "color": "red"}]},
    {"K8sTolerations": [{"operator": "Equal"}]},
    {"K8sTolerations": "not a list"},
    {"K8sAffinity": "{not json"},
    {"K8sAffinity": json.dumps({"nodeAfinity": {}})},
    {"K8sVolumes": json.dumps({"volumes": [{"name": "sandbox", "emptyDir": {}}]})},
    {"K8sVolumes": json.dumps({"volumes": [{"name": "v", "emptyDir": {}}],
                               "volumeMounts": [{"name": "v", "mountPath": "/ce-k8s/sandbox"}]})},
    {"K8sVolumes": json.dumps({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]})},
    {"K8sVolumes": "[]"},
    {"K8sAutomountToken": "yes"},
    {"K8sAnnotations": {"ok": ["list"]}},
])
def test_unusable_k8s_values(settings, overrides):
    """Issue 3: unparsable or invalid K8s* values are bad-k8s-value holds naming the attribute."""
    err = fails(settings, "bad-k8s-value", **overrides)
    assert next(iter(overrides)) in err.message or "K8s" in err.message


# -- K8sPodPatch -------------------------------------------------------------------------------------

def test_patch_is_applied_last(settings):
    """K8sPodPatch (RFC 6902) edits the finished pod."""
    patch = [{"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": 300},
             {"op": "add", "path": "/metadata/annotations/example.org~1x", "value": "y"},
             {"op": "add", "path": "/spec/containers/0/securityContext/readOnlyRootFilesystem", "value": True}]
    built = build(settings, K8sPodPatch=json.dumps(patch))
    assert built.pod["spec"]["terminationGracePeriodSeconds"] == 300
    assert built.pod["metadata"]["annotations"]["example.org/x"] == "y"
    assert main(built)["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("patch", [
    "not json",
    json.dumps({"op": "add"}),
    json.dumps([{"op": "remove", "path": "/spec/nope"}]),
    json.dumps([{"op": "test", "path": "/kind", "value": "Deployment"}]),
    json.dumps([{"op": "replace", "path": "/metadata/name", "value": "other"}]),
    json.dumps([{"op": "remove", "path": "/metadata/labels/app.kubernetes.io~1managed-by"}]),
    json.dumps([{"op": "remove", "path": "/spec/containers/0"}]),
    json.dumps([{"op": "bogus", "path": "/spec"}]),
])
def test_patch_failures(settings, patch):
    fails(settings, "patch-failed", K8sPodPatch=patch)


@pytest.mark.parametrize("ops", [
    [{"op": "replace", "path": "/spec/containers/0/securityContext/privileged", "value": True}],
    [{"op": "replace", "path": "/spec/containers/0/securityContext/allowPrivilegeEscalation", "value": True}],
    [{"op": "remove", "path": "/spec/containers/0/securityContext/capabilities"}],
    [{"op": "add", "path": "/spec/containers/0/securityContext/capabilities/add", "value": ["SYS_ADMIN"]}],
    [{"op": "remove", "path": "/spec/securityContext"}],
    [{"op": "add", "path": "/spec/securityContext/runAsUser", "value": 0}],
    [{"op": "replace", "path": "/spec/securityContext/seccompProfile/type", "value": "Unconfined"}],
    [{"op": "add", "path": "/spec/hostNetwork", "value": True}],
    # A port on the node's address: PodSecurity baseline forbids it (tests/real/test_lifecycle.py).
    [{"op": "add", "path": "/spec/containers/0/ports", "value": [{"containerPort": 8080, "hostPort": 8080}]}],
    [{"op": "replace", "path": "/spec/restartPolicy", "value": "Always"}],
    [{"op": "replace", "path": "/spec/automountServiceAccountToken", "value": True}],
    [{"op": "add", "path": "/spec/volumes/-", "value": {"name": "root", "hostPath": {"path": "/"}}}],
    [{"op": "add", "path": "/spec/containers/-", "value": {"name": "sidecar", "image": "busybox"}}],
])
def test_patch_may_not_weaken_security(settings, ops):
    """Issue 3 'Safety': anything looser only through explicit route attributes, never the patch."""
    err = fails(settings, "patch-weakens-security", K8sPodPatch=json.dumps(ops))
    assert "allow" in err.message


def test_explicit_route_attributes_are_the_baseline(settings):
    """A hostPath volume from K8sVolumes is allowed, and a patch that leaves it alone passes."""
    vols = json.dumps({"volumes": [{"name": "cvmfs", "hostPath": {"path": "/cvmfs"}}],
                       "volumeMounts": [{"name": "cvmfs", "mountPath": "/cvmfs", "readOnly": True}]})
    patch = json.dumps([{"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": 60}])
    built = build(settings, K8sVolumes=vols, K8sPodPatch=patch)
    assert any("hostPath" in v for v in built.pod["spec"]["volumes"])


# -- typed reads ------------------------------------------------------------------------------------

def test_attempt_argument_checked(settings):
    with pytest.raises(PodBuildError):
        build_manifests(routed_pilot(), settings, attempt=-1)


