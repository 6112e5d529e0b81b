"""The HTCJob CRD and operator on the real kube-apiserver, the operator holding only the rights
containers/k8s/htcjob/rbac.yaml gives its ServiceAccount (a TokenRequest token, never admin).

The schedd here is tests/htcjob/fakeschedd.py, so that faults (a cut upload, a schedd that is
down) and job states come on demand; the real schedd with a real startd judges the HTCondor side
in tests/real/test_htcjob_condor.py. What is judged here is the Kubernetes side: the schema's
refusals, printer columns, the finalizer, status through the status subresource, output
ConfigMaps owned by the resource and collected by the real garbage collector, and the rights.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from htcjob.fakeschedd import FakeSchedd

from ce_k8s.htcjob.jobstate import RUNNING
from ce_k8s.htcjob.operator import Operator
from ce_k8s.htcjob.reconcile import FINALIZER, GROUP, PLURAL, VERSION
from ce_k8s.htcjob.spec import Target

from .conftest import wait_for

pytestmark = pytest.mark.slow

MANIFESTS = Path(__file__).resolve().parents[2] / "containers" / "k8s" / "htcjob"
OPERATOR_SA = ("ce-k8s-system", "ce-k8s-htcjob-operator")


@pytest.fixture(scope="module")
def htcjob_crd(real_kube):
    """The CRD, the example namespace and the operator's RBAC, applied as a site would."""
    for name in ("crd.yaml", "namespace.yaml", "rbac.yaml"):
        real_kube.kubectl("apply", "--server-side", "-f", str(MANIFESTS / name))
    real_kube.kubectl("wait", "--for=condition=Established", "crd/htcjobs.ce-k8s.io", "--timeout=60s")
    return real_kube


@pytest.fixture(scope="module")
def operator_kubeconfig(htcjob_crd, tmp_path_factory):
    path = tmp_path_factory.mktemp("htcjob") / "operator.kubeconfig"
    return htcjob_crd.service_account_kubeconfig(*OPERATOR_SA, path)


@pytest.fixture
def user_ns(htcjob_crd, admin_core, request):
    """A user namespace with the operator's RoleBinding copied in, as the site does per namespace."""
    name = f"htc-{request.node.name.lower().replace('_', '-')[5:28].strip('-')}-{os.urandom(2).hex()}"
    htcjob_crd.kubectl("create", "namespace", name)
    htcjob_crd.kubectl("create", "rolebinding", "ce-k8s-htcjob-operator", "-n", name,
                       "--clusterrole=ce-k8s-htcjob-operator-namespace",
                       f"--serviceaccount={OPERATOR_SA[0]}:{OPERATOR_SA[1]}")
    yield name
    # Each test's operator (and its fake schedd) is gone by now: drop the finalizers it left, as
    # a site abandons jobs on purpose, so that the namespace can go.
    listed = json.loads(htcjob_crd.kubectl("get", "htcjobs", "-n", name, "-o", "json").stdout)
    for item in listed["items"]:
        htcjob_crd.kubectl("patch", "htcjob", item["metadata"]["name"], "-n", name, "--type=merge",
                           "-p", '{"metadata":{"finalizers":null}}', check=False)
    admin_core.delete_namespace(name)


@pytest.fixture
def custom(admin_client):
    from kubernetes import client

    return client.CustomObjectsApi(admin_client)


@contextlib.contextmanager
def running_operator(kubeconfig: Path, namespace: str, schedd: FakeSchedd, poll: float = 0.3,
                     work: Path | None = None, **kw):
    """The operator in a thread on its own ServiceAccount's kubeconfig, with `schedd` as every target.
    `work` (emptied at the end, as a pod's emptyDir is lost with the pod) is its working directory,
    the same path in every run as in the Deployment."""
    from kubernetes.config import new_client_from_config

    api = new_client_from_config(config_file=str(kubeconfig))
    work = work or Path(tempfile.mkdtemp(prefix="htcjob-work-"))
    op = Operator(api, namespace=namespace, default_target=Target(schedd="site"), default_token=None,
                  work_root=work / "work", claims_root=work / "claims", poll=poll,
                  schedd_factory=lambda *key: schedd, **kw)
    thread = threading.Thread(target=op.run, daemon=True)
    thread.start()
    try:
        yield op
    finally:
        op.stop.set()
        thread.join(timeout=15)
        api.close()
        shutil.rmtree(work, ignore_errors=True)
    assert not thread.is_alive(), "the operator did not stop"


def htcjob(name: str, **spec) -> dict:
    if "command" not in spec:
        spec.setdefault("script", {"source": "#!/bin/sh\necho proc $1\n"})
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HTCJob", "metadata": {"name": name}, "spec": spec}


def create(custom, ns: str, body: dict) -> dict:
    return custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def get(custom, ns: str, name: str) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def absent(custom, ns: str, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        get(custom, ns, name)
    except ApiException as exc:
        return exc.status == 404
    return False


def status_of(custom, ns, name) -> dict:
    return get(custom, ns, name).get("status") or {}


def cond(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


# ------------------------------------------------------------------------------------- schema


def test_the_schema_refuses_bad_specs_at_apply(htcjob_crd, user_ns, tmp_path):
    cases = {
        "neither command nor script": {"queue": 1},
        "both": {"command": ["/bin/true"], "script": {"source": "#!/bin/sh\n"}},
        "queue 0": {"command": ["/bin/true"], "queue": 0},
        "a script without #!": {"script": {"source": "echo hi"}},
        "memory not a quantity": {"command": ["/bin/true"], "resources": {"memory": "lots"}},
        "reserved submit key": {"command": ["/bin/true"], "submit": {"Executable": "/bin/sh"}},
        "operator attribute": {"command": ["/bin/true"], "submit": {"+HTCJobUid": '"x"'}},
        "remote target without token": {"command": ["/bin/true"], "target": {"collector": "cm:9618"}},
        "claim path escaping": {"command": ["/bin/true"], "output": {"pvc": {"claimName": "c", "path": "a/../b"}}},
        "env value with a newline": {"command": ["/bin/true"], "env": [{"name": "A", "value": "x\ny"}]},
    }
    for what, spec in cases.items():
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**htcjob("bad", **spec), "metadata": {"name": "bad", "namespace": user_ns}}
                                   if "script" in spec or "command" in spec else
                                   {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HTCJob",
                                    "metadata": {"name": "bad", "namespace": user_ns}, "spec": spec}))
        proc = htcjob_crd.kubectl("apply", "-f", str(path), check=False)
        assert proc.returncode != 0, f"{what}: accepted"
        assert "is invalid" in proc.stderr, f"{what}: {proc.stderr}"
    assert htcjob_crd.kubectl("get", "htcjobs", "-n", user_ns, "-o", "name").stdout.strip() == ""


def test_a_script_without_an_interpreter_line_needs_an_interpreter(htcjob_crd, user_ns, custom):
    created = create(custom, user_ns, htcjob("interp", script={"source": "echo A", "interpreter": ["bash"]}))
    assert created["spec"]["script"]["interpreter"] == ["bash"] and created["spec"]["queue"] == 1


def test_the_spec_cannot_change_once_created(htcjob_crd, user_ns, custom):
    create(custom, user_ns, htcjob("fixed", command=["/bin/echo", "a"]))
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(GROUP, VERSION, user_ns, PLURAL, "fixed",
                                              {"spec": {"command": ["/bin/echo", "b"]}})
    assert err.value.status == 422 and "cannot change once submitted" in err.value.body


def test_the_whole_kustomization_is_admitted_as_shipped(htcjob_crd, tmp_path):
    """`kubectl apply -k containers/k8s/htcjob` as a site runs it, judged by the real API server's
    admission (a server-side dry run); and the operator's pod passes the `restricted` Pod Security
    level (ce-k8s-system is `baseline` for the CE's own pod, so the Deployment is also tried in a
    namespace that enforces `restricted`: a pod it would refuse makes the API server warn)."""
    import yaml

    proc = htcjob_crd.kubectl("apply", "--server-side", "-k", str(MANIFESTS), "--dry-run=server", check=False)
    assert proc.returncode == 0, proc.stderr
    assert "deployment.apps/ce-k8s-htcjob-operator" in proc.stdout
    ns = f"restricted-{os.urandom(3).hex()}"
    htcjob_crd.kubectl("create", "namespace", ns)
    try:
        htcjob_crd.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
                           "pod-security.kubernetes.io/warn=restricted")
        deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
        deployment["metadata"]["namespace"] = ns
        deployment["spec"]["template"]["spec"]["serviceAccountName"] = "default"
        path = tmp_path / "deployment.json"
        path.write_text(json.dumps(deployment))
        proc = htcjob_crd.kubectl("apply", "-f", str(path), "--dry-run=server", check=False)
        assert proc.returncode == 0 and "PodSecurity" not in proc.stderr, proc.stderr
        # The judge can refuse: the same pod with root allowed is warned about.
        deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = False
        path.write_text(json.dumps(deployment))
        proc = htcjob_crd.kubectl("apply", "-f", str(path), "--dry-run=server", check=False)
        assert 'violate PodSecurity "restricted' in proc.stderr, proc.stderr
    finally:
        htcjob_crd.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# ------------------------------------------------------------------------------------- rights


def test_the_operator_holds_only_its_grants(operator_kubeconfig, user_ns):
    from kubernetes import client
    from kubernetes.config import new_client_from_config

    api = new_client_from_config(config_file=str(operator_kubeconfig))
    authz = client.AuthorizationV1Api(api)

    def can(verb, resource, namespace=None, group="", sub=None):
        review = {"spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group,
                                                  "namespace": namespace, "subresource": sub}}}
        return authz.create_self_subject_access_review(review).status.allowed

    try:
        assert can("watch", "htcjobs", group=GROUP)
        assert can("patch", "htcjobs", user_ns, GROUP, "status")
        assert can("get", "secrets", user_ns) and can("create", "configmaps", user_ns)
        assert not can("create", "htcjobs", user_ns, GROUP)      # it never makes a user's resource
        assert not can("delete", "htcjobs", user_ns, GROUP)
        assert not can("update", "htcjobs", user_ns, GROUP)      # no spec rewrite
        assert not can("list", "secrets", user_ns)               # learns no Secret name it was not given
        assert not can("get", "secrets", "default")              # only where the site bound it
        assert not can("get", "secrets", "ce-k8s-system")
        assert not can("create", "pods", user_ns)
    finally:
        api.close()


# ------------------------------------------------------------------------------------- lifecycle


def test_queue_3_submitted_once_completes_with_exit_codes_and_output(operator_kubeconfig, user_ns, custom,
                                                                      htcjob_crd):
    schedd = FakeSchedd()
    create(custom, user_ns, htcjob("three", queue=3, env=[{"name": "GREETING", "value": "a $b 'c'"}]))
    with running_operator(operator_kubeconfig, user_ns, schedd):
        st = wait_for(lambda: (s := status_of(custom, user_ns, "three")).get("jobId") and s, what="submitted")
        assert st["phase"] == "Submitted" and st["submitted"] == 3 and st["schedd"] == "fake@test"
        assert FINALIZER in get(custom, user_ns, "three")["metadata"]["finalizers"]
        cluster = int(st["jobId"])
        desc = schedd.descriptions[cluster]
        assert desc["MY.HTCJobUid"].strip('"') == get(custom, user_ns, "three")["metadata"]["uid"]
        schedd.start(cluster, 0)
        wait_for(lambda: status_of(custom, user_ns, "three").get("running") == 1, what="running 1")
        assert status_of(custom, user_ns, "three")["phase"] == "Running"
        assert cond(status_of(custom, user_ns, "three"), "Running")["status"] == "True"
        for proc, code in ((0, 0), (1, 0), (2, 3)):
            schedd.start(cluster, proc) if proc else None
            schedd.finish(cluster, proc, code, stdout=f"out {proc}\n", stderr=f"err {proc}\n",
                          files={"result.txt": f"r{proc}"})
        st = wait_for(lambda: (s := status_of(custom, user_ns, "three")).get("phase") == "Failed" and s,
                      what="finished")
        assert (st["succeeded"], st["failed"], st["idle"], st["running"]) == (2, 1, 0, 0)
        assert [(p["proc"], p["exitCode"]) for p in st["procs"]] == [(0, 0), (1, 0), (2, 3)]
        assert cond(st, "Failed")["status"] == "True" and cond(st, "Completed")["status"] == "False"
        assert st["output"] == {"configMap": "three-output", "delivered": True, "truncated": False}
        assert schedd.submits == 1
        assert not schedd.queue, "the delivered jobs were not let go (LeaveJobInQueue)"
    cm = htcjob_crd.kubectl("get", "configmap", "three-output", "-n", user_ns, "-o", "json").stdout
    cm = json.loads(cm)
    assert cm["data"]["2.stdout"] == "out 2\n" and cm["data"]["0.stderr"] == "err 0\n"
    assert cm["data"]["1.result.txt"] == "r1"
    assert cm["metadata"]["ownerReferences"][0]["name"] == "three"
    table = htcjob_crd.kubectl("get", "htcjobs", "three", "-n", user_ns).stdout.split("\n")
    assert table[0].split()[:8] == ["NAME", "PHASE", "QUEUE", "IDLE", "RUNNING", "HELD", "SUCCEEDED", "FAILED"]
    assert table[1].split()[:8] == ["three", "Failed", "3", "0", "0", "0", "2", "1"]


def test_a_held_job_shows_its_reason(operator_kubeconfig, user_ns, custom):
    schedd = FakeSchedd()
    create(custom, user_ns, htcjob("held"))
    with running_operator(operator_kubeconfig, user_ns, schedd):
        cluster = int(wait_for(lambda: status_of(custom, user_ns, "held").get("jobId"), what="submitted"))
        schedd.hold(cluster, 0, "Error from slot1: failed to execute /x", 6)
        st = wait_for(lambda: (s := status_of(custom, user_ns, "held")).get("phase") == "Held" and s, what="held")
        assert st["held"] == 1 and st["procs"][0]["holdReasonCode"] == 6
        assert "failed to execute" in cond(st, "Held")["message"] and "failed to execute" in st["message"]


def test_deletion_removes_the_jobs_before_the_resource_goes(operator_kubeconfig, user_ns, custom):
    schedd = FakeSchedd()
    create(custom, user_ns, htcjob("gone", queue=2))
    with running_operator(operator_kubeconfig, user_ns, schedd):
        cluster = int(wait_for(lambda: status_of(custom, user_ns, "gone").get("jobId"), what="submitted"))
        schedd.start(cluster, 0)
        custom.delete_namespaced_custom_object(GROUP, VERSION, user_ns, PLURAL, "gone")
        wait_for(lambda: absent(custom, user_ns, "gone"), what="the resource to go")
    assert not schedd.queue
    assert sorted(ad["ProcId"] for ad in schedd.history) == [0, 1]
    assert all("was deleted" in ad["RemoveReason"] for ad in schedd.history)


def test_a_deleted_resource_waits_for_a_schedd_that_is_down(operator_kubeconfig, user_ns, custom):
    schedd = FakeSchedd()
    create(custom, user_ns, htcjob("waits"))
    with running_operator(operator_kubeconfig, user_ns, schedd):
        cluster = int(wait_for(lambda: status_of(custom, user_ns, "waits").get("jobId"), what="submitted"))
        schedd.start(cluster, 0)
        schedd.unreachable = True
        custom.delete_namespaced_custom_object(GROUP, VERSION, user_ns, PLURAL, "waits")
        wait_for(lambda: cond(status_of(custom, user_ns, "waits"), "ScheddReachable").get("status") == "False",
                 what="ScheddReachable=False")
        assert schedd.queue[(cluster, 0)]["JobStatus"] == RUNNING    # not forgotten: still there
        schedd.unreachable = False
        wait_for(lambda: absent(custom, user_ns, "waits"), what="the resource to go once the schedd is back")
    assert not schedd.queue


def test_an_operator_restart_never_submits_twice(operator_kubeconfig, user_ns, custom):
    schedd = FakeSchedd()
    create(custom, user_ns, htcjob("restart", queue=3))
    work = Path(tempfile.mkdtemp(prefix="htcjob-work-"))
    with running_operator(operator_kubeconfig, user_ns, schedd, work=work):
        cluster = int(wait_for(lambda: status_of(custom, user_ns, "restart").get("jobId"), what="submitted"))
    # While no operator runs, the jobs move on.
    for proc in range(3):
        schedd.start(cluster, proc)
    schedd.finish(cluster, 0, 0, stdout="zero\n")
    assert not work.exists(), "the first operator's working directory outlived it"
    with running_operator(operator_kubeconfig, user_ns, schedd, work=work) as op:
        st = wait_for(lambda: (s := status_of(custom, user_ns, "restart")).get("running") == 2 and s,
                      what="status caught up")
        assert st["procs"][0]["state"] == "Completed" and schedd.submits == 1
        for proc in (1, 2):
            schedd.finish(cluster, proc, 0)
        wait_for(lambda: status_of(custom, user_ns, "restart").get("phase") == "Completed", what="completed")
        assert op.passes > 0
    assert schedd.submits == 1


def test_status_lost_after_submit_is_found_in_the_queue(operator_kubeconfig, user_ns, custom):
    """The pass submits, then dies before writing the status: the next finds the jobs by uid."""
    schedd = FakeSchedd()
    create(custom, user_ns, htcjob("lost-status", queue=2))
    with running_operator(operator_kubeconfig, user_ns, schedd) as op:
        real_patch = op.kube.patch_status
        broke = threading.Event()

        def patch_fails_after_submit(ns, name, status, resource_version):
            if schedd.submits and not broke.is_set():
                broke.set()
                raise RuntimeError("operator killed here")
            return real_patch(ns, name, status, resource_version)
        op.kube.patch_status = patch_fails_after_submit
        wait_for(broke.is_set, what="the cut")
        st = wait_for(lambda: (s := status_of(custom, user_ns, "lost-status")).get("jobId") and s, what="adopted")
        assert st["jobId"] == "1" and schedd.submits == 1


def test_a_cut_upload_is_abandoned_and_submitted_again_without_running(operator_kubeconfig, user_ns, custom):
    schedd = FakeSchedd()
    schedd.cut_next_upload = True
    create(custom, user_ns, htcjob("cut"))
    with running_operator(operator_kubeconfig, user_ns, schedd, upload_grace=0.5):
        # Held for its input, the first cluster is adopted until it is old enough to be given up.
        wait_for(lambda: status_of(custom, user_ns, "cut").get("jobId") == "2", what="resubmitted")
        assert schedd.submits == 2
    first = [ad for ad in schedd.history if ad["ClusterId"] == 1]
    assert first and all(ad["HTCJobAbandoned"] is True and ad["NumJobStarts"] == 0 for ad in first)


def test_a_refused_submit_description_is_invalid_not_retried(operator_kubeconfig, user_ns, custom):
    schedd = FakeSchedd()
    create(custom, user_ns, htcjob("refused", submit={"requirements": "(("}))
    with running_operator(operator_kubeconfig, user_ns, schedd) as op:
        st = wait_for(lambda: (s := status_of(custom, user_ns, "refused")).get("phase") == "Invalid" and s,
                      what="Invalid")
        assert cond(st, "SpecValid")["reason"] == "SubmitRefused" and "requirements" in st["message"]
        passes = op.passes
        create(custom, user_ns, htcjob("after"))       # the operator goes on with others
        wait_for(lambda: status_of(custom, user_ns, "after").get("jobId"), what="the next one")
        assert op.passes <= passes + 4                 # the refused one is not tried again and again
    assert schedd.submits == 1


def test_inputs_and_token_are_read_from_the_namespace(operator_kubeconfig, user_ns, custom, admin_core):
    schedd = FakeSchedd()
    create(custom, user_ns, htcjob("needs-input", input=[{"configMap": "params"}]))
    with running_operator(operator_kubeconfig, user_ns, schedd):
        st = wait_for(lambda: (s := status_of(custom, user_ns, "needs-input")).get("conditions") and
                      cond(s, "ScheddReachable").get("reason") == "TargetNotReady" and s, what="condition")
        assert "input configMap 'params' not found" in st["message"] and schedd.submits == 0
        admin_core.create_namespaced_config_map(user_ns, {"metadata": {"name": "params"},
                                                          "data": {"params.json": '{"n": 1}'}})
        cluster = int(wait_for(lambda: status_of(custom, user_ns, "needs-input").get("jobId"), what="submitted"))
        assert schedd.descriptions[cluster]["transfer_input_files"].endswith("/in/params.json")
    create(custom, user_ns, htcjob("remote", target={"collector": "cm.example:9618", "schedd": "s",
                                                      "tokenSecret": {"name": "tok"}}))
    with running_operator(operator_kubeconfig, user_ns, schedd):
        wait_for(lambda: "token Secret 'tok' not found" in status_of(custom, user_ns, "remote").get("message", ""),
                 what="token condition")
        admin_core.create_namespaced_secret(user_ns, {"metadata": {"name": "tok"},
                                                      "data": {"token": base64.b64encode(b"eyJ.x.y").decode()}})
        wait_for(lambda: status_of(custom, user_ns, "remote").get("jobId"), what="submitted remotely")


def test_a_finished_htcjob_goes_even_when_its_token_secret_went_first(operator_kubeconfig, user_ns, custom,
                                                                     admin_core):
    """Deleting a namespace deletes the token Secret too, in no set order: a finished HTCJob has
    nothing left in the schedd, so its finalizer must not wait for a schedd it can no longer reach."""
    schedd = FakeSchedd()
    admin_core.create_namespaced_secret(user_ns, {"metadata": {"name": "tok"},
                                                  "data": {"token": base64.b64encode(b"eyJ.x.y").decode()}})
    create(custom, user_ns, htcjob("finished", target={"collector": "cm.example:9618", "schedd": "s",
                                                        "tokenSecret": {"name": "tok"}}))
    with running_operator(operator_kubeconfig, user_ns, schedd):
        cluster = int(wait_for(lambda: status_of(custom, user_ns, "finished").get("jobId"), what="submitted"))
        schedd.start(cluster, 0)
        schedd.finish(cluster, 0, 0, stdout="ok\n")
        wait_for(lambda: status_of(custom, user_ns, "finished").get("phase") == "Completed", what="completed")
        admin_core.delete_namespaced_secret("tok", user_ns)
        schedd.unreachable = True           # and nothing to ask it anyway
        custom.delete_namespaced_custom_object(GROUP, VERSION, user_ns, PLURAL, "finished")
        wait_for(lambda: absent(custom, user_ns, "finished"), what="the finished resource to go")


def test_output_never_overwrites_a_configmap_the_htcjob_does_not_own(operator_kubeconfig, user_ns, custom,
                                                                     admin_core):
    admin_core.create_namespaced_config_map(user_ns, {"metadata": {"name": "mine-output"},
                                                      "data": {"notes": "the user's own"}})
    schedd = FakeSchedd()
    create(custom, user_ns, htcjob("mine"))
    with running_operator(operator_kubeconfig, user_ns, schedd):
        cluster = int(wait_for(lambda: status_of(custom, user_ns, "mine").get("jobId"), what="submitted"))
        schedd.start(cluster, 0)
        schedd.finish(cluster, 0, 0, stdout="out\n")
        st = wait_for(lambda: (s := status_of(custom, user_ns, "mine")) and
                      cond(s, "OutputDelivered").get("reason") == "OutputFailed" and s, what="the refusal")
        assert "is not this HTCJob's" in cond(st, "OutputDelivered")["message"]
        assert "is not this HTCJob's" in st["message"]       # the one line `kubectl get -o wide` shows
    assert admin_core.read_namespaced_config_map("mine-output", user_ns).data == {"notes": "the user's own"}
