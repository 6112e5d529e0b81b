"""What the real API server admits from ce-k8s, and what the agent's ServiceAccount may do.

Every shipped route and example pilot is turned into its Pod and Secret by `ce-k8s route` (the
product's own preview: the same builder the agent runs) and created with the agent's own token,
under the shipped admission: PodSecurity `restricted`, the LimitRange, the ResourceQuota and the
PriorityClass the routes name. The RBAC checks ask the real authorizer (SelfSubjectAccessReview
as the agent) rather than reading the YAML back, since only the server says what a Role grants.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from .conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.ad"))
PILOTS_NS = "ce-k8s-pilots"
UNROUTED = {"pilot-noroute.ad"}     # no shipped route takes it (its `explain` says why)


def routed(example: Path) -> dict:
    """`ce-k8s route --jobads <example> --json`: the one job's route, pod and secret."""
    out = subprocess.run([str(Path(sys.executable).parent / "ce-k8s"), "route", "--jobads", str(example), "--json"],
                         capture_output=True, text=True, check=False, cwd=REPO, timeout=120)
    assert out.stdout, out.stderr
    (job,) = json.loads(out.stdout)
    if job.get("secret"):   # the preview redacts the contents; any bytes under the same keys do here
        job["secret"]["data"] = {key: base64.b64encode(b"x").decode() for key in job["secret"]["data"]}
    return job


@pytest.fixture(scope="module")
def previews() -> dict[str, dict]:
    return {example.name: routed(example) for example in EXAMPLES}


def shipped_routes() -> set[str]:
    """The route names of routes/*.conf (`JOB_ROUTER_ROUTE_<name>`), read the way an admin would."""
    names = set()
    for conf in (REPO / "routes").glob("*.conf"):
        for line in conf.read_text().splitlines():
            head, at, _ = line.partition("@=")
            head = head.strip()
            if at and head.startswith("JOB_ROUTER_ROUTE_"):
                names.add(head.removeprefix("JOB_ROUTER_ROUTE_"))
    return names


def test_every_shipped_route_is_exercised_and_only_noroute_is_not_taken(previews):
    taken = {name: job["route"] for name, job in previews.items()}
    assert {name for name, route in taken.items() if route is None} == UNROUTED, taken
    assert set(taken.values()) - {None} == shipped_routes(), taken
    noroute = previews["pilot-noroute.ad"]
    assert "pod" not in noroute and noroute["explain"], noroute


@pytest.fixture
def site_namespace(pilot_namespace, admin_core):
    """The fresh namespace given the shipped pilot namespace's LimitRange and ResourceQuota too."""
    for kind in ("limit_range", "resource_quota"):
        shipped = admin_core.api_client.sanitize_for_serialization(
            getattr(admin_core, f"read_namespaced_{kind}")(PILOTS_NS, PILOTS_NS))
        body = {"metadata": {"name": shipped["metadata"]["name"]}, "spec": shipped["spec"]}
        getattr(admin_core, f"create_namespaced_{kind}")(pilot_namespace, body)
    wait_for(lambda: admin_core.read_namespaced_resource_quota(PILOTS_NS, pilot_namespace).status.hard,
             what="the quota's status")
    return pilot_namespace


def _requests(pod) -> list[dict]:
    return [c.resources.requests for c in pod.spec.containers]


@pytest.mark.parametrize("example", [e.name for e in EXAMPLES if e.name not in UNROUTED])
def test_shipped_pod_and_secret_are_admitted_for_real_with_the_agents_token(example, previews, agent_client,
                                                                          admin_core, site_namespace):
    """A real create of the pod, then of its Secret owned by it (the agent's order), in a namespace
    prepared like ce-k8s-pilots; admission keeps the requests we asked for and resolves the
    PriorityClass the route names."""
    job = previews[example]
    core = client.CoreV1Api(agent_client)
    pod_body = dict(job["pod"], metadata=dict(job["pod"]["metadata"], namespace=site_namespace))
    pod = core.create_namespaced_pod(site_namespace, pod_body)
    assert _requests(pod) == [c["resources"]["requests"] for c in job["pod"]["spec"]["containers"]]
    klass = job["pod"]["spec"].get("priorityClassName")
    if klass:
        shipped = client.SchedulingV1Api(admin_core.api_client).read_priority_class(klass)
        assert pod.spec.priority_class_name == klass and pod.spec.priority == shipped.value
    owner = {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid,
             "controller": True, "blockOwnerDeletion": False}
    secret_body = dict(job["secret"], metadata=dict(job["secret"]["metadata"], namespace=site_namespace,
                                                    ownerReferences=[owner]))
    secret = core.create_namespaced_secret(site_namespace, secret_body)
    assert set(secret.data) == set(job["secret"]["data"])
    used = wait_for(lambda: (u := admin_core.read_namespaced_resource_quota(PILOTS_NS, site_namespace).status.used)
                    and u.get("pods") == "1" and u, what="the quota counting the pod")
    assert used["secrets"] == "1"


@pytest.mark.parametrize("example", [e.name for e in EXAMPLES if e.name not in UNROUTED])
def test_shipped_pod_and_secret_pass_a_dry_run_in_the_shipped_namespace(example, previews, agent_client):
    """The same objects in ce-k8s-pilots itself (dry run: nothing is left in the shared namespace)."""
    job = previews[example]
    core = client.CoreV1Api(agent_client)
    pod = core.create_namespaced_pod(PILOTS_NS, job["pod"], dry_run="All")
    assert pod.metadata.namespace == PILOTS_NS and pod.spec.security_context.run_as_non_root
    core.create_namespaced_secret(PILOTS_NS, job["secret"], dry_run="All")


# --------------------------------------------------------------------------------------------
# The agent's rights, asked of the real authorizer


def _allowed(agent_client, verb: str, resource: str, namespace: str | None = None) -> bool:
    group, _, resource = resource.rpartition("/") if resource.count("/") == 2 else ("", "", resource)
    name, _, sub = resource.partition("/")
    attrs = {"verb": verb, "resource": name, "group": group}
    if sub:
        attrs["subresource"] = sub
    if namespace:
        attrs["namespace"] = namespace
    review = client.AuthorizationV1Api(agent_client).create_self_subject_access_review(
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
         "spec": {"resourceAttributes": attrs}})
    return bool(review.status.allowed)


def _shipped_grants() -> dict[str, set[tuple[str, str]]]:
    """{"Role"/"ClusterRole": {(resource, verb)}} as containers/k8s/base/rbac.yaml stands now."""
    grants: dict[str, set[tuple[str, str]]] = {"Role": set(), "ClusterRole": set()}
    for doc in yaml.safe_load_all((REPO / "containers/k8s/base/rbac.yaml").read_text()):
        if doc and doc.get("kind") in grants:
            for rule in doc["rules"]:
                assert rule["apiGroups"] == [""], rule     # the agent only ever needs the core group
                grants[doc["kind"]] |= {(r, v) for r in rule["resources"] for v in rule["verbs"]}
    return grants


MUST = [("create", "pods", PILOTS_NS), ("get", "pods", PILOTS_NS), ("delete", "pods", PILOTS_NS),
        ("create", "secrets", PILOTS_NS), ("patch", "secrets", PILOTS_NS), ("delete", "secrets", PILOTS_NS),
        ("list", "events", PILOTS_NS), ("list", "pods", None), ("watch", "pods", None),
        ("list", "nodes", None), ("list", "resourcequotas", None)]
MUST_NOT = [("get", "secrets", PILOTS_NS), ("list", "secrets", PILOTS_NS), ("create", "pods/eviction", PILOTS_NS),
            ("create", "pods/exec", PILOTS_NS), ("get", "pods/exec", PILOTS_NS), ("delete", "nodes", None),
            ("update", "pods", PILOTS_NS), ("patch", "pods", PILOTS_NS), ("create", "pods", "default"),
            ("get", "secrets", None)]
KUBE_SYSTEM = [(verb, resource) for resource in ("pods", "secrets", "configmaps", "serviceaccounts/token",
                                                 "events", "pods/exec")
               for verb in ("get", "create", "delete", "patch")]
# Node subresources a Summary reader might be given: the agent holds exactly those the file grants.
NODE_SUBRESOURCES = ["nodes/proxy", "nodes/stats", "nodes/log", "nodes/metrics", "nodes/spec"]


@pytest.mark.parametrize(("verb", "resource", "namespace"), MUST)
def test_agent_may(agent_client, verb, resource, namespace):
    assert _allowed(agent_client, verb, resource, namespace)


@pytest.mark.parametrize(("verb", "resource", "namespace"), MUST_NOT)
def test_agent_may_not(agent_client, verb, resource, namespace):
    assert not _allowed(agent_client, verb, resource, namespace)


def test_agent_may_nothing_in_kube_system(agent_client):
    # The cluster-wide list/watch of pods reaches kube-system too (RBAC cannot select by label).
    allowed = [(v, r) for v, r in KUBE_SYSTEM if _allowed(agent_client, v, r, "kube-system")]
    assert allowed == []


def test_agent_holds_exactly_the_node_rights_the_shipped_file_grants(agent_client):
    cluster = _shipped_grants()["ClusterRole"]
    held = {(r, "get") for r in NODE_SUBRESOURCES if _allowed(agent_client, "get", r)}
    assert held == {(r, v) for r, v in cluster if r.startswith("nodes/")}
    assert held, "the shipped ClusterRole grants no node subresource at all"


def test_every_grant_of_the_shipped_file_is_in_force(agent_client):
    grants = _shipped_grants()
    missing = [(v, r) for r, v in grants["Role"] if not _allowed(agent_client, v, r, PILOTS_NS)]
    missing += [(v, r) for r, v in grants["ClusterRole"] if not _allowed(agent_client, v, r)]
    assert missing == []


def test_a_denied_request_is_a_real_403(agent_client):
    """Not just the review: the server refuses the call itself (reading back a pilot's Secret)."""
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(agent_client).list_namespaced_secret(PILOTS_NS)
    assert err.value.status == 403
