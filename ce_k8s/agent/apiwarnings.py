"""The API server's `Warning` headers on the agent's pod and Secret writes: read, sorted, said.

Why: a real kube-apiserver (1.19+) admits a request and says in `Warning: 299 - "text"` headers
(RFC 7234 section 5.5, one header per warning) what it thinks is wrong with it: a PodSecurity `warn`
level the pod would violate, a deprecated node label in a selector, a field it does not know and
dropped, an annotation that does nothing any more. client-go logs them; the official Python client
reads none, so until now a pilot whose route asked for something the cluster ignores ran
without anyone being told. The agent reads them off the answers it already has (no extra call),
logs each once per pod (`event=api-warning`), counts them (`ce_k8s_api_warnings_total`) and, when a
warning means the pod will not do what the route meant, names it in the routed job's
`K8sPodReason` (docs/agent.md "API server warnings"). It never holds a pilot for a warning: the
server admitted the pod, and a site that wants warnings to be refusals has `enforce` for that.

What each kind of warning means was read from Kubernetes v1.37.2 (`pkg/api/pod/warnings.go`
warningsForPodSpecAndMeta, `pkg/api/node/util.go` deprecatedNodeLabels, `pkg/registry/core/secret/
strategy.go` warningsForSecret, the PodSecurity admission's EvaluatePod, the apiserver's strict
decoding and owner-reference warnings) and checked against the real server
(`tests/real/test_api_warnings.py`). Three effects:

* `RUNS`: the pod does what the route meant (PodSecurity `warn`, a policy's warning, deprecations
  the server still honours, duplicates whose last value is used): logged and counted only.
* `PLACEMENT`: a deprecated node label in a selector, affinity or topology key. A v1.37 kubelet
  still sets `beta.kubernetes.io/os`/`arch`, but no kubelet sets `node-role.kubernetes.io/master`
  and only a cloud provider the `failure-domain.beta` ones, so the pod may fit no node: the note
  is added to `K8sPodReason` while the pod is pending, beside the scheduler's reason.
* `IGNORED`: the server dropped or will not honour part of the pod (an unknown or duplicate
  field, a non-functional annotation or volume plugin, a value it reads differently): the note is
  in `K8sPodReason` for as long as the pod is pending or running.

The parser follows RFC 7234's grammar (`warn-code SP warn-agent SP warn-text [SP warn-date]`,
comma-separated, `quoted-pair` escapes) as client-go's ParseWarningHeader does, but never drops a
warning: an element it cannot parse is kept whole as the text of a warning with code 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

RUNS = "runs"
PLACEMENT = "placement"
IGNORED = "ignored"

# Where the agent's notes start in K8sPodReason (condor_ce_q shows it).
NOTE_PREFIX = "Kubernetes API warning: "
NOTE_MAX = 300          # characters of notes in one K8sPodReason; the reason's own text comes first

# pkg/api/node/util.go deprecatedNodeLabels (v1.37.2)
DEPRECATED_NODE_LABELS = (
    "beta.kubernetes.io/arch", "beta.kubernetes.io/os", "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "beta.kubernetes.io/instance-type", "app.kubernetes.io/created-by",
    "scheduler.alpha.kubernetes.io/preferAvoidPods", "node-role.kubernetes.io/master",
)
_PLACEMENT_FIELDS = ("nodeSelector", "nodeAffinity", "topologySpreadConstraints")
# Texts of warnings after which the pod is not what was asked for (pkg/api/pod/warnings.go,
# pkg/api/persistentvolumeclaim/util.go): "non-functional in v1.27+", "disabled by default in
# v1.33+", "fractional byte value ... is invalid", "a null labelSelector results in matching no
# pod", "overlapping paths", "invalid empty name", "hostIP set without hostPort", a preferred
# node-affinity value that "is invalid, ..." as a label value (no node can carry it).
_NON_FUNCTIONAL = ("non-functional", "disabled by default")
_INVALID_VALUE = ("fractional byte value", "is invalid,", "will be treated as", "results in matching no pod",
                  "overlapping paths", "invalid empty name", "hostIP set without hostPort")
_DUPLICATE = ("hides previous definition of", "duplicate port", "overlapping port definition",
              "ambiguous port definition", "duplicate name", "duplicate ip", "ownerReferences contains duplicate")
_CREDENTIALS = ("Use tokens from the TokenRequest API", "Authorization header")

# (kind, effect) for every kind: the `kind` label of ce_k8s_api_warnings_total is one of these.
KINDS: dict[str, str] = {
    "pod-security": RUNS, "admission-policy": RUNS, "unknown-field": IGNORED, "duplicate-field": IGNORED,
    "deprecated-node-label": PLACEMENT, "non-functional": IGNORED, "invalid-value": IGNORED,
    "duplicate": RUNS, "deprecated": RUNS, "credentials": RUNS, "other": RUNS,
}


@dataclass(frozen=True, slots=True)
class ApiWarning:
    """One warning-value: its code (0 when the element did not parse), agent and text."""

    code: int
    agent: str
    text: str

    @property
    def kind(self) -> str:
        return classify(self.text)

    @property
    def effect(self) -> str:
        return KINDS[self.kind]


def classify(text: str) -> str:
    """The kind of a warning's text (a key of `KINDS`), from the texts Kubernetes v1.37 sends.

    Anchored prefixes first: a PodSecurity or admission-policy text quotes the pod and a site's
    own message, which may contain any of the words tested after them.
    """
    if text.startswith("would violate PodSecurity "):
        return "pod-security"
    if text.startswith("Validation failed for ValidatingAdmissionPolicy "):
        return "admission-policy"
    if text.startswith("unknown field "):
        return "unknown-field"
    if text.startswith("duplicate field "):
        return "duplicate-field"
    if any(label in text for label in DEPRECATED_NODE_LABELS) and any(f in text for f in _PLACEMENT_FIELDS):
        return "deprecated-node-label"
    if any(word in text for word in _NON_FUNCTIONAL):
        return "non-functional"
    if any(word in text for word in _INVALID_VALUE):
        return "invalid-value"
    if any(word in text for word in _DUPLICATE):
        return "duplicate"
    if any(word in text for word in _CREDENTIALS):
        return "credentials"
    if "deprecated" in text:
        return "deprecated"
    return "other"


# -- the header grammar (RFC 7234 section 5.5, RFC 7230 section 3.2.6) ----------------------------

_CODE_AGENT = re.compile(r"[ \t]*([0-9]{3})[ \t]+([^ \t\",]+)[ \t]+")
_DATE = re.compile(r"[ \t]+\"[^\"]*\"")


def _quoted(s: str, i: int) -> tuple[str, int] | None:
    """The quoted-string starting at s[i] ('"'), unescaped, and the index after it; None if unclosed."""
    out = []
    j = i + 1
    n = len(s)
    while j < n:
        c = s[j]
        if c == '"':
            return "".join(out), j + 1
        if c == "\\" and j + 1 < n:
            j += 1
            c = s[j]
        out.append(c)
        j += 1
    return None


def _skip_to_next(s: str, i: int) -> int:
    """Index after the next comma outside a quoted-string (len(s) if none): the next element."""
    n = len(s)
    while i < n:
        c = s[i]
        if c == ",":
            return i + 1
        if c == '"':
            q = _quoted(s, i)
            if q is None:
                return n
            i = q[1]
            continue
        i += 1
    return n


def parse_value(value: str) -> list[ApiWarning]:
    """The warning-values of one `Warning` header field value (comma-separated, RFC 7230 `1#`).

    Empty list elements are skipped (RFC 7230 section 7); an element that is not `code agent "text"
    ["date"]` is kept whole, stripped, as the text of an `ApiWarning` with code 0 and agent "".
    """
    if not value.isascii():
        value = _utf8(value)
    out: list[ApiWarning] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in " \t,":
            i += 1
        if i >= n:
            break
        m = _CODE_AGENT.match(value, i)
        q = _quoted(value, m.end()) if m is not None and value.startswith('"', m.end()) else None
        if m is None or q is None:
            end = _skip_to_next(value, i)
            raw = value[i:end].rstrip(", \t")
            out.append(ApiWarning(0, "", raw))
            i = end
            continue
        text, j = q
        d = _DATE.match(value, j)
        if d is not None:
            j = d.end()
        while j < n and value[j] in " \t":
            j += 1
        if j < n and value[j] != ",":
            # Trailing junk after the text: keep the whole element rather than half of it.
            end = _skip_to_next(value, j)
            out.append(ApiWarning(0, "", value[i:end].rstrip(", \t")))
            i = end
            continue
        out.append(ApiWarning(int(m.group(1)), m.group(2), text))
        i = j + 1
    return out


def _utf8(value: str) -> str:
    """http.client decodes header bytes as ISO-8859-1; the API server writes UTF-8 text."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def parse(values: Iterable[str]) -> list[ApiWarning]:
    """Every warning of several `Warning` header field values, in order, each text once."""
    out: list[ApiWarning] = []
    seen: set[str] = set()
    for value in values:
        for w in parse_value(value):
            if w.text and w.text not in seen:
                seen.add(w.text)
                out.append(w)
    return out


def of_response(resp: object) -> list[ApiWarning]:
    """The warnings of a urllib3 response (its `Warning` header fields); [] when it has none.

    The cost on an answer without warnings is one header look-up.
    """
    headers = getattr(resp, "headers", None)
    if not headers or headers.get("Warning") is None:
        return []
    getlist = getattr(headers, "getlist", None)
    return parse(getlist("Warning") if getlist is not None else [headers["Warning"]])


# -- what the routed job is told ---------------------------------------------------------------------

def with_note(reason: str, note: str) -> str:
    """`reason` with the warnings' note after it, the note cut to NOTE_MAX characters."""
    if not note:
        return reason
    note = " ".join(note.split())
    if len(note) > NOTE_MAX:
        note = note[: NOTE_MAX - 3] + "..."
    return f"{reason}; {NOTE_PREFIX}{note}" if reason else NOTE_PREFIX + note


def join(note: str, text: str) -> str:
    """Two notes (or warnings' texts) in one; an empty one adds nothing."""
    return f"{note} | {text}" if note and text else note or text
