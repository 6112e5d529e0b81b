"""What a write must pass before the emulated API server stores it: checks, defaults, quota.

Why a part of its own: the verbs (api.py) decide what a request means; this decides whether the
object may be stored and how it looks when it is, the way kube-apiserver's validation, defaulting
and admission plugins sit between the handler and storage. Here: the kind/apiVersion check,
``generateName`` suffixes, the open-namespace check (NamespaceLifecycle), per-kind validation
(validate.py) and defaulting, and ResourceQuota: the pod's charge, the namespace totals, the
quota's ``status.used`` and the admission answer with the real "exceeded quota" message.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from fractions import Fraction

from ce_k8s.quantity import QuantityError, decode_quantity
from ce_k8s.sim.kube import validate as v
from ce_k8s.sim.kube.errors import ApiError, bad_request, forbidden, not_found
from ce_k8s.sim.kube.objects import TERMINAL_PHASES, clone, meta_of, now_iso
from ce_k8s.sim.kube.quantity import add_into, format_quantity, pod_resources
from ce_k8s.sim.kube.resources import ResourceInfo
from ce_k8s.sim.kube.store import Obj, Store

_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Quota keys charged per pod for the standard compute resources.
_STD = ("cpu", "memory", "ephemeral-storage")


class Admission:
    """Validation, defaulting and ResourceQuota admission and accounting over ``store``.

    ``rng`` is the API's own seeded generator, shared so that uids, generated names and event
    names draw from one sequence, as they did before this part was split out of :class:`Api`.
    """

    def __init__(self, store: Store, rng: random.Random) -> None:
        self.store = store
        self.rng = rng
        # Quota bookkeeping: what each live pod is charged, and per-namespace totals.
        self._charges: dict[tuple[str, str], dict[str, Fraction]] = {}
        self._ns_totals: dict[str, dict[str, Fraction]] = {}

    def check_kind(self, info: ResourceInfo, obj: Mapping[str, object]) -> None:
        """400 when the body names another kind or apiVersion than the URL's resource."""
        kind = obj.get("kind")
        if kind and kind != info.kind:
            raise bad_request(f"the API version in the data ({obj.get('apiVersion')}) does not match the expected "
                              f"API version ({info.api_version})" if obj.get("apiVersion") != info.api_version
                              else f"Kind {kind} does not match the expected kind {info.kind}")

    def generate_name(self, resource: str, ns: str, prefix: str) -> str:
        """``prefix`` plus five random characters, as ``generateName`` asks (409 after 16 taken names)."""
        base = prefix[: 63 - 5] if len(prefix) > 58 else prefix
        for _ in range(16):
            name = base + "".join(self.rng.choice(_SUFFIX_ALPHABET) for _ in range(5))
            if self.store.peek(resource, ns, name) is None:
                return name
        raise ApiError(409, "AlreadyExists", f'{resource} "{base}" already exists (generateName)')

    def check_namespace_open(self, resource: str, ns: str, name: str, group: str) -> None:
        """404 for a namespace that does not exist, 403 for one being deleted (NamespaceLifecycle)."""
        nso = self.store.peek("namespaces", "", ns)
        if nso is None:
            raise not_found("namespaces", ns)
        if meta_of(nso).get("deletionTimestamp"):
            raise ApiError(403, "Forbidden",
                           f'{resource} "{name}" is forbidden: unable to create new content in namespace {ns} '
                           "because it is being terminated",
                           {"name": name, "kind": resource,
                            "causes": [{"reason": "NamespaceTerminating", "message": f"namespace {ns} is being "
                                        "terminated", "field": "metadata.namespace"}]})

    def validate(self, resource: str, obj: Obj, old: Obj | None) -> list[v.Cause]:
        """The validation causes of ``obj`` (an update of ``old`` when given); empty when valid."""
        if resource == "pods":
            causes = v.validate_pod(obj)
            if old is not None and not causes:
                causes = v.pod_spec_update_causes(old, obj)
            return causes
        if resource == "secrets":
            v.fold_string_data(obj)
            causes = v.validate_secret(obj)
            if old is not None and old.get("immutable") is True:
                if obj.get("data") != old.get("data"):
                    causes.append(("data", "FieldValueForbidden", "Forbidden: field is immutable when `immutable` "
                                   "is set"))
                if obj.get("immutable") is not True:
                    causes.append(("immutable", "FieldValueForbidden", "Forbidden: field is immutable when "
                                   "`immutable` is set"))
            return causes
        if resource == "resourcequotas":
            hard = (obj.get("spec") or {}).get("hard") or {}  # type: ignore[union-attr]
            causes = []
            for k, val in hard.items():
                try:
                    decode_quantity(val)
                except QuantityError as e:
                    causes.append((f"spec.hard[{k}]", "FieldValueInvalid",
                                   f"Invalid value: {val!r}: {e.server_message}"))
            return causes
        return []

    def default(self, resource: str, obj: Obj) -> None:
        """Fill in the defaults the real server sets on create."""
        if resource == "pods":
            v.default_pod(obj)
        elif resource == "namespaces":
            meta = meta_of(obj)
            labels = meta.setdefault("labels", {})
            if isinstance(labels, dict):
                labels["kubernetes.io/metadata.name"] = str(meta["name"])
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        elif resource == "secrets":
            obj.setdefault("type", "Opaque")
        elif resource == "nodes":
            status = obj.setdefault("status", {})
            if isinstance(status, dict):
                status.setdefault("capacity", {})
                status.setdefault("allocatable", dict(status.get("capacity") or {}))
                status.setdefault("conditions", [])
        elif resource == "resourcequotas":
            self.quota_status(obj)
        elif resource == "events":
            obj.setdefault("count", 1)
            now = now_iso()
            obj.setdefault("firstTimestamp", now)
            obj.setdefault("lastTimestamp", now)
            obj.setdefault("type", "Normal")

    @staticmethod
    def pod_usage(pod: Obj) -> dict[str, Fraction]:
        """What a pod is charged in ResourceQuota terms."""
        usage: dict[str, Fraction] = {"pods": Fraction(1), "count/pods": Fraction(1)}
        for k, val in pod_resources(pod, "requests").items():
            usage[f"requests.{k}"] = val
            if k in _STD:
                usage[k] = val
        for k, val in pod_resources(pod, "limits").items():
            if k in _STD:
                usage[f"limits.{k}"] = val
        return usage

    def account(self, ns: str, name: str, pod: Obj | None) -> None:
        """Charge ``pod`` (None: gone) to its namespace's quota totals and refresh the quotas' ``status.used``."""
        old = self._charges.pop((ns, name), None)
        new = None
        if pod is not None:
            status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
            if status.get("phase") not in TERMINAL_PHASES:  # type: ignore[union-attr]
                new = old if old is not None else self.pod_usage(pod)
        if new is not None:
            self._charges[(ns, name)] = new
        if old == new:
            return
        totals = self._ns_totals.setdefault(ns, {})
        if old:
            add_into(totals, old, -1)
        if new:
            add_into(totals, new)
        for q in list(self.store.peek_list("resourcequotas", ns)):
            fresh = clone(q)
            self.quota_status(fresh)
            if fresh.get("status") != q.get("status"):
                self.store.put("resourcequotas", fresh, "MODIFIED")

    def quota_status(self, quota: Obj) -> None:
        """Set a ResourceQuota's ``status``: its hard limits and the namespace's use of them."""
        spec = quota.get("spec") if isinstance(quota.get("spec"), dict) else {}
        hard = dict((spec or {}).get("hard") or {})  # type: ignore[union-attr]
        ns = str(meta_of(quota).get("namespace") or "")
        totals = self._ns_totals.get(ns, {})
        used = {k: format_quantity(totals.get(k, Fraction(0)), k) for k in hard}
        quota["status"] = {"hard": hard, "used": used}

    def admit_pod(self, ns: str, name: str, pod: Obj) -> None:
        """403 for a pod its service account or a ResourceQuota does not admit, with the real message."""
        spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
        sa = (spec or {}).get("serviceAccountName")  # type: ignore[union-attr]
        if sa and self.store.peek("serviceaccounts", ns, str(sa)) is None:
            raise forbidden("pods", name, f"error looking up service account {ns}/{sa}: serviceaccount \"{sa}\" "
                            "not found")
        quotas = list(self.store.peek_list("resourcequotas", ns))
        if not quotas:
            return
        usage = self.pod_usage(pod)
        totals = self._ns_totals.get(ns, {})
        for q in sorted(quotas, key=lambda o: str(meta_of(o)["name"])):
            qname = str(meta_of(q)["name"])
            hard_raw = ((q.get("spec") or {}).get("hard") or {})  # type: ignore[union-attr]
            hard = {str(k): decode_quantity(val) for k, val in hard_raw.items()}
            missing = self._missing_requests(pod, hard)
            if missing:
                raise forbidden("pods", name, f"failed quota: {qname}: must specify {missing}")
            exceeded = sorted(k for k, h in hard.items() if usage.get(k, 0) and totals.get(k, 0) + usage[k] > h)
            if exceeded:
                def pp(values: Mapping[str, Fraction], keys: list[str] = exceeded) -> str:
                    return ",".join(f"{k}={format_quantity(values.get(k, Fraction(0)), k)}" for k in keys)
                raise forbidden("pods", name, f"exceeded quota: {qname}, requested: {pp(usage)}, used: "
                                f"{pp(totals)}, limited: {pp(hard)}")

    @staticmethod
    def _missing_requests(pod: Obj, hard: Mapping[str, Fraction]) -> str:
        spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
        parts = []
        for key in sorted(hard):
            kind, _, res = key.partition(".")
            if key in ("cpu", "memory"):
                kind, res = "requests", key
            if kind not in ("requests", "limits") or res not in ("cpu", "memory"):
                continue
            lacking = [str(c.get("name")) for c in (spec or {}).get("containers") or []  # type: ignore[union-attr]
                       if isinstance(c, dict) and res not in ((c.get("resources") or {}).get(kind) or {})]
            if lacking:
                parts.append(f"{key} for: {','.join(lacking)}")
        return "; ".join(parts)
