"""Checks and conversions for the Kubernetes values a route can set (`K8s*` attributes).

Why checked here and not left to the API server: a bad value in a route would otherwise surface as
an opaque 422 at pod-create time for every pilot on that route; here it becomes a
`PodBuildError("bad-k8s-value")` naming the attribute, which the update hook turns into a hold
with a readable reason (issue 3 "Bad input"). Only the rules the OpenAPI schema does *not* carry are
coded here (names, label syntax, quantities); shapes are checked just deep enough that the pod
we emit stays schema-valid.
"""

from __future__ import annotations

import json
import math

from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.names import is_dns_label, is_dns_subdomain, is_label_value

CODE = "bad-k8s-value"
MAX_JSON = 256 * 1024
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_ENV_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_.")


def is_qualified_name(text: object) -> bool:
    """A label/annotation key: optional DNS-subdomain prefix and `/`, then a 1-63 char name."""
    if not isinstance(text, str) or not text:
        return False
    prefix, slash, name = text.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return False
    if not 0 < len(name) <= 63 or not name[0].isascii() or not name[-1].isascii():
        return False
    if not (name[0].isalnum() and name[-1].isalnum()):
        return False
    return all(c in _NAME_CHARS for c in name)


def is_env_name(text: object) -> bool:
    """The long-standing Kubernetes rule for env var names: [-._a-zA-Z][-._a-zA-Z0-9]*."""
    if not isinstance(text, str) or not text or text[0] not in _ENV_FIRST:
        return False
    return all(c in _NAME_CHARS for c in text)


def is_clean_text(text: str) -> bool:
    """Encodable as UTF-8 and free of NUL (execve and the API cannot carry either)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escape_dollar(text: str) -> str:
    """Protect job text from Kubernetes `$(VAR)` expansion in command/args/env: `$` → `$$`."""
    return text.replace("$", "$$")


def one_line(text: str, limit: int = 4096) -> str:
    """Printable single-line text for annotations (a credential DN must not smuggle newlines)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# -- names ----------------------------------------------------------------------------------------

def dns_label_attr(attr: str, value: str) -> str:
    if not is_dns_label(value):
        raise PodBuildError(CODE, f"{attr} = {value[:80]!r} is not a valid RFC 1123 label")
    return value


def dns_subdomain_attr(attr: str, value: str) -> str:
    if not is_dns_subdomain(value):
        raise PodBuildError(CODE, f"{attr} = {value[:80]!r} is not a valid RFC 1123 subdomain name")
    return value


def image_attr(value: str) -> str:
    """An image reference: non-empty, no whitespace or control characters, sane length."""
    ok = 0 < len(value) <= 1024 and value.isascii() and value.isprintable() and " " not in value
    if not ok or value[0] in "-:/@" or value[-1] in ":/@":
        raise PodBuildError("bad-image", f"K8sImage = {value[:80]!r} is not a container image reference")
    return value


# -- quantities ------------------------------------------------------------------------------------

def cpu_quantity(millicores: int) -> str:
    """`2` for whole cores, `1500m` otherwise (canonical Kubernetes forms)."""
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def to_millicores(cpus: float) -> int:
    return max(1, math.ceil(cpus * 1000 - 1e-9))


def parse_cpu_limit(text: str) -> float | None:
    """`request` → 1.0, `none` → None, a factor like `1.5` → 1.5; ValueError otherwise (1 ≤ factor ≤ 64)."""
    word = text.strip().lower()
    if word == "request":
        return 1.0
    if word == "none":
        return None
    factor = float(word)
    if not math.isfinite(factor) or not 1.0 <= factor <= 64.0:
        raise ValueError(f"factor {text!r} must be between 1 and 64")
    return factor


# -- structured values -------------------------------------------------------------------------------

def parse_json_attr(attr: str, text: str, code: str = CODE) -> object:
    if len(text) > MAX_JSON:
        raise PodBuildError(code, f"{attr} is longer than {MAX_JSON} bytes")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PodBuildError(code, f"{attr} is not valid JSON: {exc}") from None


def string_map(attr: str, value: dict[str, object], *, label_values: bool) -> dict[str, str]:
    """A nested ad of `key = "value"` → dict[str, str]; keys must be qualified names."""
    out: dict[str, str] = {}
    for key, raw in value.items():
        if not is_qualified_name(key):
            raise PodBuildError(CODE, f"{attr}: {str(key)[:80]!r} is not a valid key")
        if isinstance(raw, bool):
            text = "true" if raw else "false"
        elif isinstance(raw, int | str):
            text = str(raw)
        else:
            raise PodBuildError(CODE, f"{attr}.{key} must be a string, got {type(raw).__name__}")
        if label_values and not is_label_value(text):
            raise PodBuildError(CODE, f"{attr}.{key} = {text[:80]!r} is not a valid label value")
        out[key] = text
    return out


_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationseconds"}
_OPERATORS = ("Exists", "Equal")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def tolerations(attr: str, value: list[object]) -> list[dict[str, object]]:
    """`{ [ key = "k"; operator = "Equal"; value = "v"; effect = "NoSchedule" ], ... }` → tolerations."""
    out: list[dict[str, object]] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise PodBuildError(CODE, f"{attr}[{i}] must be a nested ad [ key = ...; effect = ... ]")
        lowered = {str(k).lower(): v for k, v in item.items()}
        unknown = set(lowered) - _TOLERATION_KEYS
        if unknown:
            raise PodBuildError(CODE, f"{attr}[{i}] has unknown fields {sorted(unknown)}")
        tol: dict[str, object] = {}
        for field in ("key", "value"):
            if field in lowered:
                v = lowered[field]
                if not isinstance(v, str):
                    raise PodBuildError(CODE, f"{attr}[{i}].{field} must be a string")
                if field == "key" and v and not is_qualified_name(v):
                    raise PodBuildError(CODE, f"{attr}[{i}].key {v[:80]!r} is not a valid taint key")
                if field == "value" and not is_label_value(v):
                    raise PodBuildError(CODE, f"{attr}[{i}].value {v[:80]!r} is not a valid taint value")
                tol[field] = v
        if "operator" in lowered:
            op = lowered["operator"]
            if op not in _OPERATORS:
                raise PodBuildError(CODE, f"{attr}[{i}].operator must be Exists or Equal")
            tol["operator"] = op
        if "effect" in lowered:
            eff = lowered["effect"]
            if eff not in _EFFECTS:
                raise PodBuildError(CODE, f"{attr}[{i}].effect must be one of {', '.join(_EFFECTS)}")
            tol["effect"] = eff
        if "tolerationseconds" in lowered:
            secs = lowered["tolerationseconds"]
            if isinstance(secs, bool) or not isinstance(secs, int) or not -(2**63) <= secs < 2**63:
                raise PodBuildError(CODE, f"{attr}[{i}].tolerationSeconds must be an integer")
            tol["tolerationSeconds"] = secs
        if tol.get("operator") == "Exists" and tol.get("value"):
            raise PodBuildError(CODE, f"{attr}[{i}]: operator Exists takes no value")
        if not tol.get("key") and tol.get("operator", "Equal") != "Exists":
            raise PodBuildError(CODE, f"{attr}[{i}]: an empty key needs operator Exists")
        out.append(tol)
    return out


_AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")


def affinity(attr: str, text: str) -> dict[str, object]:
    value = parse_json_attr(attr, text)
    if not isinstance(value, dict):
        raise PodBuildError(CODE, f"{attr} must be a JSON object")
    for key, sub in value.items():
        if key not in _AFFINITY_KEYS:
            raise PodBuildError(CODE, f"{attr}: unknown field {str(key)[:40]!r} (want {', '.join(_AFFINITY_KEYS)})")
        if not isinstance(sub, dict):
            raise PodBuildError(CODE, f"{attr}.{key} must be a JSON object")
    return value


def volumes(attr: str, text: str, reserved_names: set[str], reserved_paths: set[str]) -> tuple[list, list]:
    """`{"volumes": [...], "volumeMounts": [...]}` → (volumes, mounts), names and paths checked."""
    value = parse_json_attr(attr, text)
    if not isinstance(value, dict) or set(value) - {"volumes", "volumeMounts"}:
        raise PodBuildError(CODE, f'{attr} must be a JSON object with "volumes" and "volumeMounts" lists')
    vols = value.get("volumes", [])
    mounts = value.get("volumeMounts", [])
    if not isinstance(vols, list) or not isinstance(mounts, list):
        raise PodBuildError(CODE, f'{attr}: "volumes" and "volumeMounts" must be lists')
    names: set[str] = set()
    for i, vol in enumerate(vols):
        if not isinstance(vol, dict) or not isinstance(vol.get("name"), str):
            raise PodBuildError(CODE, f"{attr}: volumes[{i}] must be an object with a name")
        name = vol["name"]
        if not is_dns_label(name) or name in reserved_names or name in names:
            raise PodBuildError(CODE, f"{attr}: volume name {name[:60]!r} is invalid, reserved or repeated")
        sources = [k for k in vol if k != "name"]
        if len(sources) != 1 or not isinstance(vol[sources[0]], dict):
            raise PodBuildError(CODE, f"{attr}: volume {name!r} must have exactly one source object")
        names.add(name)
    paths: set[str] = set()
    for i, mount in enumerate(mounts):
        if not isinstance(mount, dict):
            raise PodBuildError(CODE, f"{attr}: volumeMounts[{i}] must be an object")
        name, path = mount.get("name"), mount.get("mountPath")
        if name not in names:
            raise PodBuildError(CODE, f"{attr}: volumeMounts[{i}] names no volume listed in {attr}")
        if not isinstance(path, str) or not path.startswith("/") or not is_clean_text(path):
            raise PodBuildError(CODE, f"{attr}: volumeMounts[{i}].mountPath must be an absolute path")
        norm = path.rstrip("/") or "/"
        if norm in reserved_paths or norm in paths or any(norm.startswith(p + "/") for p in reserved_paths):
            raise PodBuildError(CODE, f"{attr}: mountPath {path[:80]!r} is reserved or repeated")
        if "readOnly" in mount and not isinstance(mount["readOnly"], bool):
            raise PodBuildError(CODE, f"{attr}: volumeMounts[{i}].readOnly must be true or false")
        for key in ("subPath", "subPathExpr", "mountPropagation", "recursiveReadOnly"):
            if key in mount and not isinstance(mount[key], str):
                raise PodBuildError(CODE, f"{attr}: volumeMounts[{i}].{key} must be a string")
        unknown = set(mount) - {"name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation",
                                "recursiveReadOnly"}
        if unknown:
            raise PodBuildError(CODE, f"{attr}: volumeMounts[{i}] has unknown fields {sorted(unknown)}")
        paths.add(norm)
    return vols, mounts


# -- security posture ------------------------------------------------------------------------------

def security_permissions(pod: dict) -> set[str]:
    """Everything the pod is allowed that a locked-down pod is not, as comparable strings.

    `K8sPodPatch` may not add to this set (issue 3 "Safety"): looser settings must come from
    explicit route attributes, which are applied before the patch and so are part of the baseline.
    """
    perms: set[str] = set()
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    psc = spec.get("securityContext") if isinstance(spec.get("securityContext"), dict) else {}
    if spec.get("restartPolicy") != "Never":
        perms.add(f"restartPolicy={spec.get('restartPolicy')}")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag) is True:
            perms.add(flag)
    if spec.get("hostUsers") is True:
        perms.add("hostUsers")
    if spec.get("automountServiceAccountToken") is not False:
        perms.add("service-account-token")
    for sysctl in psc.get("sysctls") or []:
        perms.add(f"sysctl={sysctl.get('name') if isinstance(sysctl, dict) else sysctl}")
    for vol in spec.get("volumes") or []:
        if isinstance(vol, dict) and "hostPath" in vol:
            hp = vol["hostPath"] if isinstance(vol["hostPath"], dict) else {}
            perms.add(f"hostPath={hp.get('path')}")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type") if isinstance(psc.get("seccompProfile"), dict) else None
    if psc.get("runAsNonRoot") is not True:
        perms.add("pod-may-run-as-root")
    if pod_seccomp not in ("RuntimeDefault", "Localhost"):
        perms.add(f"pod-seccomp={pod_seccomp}")
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(kind) or []:
            if not isinstance(c, dict):
                continue
            name = c.get("name")
            sc = c.get("securityContext") if isinstance(c.get("securityContext"), dict) else {}
            non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
            if non_root is not True:
                perms.add(f"may-run-as-root:{name}")
            if sc.get("runAsUser", psc.get("runAsUser")) == 0:
                perms.add(f"uid0:{name}")
            if sc.get("runAsGroup", psc.get("runAsGroup")) == 0:
                perms.add(f"gid0:{name}")
            if sc.get("allowPrivilegeEscalation") is not False:
                perms.add(f"privilege-escalation:{name}")
            if sc.get("privileged") is True:
                perms.add(f"privileged:{name}")
            if sc.get("procMount") not in (None, "Default"):
                perms.add(f"procMount:{name}")
            # A port bound on the node's own address (PodSecurity baseline forbids it).
            for port in c.get("ports") or []:
                if isinstance(port, dict) and port.get("hostPort"):
                    perms.add(f"hostPort={port.get('hostPort')}:{name}")
            caps = sc.get("capabilities") if isinstance(sc.get("capabilities"), dict) else {}
            if "ALL" not in (caps.get("drop") or []):
                perms.add(f"capabilities-kept:{name}")
            for cap in caps.get("add") or []:
                perms.add(f"cap-add={cap}")
            seccomp = sc.get("seccompProfile") if isinstance(sc.get("seccompProfile"), dict) else None
            stype = seccomp.get("type") if seccomp else pod_seccomp
            if stype not in ("RuntimeDefault", "Localhost"):
                perms.add(f"seccomp={stype}:{name}")
    return perms
