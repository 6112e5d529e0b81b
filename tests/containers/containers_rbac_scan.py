"""Which Kubernetes permissions does ce-k8s's code need? A static scan, for the RBAC test.

Why static: the RBAC manifests must grant exactly what the code calls, and a test that only runs
some code paths would miss the rare ones (eviction, GC deletes). So every call (or reference, for
``Watch().stream(api.list_x)``) to a method of an official-client API class
(``kubernetes.client.CoreV1Api`` & co.) is found in the source and mapped to an RBAC
(apiGroup, resource[/subresource], verb, scope) by the client's naming rules:

* the operation id is ``<op>[_namespaced]_<kind>[_<subresource>][_for_all_namespaces]`` in snake
  case; ``<op>`` is create/read/list/patch/replace/delete/delete_collection/connect_<http verb>;
* op → RBAC verb: create→create, read→get, list→list (+watch when called with ``watch=True`` or
  passed to ``Watch().stream``), patch→patch, replace→update, delete→delete,
  delete_collection→deletecollection, connect_get→get, connect_post/put/...→create;
* kind → resource: the kind's words run together and pluralised (``resource_quota`` →
  ``resourcequotas``, ``priority_class`` → ``priorityclasses``, ``network_policy`` →
  ``networkpolicies``);
* the API class names the group: ``CoreV1Api`` → "", ``PolicyV1Api`` → "policy",
  ``RbacAuthorizationV1Api`` → "rbac.authorization.k8s.io" (words dotted + ".k8s.io");
* raw requests (``api_client.param_serialize("GET", "/api/v1/nodes")``): each API path literal
  in a module is mapped the way the API server's authorizer maps a request (``permission_for_path``)
  with the module's one literal HTTP method;
* scope: ``_namespaced_`` → one namespace (a Role can grant it); ``_for_all_namespaces`` or a
  cluster-scoped kind (nodes, namespaces, priorityclasses, ...) → cluster (a ClusterRole).

The mapper is checked against the client's own request paths in test_rbac.py, so a naming rule
that is wrong fails there, not silently here.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import kubernetes.client

#: RBAC permissions every authenticated identity has through Kubernetes' default ClusterRoles
#: (system:basic-user): the agent's and doctor's self-checks need no grant of ours.
ALWAYS_GRANTED = frozenset(
    {
        ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
        ("authorization.k8s.io", "selfsubjectrulesreviews", "create"),
        ("authentication.k8s.io", "selfsubjectreviews", "create"),
    }
)

OP_RE = re.compile(
    r"^(?P<op>create|read|list|patch|replace|delete_collection|delete|connect_(?:get|post|put|patch|delete|head|options))"
    r"_(?P<rest>\w+)$"
)
OP_VERB = {
    "create": "create",
    "read": "get",
    "list": "list",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
    "delete_collection": "deletecollection",
    "connect_get": "get",
    "connect_head": "get",
    "connect_options": "get",
    "connect_post": "create",
    "connect_put": "update",
    "connect_patch": "patch",
    "connect_delete": "delete",
}
#: The API server's authorizer: HTTP method (+ whether a name is in the URL) → RBAC verb.
HTTP_VERB = {"POST": "create", "PUT": "update", "PATCH": "patch"}
RAW_CALLS = frozenset({"param_serialize", "call_api", "request"})
API_PATH_RE = re.compile(r"^/(api/v1|apis/[a-z0-9.-]+/v[0-9a-z]+)/[a-z{]")
#: Subresource suffixes the API has (longest first so "ephemeralcontainers" wins over nothing).
SUBRESOURCES = (
    "ephemeralcontainers",
    "portforward",
    "eviction",
    "finalize",
    "approval",
    "binding",
    "attach",
    "resize",
    "status",
    "proxy",
    "scale",
    "token",
    "exec",
    "log",
)
#: Group names that are not "<words>.k8s.io".
CORE_GROUPS = {"core": "", "apps": "apps", "batch": "batch", "policy": "policy", "autoscaling": "autoscaling"}
#: Kinds whose plural is not the regular one.
IRREGULAR_PLURALS = {"endpoints": "endpoints"}
#: Deprecated/legacy kinds served at /api/v1 under another name are not needed here.
VERSION_RE = re.compile(r"V\d+(?:(?:alpha|beta)\d+)?Api$")


@dataclass(frozen=True, order=True)
class Permission:
    """One RBAC permission: what a Role/ClusterRole rule grants, one verb at a time."""

    group: str
    resource: str  # "pods" or "pods/log"
    verb: str
    cluster: bool  # True: needs a ClusterRole (cluster-scoped kind or all namespaces)

    def key(self) -> tuple[str, str, str]:
        return (self.group, self.resource, self.verb)


@dataclass(frozen=True)
class ApiUse:
    """Where the code uses one API method, and what that needs."""

    file: str
    line: int
    api_class: str
    method: str
    permissions: tuple[Permission, ...]


class ScanError(Exception):
    """A call the scanner cannot attribute to one API class; str() names file:line."""


def api_group(class_name: str) -> str:
    """``CoreV1Api`` → "", ``PolicyV1Api`` → "policy", ``RbacAuthorizationV1Api`` → "rbac.authorization.k8s.io"."""
    stem = VERSION_RE.sub("", class_name)
    if stem == class_name:
        raise ValueError(f"{class_name!r} is not a versioned API class")
    words = [w.lower() for w in re.findall(r"[A-Z][a-z0-9]*", stem)]
    joined = ".".join(words)
    if joined in CORE_GROUPS:
        return CORE_GROUPS[joined]
    return joined + ".k8s.io"


def plural(kind_words: str) -> str:
    """``resource_quota`` → ``resourcequotas``; ``network_policy`` → ``networkpolicies``."""
    word = kind_words.replace("_", "")
    if word in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[word]
    if word.endswith("y") and not word.endswith(("ay", "ey", "oy", "uy")):
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "ch", "sh")):
        return word + "es"
    return word + "s"


CLUSTER_SCOPED_CACHE: dict[tuple[str, str], bool] = {}


def _is_cluster_scoped(api_class: str, op: str, kind: str) -> bool:
    """A kind is cluster-scoped when the class has no ``<op>_namespaced_<kind>`` variant."""
    cls = getattr(kubernetes.client, api_class)
    for candidate_op in ("list", "read", "create", op):
        if hasattr(cls, f"{candidate_op}_namespaced_{kind}"):
            return False
    return True


def _is_kind(cls: type, name: str) -> bool:
    """True when the API class can list ``name``, i.e. it is a kind, not kind + subresource."""
    return any(hasattr(cls, f"list_{p}{name}{s}") for p in ("", "namespaced_") for s in ("", "_for_all_namespaces"))


def permission_for(method: str, api_class: str, watch: bool = False) -> tuple[Permission, ...]:
    """The permissions one call of ``api_class.method`` needs, by the client's naming rules."""
    m = OP_RE.match(method)
    if not m:
        raise ValueError(f"{method!r} is not a resource operation")
    op, rest = m.group("op"), m.group("rest")
    verb = OP_VERB[op]
    all_namespaces = rest.endswith("_for_all_namespaces")
    if all_namespaces:
        rest = rest[: -len("_for_all_namespaces")]
    namespaced = rest.startswith("namespaced_")
    if namespaced:
        rest = rest[len("namespaced_") :]
    if rest.endswith("_with_path"):  # connect_*_proxy_with_path: same subresource, longer URL
        rest = rest[: -len("_with_path")]
    sub = None
    cls = getattr(kubernetes.client, api_class)
    for candidate in SUBRESOURCES:
        # A suffix is a subresource unless the whole name is itself a listable kind
        # (`*_policy_binding` is a kind, `pod_binding` is pods/binding): subresources are never listed.
        if rest.endswith("_" + candidate) and not _is_kind(cls, rest):
            sub = candidate
            rest = rest[: -len(candidate) - 1]
            break
    group = api_group(api_class)
    resource = plural(rest) + (f"/{sub}" if sub else "")
    if namespaced:
        cluster = False
    elif all_namespaces:
        cluster = True
    else:
        cluster = _is_cluster_scoped(api_class, op, rest)
    perms = [Permission(group, resource, verb, cluster)]
    if watch:
        perms.append(Permission(group, resource, "watch", cluster))
    return tuple(perms)


def permission_for_path(http: str, path: str) -> Permission:
    """What the API server's authorizer derives from one request (method + URL path template).

    ``/api/v1/namespaces/{namespace}/pods/{name}/log`` → ("", "pods/log", GET on a name → "get",
    namespaced). Collection GET → list, DELETE on a collection → deletecollection.
    """
    parts = path.split("?", 1)[0].strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    # /namespaces/{namespace}/<resource>..., but not the namespace object's own subresources
    # (/namespaces/{name}/status|finalize).
    namespaced = (len(rest) >= 3 and rest[0] == "namespaces" and rest[1] != "{name}"
                  and not (len(rest) == 3 and rest[2] in ("status", "finalize")))
    if namespaced:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    http = http.upper()
    if http in ("GET", "HEAD", "OPTIONS"):
        verb = "get" if named else "list"
    elif http == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = HTTP_VERB[http]
    return Permission(group, resource, verb, not namespaced)


def _literal_path(node: ast.AST) -> str | None:
    """An API path from a string literal or an f-string (formatted parts become ``{x}``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "{x}" for v in node.values)
    else:
        return None
    return text if API_PATH_RE.match(text) else None


def _raw_methods(tree: ast.AST) -> set[str]:
    """HTTP methods given literally to raw client calls (param_serialize/call_api/request)."""
    methods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in RAW_CALLS:
                continue
            candidates = list(node.args[:1]) + [k.value for k in node.keywords if k.arg == "method"]
            for c in candidates:
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.upper() in (
                        "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"):
                    methods.add(c.value.upper())
    return methods


def api_classes() -> dict[str, type]:
    """Every versioned API class of the installed client."""
    return {n: getattr(kubernetes.client, n) for n in dir(kubernetes.client) if VERSION_RE.search(n)}


def _expr_key(node: ast.AST) -> str | None:
    """A stable text for a receiver expression (``self._core``, ``core``), or None."""
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - ast.unparse handles every expression node
        return None


def _class_of_call(node: ast.AST, classes: dict[str, type]) -> str | None:
    """``client.CoreV1Api(x)`` / ``CoreV1Api()`` → "CoreV1Api"."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name in classes:
            return name
    return None


def _class_of_annotation(node: ast.AST | None, classes: dict[str, type]) -> str | None:
    if node is None:
        return None
    text = ast.unparse(node).replace('"', "").replace("'", "")
    for part in re.split(r"[\s|\[\],]+", text):
        name = part.rsplit(".", 1)[-1]
        if name in classes:
            return name
    return None


def scan_source(text: str, file: str, classes: dict[str, type] | None = None) -> list[ApiUse]:
    """Every use of an API-class method in one module's source."""
    classes = classes or api_classes()
    tree = ast.parse(text, filename=file)
    bound: dict[str, str] = {}  # receiver text -> API class
    # Pass 1: bindings (assignments from constructors, annotated parameters/attributes, copies).
    for _ in range(2):  # twice so `self.api = api` after `api: CoreV1Api` is resolved
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                cls = _class_of_call(value, classes) if value is not None else None
                if cls is None and isinstance(node, ast.AnnAssign):
                    cls = _class_of_annotation(node.annotation, classes)
                if cls is None and value is not None:
                    cls = bound.get(_expr_key(value) or "")
                if cls:
                    for t in targets:
                        key = _expr_key(t)
                        if key:
                            bound[key] = cls
            elif isinstance(node, ast.arg):
                cls = _class_of_annotation(node.annotation, classes)
                if cls:
                    bound[node.arg] = cls
    # Pass 2: method references. A reference passed to `.stream(...)` is a watch.
    streamed: set[int] = set()
    watched_calls: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "stream":
                for arg in node.args[:1]:
                    streamed.add(id(arg))
            for kw in node.keywords:
                if kw.arg == "watch" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                    watched_calls.add(id(func))
    uses: list[ApiUse] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and OP_RE.match(node.attr)):
            continue
        owners = [n for n, c in classes.items() if hasattr(c, node.attr)]
        if not owners:
            continue  # not a Kubernetes API method (e.g. a dict's own method of the same shape)
        receiver = _expr_key(node.value) or ""
        cls = bound.get(receiver)
        if cls is None or cls not in owners:
            groups = {api_group(o) for o in owners}
            if len(owners) == 1 or len(groups) == 1:
                cls = sorted(owners)[0]
            else:
                raise ScanError(
                    f"{file}:{node.lineno}: {receiver}.{node.attr} could belong to {sorted(owners)}; "
                    "bind the receiver to an API class (e.g. `api: CoreV1Api`) so RBAC can be derived"
                )
        watch = id(node) in streamed or id(node) in watched_calls
        uses.append(ApiUse(file, node.lineno, cls, node.attr, permission_for(node.attr, cls, watch)))
    # Pass 3: raw requests by URL path. A path given in the same call as a literal HTTP method
    # (``self.request("POST", "/api/v1/...")``) takes that method; any other path takes the
    # module's one literal method.
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    paired = _paired_methods(tree)
    paths = [(n.lineno, p, paired.get(id(n))) for n in ast.walk(tree)
             if id(n) not in in_fstring and (p := _literal_path(n)) is not None]
    loose = [(line, path) for line, path, http in paths if http is None]
    module_http = None
    if loose:
        methods = _raw_methods(tree)
        if len(methods) != 1:
            raise ScanError(
                f"{file}:{loose[0][0]}: API path {loose[0][1]!r} used with HTTP method(s) "
                f"{sorted(methods) or 'unknown'}; "
                "the scan needs exactly one literal method per module to derive the RBAC verb"
            )
        module_http = methods.pop()
    for line, path, http in paths:
        http = http or module_http
        uses.append(ApiUse(file, line, "raw", f"{http} {path}", (permission_for_path(http, path),)))
    return uses


def _paired_methods(tree: ast.AST) -> dict[int, str]:
    """id(path literal) -> the literal HTTP method passed first to the same call."""
    paired: dict[int, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.upper() in (
                "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"):
            for arg in node.args[1:]:
                if _literal_path(arg) is not None:
                    paired[id(arg)] = first.value.upper()
    return paired


def scan_tree(root: Path, include: list[str], exclude: tuple[str, ...] = ()) -> list[ApiUse]:
    """Scan every ``*.py`` under each of ``include`` (relative to root), skipping ``exclude`` prefixes."""
    classes = api_classes()
    uses: list[ApiUse] = []
    for rel in include:
        base = root / rel
        files = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for path in files:
            relpath = path.relative_to(root).as_posix()
            if any(relpath.startswith(e) for e in exclude):
                continue
            uses.extend(scan_source(path.read_text(encoding="utf-8"), relpath, classes))
    return uses


def required_permissions(uses: list[ApiUse]) -> dict[Permission, list[str]]:
    """Permission → the file:line places that need it (always-granted ones left out)."""
    needed: dict[Permission, list[str]] = {}
    for use in uses:
        for perm in use.permissions:
            if perm.key() in ALWAYS_GRANTED:
                continue
            needed.setdefault(perm, []).append(f"{use.file}:{use.line} {use.api_class}.{use.method}")
    return needed


def granted_permissions(docs: list[dict], pilot_namespace: str, subject: tuple[str, str]) -> set[Permission]:
    """Expand the Roles/ClusterRoles bound to ``subject`` (namespace, ServiceAccount name).

    Role rules count as namespace scope (in the pilot namespace only); ClusterRole rules bound by a
    ClusterRoleBinding count as cluster scope. Wildcards are expanded to a ``*`` entry, which the
    test refuses separately.
    """
    roles = {(d["metadata"].get("namespace"), d["kind"], d["metadata"]["name"]): d
             for d in docs if d.get("kind") in ("Role", "ClusterRole")}
    granted: set[Permission] = set()
    sa_ns, sa_name = subject
    for d in docs:
        kind = d.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa_name and s.get("namespace") == sa_ns
                   for s in d.get("subjects") or []):
            continue
        ref = d["roleRef"]
        binding_ns = d["metadata"].get("namespace")
        if kind == "RoleBinding" and binding_ns != pilot_namespace:
            continue
        role_ns = binding_ns if ref["kind"] == "Role" else None
        role = roles.get((role_ns, ref["kind"], ref["name"]))
        if role is None:
            raise ScanError(f"{kind} {d['metadata']['name']} refers to missing {ref['kind']} {ref['name']}")
        cluster = kind == "ClusterRoleBinding"
        for rule in role.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for res in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        granted.add(Permission(group, res, verb, cluster))
    return granted
