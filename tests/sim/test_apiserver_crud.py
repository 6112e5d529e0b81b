"""The API emulator against the official client: create/read/update/patch/delete semantics.

Each rule is one kmock gets wrong or lacks (docs/design.md "kmock 0.8, measured") and issue 4 item 1
requires; the expected answers are the real kube-apiserver's (Kubernetes API concepts,
kubernetes.io/docs/reference/using-api/api-concepts/).
"""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from ce_k8s.sim.kube.selectors import SelectorError, labels_match, parse_label_selector


def body_of(e: ApiException) -> dict:
    return json.loads(e.body)


def test_create_answers_201_and_stamps_metadata(core, api_only, pod_body):
    """kmock answers 200 and stamps no uid/resourceVersion/creationTimestamp/namespace."""
    _, code, _ = core.create_namespaced_pod_with_http_info("default", pod_body("p1"))
    assert code == 201
    p = core.read_namespaced_pod("p1", "default")
    assert p.metadata.uid and p.metadata.creation_timestamp and p.metadata.namespace == "default"
    assert p.kind == "Pod" and p.api_version == "v1"
    # Defaults the real server applies: phase Pending, restartPolicy kept, default tolerations, qos.
    assert p.status.phase == "Pending" and p.status.qos_class == "BestEffort"
    assert {t.key for t in p.spec.tolerations} >= {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert p.spec.containers[0].image_pull_policy == "IfNotPresent"


def test_resource_version_is_monotonic_per_write(core, pod_body):
    """resourceVersion must exist and grow with every write (etcd revision)."""
    rv1 = int(core.create_namespaced_pod("default", pod_body("p1")).metadata.resource_version)
    patched = core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"a": "b"}}})
    rv2 = int(patched.metadata.resource_version)
    rv3 = int(core.create_namespaced_secret("default", {"metadata": {"name": "s"}}).metadata.resource_version)
    assert rv1 < rv2 < rv3
    listed = core.list_namespaced_pod("default")
    assert int(listed.metadata.resource_version) >= rv3


def test_duplicate_create_is_409_already_exists(core, pod_body):
    core.create_namespaced_pod("default", pod_body("p1"))
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", pod_body("p1"))
    assert e.value.status == 409
    st = body_of(e.value)
    assert st["reason"] == "AlreadyExists" and st["message"] == 'pods "p1" already exists'


def test_missing_object_is_404_not_found(core):
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod("nope", "default")
    assert e.value.status == 404 and body_of(e.value)["message"] == 'pods "nope" not found'
    with pytest.raises(ApiException) as e:
        core.delete_namespaced_secret("nope", "default")
    assert e.value.status == 404


def test_bad_name_is_422_invalid_with_field_cause(core, pod_body):
    """Issue 4 item 1: 422 Invalid for a bad name, with the real RFC 1123 message and cause."""
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", pod_body("Bad_Name"))
    st = body_of(e.value)
    assert e.value.status == 422 and st["reason"] == "Invalid"
    assert st["message"].startswith('Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": '
                                    "a lowercase RFC 1123 subdomain")
    assert st["details"]["causes"][0]["field"] == "metadata.name"


def test_invalid_label_value_and_pod_spec_are_422(core, pod_body):
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", pod_body("p", labels={"a": "x" * 64}))
    assert e.value.status == 422 and "must be no more than 63 characters" in body_of(e.value)["message"]
    bad = pod_body("p2")
    bad["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", bad)
    assert "must be less than or equal to cpu limit of 1" in body_of(e.value)["message"]


@pytest.mark.parametrize(("memory", "said"), [
    ("1K", "unable to parse quantity's suffix"),
    ("NaN", "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"),
])
def test_a_bad_quantity_is_refused_in_the_api_servers_words(core, pod_body, memory, said):
    """ParseQuantity's own error text (k8s.io/apimachinery quantity.go), naming the field and the value."""
    bad = pod_body("p3")
    bad["spec"]["containers"][0]["resources"] = {"requests": {"memory": memory}}
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", bad)
    assert e.value.status == 422
    assert f'resources.requests[memory]: Invalid value: "{memory}": {said}' in body_of(e.value)["message"]


def test_generate_name(core, pod_body):
    """kmock fails generateName with a 500."""
    body = pod_body("x")
    body["metadata"] = {"generateName": "pilot-"}
    p = core.create_namespaced_pod("default", body)
    assert p.metadata.name.startswith("pilot-") and len(p.metadata.name) == len("pilot-") + 5


def test_namespace_comes_from_the_url_and_must_exist(core, pod_body):
    """kmock never delivers events of pods created without metadata.namespace."""
    p = core.create_namespaced_pod("default", pod_body("p1"))
    assert p.metadata.namespace == "default"
    body = pod_body("p2")
    body["metadata"]["namespace"] = "other"
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", body)
    assert e.value.status == 400
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("absent", pod_body("p3"))
    assert e.value.status == 404 and body_of(e.value)["message"] == 'namespaces "absent" not found'


def test_namespaces_resource_works(core, pod_body):
    """kmock answers 500 for the namespaces resource."""
    core.create_namespace({"metadata": {"name": "pilots"}})
    names = [n.metadata.name for n in core.list_namespace().items]
    assert "pilots" in names and "default" in names
    ns = core.read_namespace("pilots")
    assert ns.status.phase == "Active" and ns.metadata.labels["kubernetes.io/metadata.name"] == "pilots"
    core.create_namespaced_pod("pilots", pod_body("p1"))
    core.delete_namespace("pilots")
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("pilots", pod_body("p2"))
    assert e.value.status in (403, 404)


def test_list_has_kind_and_api_version(core, pod_body):
    """kmock's lists have no kind/apiVersion and kubectl then refuses them."""
    core.create_namespaced_pod("default", pod_body("p1"))
    resp = core.list_namespaced_pod("default", _preload_content=False)
    doc = json.loads(resp.data)
    assert doc["kind"] == "PodList" and doc["apiVersion"] == "v1"
    assert "kind" not in doc["items"][0]  # items in a real list carry no kind either


@pytest.mark.parametrize("selector,expected", [
    ("app=a", ["p1", "p2"]),
    ("app==a", ["p1", "p2"]),
    ("app!=a", ["p3", "p4"]),
    ("app in (a,b)", ["p1", "p2", "p3"]),
    ("app notin (a)", ["p3", "p4"]),
    ("tier", ["p2"]),
    ("!tier", ["p1", "p3", "p4"]),
    ("app=a,tier=db", ["p2"]),
    ("rank>2", ["p4"]),
    ("rank<2", ["p1"]),
])
def test_label_selectors_all_operators(core, selector, expected, pod_body):
    """kmock ignores labelSelector; here every operator of the real grammar works."""
    for name, labels in (("p1", {"app": "a", "rank": "1"}), ("p2", {"app": "a", "tier": "db"}),
                         ("p3", {"app": "b"}), ("p4", {"rank": "3"})):
        core.create_namespaced_pod("default", pod_body(name, labels=labels))
    got = [p.metadata.name for p in core.list_namespaced_pod("default", label_selector=selector).items]
    assert got == expected


def test_bad_selector_is_400(core):
    with pytest.raises(ApiException) as e:
        core.list_namespaced_pod("default", label_selector="app in (a")
    assert e.value.status == 400
    with pytest.raises(ApiException) as e:
        core.list_namespaced_pod("default", field_selector="spec.bogus=x")
    assert e.value.status == 400 and "field label not supported" in body_of(e.value)["message"]
    with pytest.raises(SelectorError):
        parse_label_selector("a=b=c")
    assert labels_match(parse_label_selector("a notin (x)"), {})


def test_field_selectors(core, api_only, pod_body):
    for n in ("p1", "p2", "p3"):
        core.create_namespaced_pod("default", pod_body(n))

    def running(pod):
        pod["status"]["phase"] = "Running"
        pod["spec"]["nodeName"] = "n1"
    api_only.call(api_only.api.write, "pods", "default", "p2", running)
    names = lambda **kw: [p.metadata.name for p in core.list_namespaced_pod("default", **kw).items]  # noqa: E731
    assert names(field_selector="metadata.name=p3") == ["p3"]
    assert names(field_selector="status.phase=Running") == ["p2"]
    assert names(field_selector="status.phase!=Running") == ["p1", "p3"]
    assert names(field_selector="spec.nodeName=n1,metadata.namespace=default") == ["p2"]
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector="spec.nodeName=").items] \
        == ["p1", "p3"]


def test_limit_and_continue_paging(core, pod_body):
    """kmock ignores limit; here pages chain with continue and keep the first page's version."""
    for i in range(5):
        core.create_namespaced_pod("default", pod_body(f"p{i}"))
    first = core.list_namespaced_pod("default", limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert first.metadata.remaining_item_count == 3 and first.metadata._continue
    second = core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    third = core.list_namespaced_pod("default", limit=2, _continue=second.metadata._continue)
    assert [p.metadata.name for p in second.items + third.items] == ["p2", "p3", "p4"]
    assert not third.metadata._continue
    assert second.metadata.resource_version == first.metadata.resource_version


def test_a_paged_list_is_one_snapshot(core, pod_body):
    """Every page shows the objects of the first page's version, as the real server serves a
    continued LIST: a pod deleted after the first page is still listed, one created is not, and
    a pod changed after it appears as it was."""
    for i in range(6):
        core.create_namespaced_pod("default", pod_body(f"p{i}"))
    first = core.list_namespaced_pod("default", limit=2)
    core.delete_namespaced_pod("p3", "default", grace_period_seconds=0)
    core.create_namespaced_pod("default", pod_body("p25"))
    core.patch_namespaced_pod("p4", "default", {"metadata": {"labels": {"changed": "yes"}}})
    rest = core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    last = core.list_namespaced_pod("default", limit=2, _continue=rest.metadata._continue)
    assert [p.metadata.name for p in rest.items + last.items] == ["p2", "p3", "p4", "p5"]
    assert "changed" not in (last.items[0].metadata.labels or {})
    assert not last.metadata._continue
    fresh = [p.metadata.name for p in core.list_namespaced_pod("default").items]
    assert fresh == ["p0", "p1", "p2", "p25", "p4", "p5"]

def test_put_replace_with_stale_resource_version_is_409(core):
    """kmock has no PUT at all. Optimistic concurrency is the real server's contract."""
    core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"a": "1"}})
    s = core.read_namespaced_secret("s", "default")
    s.data = {"a": base64.b64encode(b"2").decode()}
    updated = core.replace_namespaced_secret("s", "default", s)
    assert int(updated.metadata.resource_version) > int(s.metadata.resource_version)
    s.data = {"a": base64.b64encode(b"3").decode()}  # still the old resourceVersion
    with pytest.raises(ApiException) as e:
        core.replace_namespaced_secret("s", "default", s)
    assert e.value.status == 409 and body_of(e.value)["reason"] == "Conflict"
    assert "the object has been modified" in body_of(e.value)["message"]


def test_status_subresource_separates_spec_and_status(core, pod_body):
    """In kmock a PATCH on /status can change spec and a PATCH on the object can change status."""
    core.create_namespaced_pod("default", pod_body("p1"))
    p = core.patch_namespaced_pod_status("p1", "default", {"status": {"phase": "Running"},
                                                           "metadata": {"labels": {"sneaky": "yes"}}})
    assert p.status.phase == "Running" and not (p.metadata.labels or {}).get("sneaky")
    p = core.patch_namespaced_pod("p1", "default", {"status": {"phase": "Failed"}, "metadata": {"labels": {"a": "b"}}})
    assert p.status.phase == "Running" and p.metadata.labels["a"] == "b"
    pod = core.read_namespaced_pod("p1", "default")
    pod.status.phase = "Succeeded"
    assert core.replace_namespaced_pod_status("p1", "default", pod).status.phase == "Succeeded"


def test_pod_spec_is_immutable_except_images(core, pod_body):
    core.create_namespaced_pod("default", pod_body("p1"))
    with pytest.raises(ApiException) as e:
        core.patch_namespaced_pod("p1", "default", {"spec": {"restartPolicy": "Always"}})
    assert e.value.status == 422 and "pod updates may not change fields" in body_of(e.value)["message"]
    p = core.patch_namespaced_pod("p1", "default", {"spec": {"containers": [{"name": "pilot", "image": "busybox:2"}]}})
    assert p.spec.containers[0].image == "busybox:2"


def test_patch_flavours(core, pod_body):
    """Merge, strategic merge (as merge) and JSON patch; a JSON patch test failure is 422."""
    core.create_namespaced_pod("default", pod_body("p1", labels={"a": "1", "b": "2"}))
    # merge patch: null deletes
    core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"b": None}}},
                              _content_type="application/merge-patch+json")
    assert core.read_namespaced_pod("p1", "default").metadata.labels == {"a": "1"}
    # json patch (the client sends a list as json-patch)
    core.patch_namespaced_pod("p1", "default", [{"op": "add", "path": "/metadata/labels/c", "value": "3"}])
    assert core.read_namespaced_pod("p1", "default").metadata.labels == {"a": "1", "c": "3"}
    with pytest.raises(ApiException) as e:
        core.patch_namespaced_pod("p1", "default", [{"op": "test", "path": "/metadata/labels/a", "value": "9"}])
    assert e.value.status == 422
    # strategic merge (the client's default for a dict): containers merge by name, keeping defaults
    p = core.patch_namespaced_pod("p1", "default", {"spec": {"containers": [{"name": "pilot", "image": "b:2"}]}})
    assert p.spec.containers[0].image == "b:2" and p.spec.containers[0].termination_message_path


def test_delete_unscheduled_pod_is_immediate_and_scheduled_pod_is_graceful(core, api_only, pod_body):
    """Pod strategy: no node → deleted at once; on a node → deletionTimestamp, then gone when the
    kubelet confirms with grace 0 (or the grace expires)."""
    core.create_namespaced_pod("default", pod_body("p0"))
    _, code, _ = core.delete_namespaced_pod_with_http_info("p0", "default")
    assert code == 200 and api_only.store.get("pods", "default", "p0") is None

    core.create_namespaced_pod("default", pod_body("p1", terminationGracePeriodSeconds=30))
    api_only.call(api_only.api.bind, "default", "p1", {"target": {"name": "n1"}})
    _, code, _ = core.delete_namespaced_pod_with_http_info("p1", "default")
    pod = api_only.store.get("pods", "default", "p1")
    assert code == 202 and pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"] == 30
    # the kubelet's confirmation: grace 0 with a uid precondition
    with pytest.raises(ApiException) as e:
        core.delete_namespaced_pod("p1", "default", grace_period_seconds=0,
                                   body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="other")))
    assert e.value.status == 409
    core.delete_namespaced_pod("p1", "default", grace_period_seconds=0)
    assert api_only.store.get("pods", "default", "p1") is None


def test_grace_expiry_removes_pod(core, api_only, pod_body):
    core.create_namespaced_pod("default", pod_body("p1"))
    api_only.call(api_only.api.bind, "default", "p1", {"target": {"name": "n1"}})
    core.delete_namespaced_pod("p1", "default", grace_period_seconds=1)
    assert api_only.store.get("pods", "default", "p1") is not None
    api_only.wait_for(lambda: api_only.store.get("pods", "default", "p1") is None, timeout=3)


def test_finalizers_hold_deletion_until_cleared(core, api_only):
    core.create_namespaced_secret("default", {"metadata": {"name": "s", "finalizers": ["example.org/keep"]}})
    core.delete_namespaced_secret("s", "default")
    s = core.read_namespaced_secret("s", "default")
    assert s.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as e:  # no new finalizers once deleting
        core.patch_namespaced_secret("s", "default", {"metadata": {"finalizers": ["example.org/keep", "x.org/y"]}})
    assert e.value.status == 422
    core.patch_namespaced_secret("s", "default", {"metadata": {"finalizers": None}})
    assert api_only.store.get("secrets", "default", "s") is None


def test_delete_collection(core, api_only, pod_body):
    """kmock has no deleteCollection."""
    for n, app in (("a1", "x"), ("a2", "x"), ("b1", "y")):
        core.create_namespaced_pod("default", pod_body(n, labels={"app": app}))
    core.delete_collection_namespaced_pod("default", label_selector="app=x")
    assert [p["metadata"]["name"] for p in api_only.store.list("pods", "default")] == ["b1"]


def _owned_secret(name: str, pod) -> dict:
    return {"metadata": {"name": name, "ownerReferences": [{
        "apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid,
        "blockOwnerDeletion": True}]}}


def test_garbage_collection_of_owned_secret(core, api_only, pod_body):
    """Issue 4 item 1: a Secret whose owner pod is gone is deleted, as the real GC does."""
    pod = core.create_namespaced_pod("default", pod_body("p1"))
    core.create_namespaced_secret("default", _owned_secret("s1", pod))
    core.delete_namespaced_pod("p1", "default")
    api_only.wait_for(lambda: api_only.store.get("secrets", "default", "s1") is None, timeout=3)


def test_gc_deletes_secret_created_for_an_absent_owner_and_orphan_keeps_it(core, api_only, pod_body):
    ghost = client.V1Pod(metadata=client.V1ObjectMeta(name="ghost", uid="00000000-0000-4000-8000-000000000000"))
    core.create_namespaced_secret("default", _owned_secret("s-ghost", ghost))
    api_only.wait_for(lambda: api_only.store.get("secrets", "default", "s-ghost") is None, timeout=3)
    pod = core.create_namespaced_pod("default", pod_body("p2"))
    core.create_namespaced_secret("default", _owned_secret("s2", pod))
    core.delete_namespaced_pod("p2", "default", propagation_policy="Orphan")
    s = api_only.wait_for(lambda: api_only.store.get("secrets", "default", "s2"), timeout=3)
    assert not s["metadata"].get("ownerReferences")


def test_foreground_deletion_waits_for_dependents(core, api_only, pod_body):
    pod = core.create_namespaced_pod("default", pod_body("p1"))
    core.create_namespaced_secret("default", _owned_secret("s1", pod))
    core.delete_namespaced_pod("p1", "default", propagation_policy="Foreground")
    api_only.wait_for(lambda: api_only.store.get("pods", "default", "p1") is None, timeout=3)
    assert api_only.store.get("secrets", "default", "s1") is None


def _quota(core, **hard):
    core.create_namespaced_resource_quota("default", {"metadata": {"name": "q"}, "spec": {"hard": hard}})


def test_resource_quota_admission_and_status(core, api_only, pod_body):
    """Issue 4 item 1: 403 Forbidden with the real "exceeded quota" message; status.used kept current."""
    _quota(core, **{"requests.cpu": "2", "pods": "5", "requests.nvidia.com/gpu": "1"})
    core.create_namespaced_pod("default", pod_body("p1", cpu="1500m"))
    q = core.read_namespaced_resource_quota("q", "default")
    assert q.status.used == {"requests.cpu": "1500m", "pods": "1", "requests.nvidia.com/gpu": "0"}
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", pod_body("p2", cpu="1"))
    assert e.value.status == 403 and body_of(e.value)["reason"] == "Forbidden"
    assert body_of(e.value)["message"] == ('pods "p2" is forbidden: exceeded quota: q, requested: requests.cpu=1, '
                                           "used: requests.cpu=1500m, limited: requests.cpu=2")
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", pod_body("p3"))
    assert "failed quota: q: must specify requests.cpu for: pilot" in body_of(e.value)["message"]
    # A terminal pod no longer counts (the quota controller releases it).
    api_only.call(api_only.api.write, "pods", "default", "p1", lambda p: p["status"].update(phase="Succeeded"))
    api_only.wait_for(lambda: core.read_namespaced_resource_quota("q", "default").status.used["requests.cpu"] == "0")
    core.create_namespaced_pod("default", pod_body("p2", cpu="1"))


def test_quota_counts_gpus_and_pod_count(core, pod_body):
    _quota(core, **{"pods": "1", "requests.nvidia.com/gpu": "1"})
    gpu = pod_body("g1")
    gpu["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}  # requests default to limits
    core.create_namespaced_pod("default", gpu)
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("default", pod_body("p2"))
    assert "exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1" in body_of(e.value)["message"]


def test_secret_size_limit_and_string_data(core):
    core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"proxy": "PEM"}})
    assert core.read_namespaced_secret("s", "default").data == {"proxy": base64.b64encode(b"PEM").decode()}
    big = base64.b64encode(b"x" * (1024 * 1024 + 1)).decode()
    with pytest.raises(ApiException) as e:
        core.create_namespaced_secret("default", {"metadata": {"name": "big"}, "data": {"f": big}})
    assert e.value.status == 422 and "Too long: must have at most 1048576 bytes" in body_of(e.value)["message"]


def test_eviction_subresource_marks_disruption_target(core, api_only, pod_body):
    core.create_namespaced_pod("default", pod_body("p1"))
    api_only.call(api_only.api.bind, "default", "p1", {"target": {"name": "n1"}})
    ev = client.V1Eviction(metadata=client.V1ObjectMeta(name="p1", namespace="default"))
    core.create_namespaced_pod_eviction("p1", "default", ev)
    pod = api_only.store.get("pods", "default", "p1")
    cond = {c["type"]: c for c in pod["status"]["conditions"]}["DisruptionTarget"]
    assert cond["reason"] == "EvictionByEvictionAPI" and pod["metadata"]["deletionTimestamp"]


def test_events_create_and_list(core):
    core.create_namespaced_event("default", {"metadata": {"name": "e1"}, "reason": "Test", "message": "hi",
                                             "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"}})
    items = core.list_namespaced_event("default", field_selector="involvedObject.name=p").items
    assert [(e.reason, e.message) for e in items] == [("Test", "hi")]


def test_self_subject_access_review_follows_configured_rules(core_api):
    """Issue 4 item 1: SSAR answers from a configured rule set (the agent's RBAC check)."""
    from ce_k8s.sim.kube.apiserver import ApiServer

    rules = [{"verbs": ["get", "list", "watch", "create", "delete"], "resources": ["pods", "secrets"]}]
    with ApiServer.running(kubelet=False, rules=rules) as srv:
        authz = client.AuthorizationV1Api(core_api(srv).api_client)

        def allowed(verb, resource, sub=""):
            ra = client.V1ResourceAttributes(verb=verb, resource=resource, subresource=sub, namespace="default")
            review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=ra))
            return authz.create_self_subject_access_review(review).status.allowed
        assert allowed("create", "pods") and allowed("list", "secrets")
        assert not allowed("patch", "pods") and not allowed("get", "pods", "log")


def test_enforced_rbac_answers_403(pod_body, core_api):
    from ce_k8s.sim.kube.apiserver import ApiServer

    with ApiServer.running(kubelet=False, rules=[{"verbs": ["list"], "resources": ["pods"]}], enforce_rbac=True) as srv:
        core = core_api(srv)
        core.list_namespaced_pod("default")
        with pytest.raises(ApiException) as e:
            core.create_namespaced_pod("default", pod_body("p1"))
        assert e.value.status == 403 and 'cannot create resource "pods"' in body_of(e.value)["message"]


def test_discovery_and_version_with_and_without_trailing_slash(core, api_only):
    """kmock answers groupVersion "/v1" and 404s trailing-slash discovery paths."""
    assert client.VersionApi(core.api_client).get_code().git_version.startswith("v1.32")
    names = {r.name for r in core.get_api_resources().resources}
    assert {"pods", "pods/status", "pods/log", "pods/eviction", "secrets", "nodes", "namespaces",
            "resourcequotas", "events"} <= names
    import urllib.request

    for path in ("/api", "/api/", "/api/v1", "/api/v1/", "/apis", "/apis/", "/version", "/version/",
                 "/apis/authorization.k8s.io/v1", "/openapi/v3"):
        with urllib.request.urlopen(api_only.url + path) as r:
            doc = json.loads(r.read())
        assert doc, path
    with urllib.request.urlopen(api_only.url + "/api/v1") as r:
        assert json.loads(r.read())["groupVersion"] == "v1"


def test_status_write_keeps_spec_and_never_edits_the_stored_object(core, api_only, pod_body):
    """The simulators' status writes (Api.write) change status only: a replaced spec is put back,
    the object stored before the write is left as it was, and a read sees the new status."""
    core.create_namespaced_pod("default", pod_body("p1"))
    before = api_only.call(api_only.api.get, "pods", "default", "p1")
    before_status = json.dumps(before.get("status"), sort_keys=True)

    def mutate(p):
        p["status"]["phase"] = "Running"
        p["metadata"].setdefault("annotations", {})["x"] = "y"
        p["spec"] = {"containers": []}          # ignored: the status subresource cannot change spec

    after = api_only.call(api_only.api.write, "pods", "default", "p1", mutate)
    assert after["status"]["phase"] == "Running"
    assert after["spec"] == before["spec"] and after["spec"]["containers"]
    assert json.dumps(before.get("status"), sort_keys=True) == before_status      # old version untouched
    assert "x" not in (before["metadata"].get("annotations") or {})
    assert core.read_namespaced_pod("p1", "default").status.phase == "Running"
