"""Validation and defaulting of the objects the emulator stores.

A fake that accepts what the real server refuses lets bugs through: a pod name with an underscore,
a label value of 64 characters, a Secret over 1 MiB or a request above its limit must get the
same 422 Invalid here as in production. Defaulting matters for the same reason the other way: the
agent reads back pods, and a real pod has ``restartPolicy``, ``imagePullPolicy``, the two default
``NoExecute`` tolerations, ``qosClass`` and requests copied from limits.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

from ce_k8s.quantity import QuantityError, decode_quantity

Cause = tuple[str, str, str]  # (field, reason, message)

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                 "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
                 "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
             "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
             "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
                   "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
                   "'my_value',  or '12345', regex used for validation is "
                   "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
QUALIFIED_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                 "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used "
                 "for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
SECRET_MAX_BYTES = 1024 * 1024
ANNOTATIONS_MAX_BYTES = 256 * 1024

# Resources whose names must be DNS-1123 labels rather than subdomains.
_LABEL_NAMED = {"namespaces"}


def _q(value: object) -> str:
    """Go's %q-ish rendering used in Invalid value messages."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def validate_name(resource: str, name: object) -> list[Cause]:
    """``metadata.name`` rules: subdomain (≤253) or label (≤63) for namespaces."""
    if not isinstance(name, str) or not name:
        return [("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")]
    if resource in _LABEL_NAMED:
        if len(name) > 63:
            return [("metadata.name", "FieldValueInvalid",
                     f"Invalid value: {_q(name)}: must be no more than 63 characters")]
        if not DNS1123_LABEL.match(name):
            return [("metadata.name", "FieldValueInvalid", f"Invalid value: {_q(name)}: {LABEL_MSG}")]
        return []
    if len(name) > 253:
        return [("metadata.name", "FieldValueInvalid",
                 f"Invalid value: {_q(name)}: must be no more than 253 characters")]
    if not DNS1123_SUBDOMAIN.match(name):
        return [("metadata.name", "FieldValueInvalid", f"Invalid value: {_q(name)}: {SUBDOMAIN_MSG}")]
    return []


def _validate_qualified_key(key: str, fld: str) -> list[Cause]:
    prefix, _, part = key.rpartition("/")
    causes: list[Cause] = []
    if "/" in key and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        causes.append((fld, "FieldValueInvalid", f"Invalid value: {_q(key)}: prefix part {SUBDOMAIN_MSG}"))
    if not part or len(part) > 63 or not _QUALIFIED_NAME.match(part):
        extra = "name part must be no more than 63 characters" if len(part) > 63 else QUALIFIED_MSG
        causes.append((fld, "FieldValueInvalid", f"Invalid value: {_q(key)}: {extra}"))
    return causes


def validate_metadata(resource: str, meta: Mapping[str, object]) -> list[Cause]:
    """Name, labels and annotations of any object."""
    causes = validate_name(resource, meta.get("name"))
    labels = meta.get("labels")
    if labels is not None and not isinstance(labels, dict):
        causes.append(("metadata.labels", "FieldValueInvalid", "Invalid value: must be a map"))
    elif isinstance(labels, dict):
        for k, v in labels.items():
            causes += _validate_qualified_key(str(k), "metadata.labels")
            if not isinstance(v, str):
                causes.append(("metadata.labels", "FieldValueInvalid", f"Invalid value: {_q(v)}: must be a string"))
            elif len(v) > 63:
                causes.append(("metadata.labels", "FieldValueInvalid",
                               f"Invalid value: {_q(v)}: must be no more than 63 characters"))
            elif not _LABEL_VALUE.match(v):
                causes.append(("metadata.labels", "FieldValueInvalid", f"Invalid value: {_q(v)}: {LABEL_VALUE_MSG}"))
    annotations = meta.get("annotations")
    if isinstance(annotations, dict):
        total = 0
        for k, v in annotations.items():
            causes += _validate_qualified_key(str(k).lower(), "metadata.annotations")
            total += len(str(k)) + len(str(v))
        if total > ANNOTATIONS_MAX_BYTES:
            causes.append(("metadata.annotations", "FieldValueTooLong",
                           f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes"))
    return causes


_RESTART = ("Always", "OnFailure", "Never")


def _validate_resources(c: Mapping[str, object], path: str) -> list[Cause]:
    res = c.get("resources")
    if not isinstance(res, dict):
        return []
    causes: list[Cause] = []
    parsed: dict[str, dict[str, object]] = {}
    for kind in ("requests", "limits"):
        table = res.get(kind)
        if not isinstance(table, dict):
            continue
        parsed[kind] = {}
        for k, v in table.items():
            try:
                q = decode_quantity(v)
            except QuantityError as e:
                causes.append((f"{path}.resources.{kind}[{k}]", "FieldValueInvalid",
                               f"Invalid value: {_q(v)}: {e.server_message}"))
                continue
            if q < 0:
                causes.append((f"{path}.resources.{kind}[{k}]", "FieldValueInvalid",
                               f"Invalid value: {_q(v)}: must be greater than or equal to 0"))
            parsed[kind][str(k)] = q
    for k, req in parsed.get("requests", {}).items():
        lim = parsed.get("limits", {}).get(k)
        if lim is not None and req > lim:  # type: ignore[operator]
            causes.append((f"{path}.resources.requests", "FieldValueInvalid",
                           f"Invalid value: {_q(res['requests'][k])}: must be less than or equal to {k} limit "
                           f"of {res['limits'][k]}"))
    return causes


def validate_pod(pod: Mapping[str, object]) -> list[Cause]:
    """The pod spec rules a pilot pod can break."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "FieldValueRequired", "Required value")]
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        causes.append(("spec.containers", "FieldValueRequired", "Required value"))
        containers = []
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        items = spec.get(key) if key == "initContainers" else containers
        if not isinstance(items, list):
            continue
        for i, c in enumerate(items):
            path = f"spec.{key}[{i}]"
            if not isinstance(c, dict):
                causes.append((path, "FieldValueInvalid", "Invalid value: must be an object"))
                continue
            name = c.get("name")
            if not name:
                causes.append((f"{path}.name", "FieldValueRequired", "Required value"))
            elif not isinstance(name, str) or len(name) > 63 or not DNS1123_LABEL.match(name):
                causes.append((f"{path}.name", "FieldValueInvalid", f"Invalid value: {_q(name)}: {LABEL_MSG}"))
            elif name in seen:
                causes.append((f"{path}.name", "FieldValueDuplicate", f"Duplicate value: {_q(name)}"))
            else:
                seen.add(name)
            if not c.get("image"):
                causes.append((f"{path}.image", "FieldValueRequired", "Required value"))
            causes += _validate_resources(c, path)
    rp = spec.get("restartPolicy")
    if rp is not None and rp not in _RESTART:
        causes.append(("spec.restartPolicy", "FieldValueNotSupported",
                       f'Unsupported value: {_q(rp)}: supported values: "Always", "OnFailure", "Never"'))
    ads = spec.get("activeDeadlineSeconds")
    if ads is not None and (not isinstance(ads, int) or isinstance(ads, bool) or not 1 <= ads <= 2147483647):
        causes.append(("spec.activeDeadlineSeconds", "FieldValueInvalid",
                       f"Invalid value: {ads}: must be between 1 and 2147483647, inclusive"))
    return causes


def validate_secret(secret: dict[str, object]) -> list[Cause]:
    """Data keys, base64 values and the 1 MiB total (``stringData`` is folded in first)."""
    causes: list[Cause] = []
    data = secret.get("data") or {}
    if not isinstance(data, dict):
        return [("data", "FieldValueInvalid", "Invalid value: must be a map")]
    total = 0
    for k, v in data.items():
        if not _CONFIG_KEY.match(str(k)) or len(str(k)) > 253:
            causes.append((f"data[{k}]", "FieldValueInvalid",
                           f"Invalid value: {_q(k)}: a valid config key must consist of alphanumeric characters, "
                           "'-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for "
                           "validation is '[-._a-zA-Z0-9]+')"))
        # As the real server (IsConfigMapKey): a key is a file name in a volume, never a step up.
        if str(k) in (".", "..") or str(k).startswith(".."):
            rule = f"must not be '{k}'" if str(k) in (".", "..") else "must not start with '..'"
            causes.append((f"data[{k}]", "FieldValueInvalid", f"Invalid value: {_q(k)}: {rule}"))
        try:
            total += len(base64.b64decode(str(v), validate=True))
        except (binascii.Error, ValueError):
            causes.append((f"data[{k}]", "FieldValueInvalid", "Invalid value: illegal base64 data"))
    if total > SECRET_MAX_BYTES:
        causes.append(("data", "FieldValueTooLong", f"Too long: must have at most {SECRET_MAX_BYTES} bytes"))
    return causes


def fold_string_data(secret: dict[str, object]) -> None:
    """Move ``stringData`` into ``data`` (base64), as the API server does on every write."""
    sd = secret.pop("stringData", None)
    if isinstance(sd, dict) and sd:
        data = dict(secret.get("data") or {})  # type: ignore[arg-type]
        for k, v in sd.items():
            data[k] = base64.b64encode(str(v).encode()).decode()
        secret["data"] = data


_DEFAULT_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300},
)


def _default_pull_policy(image: str) -> str:
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def qos_class(spec: Mapping[str, object]) -> str:
    """Guaranteed / Burstable / BestEffort from the containers' requests and limits."""
    containers = [c for c in (spec.get("containers") or []) if isinstance(c, dict)]
    containers += [c for c in (spec.get("initContainers") or []) if isinstance(c, dict)]
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req = res.get("requests") or {}
        lim = res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and decode_quantity(req[r]) != decode_quantity(lim[r])):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def default_pod(pod: dict[str, object]) -> None:
    """Apply the API server's defaults and the default admission plugins' changes to a new pod."""
    spec = pod.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec["serviceAccount"] = spec["serviceAccountName"]
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            if not isinstance(c, dict):
                continue
            c.setdefault("imagePullPolicy", _default_pull_policy(str(c.get("image", ""))))
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            res = c.setdefault("resources", {})
            if isinstance(res, dict) and isinstance(res.get("limits"), dict):
                req = res.setdefault("requests", {})
                for k, v in res["limits"].items():
                    req.setdefault(k, v)
    tolerations = spec.setdefault("tolerations", [])
    if isinstance(tolerations, list):
        for dflt in _DEFAULT_TOLERATIONS:
            if not any(isinstance(t, dict) and t.get("key") == dflt["key"] and t.get("effect") in ("NoExecute", None)
                       for t in tolerations):
                tolerations.append(dict(dflt))
    status = {"phase": "Pending", "qosClass": qos_class(spec)}
    pod["status"] = status


MUTABLE_POD_SPEC_MSG = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
    "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)")


def pod_spec_update_causes(old: Mapping[str, object], new: Mapping[str, object]) -> list[Cause]:
    """Only images, activeDeadlineSeconds and added tolerations may change on a pod update."""
    o = dict(old.get("spec") or {})  # type: ignore[arg-type]
    n = dict(new.get("spec") or {})  # type: ignore[arg-type]
    for key in ("containers", "initContainers"):
        if isinstance(o.get(key), list) and isinstance(n.get(key), list) and len(o[key]) == len(n[key]):
            n[key] = [{**nc, "image": oc.get("image")} if isinstance(nc, dict) and isinstance(oc, dict) else nc
                      for oc, nc in zip(o[key], n[key], strict=True)]
    causes: list[Cause] = []
    old_tol = o.get("tolerations") or []
    new_tol = n.get("tolerations") or []
    if isinstance(old_tol, list) and isinstance(new_tol, list) and all(t in new_tol for t in old_tol):
        n["tolerations"] = old_tol
    new_ads, old_ads = n.get("activeDeadlineSeconds"), o.get("activeDeadlineSeconds")
    if new_ads is not None and (old_ads is None or new_ads <= old_ads):
        n["activeDeadlineSeconds"] = old_ads
        if n["activeDeadlineSeconds"] is None:
            n.pop("activeDeadlineSeconds")
    elif new_ads != old_ads:
        causes.append(("spec.activeDeadlineSeconds", "FieldValueInvalid",
                       f"Invalid value: {new_ads}: must be less than or equal to previous value"))
    if n != o:
        causes.append(("spec", "FieldValueForbidden", MUTABLE_POD_SPEC_MSG))
    return causes
