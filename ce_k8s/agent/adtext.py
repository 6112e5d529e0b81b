"""Cheap reading and writing of old-syntax ClassAd lines on the agent's hot path.

Why not classad2 here: a full parse of a 150-attribute routed ad costs about a millisecond, and
the update path must answer in well under 500 µs at 20,000 pods. After the first sight of a job,
the agent only needs a dozen attribute values, so it scans the sPrintAd lines
(`Name = value`, docs/hook-protocol.md §2.2) for those names and leaves everything else alone.

Output lines follow the router's stdout rules (hook-protocol.md §2.1, §8): `Name = value`, strings in double
quotes with `"` escaped as `\\"`, no raw newlines. In the old ClassAd syntax the router parses,
a backslash is not an escape character (checked against classad2's old parser), so backslashes
in free text are replaced by `/` rather than risk a value ending in `\\"`.
"""

from __future__ import annotations

# The agent reads literals exactly as the hooks do: one implementation, re-exported here.
from ce_k8s.hooks._common import to_int as as_int  # noqa: F401
from ce_k8s.hooks._common import unquote  # noqa: F401

# Everything the update path reads or may rewrite (lower-case).
WANTED = frozenset({
    "owner", "clusterid", "procid", "globaljobid", "routedfromjobid",
    "k8spodname", "k8sattempt", "k8ssourceglobaljobid", "k8smaxattempts", "k8spendingtimeout",
    "jobstatus", "gridjobstatus", "gridjobid", "k8spodphase", "k8spodreason", "k8spoduid",
    "k8spodnamespace", "k8snodename", "remotehost", "jobcurrentstartdate", "jobstartdate",
    "numjobstarts", "exitcode", "completiondate", "remotewallclocktime", "jobfinishedhookdone",
    "holdreason", "holdreasoncode", "holdreasonsubcode", "routename", "k8sretryafter",
    "x509userproxy", "scitokensfile", "iwd",          # credential refresh (ce_k8s.agent.credentials)
})

MAX_STRING = 1024


# Per wanted-set memo of raw attribute names (as sPrintAd wrote them) -> lower-case wanted name or
# None. A CE's ads repeat the same few hundred spellings, so after the first ads every line costs
# one partition and one dict look-up instead of strip + lower + a set test (issue 17: the update
# path is paid once per routed job per poll). Bounded, so forged ads cannot grow it for ever.
_CANONICAL: dict[frozenset[str], dict[str, str | None]] = {}
_CANONICAL_MAX = 4096
_UNSEEN = object()


def scan(text: str, wanted: frozenset[str] = WANTED) -> dict[str, str]:
    """Raw right-hand sides of the wanted attributes, keyed by lower-case name (last one wins).

    A line counts when it has ` = ` after a non-empty name: the name is what precedes the first
    ` = `, stripped and lower-cased; the value is the rest of the line, stripped.
    """
    canonical = _CANONICAL.get(wanted)
    if canonical is None:
        canonical = _CANONICAL.setdefault(wanted, {})
    found: dict[str, str] = {}
    for line in text.split("\n"):
        raw, sep, value = line.partition(" = ")
        if not sep or not raw:
            continue
        name = canonical.get(raw, _UNSEEN)
        if name is _UNSEEN:
            low = raw.strip().lower()
            name = low if low in wanted else None
            if len(canonical) < _CANONICAL_MAX:
                canonical[raw] = name
        if name is not None:
            found[name] = value.strip()
    return found


# The GridResource rule is the hooks' own (`ce_k8s.hooks._common.ad_grid_resource`, which works on the
# bytes): a line `GridResource = "<old-syntax string>"`, the name in any case with ASCII space around
# it (what `bytes.strip` removes), the first `=` of the line (with or without spaces), no bare `"`
# inside the value, the last such line wins. `scan_job` applies it line by line in its one pass.
_ASCII_SPACE = " \t\n\r\x0b\x0c"
_GRID = "\0gridresource"          # memo mark of a raw name that is GridResource's by that rule
_CANONICAL_JOB: dict[frozenset[str], dict[str, str | None]] = {}


def _grid_name(name: str) -> bool:
    """Whether `name` (what precedes a line's first `=`) names GridResource by the hooks' rule."""
    name = name.strip(_ASCII_SPACE)
    return len(name) == 12 and name.isascii() and name.lower() == "gridresource"


def grid_resource_line(line: str) -> str | None:
    """The GridResource string of one line of sPrintAd text by the hooks' rule, None if the line is not one."""
    name, sep, value = line.partition("=")
    if not sep or not _grid_name(name):
        return None
    value = value.strip(_ASCII_SPACE)
    if len(value) < 2 or value[0] != '"' or value[-1] != '"' or '"' in value[1:-1].replace('\\"', ""):
        return None
    return value[1:-1].replace('\\"', '"')


def scan_job(text: str, wanted: frozenset[str]) -> tuple[dict[str, str], str | None]:
    """`scan(text, wanted)` and the ad's GridResource (`grid_resource_line`'s rule), in one pass.

    Why one pass: the agent's verbs need both of every request (ce_k8s.agent.routedjob), and the
    GridResource check was a second and third pass over the text (encode, then the hooks' byte
    search). The wanted attributes are found exactly as `scan` finds them (same lines, same limits,
    last one wins); `wanted` must not hold `gridresource`, which follows the hooks' rule instead.
    """
    canonical = _CANONICAL_JOB.get(wanted)
    if canonical is None:
        canonical = _CANONICAL_JOB.setdefault(wanted, {})
    found: dict[str, str] = {}
    grid = None
    for line in text.split("\n"):
        raw, sep, value = line.partition(" = ")
        if not sep or not raw:
            if "=" in line:         # `GridResource="..."` needs no spaces around its `=`
                got = grid_resource_line(line)
                if got is not None:
                    grid = got
            continue
        name = canonical.get(raw, _UNSEEN)
        if name is _UNSEEN:
            low = raw.strip().lower()
            name = low if low in wanted else _GRID if _grid_name(raw.partition("=")[0]) else None
            if len(canonical) < _CANONICAL_MAX:
                canonical[raw] = name
        if name is None:
            continue
        if name is _GRID:
            got = grid_resource_line(line)
            if got is not None:
                grid = got
            continue
        found[name] = value.strip()
    return found, grid


def quote(text: str) -> str:
    """A machine-safe old-syntax string literal: one line, `"` escaped, no backslashes."""
    # the per-character pass only when needed: pod and node names, phases and most messages are
    # printable, and this runs for every string of every update reply
    if not text.isprintable():
        text = "".join(c if c.isprintable() else " " for c in text)
    clean = text.replace("\\", "/")
    if len(clean) > MAX_STRING:
        clean = clean[: MAX_STRING - 3] + "..."
    return '"' + clean.replace('"', '\\"') + '"'


def render(value: object) -> str:
    """One value as the router's old-syntax parser expects it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if value is None:
        return "undefined"
    return quote(str(value))


def changed_lines(desired: dict[str, object], current: dict[str, str]) -> str:
    """`Name = value` lines for the desired attributes whose rendering differs from the ad's.

    The routed ad the hook receives lags one poll (hook-protocol.md §2.3), so a value printed last cycle may be
    printed once more; that is harmless. Nothing is printed when nothing changed.
    """
    out = []
    for name, value in desired.items():
        text = render(value)
        if current.get(name.lower()) != text:
            out.append(f"{name} = {text}\n")
    return "".join(out)
