"""TRANSLATE_JOB hook: echo the source ad, make the routed job inert, name its pod.

The router replaces the routed ad with this hook's stdout (docs/hook-protocol.md §2.2), so the
output is the *whole* input ad.

Only for a Kubernetes route: the router runs this hook for every routed job on the CE
(JOB_ROUTER_HOOK_KEYWORD is global), so the route-description line it prints first decides. A
route whose `GridResource` does not start with the words of `CE_K8S_GRID_RESOURCE` (`batch k8s`),
or that has none, is another backend's: its source ad is written back byte for byte as it arrived
and the router routes exactly what it would have (docs/routes.md, "CEs with other backends").

For a Kubernetes route, what changes:

* `Managed = "ScheddDone"`, `ManagedManager = "ce-k8s"`: nobody but ce-k8s acts on the routed job
  (hook-protocol.md §3). "ScheddDone" ("the gridmanager is completely done with this job") is the one value that
  both the schedd and the gridmanager leave alone, read from HTCondor v23.9.6 (same on 25.x):
  `src/condor_schedd.V6/schedd.cpp` count_jobs counts a grid-universe job towards starting a
  condor_gridmanager for its owner only when `Managed != "ScheddDone"`, and every job query of
  `src/condor_gridmanager/gridmanager.cpp` doContactSchedd (the adoption of a previous
  gridmanager's jobs, new jobs, removals, dirty jobs) excludes `Managed == "ScheddDone"`
  (`expr_not_completely_done`). "External", which this hook used before, is the gridmanager's
  *own* marker: its first contact adopts every grid job with `Managed == "External"`, and on a
  real 23.9 it submitted our routed jobs to BLAH (finding R1 in docs/real-condor.md), a second run of the
  pilot. `src/condor_job_router/JobRouter.cpp` GetCandidateJobs' umbrella constraint excludes
  "ScheddDone" too, so the router never takes a routed job for a new source job. `ManagedManager`
  stays the marker of who owns the job.
* `K8sAttempt`: 0, or the source job's `K8sAttempt` + 1 when it carries one (after a reroute,
  via `CE_K8S_ATTRS_TO_COPY`), so a rerouted pilot never reuses the old pod's name.
* `K8sPodName = pod_name(GlobalJobId, K8sAttempt)`: deterministic, so a re-translation after any
  failure names the same pod and the agent adopts instead of duplicating (docs/design.md Decision 5).
* `K8sSourceGlobalJobId`: the source `GlobalJobId`, verbatim. VanillaToGrid deletes `GlobalJobId` from
  the routed ad (hook-protocol.md §2.2 step 1), and the agent needs it to name the pod of a later attempt.
* `JobUniverse` is added if missing: without it VanillaToGrid aborts the whole router (hook-protocol.md §2.2).
* Every incoming `K8s*` attribute is dropped: Kubernetes settings are the site's, chosen by routes
  (docs/design.md Decision 1), never by the factory that wrote the job ad (tests/hardening/test_injection.py).
* A line that continues an open string literal (sPrintAd writes raw newlines, hook-protocol.md §2.2) belongs to the
  attribute before it, even if it looks like `Name = value`: job text cannot smuggle attributes.

The translate hook never talks to the agent: pod creation happens on the first update, once the
routed ad carries every transform's result (docs/design.md Decision 1).
"""

import sys

from ce_k8s.hooks._common import arm_deadline, grid_resource_matches, log, read_stdin, to_int, unquote, write_stdout

SEPARATOR = "\n------\n"
MANAGER = "ce-k8s"
MANAGED = "ScheddDone"      # see the module docstring: the value no schedd or gridmanager acts on
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
    """Whether an old-syntax string literal is still open after `text` (only `\\"` escapes, hook-protocol.md §2.2).

    Jumps from quote to quote with `str.find`: a quote toggles the state unless it is inside a
    string and the character just before it (in this text) is a backslash.
    """
    i = text.find('"')
    while i >= 0:
        if not (open_ and i > 0 and text[i - 1] == "\\"):
            open_ = not open_
        i = text.find('"', i + 1)
    return open_


# -- the route-description line ------------------------------------------------------------------
# JobRoute::RouteDescription (src/condor_job_router/JobRouter.cpp) prints a new-syntax ClassAd:
# `[ Name = "Pilots"; GridResource = "batch k8s"; TargetUniverse = 9 ]`, GridResource only when the
# route defines one, in whatever attribute order the ClassAd library keeps. New syntax means
# backslash escapes in strings (unlike the old-syntax job ad below the separator).

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "a": "\a"}


def _skip_literal(text: str, i: int) -> int:
    """Index just past the quoted literal (`"string"` or `'name'`) that starts at `text[i]`;
    `len(text) + 1` when it is never closed."""
    quote = text[i]
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
        elif c == quote:
            return i + 1
        else:
            i += 1
    return len(text) + 1


def _new_syntax_string(literal: str) -> str | None:
    """The value of one new-syntax string literal, None if `literal` is anything else."""
    if len(literal) < 2 or literal[0] != '"' or _skip_literal(literal, 0) != len(literal):
        return None
    body = literal[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 == len(body):
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in "01234567":
            j = i + 1
            while j < len(body) and j < i + 4 and body[j] in "01234567":
                j += 1
            out.append(chr(int(body[i + 1:j], 8)))
            i = j
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


def route_grid_resource(route_line: str) -> str | None:
    """The route's `GridResource` from the route-description line, None when it has none (or the
    line is not a ClassAd, or GridResource is not a string literal).

    Split at the top-level `;` (skipping string literals and nested `[]`, `{}`, `()`), so a route
    name such as `"a; GridResource = \\"batch k8s\\""` cannot pose as the attribute.
    """
    text = route_line.strip()
    if len(text) < 2 or text[0] != "[" or text[-1] != "]":
        return None
    body = text[1:-1]
    found = None
    depth = 0
    start = 0
    i = 0
    while i <= len(body):
        c = body[i] if i < len(body) else ";"
        if c in "\"'":
            i = _skip_literal(body, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ";" and (depth == 0 or i == len(body)):
            name, sep, value = body[start:i].partition("=")
            name = name.strip()
            if len(name) > 1 and name[0] == name[-1] == "'":
                name = name[1:-1]
            if sep and name.lower() == "gridresource":
                found = _new_syntax_string(value.strip())
            start = i + 1
        i += 1
    return found


def is_kubernetes_route(route_line: str, grid_resource_knob: str) -> bool:
    """Whether the route described by `route_line` sends jobs to Kubernetes: its GridResource
    starts with the words of `CE_K8S_GRID_RESOURCE` (`grid_resource_knob`), case-insensitively.
    A route without GridResource is not (docs/routes.md, "CEs with other backends")."""
    return grid_resource_matches(route_grid_resource(route_line), grid_resource_knob)


# Attributes ce-k8s itself writes into the routed job and copies back to the source job
# (CE_K8S_ATTRS_TO_COPY); seen again on a reroute, they are dropped without a warning.
_OURS = frozenset({"k8spodname", "k8sattempt", "k8ssourceglobaljobid", "k8spodnamespace", "k8spodphase",
                   "k8spodreason", "k8snodename", "k8spoduid"})


def translate_ad_text(route_line: str, ad_text: str) -> str:
    """The translate hook's stdout for one source ad (pure; `ce-k8s route` calls it in-process).

    This is the Kubernetes translation; whether a route is a Kubernetes one is decided before,
    by `is_kubernetes_route` (`main` and `ce-k8s route` both ask it first). `route_line` is
    accepted for symmetry with the router's stdin; routes are applied after translation, so
    nothing here depends on it. Every input attribute line is echoed byte for byte, except the
    attributes this hook sets, which are replaced.
    An attribute whose string value contained a raw newline (sPrintAd writes those unescaped,
    hook-protocol.md §2.2) cannot survive the router's line parser and is dropped with a warning on stderr.
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
            # Kubernetes settings are the site's, set by routes (docs/design.md Decision 1); the job's own
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

    out.append(f'Managed = "{MANAGED}"')
    out.append(f'ManagedManager = "{MANAGER}"')
    out.append(f"K8sAttempt = {attempt}")
    out.append(f'K8sPodName = "{pod_name(gjid, attempt)}"')
    out.append(f"K8sSourceGlobalJobId = {gjid_raw}")
    if "jobuniverse" not in raw:
        out.append("JobUniverse = 5")
    return "\n".join(out) + "\n"


def main() -> int:
    """Exit 0 with the ad on success; exit 1 (graceful removal, retried later, hook-protocol.md §2.2) on bad input.

    Another backend's job (see the module docstring) gets its source ad back unchanged, the bytes
    after the separator exactly as they arrived, and exit 0.
    """
    from ce_k8s.protocol import hook_grid_resource, hook_settings

    arm_deadline(hook_settings()[1], 1)
    data = read_stdin()
    if data is None:
        return 1
    route_raw, sep, ad_raw = data.partition(SEPARATOR.encode())
    if not sep:
        log("stdin has no '------' separator after the route line")
        return 1
    route_line = route_raw.decode("utf-8", "surrogateescape")
    if not is_kubernetes_route(route_line, hook_grid_resource()):
        write_stdout(ad_raw)
        return 0
    try:
        result = translate_ad_text(route_line, ad_raw.decode("utf-8", "surrogateescape"))
    except TranslateError as exc:
        log(f"cannot translate: {exc}")
        return 1
    write_stdout(result.encode("utf-8", "surrogateescape"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
