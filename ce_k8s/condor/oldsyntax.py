"""Convert old-syntax job routes (``JOB_ROUTER_ENTRIES`` ClassAds) into ``JOB_ROUTER_ROUTE_<name>``.

HTCondor 24.10+ ignores ``JOB_ROUTER_DEFAULTS``/``_ENTRIES``/``_ENTRIES_FILE``/``_ENTRIES_CMD``
(``gated_config`` says exactly which HTCondor version reads what). Sites upgrading from CE ≤ 23
still have them, so this module does what the router did when it loaded them: each entry is
*defaults ∪ entry* (entry wins), then ``ConvertClassadJobRouterRouteToXForm`` (xform_utils.cpp, 24.0)
turns the ad into transform statements:

* ``Name`` → the route name (default: the GridResource), ``TargetUniverse`` → ``UNIVERSE n``,
  ``Requirements`` → ``REQUIREMENTS``, flattened against the route ad with the ``TARGET.`` scope
  removed (only the scope: ``target.x509UserProxyVOName`` → ``x509UserProxyVOName``);
* ``copy_A = "B"`` → ``COPY A B``, ``delete_A`` → ``DELETE A``, ``set_A = e`` → ``SET A e``,
  ``eval_set_A = e`` → ``EVALSET A e`` (flattened, ``TARGET.`` → ``MY.``), in that group order,
  each group sorted case-insensitively; route attributes an ``eval_set_`` still refers to are
  temporarily ``SET`` and ``DELETE``d afterwards;
* every other attribute becomes a macro assignment (``GridResource = "batch pbs"``; other literal
  strings lose their quotes, as in HTCondor).

Like the router, old route knobs are read *expanded* (``param``), a later entry with the same name
replaces an earlier one unless it says ``OverrideRoutingEntry = false``, and a new-syntax
``JOB_ROUTER_ROUTE_<name>`` wins over an entry of that name. ``JOB_ROUTER_ENTRIES_CMD`` is never run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import classad2

from ce_k8s.condor.config import CondorConfig, ConfigError, Origin
from ce_k8s.condor.diagnostics import Diagnostic, Severity
from ce_k8s.condor.wire import unparse_old

log = logging.getLogger(__name__)

ENTRY_KNOBS = ("JOB_ROUTER_ENTRIES_CMD", "JOB_ROUTER_ENTRIES_FILE", "JOB_ROUTER_ENTRIES")
#: knobs that only mean something to the old syntax; converted_config() drops them.
OLD_KNOBS = (
    "JOB_ROUTER_DEFAULTS",
    *ENTRY_KNOBS,
    "MERGE_JOB_ROUTER_DEFAULT_ADS",
    "JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES",
)
_ROUTE_PREFIX = "JOB_ROUTER_ROUTE_"
_TAG = "jrt"
_VALID_ROUTE_NAME = re.compile(r"[A-Za-z0-9_]+")

_FLATTEN_MY = {  # atr_f_Flatten | atr_f_MyTarget attributes of xform_utils.cpp's RouterAttrItems
    "editjobinplace",
    "failureratethreshold",
    "jobfailuretest",
    "jobshouldbesandboxed",
    "overrideroutingentry",
    "usesharedx509userproxy",
    "sharedx509userproxy",
}


class ConversionError(Exception):
    """One or more old-syntax routes could not be converted; ``str()`` has one file:line per line."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass
class ConversionResult:
    """The new-syntax config text, the converted route names (in order) and what to look at."""

    text: str
    routes: list[str]
    warnings: list[str] = field(default_factory=list)


@dataclass
class _OldRoute:
    name: str
    ad: classad2.ClassAd
    where: Origin
    label: str  # e.g. "JOB_ROUTER_ENTRIES [2]"
    original_name: str | None = None  # set when the name had to be made knob-safe


# ---- detection ----------------------------------------------------------------------------


def _is_classad_route(text: str | None) -> bool:
    if not text:
        return False
    s = text.lstrip()
    return s.startswith("[") or s.startswith("/*")


def _classad_route_knobs(cfg: CondorConfig) -> list[str]:
    out = []
    for name in cfg.names():
        if name.upper().startswith(_ROUTE_PREFIX) and name.upper() != _ROUTE_PREFIX + "NAMES":
            if _is_classad_route(cfg.raw(name)):
                out.append(name)
    return out


def has_old_syntax(cfg: CondorConfig) -> bool:
    """True when the config holds routes in the old ClassAd syntax (entries or ``[...]`` routes)."""
    return any(cfg.raw(k) for k in ENTRY_KNOBS) or bool(_classad_route_knobs(cfg))


# ---- ClassAd text helpers ---------------------------------------------------------------------


def _skip_gap(text: str, i: int) -> int:
    """Skip whitespace, commas and C/C++ comments between route ads."""
    n = len(text)
    while i < n:
        c = text[i]
        if c.isspace() or c == ",":
            i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        else:
            break
    return i


def _ad_end(text: str, start: int) -> int:
    """Index just after the ``]`` closing the ad that opens at ``start``, or -1."""
    depth = 0
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            i += 1
            while i < n and text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c in "[{(":
            depth += 1
        elif c in "]})":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _knob_lines(cfg: CondorConfig, knob: str, text: str) -> Callable[[int], int]:
    """Offset in ``text`` (the knob's expanded value) → file line; exact unless expansion moved text."""
    where = cfg.origin(knob) or Origin("<config>", 0)
    if cfg.raw(knob) == text:
        return lambda offset: cfg.line_of(knob, offset) or where.line
    return lambda offset: where.line


def _split_ads(
    text: str, where: Origin, what: str, line_at: Callable[[int], int], errors: list[ConfigError]
) -> list[tuple[classad2.ClassAd, int]]:
    """Parse a list of ``[...]`` ads; returns (ad, file line) pairs and collects errors."""
    ads: list[tuple[classad2.ClassAd, int]] = []
    i = _skip_gap(text, 0)
    while i < len(text):
        line = line_at(i)
        if text[i] != "[":
            hint = " (a '\\' line continuation must end its line)" if text[i] == "\\" else ""
            errors.append(ConfigError(where.file, line, f"{what}: expected '[' to start a route ad, found "
                                      f"{text[i:i + 30]!r}{hint}"))
            return ads
        end = _ad_end(text, i)
        if end < 0:
            errors.append(ConfigError(where.file, line, f"{what}: route ad starting here has no closing ']'"))
            return ads
        try:
            ad = classad2.parseOne(text[i:end], classad2.ParserType.New)
        except (ValueError, classad2.ClassAdException) as exc:
            errors.append(ConfigError(where.file, line, f"{what}: cannot parse route ad "
                                      f"{_snippet(text[i:end])}: {exc}"))
        else:
            ads.append((ad, line))
        i = _skip_gap(text, end)
    return ads


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= 60 else flat[:57] + "...")


def _rewrite_target(text: str, replacement: str) -> str:
    """Replace the ``TARGET.`` scope of attribute references (not inside strings) by ``replacement``.

    This is RewriteAttrRefs(tree, {"TARGET": replacement}) done on unparsed old-syntax text: only an
    identifier ``target`` (any case) directly followed by ``.`` and not itself scoped changes.
    """
    out: list[str] = []
    i = 0
    n = len(text)
    prev = ""
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            prev = c
            i = j + 1
            continue
        if c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            if word.lower() == "target" and j < n and text[j] == "." and prev != ".":
                out.append(replacement)
                i = j + 1
                prev = "."
                continue
            out.append(word)
            prev = word[-1]
            i = j
            continue
        out.append(c)
        if not c.isspace():
            prev = c
        i += 1
    return "".join(out)


def _unparse(value: object) -> str:
    return unparse_old(value)


def _flatten_unparse(ad: classad2.ClassAd, expr: classad2.ExprTree, target_to: str) -> str:
    """unparse_special(): flatten against the route ad, then rewrite the TARGET scope."""
    try:
        flat = ad.flatten(expr)
    except Exception:  # flattening is best effort, as FlattenAndInline's failure path
        flat = expr
    text = _unparse(flat)
    return _rewrite_target(text, target_to)


def _literal_string(expr: classad2.ExprTree) -> str | None:
    """The value of a literal string expression (ExprTreeIsLiteralString), else None."""
    text = _unparse(expr)
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        try:
            value = expr.eval()
        except Exception:
            return None
        if isinstance(value, str) and unparse_old(value) == text:
            return value
    return None


# ---- the statement builder (ConvertClassadJobRouterRouteToXForm) ---------------------------------


class _NoCaseMap:
    """std::map<string, string, CaseIgnLTStr>: first spelling kept, last value wins, sorted nocase."""

    def __init__(self) -> None:
        self._d: dict[str, tuple[str, str]] = {}

    def __setitem__(self, key: str, value: str) -> None:
        old = self._d.get(key.lower())
        self._d[key.lower()] = (old[0] if old else key, value)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._d

    def __bool__(self) -> bool:
        return bool(self._d)

    def items(self) -> list[tuple[str, str]]:
        return [self._d[k] for k in sorted(self._d)]


def route_statements(name: str, ad: classad2.ClassAd) -> list[str]:
    """The transform statements for one merged old-syntax route ad (without NAME handling)."""
    target_universe = 0
    requirements = ""
    assignments = _NoCaseMap()
    string_assignments: set[str] = set()
    copy_cmds = _NoCaseMap()
    delete_cmds = _NoCaseMap()
    set_cmds = _NoCaseMap()
    evalset_cmds = _NoCaseMap()
    evalset_refs: set[str] = set()
    spelled: dict[str, str] = {}

    for attr in ad.keys():
        low = attr.lower()
        expr = ad.lookup(attr)
        if low.startswith("copy_"):
            try:
                value = ad.eval(attr)
            except Exception:
                value = None
            if isinstance(value, str):
                copy_cmds[attr[5:]] = value
        elif low.startswith("delete_"):
            delete_cmds[attr[7:]] = ""
        elif low.startswith("set_"):
            rhs = _unparse(expr)
            if rhs:
                set_cmds[attr[4:]] = rhs
        elif low.startswith("eval_set_"):
            rhs = _unparse(expr)
            if rhs:
                refs = [r for r in ad.internalRefs(expr) if r]
                if refs:
                    rhs = _flatten_unparse(ad, expr, "MY.")
                    refs = [r for r in ad.internalRefs(classad2.ExprTree(rhs)) if r]
                evalset_cmds[attr[9:]] = rhs
                for r in refs:
                    evalset_refs.add(r.lower())
                    spelled.setdefault(r.lower(), r)
        elif low == "name":
            continue  # the route name is the knob name
        elif low == "targetuniverse":
            try:
                tu = ad.eval(attr)
            except Exception:
                tu = None
            if isinstance(tu, int) and not isinstance(tu, bool):
                target_universe = tu
        elif low == "gridresource":
            rhs = _unparse(expr)
            if rhs:
                assignments[attr] = rhs
                string_assignments.add(low)
        elif low == "requirements":
            requirements = _flatten_unparse(ad, expr, "")
        else:
            if low in _FLATTEN_MY:
                rhs = _flatten_unparse(ad, expr, "MY.")
                is_string = True
            else:
                lit = _literal_string(expr)
                is_string = lit is not None
                rhs = lit if lit is not None else _unparse(expr)
            if rhs:
                assignments[attr] = rhs
                if is_string:
                    string_assignments.add(low)

    out = [f"# autoconversion of route '{name}' from old route syntax", f"NAME {name}"]
    if target_universe:
        out.append(f"UNIVERSE {target_universe}")
    if requirements:
        out.append(f"REQUIREMENTS {requirements}")
    out.append("")
    out.extend(f"{k} = {v}" for k, v in assignments.items())
    for title, cmds, fmt in (
        ("# copy_* rules", copy_cmds, "COPY {0} {1}"),
        ("# delete_* rules", delete_cmds, "DELETE {0}"),
        ("# set_* rules", set_cmds, "SET {0} {1}"),
    ):
        if cmds:
            out += ["", title]
            out.extend(fmt.format(k, v) for k, v in cmds.items())
    temps = sorted(
        (r for r in evalset_refs if r in assignments and r not in set_cmds), key=str.lower
    )
    if temps:
        out += ["", "# temporarily SET attrs because eval_set_ rules refer to them"]
        for r in temps:
            n = spelled[r]
            out.append(f'SET {n} "$({n})"' if r in string_assignments else f"SET {n} $({n})")
    if evalset_cmds:
        out += ["", "# eval_set_* rules"]
        out.extend(f"EVALSET {k} {v}" for k, v in evalset_cmds.items())
    if temps:
        out += ["", "# remove temporary attrs"]
        out.extend(f"DELETE {spelled[r]}" for r in temps)
    return out


# ---- reading the old knobs ----------------------------------------------------------------------


def _defaults_ad(cfg: CondorConfig, warnings: list[str], errors: list[ConfigError]) -> classad2.ClassAd:
    """JOB_ROUTER_DEFAULTS as the router loads it (initRouterDefaultsAd, 24.0)."""
    result = classad2.ClassAd()
    text = cfg.get("JOB_ROUTER_DEFAULTS")
    if not text or not text.strip():
        return result
    where = cfg.origin("JOB_ROUTER_DEFAULTS") or Origin("<config>", 0)
    merge = cfg.get_bool("MERGE_JOB_ROUTER_DEFAULT_ADS", False)
    body = text.strip()
    if not body.startswith("["):
        body = "[ " + body + " ]"
        merge = False
    ads = _split_ads(body, where, "JOB_ROUTER_DEFAULTS", _knob_lines(cfg, "JOB_ROUTER_DEFAULTS", body), errors)
    for k, (ad, _line) in enumerate(ads):
        if k > 0 and not merge:
            warnings.append(
                f"{where}: JOB_ROUTER_DEFAULTS holds {len(ads)} ads but MERGE_JOB_ROUTER_DEFAULT_ADS is "
                "false, so (as in HTCondor) only the first one is used"
            )
            break
        result = _merge(result, ad)
    return result


def _merge(*ads: classad2.ClassAd) -> classad2.ClassAd:
    """defaults ∪ entry, later ads winning, expressions kept unevaluated."""
    merged = classad2.ClassAd()
    for ad in ads:
        for key in ad.keys():
            merged[key] = ad.lookup(key)
    return merged


def _route_name(merged: classad2.ClassAd, fallback: str) -> str:
    for key in ("Name", "GridResource"):
        try:
            value = merged.eval(key)
        except Exception:
            value = None
        if isinstance(value, str) and value:
            return value
    return fallback


def _override(merged: classad2.ClassAd) -> int:
    try:
        value = merged.eval("OverrideRoutingEntry")
    except Exception:
        return -1
    if isinstance(value, bool):
        return int(value)
    return -1


def _collect(cfg: CondorConfig, warnings: list[str], errors: list[ConfigError]) -> list[_OldRoute]:
    defaults = _defaults_ad(cfg, warnings, errors)
    routes: dict[str, _OldRoute] = {}
    counter = 0
    for knob in ENTRY_KNOBS:
        value = cfg.get(knob)
        if not value:
            continue
        where = cfg.origin(knob) or Origin("<config>", 0)
        line_at = _knob_lines(cfg, knob, value)
        if knob == "JOB_ROUTER_ENTRIES_CMD":
            warnings.append(
                f"{where}: JOB_ROUTER_ENTRIES_CMD = {value.strip()} is a command and was not run; run it "
                "yourself, save its output to a file, set JOB_ROUTER_ENTRIES_FILE to it and convert again"
            )
            continue
        if knob == "JOB_ROUTER_ENTRIES_FILE":
            path = Path(value.strip())
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                errors.append(ConfigError(where.file, where.line,
                                          f"JOB_ROUTER_ENTRIES_FILE: cannot read {path}: {exc.strerror}"))
                continue
            where = Origin(str(path), 1)

            def line_at(offset: int, text: str = text) -> int:
                return 1 + text.count("\n", 0, offset)
        else:
            text = value
        for ad, line in _split_ads(text, where, knob, line_at, errors):
            counter += 1
            merged = _merge(defaults, ad)
            label = f"{knob} [{counter}]"
            route = _make_route(merged, Origin(where.file, line), label, f"entries_{counter}", warnings)
            _add(routes, route, warnings)
    return list(routes.values())


def _make_route(merged: classad2.ClassAd, where: Origin, label: str, fallback: str,
                warnings: list[str]) -> _OldRoute:
    name = _route_name(merged, fallback)
    route = _OldRoute(name, merged, where, label)
    if not _VALID_ROUTE_NAME.fullmatch(name):
        safe = re.sub(r"[^A-Za-z0-9_]", "_", name)
        warnings.append(
            f"{where}: route name {name!r} is not a valid knob suffix (letters, digits, '_'); "
            f"converted as {safe}"
        )
        route.original_name = name
        route.name = safe
    return route


def _add(routes: dict[str, _OldRoute], route: _OldRoute, warnings: list[str]) -> None:
    key = route.name.lower()
    existing = routes.get(key)
    if existing is None:
        routes[key] = route
        return
    override = _override(route.ad)
    if override < 0:
        warnings.append(
            f"{route.where}: two route entries are named '{route.name}' (the other at {existing.where}); "
            "as in HTCondor the later one replaces the earlier one (set OverrideRoutingEntry to say so)"
        )
        override = 1
    if override:
        routes[key] = route  # keeps the earlier entry's position, as the router's hash_order did
    else:
        warnings.append(f"{route.where}: route '{route.name}' has OverrideRoutingEntry = false; ignored")


# ---- public API -----------------------------------------------------------------------------------


def _convert(cfg: CondorConfig) -> tuple[ConversionResult, list[str]]:
    warnings: list[str] = []
    errors: list[ConfigError] = []
    entries = _collect(cfg, warnings, errors)

    # new-syntax JOB_ROUTER_ROUTE_<name> knobs win over entries with the same name
    kept: list[_OldRoute] = []
    for route in entries:
        knob = _ROUTE_PREFIX + route.name
        raw = cfg.raw(knob)
        if raw is not None and raw.strip() and not _is_classad_route(raw):
            warnings.append(
                f"{route.where}: {route.label} '{route.name}' is replaced by {knob} at {cfg.origin(knob)} "
                "(as in HTCondor); not converted"
            )
            continue
        kept.append(route)

    classad_knobs = _classad_route_knobs(cfg)
    for knob in classad_knobs:
        name = knob[len(_ROUTE_PREFIX):]
        where = cfg.origin(knob) or Origin("<config>", 0)
        text = cfg.get(knob) or ""
        ads = _split_ads(text, where, knob, _knob_lines(cfg, knob, text), errors)
        if ads:
            kept = [r for r in kept if r.name.lower() != name.lower()]
            kept.append(_OldRoute(name, ads[0][0], Origin(where.file, ads[0][1]), knob))
            if len(ads) > 1:
                warnings.append(f"{where}: {knob} holds more than one route ad; only the first is used")

    if errors:
        raise ConversionError(errors)

    if cfg.raw("JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES") is not None and not cfg.get_bool(
        "JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES", False
    ):
        warnings.append(
            f"{cfg.origin('JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES')}: JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES "
            "is false, so HTCondor 23.5-24.0 ignored these entries; the converted routes are active"
        )

    names_value = cfg.get("JOB_ROUTER_ROUTE_NAMES")
    route_names = [r.name for r in kept]
    if names_value is not None:
        listed = {n.lower() for n in names_value.replace(",", " ").split()}
        for r in kept:
            if r.name.lower() not in listed:
                warnings.append(
                    f"{r.where}: route '{r.name}' is not in JOB_ROUTER_ROUTE_NAMES "
                    f"({cfg.origin('JOB_ROUTER_ROUTE_NAMES')}), so it stays disabled"
                )
        names_line = " ".join(names_value.split())
    else:
        names_line = " ".join(route_names)
        if len(kept) > 1:
            warnings.append(
                f"{kept[0].where}: JOB_ROUTER_ROUTE_NAMES was not set: HTCondor <= 24.0 tried these routes "
                f"in hash-table order; the converted config tries them in the order they were written "
                f"({names_line}). Check it."
            )

    sources = [k for k in ("JOB_ROUTER_DEFAULTS", *ENTRY_KNOBS) if cfg.raw(k)] + classad_knobs
    out = ["# Converted by 'ce-k8s routes convert' from old-syntax job routes:"]
    out += [f"#   {k} ({cfg.origin(k)})" for k in sources]
    out += [
        "# HTCondor 24.10 and later ignore those knobs: remove them and use these lines instead.",
        "# Routes from JOB_ROUTER_ENTRIES skipped the pre/post-route transforms; these routes run them.",
        "",
        f"JOB_ROUTER_ROUTE_NAMES = {names_line}",
    ]
    for r in kept:
        out += ["", f"# {r.label} at {r.where}"]
        if r.original_name is not None:
            out.append(f"# original route name: {r.original_name!r}")
        out.append(f"{_ROUTE_PREFIX}{r.name} @={_TAG}")
        out += route_statements(r.name, r.ad)
        out.append(f"@{_TAG}")
    text = "\n".join(out) + "\n"
    return ConversionResult(text, route_names, warnings), classad_knobs


def convert(cfg: CondorConfig) -> ConversionResult:
    """Convert every old-syntax route in ``cfg`` to new-syntax config text.

    Raises ConversionError (one ``file:line: message`` per problem) when a route ad is broken.
    """
    return _convert(cfg)[0]


def converted_config(cfg: CondorConfig) -> CondorConfig:
    """``cfg`` with the old route knobs replaced by the converted routes (a copy; ``cfg`` is unchanged)."""
    if not has_old_syntax(cfg):
        return cfg
    result, classad_knobs = _convert(cfg)
    new = cfg.copy()
    for knob in (*OLD_KNOBS, *classad_knobs):
        new.unset(knob)
    new.read_text(result.text, "<converted by ce-k8s routes convert>")
    new.warnings.extend(result.warnings)
    log.info("converted %d old-syntax routes: %s", len(result.routes), " ".join(result.routes))
    return new


# ---- which HTCondor reads what -------------------------------------------------------------------

#: HTCondor 23.5.0 turned ``JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES``' default from true to false
#: (HTCONDOR-2260: JobRouter.cpp ``JobRouter::config``/``initRouterDefaultsAd``; the 24.0 LTS series
#: keeps that rule).
ENTRIES_OFF_BY_DEFAULT = (23, 5, 0)
#: HTCondor 24.10.0 removed the old syntax from the router (HTCONDOR-3118, v24 version history):
#: ``JOB_ROUTER_ENTRIES*``/``_DEFAULTS`` are only named in a warning and a ``[...]`` route is not read.
OLD_SYNTAX_REMOVED = (24, 10, 0)
_GATED_KNOBS = ("JOB_ROUTER_DEFAULTS", *ENTRY_KNOBS)


def _version_text(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)


def gated_config(cfg: CondorConfig) -> tuple[CondorConfig, list[Diagnostic], bool]:
    """``cfg`` as the modelled HTCondor (``cfg.version``) routes with its old-syntax routes.

    Returns (configuration, findings, converted): before 24.10 the old routes the router reads are
    converted to ``JOB_ROUTER_ROUTE_<name>`` (entries only when ``JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES``
    is true, its default being true before 23.5.0 and false from then on; ``[...]`` route knobs
    always); from 24.10 nothing is converted and each old knob is an ERROR whose fix is
    ``ce-k8s routes convert`` (the router routes no job through them).
    """
    if not has_old_syntax(cfg):
        return cfg, [], False
    version = cfg.version
    found: list[Diagnostic] = []
    if version >= OLD_SYNTAX_REMOVED:
        modelled, removed = _version_text(version), _version_text(OLD_SYNTAX_REMOVED)
        for knob in (*(k for k in _GATED_KNOBS if cfg.raw(k)), *_classad_route_knobs(cfg)):
            where = cfg.origin(knob) or Origin("<config>", 0)
            found.append(Diagnostic(where.file, where.line, Severity.ERROR,
                                    f"{knob} is old-syntax route configuration, which HTCondor {modelled} does not "
                                    f"read (removed in {removed}): the router routes no job through it; convert it "
                                    "with 'ce-k8s routes convert'"))
        return cfg, found, False
    use_entries = cfg.get_bool("JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES", version < ENTRIES_OFF_BY_DEFAULT)
    gated = cfg
    if not use_entries and any(cfg.raw(k) for k in _GATED_KNOBS):
        gated = cfg.copy()
        for knob in _GATED_KNOBS:
            if cfg.raw(knob):
                where = cfg.origin(knob) or Origin("<config>", 0)
                found.append(Diagnostic(where.file, where.line, Severity.WARNING,
                                        f"{knob} is ignored by HTCondor {_version_text(version)} because "
                                        "JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES is false (the router logs this and "
                                        "carries on): no job is routed through these entries"))
            gated.unset(knob)
        gated.unset("JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES")
    if not has_old_syntax(gated):
        return gated, found, False
    return converted_config(gated), found, True
