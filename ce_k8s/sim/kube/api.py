"""Object semantics of the emulated API server: the one write path every change goes through.

HTTP handlers, the kubelet/scheduler simulator and the built-in controllers (garbage collector,
quota, namespace deletion) all call :class:`Api`, so every change gets a resourceVersion, a watch
event, quota accounting and garbage collection exactly once, whoever made it. The rules follow
the real server (kube-apiserver v1.32): creation stamps ``uid``/``creationTimestamp``/
``generateName``, updates check ``resourceVersion`` preconditions and keep spec and status apart,
deletes honour grace periods, finalizers, preconditions and propagation policies, and pods are
admitted against ``ResourceQuota`` with the real "exceeded quota" message.

All methods run on the server's event loop thread.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import collections
import json
import logging
import random
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import jsonpatch

from ce_k8s.sim.kube import validate as v
from ce_k8s.sim.kube.api_admission import Admission
from ce_k8s.sim.kube.api_controllers import SYSTEM_NAMESPACES, Controllers
from ce_k8s.sim.kube.errors import (
    MODIFIED,
    ApiError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
)
from ce_k8s.sim.kube.objects import SCALARS, TERMINAL_PHASES, clone, meta_of, now_iso, set_condition
from ce_k8s.sim.kube.resources import BY_PLURAL, ResourceInfo
from ce_k8s.sim.kube.selectors import SelectorError, make_filter
from ce_k8s.sim.kube.store import Obj, Store

# Also re-exported here, where the rest of the emulator imports them from.
__all__ = ["LIST_SNAPSHOTS", "LOG_STREAMS", "LOG_STREAM_MODES", "SYSTEM_NAMESPACES", "TERMINAL_PHASES",
           "AccessRule", "Api", "ApiOptions", "clone", "log_lines_of", "merge_patch", "meta_of", "now_iso",
           "pod_log_stream", "set_condition", "strategic_merge"]

log = logging.getLogger(__name__)

LIST_SNAPSHOTS = 8          # paged LISTs whose first-page snapshot is kept (Api.list)


@dataclass
class AccessRule:
    """One RBAC-like rule for SelfSubjectAccessReview answers (``*`` matches anything)."""

    verbs: tuple[str, ...] = ("*",)
    resources: tuple[str, ...] = ("*",)
    api_groups: tuple[str, ...] = ("*",)
    namespaces: tuple[str, ...] = ("*",)

    def allows(self, verb: str, resource: str, group: str, namespace: str) -> bool:
        """Whether this rule grants ``verb`` on ``resource`` (``pods`` or ``pods/log``)."""
        return (("*" in self.verbs or verb in self.verbs)
                and ("*" in self.resources or resource in self.resources)
                and ("*" in self.api_groups or group in self.api_groups)
                and ("*" in self.namespaces or namespace in self.namespaces or not namespace))

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> AccessRule:
        """Build from ``{"verbs": [...], "resources": [...], "apiGroups": [...], "namespaces": [...]}``."""
        def tup(key: str) -> tuple[str, ...]:
            val = d.get(key, ["*"])
            return tuple(str(x) for x in val) if isinstance(val, list | tuple) else (str(val),)
        return cls(tup("verbs"), tup("resources"), tup("apiGroups"), tup("namespaces"))


@dataclass
class ApiOptions:
    """Tunables of the emulated control plane."""

    time_scale: float = 1.0          # multiplies grace periods and controller delays
    gc_delay: float = 0.02           # seconds before the garbage collector acts (real: ~immediate)
    max_events: int = 5000           # Event objects kept (the real server expires them after 1 h)
    seed: int = 0
    user: str = "system:serviceaccount:ce-k8s:ce-k8s-agent"
    enforce_rbac: bool = False       # also answer 403 to requests the rules do not allow
    rules: list[AccessRule] = field(default_factory=lambda: [AccessRule()])
    log_streams: str = "forbid"      # pods/log `stream=`: one of LOG_STREAM_MODES (docs/testbed.md)

    def __post_init__(self) -> None:
        if self.log_streams not in LOG_STREAM_MODES:
            raise ValueError(f"log_streams must be one of {', '.join(LOG_STREAM_MODES)}, "
                             f"not {self.log_streams!r}")


# What a cluster does with the `stream` query parameter of pods/log (KEP-3288):
#   split  -- v1.32+ with the PodLogsQuerySplitStreams feature gate on: Stdout, Stderr or All.
#   forbid -- v1.32+ with the gate off (its default through current releases): any `stream` is
#             a 422 "stream: Forbidden: may not be specified" (kubernetes/kubernetes#133005).
#   ignore -- v1.31 and older: PodLogOptions has no such field, the parameter is dropped and
#             the combined log is returned.
LOG_STREAM_MODES = ("split", "forbid", "ignore")
LOG_STREAMS = ("All", "Stderr", "Stdout")     # listed sorted in the 422 (the real order may differ)


def pod_log_stream(mode: str, name: str, stream: str | None, tail: int | None, limit: int | None,
                   since: int | None) -> str:
    """Validate pods/log options as kube-apiserver's ValidatePodLogOptions does (422 Invalid, kind
    PodLogOptions, every failing rule in one answer) and return the stream to serve: "All",
    "Stdout" or "Stderr".

    Why here and before the pod is looked up: the real server validates the options before it
    reads the pod, so a bad option is a 422 even for a pod that does not exist.
    """
    causes: list[tuple[str, str, str]] = []
    if tail is not None and tail < 0:
        causes.append(("tailLines", "FieldValueInvalid",
                       f"Invalid value: {tail}: must be greater than or equal to 0"))
    if limit is not None and limit < 1:
        causes.append(("limitBytes", "FieldValueInvalid", f"Invalid value: {limit}: must be greater than 0"))
    if since is not None and since < 1:
        causes.append(("sinceSeconds", "FieldValueInvalid", f"Invalid value: {since}: must be greater than 0"))
    if mode == "ignore":
        stream = None
    elif mode == "forbid":
        if stream is not None:
            causes.append(("stream", "FieldValueForbidden", "Forbidden: may not be specified"))
        stream = None
    elif stream is None:
        stream = "All"     # the gate's defaulting: no `stream` means both, interleaved
    else:
        if stream not in LOG_STREAMS:
            listed = ", ".join(f'"{s}"' for s in LOG_STREAMS)
            causes.append(("stream", "FieldValueNotSupported",
                           f'Unsupported value: "{stream}": supported values: {listed}'))
        if stream != "All" and tail is not None:
            causes.append(("[]", "FieldValueForbidden",
                           "Forbidden: `tailLines` and specific `stream` are mutually exclusive for now"))
    if causes:
        raise invalid("PodLogOptions", name, causes)
    return stream or "All"


def log_lines_of(lines: list[tuple[str, str, str]], stream: str) -> list[tuple[str, str, str]]:
    """The (timestamp, stream, text) entries a pods/log `stream` selects, in write order."""
    if stream == "All":
        return lines
    want = stream.lower()
    return [x for x in lines if x[1] == want]


class Api:
    """Create/read/update/patch/delete with the real server's semantics, on top of :class:`Store`."""

    def __init__(self, store: Store, options: ApiOptions | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.store = store
        self.opts = options or ApiOptions()
        self.loop = loop or asyncio.get_event_loop()
        # Seeded so uids and generated names repeat from run to run; nothing here is a secret.
        self.rng = random.Random(self.opts.seed)  # noqa: S311
        # What a write must pass before storage (validation, defaulting, quota), and the built-in
        # controllers that act after it (namespace deletion, garbage collection).
        self.admission = Admission(store, self.rng)
        self.controllers = Controllers(self)
        self._event_keys: deque[tuple[str, str]] = deque()
        self._timers: set[asyncio.TimerHandle] = set()
        # Paged LISTs in progress: the sorted result of a first page, by what it was asked
        # for and at which resourceVersion (see `list`).
        self._pages: collections.OrderedDict[tuple[object, ...], list[tuple[tuple[str, str], Obj]]] = \
            collections.OrderedDict()
        # Who may keep a pod whose grace period ran out: the end of the grace stands in for the
        # kubelet's confirmation here, but a kubelet that cannot be reached (a lost node) never
        # confirms, and the real server then keeps the pod Terminating (ce_k8s.sim.kube.kubelet).
        self.grace_holds: list[Callable[[Obj], bool]] = []
        for ns in SYSTEM_NAMESPACES:
            self.create("namespaces", None, {"metadata": {"name": ns}})

    # ---- helpers ----------------------------------------------------------------------------
    def info(self, resource: str) -> ResourceInfo:
        """The table entry for ``resource`` (404 for anything we do not serve)."""
        info = BY_PLURAL.get(resource)
        if info is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return info

    def later(self, delay: float, fn: Callable[..., None], *args: object) -> None:
        """Run ``fn(*args)`` on the loop after ``delay`` seconds (a controller's deferred step)."""
        handle: asyncio.TimerHandle

        def run() -> None:
            self._timers.discard(handle)
            try:
                fn(*args)
            except ApiError as e:
                log.debug("deferred %s: %s", getattr(fn, "__name__", fn), e.message)
            except Exception:
                log.exception("deferred %s failed", getattr(fn, "__name__", fn))

        handle = self.loop.call_later(max(0.0, delay), run)
        self._timers.add(handle)

    def cancel_timers(self) -> None:
        """Drop pending controller timers (server shutdown)."""
        for h in list(self._timers):
            h.cancel()
        self._timers.clear()

    def _new_uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def get(self, resource: str, namespace: str | None, name: str) -> Obj:
        """The stored object (not a copy) or 404."""
        info = self.info(resource)
        obj = self.store.peek(resource, ns_key(info, namespace), name)
        if obj is None:
            raise not_found(resource, name, info.group)
        return obj

    # ---- create -----------------------------------------------------------------------------
    def create(self, resource: str, namespace: str | None, body: object, *, dry_run: bool = False) -> Obj:
        """POST on a collection: validate, default, admit, stamp and store (201)."""
        info = self.info(resource)
        if "create" not in info.verbs:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if not isinstance(body, dict):
            raise bad_request("the body of the request was in an unknown format")
        obj: Obj = clone(body)
        self.admission.check_kind(info, obj)
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if resource == "selfsubjectaccessreviews":
            obj["kind"], obj["apiVersion"] = info.kind, info.api_version
            return self._access_review(obj)
        ns = ""
        if info.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise bad_request("the namespace of the provided object does not match the namespace sent on "
                                  "the request")
            ns = str(namespace or body_ns or "")
            if not ns:
                raise bad_request("an empty namespace may not be set during creation")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self.admission.generate_name(resource, ns, str(meta["generateName"]))
        name = meta.get("name")
        causes = v.validate_metadata(resource, meta)
        causes += self.admission.validate(resource, obj, None)
        if causes:
            raise invalid(info.kind, str(name or ""), causes)
        name = str(name)
        if info.namespaced:
            self.admission.check_namespace_open(resource, ns, name, info.group)
        obj["kind"], obj["apiVersion"] = info.kind, info.api_version
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "selfLink"):
            meta.pop(k, None)
        meta["uid"] = self._new_uid()
        meta["creationTimestamp"] = now_iso()
        self.admission.default(resource, obj)
        if resource == "pods":
            # Admission (ResourceQuota) runs before storage says AlreadyExists, dry runs included:
            # at a full quota a create of a pod that exists is 403 "exceeded quota", not 409, on
            # a real kube-apiserver (tests/real/test_emulator_parity.py; the creator's re-run
            # asks for the pod itself then).
            self.admission.admit_pod(ns, name, obj)
        if self.store.peek(resource, ns, name) is not None:
            raise already_exists(resource, name, info.group)
        if dry_run:
            return obj      # with its uid and no resourceVersion, as the real dry run answers
        stored = self.commit(resource, None, obj)
        if resource == "namespaces":
            self._ensure_default_sa(name)
        if resource == "events":
            self._trim_events((ns, name))
        return stored

    def _ensure_default_sa(self, ns: str) -> None:
        if self.store.peek("serviceaccounts", ns, "default") is None:
            self.create("serviceaccounts", ns, {"metadata": {"name": "default"}})

    # ---- the single commit point ----------------------------------------------------------------
    def commit(self, resource: str, old: Obj | None, new: Obj) -> Obj:
        """Store ``new`` (ADDED when ``old`` is None, else MODIFIED), with its quota charge and a
        garbage-collector check when one of its owners is already gone."""
        stored = self.store.put(resource, new, "ADDED" if old is None else "MODIFIED")
        meta = meta_of(stored)
        if resource == "pods":
            self.admission.account(str(meta.get("namespace")), str(meta["name"]), stored)
        refs = meta.get("ownerReferences")
        if isinstance(refs, list) and refs:
            if any(self.store.peek_uid(str(r.get("uid"))) is None for r in refs if isinstance(r, dict)):
                self.later(self.opts.gc_delay, self.controllers.gc_orphan_check, resource,
                           str(meta.get("namespace") or ""), str(meta["name"]), str(meta.get("uid")))
        return stored

    def remove(self, resource: str, obj: Obj) -> Obj:
        """Take ``obj`` out of the store (DELETED), freeing its quota and collecting its dependents."""
        meta = meta_of(obj)
        ns, name = str(meta.get("namespace") or ""), str(meta["name"])
        final = self.store.remove(resource, ns, name) or obj
        if resource == "pods":
            self.admission.account(ns, name, None)
        uid = meta.get("uid")
        if uid and self.store.dependents_of(str(uid)):
            self.later(self.opts.gc_delay, self.controllers.gc_dependents, str(uid))
        return final

    # ---- update / patch -----------------------------------------------------------------------
    def replace(self, resource: str, namespace: str | None, name: str, body: object,
                subresource: str | None = None, *, dry_run: bool = False) -> Obj:
        """PUT: full replacement with resourceVersion precondition and spec/status separation."""
        info = self.info(resource)
        if not isinstance(body, dict):
            raise bad_request("the body of the request was in an unknown format")
        self.admission.check_kind(info, body)
        old = self.get(resource, namespace, name)
        new = clone(body)
        return self._update(info, old, new, subresource, dry_run=dry_run)

    def patch(self, resource: str, namespace: str | None, name: str, patch_type: str, body: object,
              subresource: str | None = None, *, dry_run: bool = False) -> Obj:
        """PATCH with JSON patch, merge patch, strategic merge (as merge) or apply (as merge)."""
        info = self.info(resource)
        old = self.get(resource, namespace, name)
        doc = clone(old)
        if patch_type == "json":
            if not isinstance(body, list):
                raise bad_request("json patch must be a list of operations")
            try:
                new = jsonpatch.JsonPatch(body).apply(doc)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, TypeError) as e:
                raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                               f"{e}") from e
        elif patch_type in ("merge", "strategic", "apply"):
            if not isinstance(body, dict):
                raise bad_request("the body of the request was in an unknown format")
            new = merge_patch(doc, body) if patch_type == "merge" else strategic_merge(doc, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                           f"accepted media types include: application/json-patch+json, "
                           f"application/merge-patch+json, application/apply-patch+yaml, "
                           f"application/strategic-merge-patch+json ({patch_type})")
        if not isinstance(new, dict):
            raise bad_request("the patched object is not an object")
        # A patch that does not mention resourceVersion carries the current one: no precondition.
        patched_rv = _patch_mentions_rv(body)
        if not patched_rv:
            meta_of(new)["resourceVersion"] = meta_of(old).get("resourceVersion")
        return self._update(info, old, new, subresource, dry_run=dry_run)

    def _update(self, info: ResourceInfo, old: Obj, new: Obj, subresource: str | None, *,
                dry_run: bool = False) -> Obj:
        resource = info.plural
        ometa = meta_of(old)
        name = str(ometa["name"])
        nmeta = new.get("metadata")
        if not isinstance(nmeta, dict):
            nmeta = new["metadata"] = {}
        if nmeta.get("name") not in (None, name):
            raise bad_request(f"the name of the object ({nmeta.get('name')}) does not match the name on the URL "
                              f"({name})")
        if info.namespaced and nmeta.get("namespace") not in (None, "", ometa.get("namespace")):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the "
                              "request")
        rv = nmeta.get("resourceVersion")
        if rv not in (None, "") and str(rv) != str(ometa.get("resourceVersion")):
            raise conflict(resource, name, MODIFIED, info.group)
        if nmeta.get("uid") not in (None, "", ometa.get("uid")):
            raise conflict(resource, name, f"Precondition failed: UID in precondition: {nmeta.get('uid')}, UID in "
                           f"object meta: {ometa.get('uid')}", info.group)
        if subresource == "status":
            result = clone(old)
            result["status"] = clone(new.get("status") or {})
        else:
            result = new
            result["kind"], result["apiVersion"] = info.kind, info.api_version
            rmeta = meta_of(result)
            for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                      "deletionGracePeriodSeconds", "generation"):
                if k in ometa:
                    rmeta[k] = ometa[k]
                else:
                    rmeta.pop(k, None)
            if not info.namespaced:
                rmeta.pop("namespace", None)
            if info.has_status:
                if "status" in old:
                    result["status"] = clone(old["status"])
                else:
                    result.pop("status", None)
            if resource == "namespaces":
                result["spec"] = clone(old.get("spec"))
            causes = v.validate_metadata(resource, rmeta) + self.admission.validate(resource, result, old)
            if causes:
                raise invalid(info.kind, name, causes)
            if (ometa.get("deletionTimestamp") and isinstance(rmeta.get("finalizers"), list)
                    and any(f not in (ometa.get("finalizers") or []) for f in rmeta["finalizers"])):
                raise invalid(info.kind, name, [("metadata.finalizers", "FieldValueForbidden",
                                                 "Forbidden: no new finalizers can be added if the object is being "
                                                 "deleted")])
        if resource == "resourcequotas" and subresource != "status":
            self.admission.quota_status(result)
        if dry_run:
            return result
        if deletion_complete(result):
            return self.remove(resource, result)
        if _same_content(old, result):
            return old  # the real server does not bump resourceVersion for a no-op update
        return self.commit(resource, old, result)

    def write(self, resource: str, namespace: str | None, name: str,
              mutate: Callable[[Obj], None], *, status: bool = True) -> Obj:
        """Internal read-modify-write used by the simulators (kubelet, scheduler, node controller).

        ``mutate`` gets a deep copy; the result goes through the same commit as an HTTP PUT on
        ``/status`` (or the main resource when ``status`` is False) without spec validation.

        A status write copies everything but ``spec``, which it shares with the stored object:
        the status subresource cannot change spec (a replaced ``spec`` is put back, as the real
        server does), and copying a pod's spec for each of the kubelet's status changes was a
        third of the emulator's CPU in the pipeline benchmark. Stored objects are never changed
        in place (Store.remove shares sub-objects the same way), so ``mutate`` may read spec
        and must not edit it.
        """
        old = self.get(resource, namespace, name)
        if status and "spec" in old:
            new = {k: v if k == "spec" or type(v) in SCALARS else clone(v) for k, v in old.items()}
            mutate(new)
            new["spec"] = old["spec"]
        else:
            new = clone(old)
            mutate(new)
        if _same_content(old, new):
            return old
        if not status and deletion_complete(new):
            return self.remove(resource, new)
        return self.commit(resource, old, new)

    # ---- delete -------------------------------------------------------------------------------
    def delete(self, resource: str, namespace: str | None, name: str, options: Mapping[str, object] | None = None,
               *, dry_run: bool = False) -> tuple[Obj, int]:
        """DELETE: returns (body, http code). Pods and namespaces answer with the object, others with
        a Success Status; 202 when the object is not gone yet (grace period or finalizers)."""
        info = self.info(resource)
        opts = dict(options or {})
        obj = self.get(resource, namespace, name)
        meta = meta_of(obj)
        pre = opts.get("preconditions")
        if isinstance(pre, dict):
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                raise conflict(resource, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in "
                               f"object meta: {meta.get('uid')}", info.group)
            if pre.get("resourceVersion") and str(pre["resourceVersion"]) != str(meta.get("resourceVersion")):
                raise conflict(resource, name, f"Precondition failed: ResourceVersion in precondition: "
                               f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                               f"{meta.get('resourceVersion')}", info.group)
        grace = grace_period(resource, obj, opts.get("gracePeriodSeconds"))
        policy = opts.get("propagationPolicy")
        if policy is None and opts.get("orphanDependents") is True:
            policy = "Orphan"
        if policy not in (None, "Background", "Foreground", "Orphan"):
            raise invalid("DeleteOptions", "", [("propagationPolicy", "FieldValueNotSupported",
                                                 f'Unsupported value: "{policy}": supported values: "Foreground", '
                                                 '"Background", "Orphan", "nil"')])
        if dry_run:
            return obj, 200
        if resource == "namespaces":
            return self.controllers.delete_namespace(obj), 202
        uid = str(meta.get("uid"))
        if policy == "Orphan":
            self.controllers.orphan_dependents(uid)
        new = clone(obj)
        nmeta = meta_of(new)
        finalizers = list(nmeta.get("finalizers") or [])
        if policy == "Foreground" and self.store.dependents_of(uid) and "foregroundDeletion" not in finalizers:
            if not nmeta.get("deletionTimestamp"):
                finalizers.append("foregroundDeletion")
                nmeta["finalizers"] = finalizers
                self.later(self.opts.gc_delay, self.controllers.foreground, uid)
        if nmeta.get("deletionTimestamp"):
            current = nmeta.get("deletionGracePeriodSeconds")
            if isinstance(current, int) and grace < current:
                nmeta["deletionGracePeriodSeconds"] = grace
                nmeta["deletionTimestamp"] = now_iso(grace)
                if deletion_complete(new):
                    if resource == "pods":
                        new = self.commit(resource, obj, new)
                    return deleted_answer(info, self.remove(resource, new)), 200
                return self.commit(resource, obj, new), 202
            return obj, 202
        if grace == 0 and not finalizers:
            if resource == "pods":
                # A pod is deleted gracefully even with no grace left (unscheduled, finished, or
                # gracePeriodSeconds=0): kube-apiserver first stores it with deletionTimestamp and
                # deletionGracePeriodSeconds 0, then removes it, so watchers see MODIFIED then a
                # DELETED that carries the stamp (tests/real/test_emulator_parity.py).
                nmeta["deletionTimestamp"] = now_iso()
                nmeta["deletionGracePeriodSeconds"] = 0
                obj = self.commit(resource, obj, new)
            return deleted_answer(info, self.remove(resource, obj)), 200
        nmeta["deletionTimestamp"] = now_iso(grace)
        nmeta["deletionGracePeriodSeconds"] = grace
        stored = self.commit(resource, obj, new)
        if grace > 0:
            self.later(grace * self.opts.time_scale, self._grace_expired, resource, str(meta.get("namespace") or ""),
                        name, uid)
        return stored, 202

    def _grace_expired(self, resource: str, ns: str, name: str, uid: str) -> None:
        obj = self.store.peek(resource, ns, name)
        if obj is None or meta_of(obj).get("uid") != uid or not meta_of(obj).get("deletionTimestamp"):
            return
        if any(hold(obj) for hold in self.grace_holds):
            return
        new = clone(obj)
        meta_of(new)["deletionGracePeriodSeconds"] = 0
        if deletion_complete(new):
            self.remove(resource, new)
        else:
            self.commit(resource, obj, new)

    def delete_collection(self, resource: str, namespace: str | None, label_selector: str | None,
                          field_selector: str | None, options: Mapping[str, object] | None = None) -> Obj:
        """DELETE on a collection: delete every selected object, answer with the list of them."""
        info = self.info(resource)
        if "deletecollection" not in info.verbs:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        try:
            pred = make_filter(label_selector, field_selector, resource)
        except SelectorError as e:
            raise bad_request(str(e)) from e
        items = []
        for obj in list(self.store.peek_list(resource, ns_key(info, namespace) if info.namespaced and
                                             namespace else None)):
            if pred is None or pred(obj):
                meta = meta_of(obj)
                try:
                    body, _ = self.delete(resource, str(meta.get("namespace") or "") or None, str(meta["name"]),
                                          options)
                except ApiError:
                    continue
                items.append(body if body.get("kind") != "Status" else obj)
        return {"kind": f"{info.kind}List", "apiVersion": info.api_version,
                "metadata": {"resourceVersion": str(self.store.resource_version)}, "items": items}

    # ---- subresources -------------------------------------------------------------------------
    def evict(self, namespace: str, name: str, body: object) -> Obj:
        """POST pods/eviction (policy/v1): DisruptionTarget condition, then a normal delete."""
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            raise bad_request("the body of the request was in an unknown format")
        self.get("pods", namespace, name)         # 404 for a pod that does not exist
        if meta_of(body).get("name") not in (None, name):
            raise bad_request("name in URL does not match name in Eviction object")
        # Every evicted pod gets the condition, a finished or terminating one too: kube-apiserver's
        # addConditionAndDeletePod runs for every pod it evicts (finding 4 of
        # docs/real-kubernetes.md; tests/real/test_emulator_parity.py), so the agent must tell a
        # drain after the pilot's end from an eviction that ended it.
        def mark(p: Obj) -> None:
            set_condition(p.setdefault("status", {}), "DisruptionTarget", "True",  # type: ignore[arg-type]
                          "EvictionByEvictionAPI", "Eviction API: evicting")
        self.write("pods", namespace, name, mark)
        opts = body.get("deleteOptions") if isinstance(body.get("deleteOptions"), dict) else None
        self.delete("pods", namespace, name, opts)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def bind(self, namespace: str, name: str, body: object) -> Obj:
        """POST pods/binding: set ``spec.nodeName`` once (what the scheduler does)."""
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict):
            raise bad_request("the body of the request was in an unknown format")
        node = str(body["target"].get("name") or "")
        pod = self.get("pods", namespace, name)
        spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
        if (spec or {}).get("nodeName"):  # type: ignore[union-attr]
            raise conflict("pods", name, f'pod {name} is already assigned to node "{spec["nodeName"]}"')  # type: ignore[index]
        if meta_of(pod).get("deletionTimestamp"):
            raise conflict("pods", name, f"pod {name} is being deleted, cannot be assigned to a host")

        def assign(p: Obj) -> None:
            p["spec"]["nodeName"] = node  # type: ignore[index]
            set_condition(p.setdefault("status", {}), "PodScheduled", "True")  # type: ignore[arg-type]
        self.write("pods", namespace, name, assign)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _access_review(self, obj: Obj) -> Obj:
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        ra = (spec or {}).get("resourceAttributes")  # type: ignore[union-attr]
        if isinstance(ra, dict):
            res = str(ra.get("resource", ""))
            if ra.get("subresource"):
                res = f"{res}/{ra['subresource']}"
            allowed = self.allowed(str(ra.get("verb", "")), res, str(ra.get("group", "")),
                                   str(ra.get("namespace", "")))
        else:
            allowed = False
        status: dict[str, object] = {"allowed": allowed}
        if not allowed:
            status["reason"] = "no RBAC policy matched" if isinstance(ra, dict) else "only resourceAttributes are " \
                "supported by the emulator"
        obj["status"] = status
        meta_of(obj).pop("uid", None)
        return obj

    def allowed(self, verb: str, resource: str, group: str, namespace: str) -> bool:
        """Whether the configured rules allow this request (SelfSubjectAccessReview and RBAC)."""
        return any(r.allows(verb, resource, group, namespace) for r in self.opts.rules)

    # ---- events ---------------------------------------------------------------------------------
    def _trim_events(self, key: tuple[str, str]) -> None:
        self._event_keys.append(key)
        while len(self._event_keys) > self.opts.max_events:
            ns, name = self._event_keys.popleft()
            obj = self.store.peek("events", ns, name)
            if obj is not None:
                self.remove("events", obj)

    def record_event(self, involved: Obj, reason: str, message: str, etype: str = "Normal",
                     component: str = "kubelet", host: str | None = None) -> None:
        """Create a core/v1 Event about ``involved`` (what kubelet and scheduler emit)."""
        meta = meta_of(involved)
        ns = str(meta.get("namespace") or "default")
        if self.store.peek("namespaces", "", ns) is None:
            return
        src: dict[str, object] = {"component": component}
        if host:
            src["host"] = host
        body = {
            "metadata": {"name": f"{meta.get('name')}.{self.rng.getrandbits(64):016x}", "namespace": ns},
            "involvedObject": {"kind": involved.get("kind"), "namespace": ns, "name": meta.get("name"),
                               "uid": meta.get("uid"), "apiVersion": involved.get("apiVersion"),
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message, "type": etype, "source": src,
            "reportingComponent": component, "reportingInstance": host or "",
        }
        try:
            self.create("events", ns, body)
        except ApiError as e:
            log.debug("event not recorded: %s", e.message)

    # ---- list -------------------------------------------------------------------------------------
    def list(self, resource: str, namespace: str | None, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None, continue_: str | None = None) -> Obj:
        """LIST with selectors and ``limit``/``continue`` paging (items sorted by namespace/name).

        A paged LIST is one snapshot, as the real server serves it: every page of it shows the
        objects as they were at the first page's resourceVersion. Stored objects are never
        mutated, so the first page keeps its sorted result (references only) and each
        continuation bisects into it: a page costs O(limit), not a filter and sort of every
        object (40 pages of 20,000 pods would otherwise cost 40 full sorts, which made the
        emulator, not the client, the bottleneck of the agent's relist). A continuation whose
        snapshot is no longer kept (a restarted emulator, or more than `LIST_SNAPSHOTS` lists
        running at once) is served from the current objects after its key, as before.
        """
        info = self.info(resource)
        if "list" not in info.verbs:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        try:
            pred = make_filter(label_selector, field_selector, resource)
        except SelectorError as e:
            raise bad_request(str(e)) from e
        rv = self.store.resource_version
        start: tuple[str, str] | None = None
        if continue_:
            try:
                tok = json.loads(base64.urlsafe_b64decode(continue_.encode()).decode())
                start = (str(tok["ns"]), str(tok["name"]))
                rv = int(tok["rv"])
            except (ValueError, KeyError, TypeError) as e:
                raise bad_request(f"continue key is not valid: {e}") from e
        ns = namespace if info.namespaced and namespace else None
        snap_key = (resource, ns, label_selector, field_selector, rv)
        keyed = self._pages.get(snap_key) if start is not None else None
        if keyed is None:
            objs = [o for o in self.store.peek_list(resource, ns) if pred is None or pred(o)]
            keyed = sorted((((str(meta_of(o).get("namespace") or ""), str(meta_of(o)["name"])), o) for o in objs),
                           key=_first) if objs else []
        else:
            self._pages.move_to_end(snap_key)
        first = bisect.bisect_right(keyed, start, key=_first) if start is not None else 0
        list_meta: dict[str, object] = {"resourceVersion": str(rv)}
        end = len(keyed)
        if limit and limit > 0 and end - first > limit:
            end = first + limit
            last = keyed[end - 1][0]
            list_meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": rv, "ns": last[0], "name": last[1]}).encode()).decode()
            list_meta["remainingItemCount"] = len(keyed) - end
            if start is None or snap_key not in self._pages:
                self._pages[snap_key] = keyed
                while len(self._pages) > LIST_SNAPSHOTS:
                    self._pages.popitem(last=False)
        elif start is not None:
            self._pages.pop(snap_key, None)       # the last page: this list is done
        items = [{k: val for k, val in o.items() if k not in ("kind", "apiVersion")} for _, o in keyed[first:end]]
        return {"kind": f"{info.kind}List", "apiVersion": info.api_version, "metadata": list_meta, "items": items}


def ns_key(info: ResourceInfo, namespace: str | None) -> str:
    """The store's namespace key: "" for a cluster-scoped resource."""
    return (namespace or "") if info.namespaced else ""


def deletion_complete(obj: Obj) -> bool:
    """Whether a deleted object may go now: no finalizers and no grace period left."""
    meta = meta_of(obj)
    return bool(meta.get("deletionTimestamp")) and not meta.get("finalizers") and \
        not meta.get("deletionGracePeriodSeconds")


def deleted_answer(info: ResourceInfo, final: Obj) -> Obj:
    """A finished DELETE's body: the object for pods and namespaces, a Success Status otherwise."""
    if info.plural in ("pods", "namespaces"):
        return final
    meta = meta_of(final)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": meta.get("name"), "kind": info.plural, "uid": meta.get("uid")}}


def grace_period(resource: str, obj: Obj, requested: object) -> int:
    """The grace period a DELETE gives ``obj``: only a running pod's is more than 0."""
    if resource != "pods":
        return 0
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    assert isinstance(spec, dict) and isinstance(status, dict)
    # Unscheduled and terminal pods have nothing to stop: deleted at once (pod strategy).
    if not spec.get("nodeName") or status.get("phase") in TERMINAL_PHASES:
        return 0
    if requested is None:
        g = spec.get("terminationGracePeriodSeconds", 30)
        return int(g) if isinstance(g, int) and g >= 0 else 30
    try:
        g = int(requested)  # type: ignore[call-overload]
    except (TypeError, ValueError) as e:
        raise bad_request(f"invalid gracePeriodSeconds {requested!r}") from e
    return max(0, g)


def _first(pair: tuple[tuple[str, str], Obj]) -> tuple[str, str]:
    return pair[0]


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386 JSON merge patch (``null`` deletes, lists replace)."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, val in patch.items():
        if k.startswith("$") and isinstance(k, str):
            continue  # strategic-merge directives ($patch, $setElementOrder) are ignored
        if val is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), val)
    return result


# patchMergeKey of the list fields ce-k8s objects use (from the Kubernetes API types); lists not
# named here are replaced, as in a JSON merge patch. "finalizers" merges as a set of strings.
_MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "volumes": "name",
    "env": "name", "volumeMounts": "mountPath", "ports": "containerPort", "conditions": "type",
    "ownerReferences": "uid", "imagePullSecrets": "name", "addresses": "type", "envFrom": None,
}


def strategic_merge(target: object, patch: object) -> object:
    """Strategic merge patch for the fields we use: lists with a merge key merge element-wise
    (``$patch: delete`` removes one), ``finalizers`` merge as a set, other lists are replaced."""
    if not isinstance(patch, dict):
        return clone(patch)
    if patch.get("$patch") == "replace":
        return {k: clone(x) for k, x in patch.items() if not k.startswith("$")}
    result = dict(target) if isinstance(target, dict) else {}
    for k, val in patch.items():
        if k.startswith("$"):
            continue
        if val is None:
            result.pop(k, None)
        elif isinstance(val, list) and isinstance(result.get(k), list) and _MERGE_KEYS.get(k):
            result[k] = _merge_list(result[k], val, str(_MERGE_KEYS[k]))
        elif isinstance(val, list) and k == "finalizers" and isinstance(result.get(k), list):
            result[k] = list(result[k]) + [f for f in val if f not in result[k]]
        else:
            result[k] = strategic_merge(result.get(k), val) if isinstance(val, dict) else clone(val)
    return result


def _merge_list(old: list[object], patch: list[object], key: str) -> list[object]:
    out = list(old)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            out.append(clone(item))
            continue
        idx = next((i for i, o in enumerate(out) if isinstance(o, dict) and o.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append({k: clone(x) for k, x in item.items() if not k.startswith("$")})
        else:
            out[idx] = strategic_merge(out[idx], item)
    return out


def _patch_mentions_rv(body: object) -> bool:
    if isinstance(body, dict):
        m = body.get("metadata")
        return isinstance(m, dict) and m.get("resourceVersion") not in (None, "")
    if isinstance(body, list):
        return any(isinstance(op, dict) and str(op.get("path", "")).startswith("/metadata/resourceVersion")
                   for op in body)
    return False


def _same_content(a: Obj, b: Obj) -> bool:
    ma, mb = meta_of(a), meta_of(b)
    if {k: x for k, x in ma.items() if k != "resourceVersion"} != {k: x for k, x in mb.items()
                                                                   if k != "resourceVersion"}:
        return False
    return {k: x for k, x in a.items() if k != "metadata"} == {k: x for k, x in b.items() if k != "metadata"}
