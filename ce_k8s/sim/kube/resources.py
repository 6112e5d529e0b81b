"""The resource table of the emulated API server and the discovery documents built from it.

kubectl and the official client discover resources before using them; kmock's discovery answers
``groupVersion: "/v1"`` and drops trailing-slash paths (docs/design.md "kmock 0.8, measured"), which
breaks kubectl. Here the table is explicit and small: only what ce-k8s uses, each resource with the
kind, scope, verbs and subresources a real v1.32 server advertises.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4-ce-k8s-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceInfo:
    """One served resource (or subresource when ``plural`` contains a slash)."""

    plural: str
    kind: str
    group: str = ""
    version: str = "v1"
    namespaced: bool = True
    verbs: tuple[str, ...] = _ALL_VERBS
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    has_status: bool = False
    singular: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        """``apiVersion`` of the objects (``v1`` or ``group/version``)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def discovery_entry(self) -> dict[str, object]:
        """This resource as one ``APIResourceList.resources`` entry."""
        entry: dict[str, object] = {
            "name": self.plural,
            "singularName": self.singular or (self.kind.lower() if "/" not in self.plural else ""),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        entry.update(self.extra)
        return entry


RESOURCES: tuple[ResourceInfo, ...] = (
    ResourceInfo("pods", "Pod", short_names=("po",), categories=("all",), has_status=True),
    ResourceInfo("secrets", "Secret"),
    ResourceInfo("configmaps", "ConfigMap", short_names=("cm",)),
    ResourceInfo("serviceaccounts", "ServiceAccount", short_names=("sa",)),
    ResourceInfo("nodes", "Node", namespaced=False, short_names=("no",), has_status=True),
    ResourceInfo("namespaces", "Namespace", namespaced=False, short_names=("ns",), has_status=True,
                 verbs=("create", "delete", "get", "list", "patch", "update", "watch")),
    ResourceInfo("resourcequotas", "ResourceQuota", short_names=("quota",), has_status=True),
    ResourceInfo("events", "Event", short_names=("ev",)),
    ResourceInfo("selfsubjectaccessreviews", "SelfSubjectAccessReview", group="authorization.k8s.io",
                 namespaced=False, verbs=("create",)),
)

SUBRESOURCES: tuple[ResourceInfo, ...] = (
    ResourceInfo("pods/status", "Pod", verbs=("get", "patch", "update")),
    ResourceInfo("pods/log", "Pod", verbs=("get",)),
    ResourceInfo("pods/eviction", "Eviction", verbs=("create",), extra={"group": "policy", "version": "v1"}),
    ResourceInfo("pods/binding", "Binding", verbs=("create",)),
    ResourceInfo("nodes/status", "Node", namespaced=False, verbs=("get", "patch", "update")),
    ResourceInfo("namespaces/status", "Namespace", namespaced=False, verbs=("get", "patch", "update")),
    ResourceInfo("resourcequotas/status", "ResourceQuota", verbs=("get", "patch", "update")),
)

BY_GROUP_PLURAL: dict[tuple[str, str], ResourceInfo] = {(r.group, r.plural): r for r in RESOURCES}
BY_PLURAL: dict[str, ResourceInfo] = {r.plural: r for r in RESOURCES}


def group_versions() -> dict[str, list[str]]:
    """Served group → versions (core group is ``""``)."""
    out: dict[str, list[str]] = {}
    for r in RESOURCES:
        versions = out.setdefault(r.group, [])
        if r.version not in versions:
            versions.append(r.version)
    return out


def api_versions_doc() -> dict[str, object]:
    """``GET /api``: the core group's versions."""
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}


def _group_doc(group: str, versions: list[str]) -> dict[str, object]:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list_doc() -> dict[str, object]:
    """``GET /apis``: every named group."""
    groups = [_group_doc(g, vs) for g, vs in group_versions().items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group_doc(group: str) -> dict[str, object] | None:
    """``GET /apis/<group>``, or ``None`` for an unknown group."""
    vs = group_versions().get(group)
    if not group or vs is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group, vs)}


def resource_list_doc(group: str, version: str) -> dict[str, object] | None:
    """``GET /api/v1`` or ``/apis/<g>/<v>``: the APIResourceList, or ``None`` if not served."""
    entries = [r.discovery_entry() for r in RESOURCES if r.group == group and r.version == version]
    if not entries:
        return None
    if not group:
        entries += [r.discovery_entry() for r in SUBRESOURCES]
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": entries}


def openapi_v3_group_versions() -> list[str]:
    """Keys of the ``/openapi/v3`` root: ``api/v1`` and ``apis/<group>/<version>``."""
    return [f"apis/{g}/{v}" if g else f"api/{v}" for g, vs in group_versions().items() for v in vs]


def openapi_v3_doc(gv_path: str) -> dict[str, object] | None:
    """A minimal per-group-version OpenAPI v3 document: one PATCH operation per kind, carrying the
    ``fieldValidation`` parameter, which is all kubectl reads to choose server-side validation."""
    parts = gv_path.split("/")
    if parts[0] == "api" and len(parts) == 2:
        group, version = "", parts[1]
    elif parts[0] == "apis" and len(parts) == 3:
        group, version = parts[1], parts[2]
    else:
        return None
    paths: dict[str, object] = {}
    for r in RESOURCES:
        if r.group != group or r.version != version:
            continue
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        scope = "/namespaces/{namespace}" if r.namespaced else ""
        op = {"x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": r.kind},
              "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                             {"name": "dryRun", "in": "query", "schema": {"type": "string"}}],
              "responses": {"200": {"description": "OK"}}}
        paths[f"{prefix}{scope}/{r.plural}/{{name}}"] = {"patch": op}
    if not paths:
        return None
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes (ce-k8s sim)", "version": "v1.32.4"}, "paths": paths}
