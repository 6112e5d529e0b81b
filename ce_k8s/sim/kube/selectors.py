"""Label and field selectors, parsed and matched the way the API server does.

Why our own parser: kmock ignores both selectors (docs/design.md "kmock 0.8, measured"), and the agent's
watch cache depends on the server filtering by label. The grammar is the one of
``k8s.io/apimachinery/pkg/labels`` (``=``, ``==``, ``!=``, ``in``, ``notin``, ``exists``,
``!exists``, ``>``, ``<``) and ``k8s.io/apimachinery/pkg/fields`` (``=``, ``==``, ``!=``).
A selector that does not parse is a client bug, so it raises :class:`SelectorError`, which the
server answers with 400 BadRequest as the real one does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class SelectorError(ValueError):
    """A label or field selector that does not parse (the server answers 400 BadRequest)."""


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector: ``key op values``."""

    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Return whether ``labels`` satisfy this term (absent keys satisfy ``!=`` and ``notin``)."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if not present:
            return False
        try:
            have = int(str(value))
            want = int(self.values[0])
        except ValueError:
            return False
        return have > want if self.op == "gt" else have < want


_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside ``( … )``."""
    terms: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unable to parse requirement: unbalanced ')' in {text!r}")
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SelectorError(f"unable to parse requirement: unbalanced '(' in {text!r}")
    terms.append("".join(cur))
    return terms


def _check_key(key: str, text: str) -> str:
    if not key or len(key.split("/")[-1]) > 63 or not _KEY.match(key):
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r} in {text!r}")
    return key


def _check_value(value: str, text: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise SelectorError(f"unable to parse requirement: invalid label value {value!r} in {text!r}")
    return value


_SET_TERM = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")
_CMP_TERM = re.compile(r"^\s*([^\s=!<>]+)\s*(==|=|!=|>|<)\s*(.*?)\s*$")


def parse_label_selector(text: str | None) -> tuple[Requirement, ...]:
    """Parse a ``labelSelector`` query string into requirements (all must match)."""
    if text is None or not text.strip():
        return ()
    reqs: list[Requirement] = []
    for raw in _split_terms(text):
        term = raw.strip()
        if not term:
            raise SelectorError(f"unable to parse requirement: empty term in {text!r}")
        if m := _SET_TERM.match(term):
            key = _check_key(m[1], text)
            vals = tuple(_check_value(v.strip(), text) for v in m[3].split(",")) if m[3].strip() else ()
            reqs.append(Requirement(key, m[2], vals))
        elif m := _CMP_TERM.match(term):
            key = _check_key(m[1], text)
            op = {"==": "=", ">": "gt", "<": "lt"}.get(m[2], m[2])
            val = m[3]
            if op in ("gt", "lt"):
                if not re.fullmatch(r"-?\d+", val):
                    raise SelectorError(f"unable to parse requirement: {val!r} is not an integer in {text!r}")
            else:
                _check_value(val, text)
            reqs.append(Requirement(key, op, (val,)))
        elif term.startswith("!"):
            reqs.append(Requirement(_check_key(term[1:].strip(), text), "!exists"))
        else:
            reqs.append(Requirement(_check_key(term, text), "exists"))
    return tuple(reqs)


def labels_match(reqs: tuple[Requirement, ...], labels: Mapping[str, str] | None) -> bool:
    """Return whether every requirement holds for ``labels``."""
    lab = labels or {}
    return all(r.matches(lab) for r in reqs)


# Field paths each resource supports in fieldSelector (the real server rejects all others).
_COMMON_FIELDS = ("metadata.name", "metadata.namespace")
SUPPORTED_FIELDS: dict[str, tuple[str, ...]] = {
    "pods": (*_COMMON_FIELDS, "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
             "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
             "status.nominatedNodeName"),
    "secrets": (*_COMMON_FIELDS, "type"),
    "nodes": (*_COMMON_FIELDS, "spec.unschedulable"),
    "namespaces": (*_COMMON_FIELDS, "status.phase"),
    "events": (*_COMMON_FIELDS, "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
               "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
               "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"),
}


@dataclass(frozen=True)
class FieldTerm:
    """One ``path op value`` term of a field selector."""

    path: str
    negate: bool
    value: str


def parse_field_selector(text: str | None, resource: str) -> tuple[FieldTerm, ...]:
    """Parse a ``fieldSelector`` for ``resource``; unknown fields raise :class:`SelectorError`."""
    if text is None or not text.strip():
        return ()
    allowed = SUPPORTED_FIELDS.get(resource, _COMMON_FIELDS)
    terms: list[FieldTerm] = []
    for raw in text.split(","):
        m = re.fullmatch(r"\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*", raw)
        if not m:
            raise SelectorError(f"invalid selector: {text!r}; can't understand {raw!r}")
        if m[1] not in allowed:
            raise SelectorError(f"field label not supported: {m[1]}")
        terms.append(FieldTerm(m[1], m[2] == "!=", m[3]))
    return tuple(terms)


def field_value(obj: Mapping[str, object], path: str) -> str:
    """The string form a field selector compares against (missing → ``""``, bools lower-case)."""
    if path == "source" and "source" in obj:
        src = obj.get("source")
        return str(src.get("component", "")) if isinstance(src, dict) else ""
    cur: object = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return "false" if path == "spec.unschedulable" else ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def fields_match(terms: tuple[FieldTerm, ...], obj: Mapping[str, object]) -> bool:
    """Return whether every field term holds for ``obj``."""
    return all((field_value(obj, t.path) == t.value) != t.negate for t in terms)


def make_filter(label_selector: str | None, field_selector: str | None,
                resource: str) -> Callable[[Mapping[str, object]], bool] | None:
    """Compile both selectors into one predicate, or ``None`` when nothing is selected."""
    lreqs = parse_label_selector(label_selector)
    fterms = parse_field_selector(field_selector, resource)
    if not lreqs and not fterms:
        return None

    def pred(obj: Mapping[str, object]) -> bool:
        meta = obj.get("metadata")
        labels = meta.get("labels") if isinstance(meta, dict) else None
        return labels_match(lreqs, labels) and fields_match(fterms, obj)

    return pred
