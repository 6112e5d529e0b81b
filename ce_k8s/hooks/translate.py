"""TRANSLATE_JOB hook: echo the source ad, make the routed job inert, name its pod.

The router replaces the routed ad with this hook's stdout (jobrouter-protocol.md §2.2), so the
output is the *whole* input ad. What changes:

* `Managed = "External"`, `ManagedManager = "ce-k8s"`: nobody but ce-k8s acts on the routed job
  (§3: otherwise the schedd or gridmanager would try to run it).
* `K8sAttempt`: 0, or the source job's `K8sAttempt` + 1 when it carries one (after a reroute,
  via `CE_K8S_ATTRS_TO_COPY`), so a rerouted pilot never reuses the old pod's name.
* `K8sPodName = pod_name(GlobalJobId, K8sAttempt)`: deterministic, so a re-translation after any
  failure names the same pod and the agent adopts instead of duplicating (DESIGN decision 5).
* `K8sSourceGlobalJobId`: the source `GlobalJobId`, verbatim. VanillaToGrid deletes `GlobalJobId` from
  the routed ad (§2.2 step 1), and the agent needs it to name the pod of a later attempt.
* `JobUniverse` is added if missing: without it VanillaToGrid aborts the whole router (§2.2).
* Every incoming `K8s*` attribute is dropped: Kubernetes settings are the site's, chosen by routes
  (DESIGN decision 1), never by the factory that wrote the job ad (tests/hardening/test_injection.py).
* A line that continues an open string literal (sPrintAd writes raw newlines, §2.2) belongs to the
  attribute before it, even if it looks like `Name = value`: job text cannot smuggle attributes.

The translate hook never talks to the agent: pod creation happens on the first update, once the
routed ad carries every transform's result (DESIGN decision 1).
"""

import sys

from ce_k8s.hooks._common import arm_deadline, log, read_stdin, to_int, unquote, write_stdout

SEPARATOR = "\n------\n"
MANAGER = "ce-k8s"
_REPLACED = frozenset({"managed", "managedmanager", "k8spodname", "k8sattempt", "k8ssourceglobaljobid"})


class TranslateError(ValueError):
    """The input is not a job ad this hook can translate."""


def _is_attr_start(line: str) -> str | None:
    """Lower-case attribute name if `line` starts an `Name = value` attribute, else None.

    A name starts with a letter or `_` and holds only letters, digits, `_` and `.`; checked with
    whole-string methods, not a loop per character, because this runs for every line of every
    routed job.
    """
    name, sep, _ = line.partition("=")
    if not sep:
        return None
    name = name.strip()
    if not name or not (name[0].isalpha() or name[0] == "_"):
        return None
    if not name.replace("_", "a").replace(".", "a").isalnum():
        return None
    return name.lower()


def _string_open(text: str, open_: bool) -> bool:
    """Whether an old-syntax string literal is still open after `text` (only `\\"` escapes, §2.2).

    Jumps from quote to quote with `str.find`: a quote toggles the state unless it is inside a
    string and the character just before it (in this text) is a backslash.
    """
    i = text.find('"')
    while i >= 0:
        if not (open_ and i > 0 and text[i - 1] == "\\"):
            open_ = not open_
        i = text.find('"', i + 1)
    return open_


# Attributes ce-k8s itself writes into the routed job and copies back to the source job
# (CE_K8S_ATTRS_TO_COPY); seen again on a reroute, they are dropped without a warning.
_OURS = frozenset({"k8spodname", "k8sattempt", "k8ssourceglobaljobid", "k8spodnamespace", "k8spodphase",
                   "k8spodreason", "k8snodename", "k8spoduid"})


def translate_ad_text(route_line: str, ad_text: str) -> str:
    """The translate hook's stdout for one source ad (pure; `ce-k8s route` calls it in-process).

    `route_line` is the route-description line (accepted for symmetry with the router's stdin;
    routes are applied after translation, so nothing here depends on it). Every input attribute
    line is echoed byte for byte, except the attributes this hook sets, which are replaced.
    An attribute whose string value contained a raw newline (sPrintAd writes those unescaped,
    §2.2) cannot survive the router's line parser and is dropped with a warning on stderr.
    """
    del route_line
    groups: list[tuple[str, list[str]]] = []
    in_string = False
    for line in ad_text.split("\n"):
        if in_string:
            # the previous value's string is still open: this line is its raw newline's tail,
            # whatever it looks like (`x<NL>Owner = "root"` must not become an attribute)
            groups[-1][1].append(line)
            in_string = _string_open(line, True)
            continue
        if not line.strip():
            continue
        name = _is_attr_start(line)
        if name is not None:
            groups.append((name, [line]))
            in_string = _string_open(line.partition("=")[2], False)
        elif groups:
            groups[-1][1].append(line)
        else:
            raise TranslateError(f"line 1 is not an attribute: {line[:80]!r}")
    if not groups:
        raise TranslateError("empty job ad")

    raw: dict[str, str] = {}
    out: list[str] = []
    for name, lines in groups:
        if len(lines) > 1:
            log(f"dropping attribute {lines[0].partition('=')[0].strip()}: its value contains a raw newline")
            continue
        raw[name] = lines[0].partition("=")[2].strip()
        if name.startswith("k8s"):
            # Kubernetes settings are the site's, set by routes (DESIGN decision 1); the job's own
            # K8s* attributes would otherwise survive wherever a route does not SET them.
            if name not in _OURS:
                log(f"dropping job attribute {lines[0].partition('=')[0].strip()}: K8s* settings come from routes")
            continue
        if name not in _REPLACED:
            out.append(lines[0])

    previous = to_int(raw.get("k8sattempt"))
    attempt = previous + 1 if previous is not None and previous >= 0 else 0
    gjid_raw = raw.get("globaljobid")
    gjid = unquote(gjid_raw)
    if not gjid:
        # Every schedd job has one; fall back to the other unique triple rather than fail.
        cluster, proc, qdate = (to_int(raw.get(k)) for k in ("clusterid", "procid", "qdate"))
        if cluster is None or proc is None:
            raise TranslateError("job ad has neither GlobalJobId nor ClusterId/ProcId")
        gjid = f"{cluster}.{proc}#{qdate or 0}"
        gjid_raw = '"' + gjid + '"'
        log(f"job {cluster}.{proc} has no GlobalJobId; using {gjid!r}")

    from ce_k8s.pods.names import pod_name

    out.append('Managed = "External"')
    out.append(f'ManagedManager = "{MANAGER}"')
    out.append(f"K8sAttempt = {attempt}")
    out.append(f'K8sPodName = "{pod_name(gjid, attempt)}"')
    out.append(f"K8sSourceGlobalJobId = {gjid_raw}")
    if "jobuniverse" not in raw:
        out.append("JobUniverse = 5")
    return "\n".join(out) + "\n"


def main() -> int:
    """Exit 0 with the ad on success; exit 1 (graceful removal, retried later, §2.2) on bad input."""
    from ce_k8s.protocol import hook_settings

    arm_deadline(hook_settings()[1], 1)
    data = read_stdin()
    if data is None:
        return 1
    text = data.decode("utf-8", "surrogateescape")
    route_line, sep, ad_text = text.partition(SEPARATOR)
    if not sep:
        log("stdin has no '------' separator after the route line")
        return 1
    try:
        result = translate_ad_text(route_line, ad_text)
    except TranslateError as exc:
        log(f"cannot translate: {exc}")
        return 1
    write_stdout(result.encode("utf-8", "surrogateescape"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
