"""Deterministic, valid Kubernetes names and label values for ce-k8s objects (standard library only).

Why this module is stdlib-only and avoids `re`: the translate hook imports it to stamp the pod
name into the routed ad, and the router forks a hook per job per poll (docs/agent.md).
Why names are derived, not random: "exactly one pod per attempt" (decision 5) — the agent
creates `pod_name(GlobalJobId, attempt)` and treats AlreadyExists as "adopt", so a retried create
can never make a second pod. The hash is SHA-256 (not `hash()`, which is salted per process) so
the name is identical across runs, hosts and Python versions.
"""

try:  # the bare C module is cheaper to import than hashlib (which loads OpenSSL)
    from _sha2 import sha256 as _sha256  # Python >= 3.12
except ImportError:  # pragma: no cover - depends on the interpreter build
    try:
        from _sha256 import sha256 as _sha256  # Python 3.11
    except ImportError:
        from hashlib import sha256 as _sha256

MAX_LABEL = 63
POD_PREFIX = "ce"
SECRET_SUFFIX = "-sandbox"  # noqa: S105 - a name suffix, not a password

_LOWER_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_ALNUM = _LOWER_ALNUM | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_LABEL_INNER = _ALNUM | frozenset("-_.")
_DIGITS = frozenset("0123456789")


def short_hash(text: str, length: int = 8) -> str:
    """First `length` hex digits of SHA-256 of the UTF-8 text (surrogates escaped, never raises)."""
    return _sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def _split_job_id(global_job_id: str) -> tuple[str, str] | None:
    """(cluster, proc) from "schedd#cluster.proc#qdate" when it has that shape, else None."""
    parts = global_job_id.split("#")
    if len(parts) != 3:
        return None
    cluster, dot, proc = parts[1].partition(".")
    if not dot or not cluster or not proc or len(cluster) > 10 or len(proc) > 10:
        return None
    if not (set(cluster) <= _DIGITS and set(proc) <= _DIGITS):
        return None
    return str(int(cluster)), str(int(proc))


def pod_name(global_job_id: str, attempt: int) -> str:
    """The pod name for one attempt of one source job: `ce-<cluster>-<proc>-a<attempt>-<hash10>`.

    The readable part helps admins (`kubectl get pods | grep 1234567-3`); the hash of the whole
    GlobalJobId (schedd name and QDate included) keeps two CEs, or a CE whose cluster ids restarted,
    from colliding. Always a DNS-1123 label of at most 63 characters.
    """
    if not isinstance(global_job_id, str) or not global_job_id:
        raise ValueError("pod_name needs a non-empty GlobalJobId string")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0 or attempt > 999_999:
        raise ValueError(f"attempt must be an integer in 0..999999, got {attempt!r}")
    digest = short_hash(global_job_id, 10)
    ids = _split_job_id(global_job_id)
    middle = f"{ids[0]}-{ids[1]}" if ids else "job"
    return f"{POD_PREFIX}-{middle}-a{attempt}-{digest}"


def secret_name(pod: str) -> str:
    """The name of the pod's sandbox Secret (a DNS-1123 subdomain: the pod name is a label)."""
    return pod + SECRET_SUFFIX


def is_dns_label(text: object) -> bool:
    """True for an RFC 1123 label: 1-63 of [a-z0-9-], starting and ending alphanumeric."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_LABEL:
        return False
    if text[0] not in _LOWER_ALNUM or text[-1] not in _LOWER_ALNUM:
        return False
    return all(c in _LOWER_ALNUM or c == "-" for c in text)


def is_dns_subdomain(text: object) -> bool:
    """True for an RFC 1123 subdomain: dot-separated labels, at most 253 characters."""
    if not isinstance(text, str) or not 0 < len(text) <= 253:
        return False
    return all(is_dns_label(part) for part in text.split("."))


def is_label_value(text: object) -> bool:
    """True for a valid label value: empty, or <= 63 of [A-Za-z0-9-_.] with alphanumeric ends."""
    if not isinstance(text, str) or len(text) > MAX_LABEL:
        return False
    if not text:
        return True
    if text[0] not in _ALNUM or text[-1] not in _ALNUM:
        return False
    return all(c in _LABEL_INNER for c in text)


def _squash(text: str, allowed: frozenset[str], filler: str) -> str:
    """Replace characters outside `allowed` with `filler`, collapsing runs of fillers."""
    out: list[str] = []
    for c in text:
        if c in allowed:
            out.append(c)
        elif not out or out[-1] != filler:
            out.append(filler)
    return "".join(out)


def _fit(base: str, text: str, ends: frozenset[str]) -> str:
    """Trim `base` so `base-<hash8>` fits a label; used whenever sanitising changed the text."""
    digest = short_hash(text)
    base = base[: MAX_LABEL - len(digest) - 1]
    while base and base[-1] not in ends:
        base = base[:-1]
    return f"{base}-{digest}" if base else digest


def label_value(text: str) -> str:
    """Sanitise any text into a valid label value that stays readable and distinct.

    Valid input comes back unchanged (so `1234567.3` stays `1234567.3`); anything else has its
    invalid characters replaced by `_`, is trimmed, and gets `-<hash8>` of the original appended so
    that two different inputs never collapse into the same label value.
    """
    text = str(text)
    if is_label_value(text):
        return text
    base = _squash(text, _LABEL_INNER, "_")
    while base and base[0] not in _ALNUM:
        base = base[1:]
    return _fit(base, text, _ALNUM)


def dns_label(text: str) -> str:
    """Sanitise any text into an RFC 1123 label (lower-case), hashed like `label_value` if changed."""
    text = str(text)
    if is_dns_label(text):
        return text
    base = _squash(text.lower(), _LOWER_ALNUM, "-")
    while base and base[0] not in _LOWER_ALNUM:
        base = base[1:]
    return _fit(base, text, _LOWER_ALNUM)
