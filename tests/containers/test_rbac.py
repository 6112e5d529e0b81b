"""RBAC: the agent's Role/ClusterRole grant exactly the API calls ce-k8s's code makes.

The code is scanned statically (containers_rbac_scan.py): every Kubernetes client method used in
ce_k8s/ (the emulator in ce_k8s/sim/ excepted: it is the server, not a client) is mapped to an
RBAC (group, resource, verb, scope) by the client's naming rules, and compared with the rules the
manifests bind to the ce-k8s-agent ServiceAccount. The naming rules are themselves checked against
the client's own request paths. Reference: docs/security.md (least privilege).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from containers_helpers import REPO
from containers_rbac_scan import (
    ALWAYS_GRANTED,
    Permission,
    ScanError,
    api_classes,
    api_group,
    granted_permissions,
    permission_for,
    permission_for_path,
    required_permissions,
    scan_source,
    scan_tree,
)

SA = ("ce-k8s-system", "ce-k8s-agent")
PILOTS = "ce-k8s-pilots"
#: What the scan covers: every module that talks to the API with the agent's credentials.
SCANNED = ["ce_k8s"]
# ops/nodes.py runs from the Slurm controller with its own identity (containers/slurm/rbac.yaml),
# checked by tests/ops/test_slurm.py; granting node patch and evictions to the agent would be wrong.
# The test beds (the emulators, the real control plane's tools, the demos on them) act as the
# cluster, not as the CE.
# The HTCJob operator has its own ServiceAccount (containers/k8s/htcjob/rbac.yaml), judged on the
# real API server with exactly that account's token (tests/real/test_htcjob_kube.py).
EXCLUDED = ("ce_k8s/sim/", "ce_k8s/real/", "ce_k8s/demos/", "ce_k8s/ops/nodes.py", "ce_k8s/htcjob/")

# Accounting's usage sources (CE_K8S_USAGE_SOURCE, docs/accounting.md). The default reads each
# kubelet directly: that request goes to no API path, so the scan cannot see it, yet the kubelet
# authorises it as get nodes/stats (kubelet pkg/kubelet/server/auth.go: /stats/* -> subresource
# stats) with a SubjectAccessReview of the agent's own identity, so the manifests must grant it.
# The `proxy` source is an API call the scan does see (get nodes/proxy), but one a site opts into:
# the shipped RBAC does not grant it (docs/security.md says why).
KUBELET_DIRECT = {Permission("", "nodes/stats", "get", True): "ce_k8s/agent/accounting.py KUBELET_SUMMARY_PATH "
                                                               "(the kubelet's /stats/summary)"}
OPT_IN = {Permission("", "nodes/proxy", "get", True): "CE_K8S_USAGE_SOURCE = proxy"}

SERIALIZE_DEF = re.compile(r"def _(\w+)_serialize\(")
REQUEST = re.compile(r"method='(\w+)',\s*resource_path='([^']+)'")


def _operations(source: str):
    """(method name, HTTP method, path template) of each `_<op>_serialize` helper in a class."""
    defs = list(SERIALIZE_DEF.finditer(source))
    for i, d in enumerate(defs):
        end = defs[i + 1].start() if i + 1 < len(defs) else len(source)
        req = REQUEST.search(source, d.end(), end)
        if req:
            yield d.group(1), req.group(1), req.group(2)


def test_naming_rules_agree_with_the_clients_request_paths():
    """For every resource operation of every API class in the installed client, the name-derived
    permission equals the one the API server's authorizer derives from the method's HTTP verb and
    URL: two independent derivations, each checking the other."""
    checked = 0
    for name, cls in api_classes().items():
        for method, http, path in _operations(Path(inspect.getsourcefile(cls)).read_text()):
            try:
                got = permission_for(method, name)[0]
            except ValueError:
                continue  # not a resource operation (e.g. get_api_resources)
            assert got == permission_for_path(http, path), f"{name}.{method} ({http} {path})"
            checked += 1
    assert checked > 800, f"only {checked} operations checked: did the client change shape?"


@pytest.mark.parametrize(
    ("cls", "group"),
    [("CoreV1Api", ""), ("PolicyV1Api", "policy"), ("AppsV1Api", "apps"),
     ("RbacAuthorizationV1Api", "rbac.authorization.k8s.io"), ("SchedulingV1Api", "scheduling.k8s.io"),
     ("FlowcontrolApiserverV1Api", "flowcontrol.apiserver.k8s.io"), ("AuthorizationV1Api", "authorization.k8s.io")],
)
def test_api_group_from_class_name(cls, group):
    assert api_group(cls) == group


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("create_namespaced_pod", Permission("", "pods", "create", False)),
        ("read_namespaced_pod_log", Permission("", "pods/log", "get", False)),
        ("create_namespaced_pod_eviction", Permission("", "pods/eviction", "create", False)),
        ("list_pod_for_all_namespaces", Permission("", "pods", "list", True)),
        ("patch_node", Permission("", "nodes", "patch", True)),
        ("read_node", Permission("", "nodes", "get", True)),
        ("list_resource_quota_for_all_namespaces", Permission("", "resourcequotas", "list", True)),
        ("replace_namespaced_pod_status", Permission("", "pods/status", "update", False)),
        ("delete_collection_namespaced_secret", Permission("", "secrets", "deletecollection", False)),
    ],
)
def test_core_methods_map_to_rbac(method, expected):
    assert permission_for(method, "CoreV1Api") == (expected,)


def test_scanner_resolves_receivers_watches_and_references():
    src = '''
from kubernetes import client, watch
class Agent:
    def __init__(self, api: client.CoreV1Api, policy):
        self.core = api
        self.policy = client.PolicyV1Api(policy)
    def run(self):
        self.core.create_namespaced_pod("ns", {})
        self.core.list_namespaced_pod("ns", watch=True)
        for ev in watch.Watch().stream(self.core.list_node):
            pass
        self.policy.read_namespaced_pod_disruption_budget("x", "ns")
        helper(self.core.read_namespaced_pod_log)
        {}.items()
'''
    uses = scan_source(src, "agent.py")
    got = {(u.line, u.method): {(p.resource, p.verb) for p in u.permissions} for u in uses}
    assert got == {
        (8, "create_namespaced_pod"): {("pods", "create")},
        (9, "list_namespaced_pod"): {("pods", "list"), ("pods", "watch")},
        (10, "list_node"): {("nodes", "list"), ("nodes", "watch")},
        (12, "read_namespaced_pod_disruption_budget"): {("poddisruptionbudgets", "get")},
        (13, "read_namespaced_pod_log"): {("pods/log", "get")},
    }
    assert next(u for u in uses if u.line == 12).permissions[0].group == "policy"


def test_scanner_maps_raw_requests_by_path():
    """info/snapshot.py-style raw requests: api_client.param_serialize("GET", path) with path literals."""
    src = '''
def snap(api_client, ns):
    def list_all(path):
        return api_client.param_serialize("GET", path)
    list_all("/api/v1/nodes")
    list_all(f"/api/v1/namespaces/{ns}/pods")
    list_all("/apis/policy/v1/poddisruptionbudgets")
'''
    perms = {p for u in scan_source(src, "s.py") for p in u.permissions}
    assert perms == {Permission("", "nodes", "list", True), Permission("", "pods", "list", False),
                     Permission("policy", "poddisruptionbudgets", "list", True)}
    with pytest.raises(ScanError, match=r"s\.py:2: API path '/api/v1/nodes'"):
        scan_source('def f(c):\n    c.go("/api/v1/nodes")\n', "s.py")


def test_scanner_takes_the_method_given_in_the_same_call_as_the_path():
    """corecalls.py-style raw requests: each call names its method and its path literally."""
    src = '''
class Calls:
    def create(self, ns, body):
        return self.request("POST", "/api/v1/namespaces/{namespace}/pods", {"namespace": ns}, None, body)

    def log(self, name, ns):
        return self.request("GET", "/api/v1/namespaces/{namespace}/pods/{name}/log", {"name": name})

    def delete(self, name, ns):
        return self.request("DELETE", "/api/v1/namespaces/{namespace}/pods/{name}", {"name": name})
'''
    perms = {p for u in scan_source(src, "c.py") for p in u.permissions}
    assert perms == {Permission("", "pods", "create", False), Permission("", "pods/log", "get", False),
                     Permission("", "pods", "delete", False)}


def test_scanner_refuses_a_method_it_cannot_attribute():
    """list_namespaced_event exists in CoreV1Api ("") and EventsV1Api (events.k8s.io)."""
    with pytest.raises(ScanError, match=r"x\.py:2: api\.list_namespaced_event"):
        scan_source("def f(api):\n    api.list_namespaced_event('ns')\n", "x.py")
    uses = scan_source("from kubernetes.client import EventsV1Api\ndef f(api: EventsV1Api):\n"
                       "    api.list_namespaced_event('ns')\n", "x.py")
    assert uses[0].permissions[0].group == "events.k8s.io"


def test_self_checks_need_no_grant():
    """SelfSubjectAccessReviews (doctor's RBAC check) are allowed for everyone by system:basic-user."""
    uses = scan_source("from kubernetes import client\na = client.AuthorizationV1Api()\n"
                       "a.create_self_subject_access_review({})\n", "d.py")
    assert uses and all(p.key() in ALWAYS_GRANTED for u in uses for p in u.permissions)
    assert required_permissions(uses) == {}


def _normalise(needed: set[Permission]) -> set[Permission]:
    """A namespaced need is covered by the same cluster-wide need (one grant, not two)."""
    return {p for p in needed if p.cluster or Permission(p.group, p.resource, p.verb, True) not in needed}


def test_rbac_grants_exactly_what_the_code_calls(rendered):
    """Every (resource, verb) the code uses is granted, at the right scope (Role for namespaced
    calls in the pilots' namespace, ClusterRole for all-namespace/cluster-scoped ones), and no
    rule grants anything no code calls."""
    uses = scan_tree(REPO, SCANNED, exclude=EXCLUDED)
    needed_where = required_permissions(uses)
    assert needed_where, "the scan found no Kubernetes calls at all: is the scanner broken?"
    for perm in OPT_IN:
        assert perm in needed_where, f"{perm} is no longer called: drop it from OPT_IN"
        del needed_where[perm]
    for perm, where in KUBELET_DIRECT.items():
        needed_where[perm] = [where]
    needed = _normalise(set(needed_where))
    granted = granted_permissions(rendered["base"], PILOTS, SA)
    missing = sorted(needed - granted)
    extra = sorted(granted - needed)
    report = [f"missing {p} needed by {needed_where[p][:3]}" for p in missing] + [f"not used by any code: {p}"
                                                                                  for p in extra]
    assert not report, "\n".join(report)


def test_the_overlay_keeps_the_base_rbac(rendered, site):
    assert granted_permissions(site, PILOTS, SA) == granted_permissions(rendered["base"], PILOTS, SA)


def test_the_kubelet_path_and_its_grant_are_what_the_kubelet_authorises(rendered):
    """The direct read is `/stats/summary` on the kubelet, which the kubelet maps to get nodes/stats
    (kubelet server/auth.go: /stats/* -> `stats`; everything else -> `proxy`). The base grants that
    subresource, and no nodes/proxy: a site using the proxy source adds it (docs/accounting.md)."""
    from ce_k8s.agent import accounting

    assert accounting.KUBELET_SUMMARY_PATH.startswith("/stats/")
    assert accounting.SOURCE_GRANT == {"kubelet": "nodes/stats", "proxy": "nodes/proxy"}
    granted = granted_permissions(rendered["base"], PILOTS, SA)
    assert set(KUBELET_DIRECT) <= granted and not set(OPT_IN) & granted
