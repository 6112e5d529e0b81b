"""The ClassAd wire format of the job-router hook protocol.

Every byte a hook reads or writes goes through here, so the rules are the router's own
(docs/hook-protocol.md §2.1, §2.2, §7): ads are written the way ``sPrintAd`` writes them and
hook output is read the way ``ClassAd::Insert`` reads it, quirks included. Values are rendered
by ``classad2``'s old-syntax unparser, which is the same ``ClassAdUnParser`` the router uses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import classad2

# Names sPrintAd never prints (compat_classad.cpp:53-55, 2241-2251), compared case-insensitively.
PRIVATE_ATTRS: frozenset[str] = frozenset(
    {"capability", "childclaimids", "claimid", "claimidlist", "claimids", "transferkey"}
)
_PRIVATE_PREFIX = "_condor_priv"

# Inputs larger than this are refused before any parsing: a job ad is a few kB, and a hostile or
# broken peer must not make us allocate without bound.
MAX_AD_BYTES = 4 * 1024 * 1024

# Lines that separate ads in `condor_q -long` style input (job_router_info.cpp:330-468).
_SEPARATOR = re.compile(r"^\s*$|^\.\.\.\s*$|^\*\*\*|^-- ")


class AdParseError(ValueError):
    """A job ad that cannot be read; names the line so an admin can find it."""

    def __init__(self, message: str, line_no: int = 0, line: str = "", source: str = "<input>") -> None:
        self.line_no = line_no
        self.line = line
        self.source = source
        where = f"{source}:{line_no}: " if line_no else f"{source}: "
        super().__init__(where + message)


class HookOutputError(AdParseError):
    """A hook output line the router would refuse (hook-protocol.md §2.1); what that costs depends on the hook."""


def is_private(name: str) -> bool:
    low = name.lower()
    return low in PRIVATE_ATTRS or low.startswith(_PRIVATE_PREFIX)


def unparse_old(value: object) -> str:
    """Render one value or expression exactly as sPrintAd does (old syntax, old-value mode)."""
    one = classad2.ClassAd()
    one["X"] = value
    text = one.printOld()
    # printOld gives "X = <value>\n"; the value itself may contain raw newlines (router quirk).
    return text[4:-1] if text.endswith("\n") else text[4:]


# Per raw attribute name as printOld writes it: _PRINT (printed), _DROP (private), _RULE (a quoted
# or non-ASCII name: the attribute rule decides). Attribute names repeat across a CE's ads, so after
# the first ads each line costs one dict look-up. Bounded, so odd ads cannot grow it for ever.
_PRINT, _DROP, _RULE = 0, 1, 2
_NAME_KIND: dict[str, int] = {}
_NAME_KIND_MAX = 8192


def _name_kind(name: str) -> int:
    kind = _NAME_KIND.get(name)
    if kind is None:
        kind = _RULE if not (name.isidentifier() and name.isascii()) else _DROP if is_private(name) else _PRINT
        if len(_NAME_KIND) < _NAME_KIND_MAX:
            _NAME_KIND[name] = kind
    return kind


def sprint_ad(ad: classad2.ClassAd) -> str:
    """The bytes sPrintAd produces: byte-order sorted names, private names dropped, one per line.

    The library prints the whole ad in one call; its lines are then filtered and put in byte
    order. That is used only when every attribute came out as one line under its own name (no
    raw newline in a value, no quoted name); otherwise each value is printed on its own
    (`sprint_ad_by_attribute`, the rule). Why: the router emulator prints an ad for five of
    every pilot's six hook calls, and printing attribute by attribute was 40 % of its CPU
    (177 vs 9 µs for an 87-attribute ad). Sorting the lines sorts the names: every name is an
    ASCII identifier and is followed by a space, which sorts before every identifier character.
    """
    lines = ad.printOld().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    # Every attribute prints at least one line, so as many lines as attributes means one each.
    if len(lines) == len(ad):
        kept = []
        for line in lines:
            kind = _name_kind(line.partition(" = ")[0])
            if kind == _PRINT:
                kept.append(line)
            elif kind == _RULE:
                break
        else:
            kept.sort()
            kept.append("")
            return "\n".join(kept)
    return sprint_ad_by_attribute(ad)


def sprint_ad_by_attribute(ad: classad2.ClassAd) -> str:
    """`sprint_ad` one attribute at a time, through one scratch ad (the rule the fast path must
    match, and the path for values with raw newlines)."""
    out: list[str] = []
    one = classad2.ClassAd()
    for name in sorted(ad.keys()):
        if is_private(name):
            continue
        one["X"] = ad.lookup(name)
        text = one.printOld()
        value = text[4:-1] if text.endswith("\n") else text[4:]
        out.append(f"{name} = {value}\n")
    return "".join(out)


def route_info_line(name: str, target_universe: int, grid_resource: str | None) -> str:
    """The new-style one-line route description the translate hook reads first (hook-protocol.md §2.2)."""
    route = classad2.ClassAd()
    route["Name"] = name
    if grid_resource:
        route["GridResource"] = grid_resource
    route["TargetUniverse"] = int(target_universe)
    return repr(route)


def translate_stdin(route_line: str, src: classad2.ClassAd) -> bytes:
    """Route line, no newline of its own, then the dashes, then the source ad (hook-protocol.md §2.2)."""
    return (route_line + "\n------\n" + sprint_ad(src)).encode()


def finalize_stdin(src: classad2.ClassAd, dest: classad2.ClassAd) -> bytes:
    """Source ad, an empty line, the dashes, then the routed ad (hook-protocol.md §2.4)."""
    return (sprint_ad(src) + "\n------\n" + sprint_ad(dest)).encode()


def _check_size(text: str, source: str) -> None:
    if len(text) > MAX_AD_BYTES:
        raise AdParseError(f"input of {len(text)} bytes exceeds the {MAX_AD_BYTES}-byte limit", 0, "", source)


# classad2 unparses and frees a chain like `1+1+...` recursively in C++: 10,000 operators overflow
# a 2 MiB thread stack and kill the whole process (a segfault, not an exception; issue 9). No real
# job expression has more than a few dozen operators, so one line holding more is refused first.
MAX_EXPR_OPERATORS = 1000
# String literals are skipped (`\` + any character taken as a pair: where that differs from the
# old parser it can only end a literal earlier, i.e. count more, never hide an operator).
_STRING_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"?')
_OPERATOR = re.compile(r"[-+*/%&|^<>=!?:.,]|\b(?:is|isnt)\b", re.IGNORECASE)


def _check_expression(expr: str, line_no: int, line: str, source: str) -> None:
    """Refuse an expression with more operators than MAX_EXPR_OPERATORS (see above)."""
    if len(expr) < MAX_EXPR_OPERATORS:
        return
    count = len(_OPERATOR.findall(_STRING_LITERAL.sub("", expr)))
    if count > MAX_EXPR_OPERATORS:
        raise AdParseError(f"expression has {count} operators (at most {MAX_EXPR_OPERATORS} are accepted)",
                           line_no, line[:80], source)


def _json_expressions(value: object) -> Iterable[str]:
    """Every `/Expr(...)/` string inside a decoded JSON value (iterative: no recursion limit)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if item.startswith("/Expr("):
                yield item
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())


def _parse_rhs(rhs: str) -> object | None:
    """Parse a right-hand side with the old-ClassAd parser; None when it does not parse.

    Like ``ParseExpression`` without the full-buffer check, text after a complete expression is
    ignored; the sentinel line tells "parsed" from "parser gave up on this line".
    """
    try:
        parsed = classad2.parseOne(f"X = {rhs}\n_CeK8sSentinel_ = 1", classad2.ParserType.Old)
    except (ValueError, classad2.ClassAdException):
        return None
    if "X" not in parsed:
        return None
    return parsed.lookup("X")


def _insert_line(ad: classad2.ClassAd, line: str) -> str | None:
    """Insert one ``Name = value`` line by ClassAd::Insert's rules; returns an error or None."""
    stripped = line.lstrip(" ")
    pos = stripped.find("=")
    if pos < 0:
        return "no '=' in line"
    name = stripped[:pos].rstrip(" ")
    if not name:
        return "no attribute name before '='"
    if name[0] == "'":
        return "quoted attribute names are refused"
    if not (name.isascii() and name.isprintable()):
        # classad2 raises ValueError/UnicodeEncodeError on NUL or undecodable bytes in a name
        return "attribute name is not printable ASCII"
    rhs = stripped[pos + 1 :].lstrip(" ")
    expr = _parse_rhs(rhs)
    if expr is None:
        return "value does not parse as an old-syntax ClassAd expression"
    ad[name] = expr
    return None


def parse_hook_output(text: str, source: str = "<hook stdout>") -> classad2.ClassAd:
    """Read hook stdout as the router does: blank lines skipped, any bad line fails the whole.

    The lines are parsed in one call when that gives every line's attribute (the common case);
    otherwise line by line (`hook_output_by_line`), which is the rule and names the bad line.
    Why: the router emulator parses every hook's output on its one thread, and a parser call
    per line was a sixth of that thread's work in the pipeline benchmark.
    """
    _check_size(text, source)
    lines = []
    names = set()
    for no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        _check_expression(line, no, line, source)
        lines.append((no, line))
        name = _line_name(line)
        if name is not None and names is not None and name.isascii() and name.isprintable():
            names.add(name.lower())
        else:
            names = None          # a line the fast path cannot vouch for: the line rule decides
    if names is not None and lines:
        try:
            ad = classad2.parseOne("\n".join(line for _, line in lines), classad2.ParserType.Old)
        except (ValueError, classad2.ClassAdException):
            ad = None
        # Each line must have given its own attribute: one name per line, all of them present.
        if ad is not None and len(names) == len(lines) == len(ad) and all(n in ad for n in names):
            return ad
    return hook_output_by_line(lines, source)


def hook_output_by_line(lines: list[tuple[int, str]], source: str) -> classad2.ClassAd:
    """The router's rule for hook stdout, one ClassAd::Insert per (line number, line)."""
    ad = classad2.ClassAd()
    for no, line in lines:
        error = _insert_line(ad, line)
        if error:
            raise HookOutputError(error, no, line, source)
    return ad


def _line_name(line: str) -> str | None:
    stripped = line.lstrip(" ")
    pos = stripped.find("=")
    if pos <= 0:
        return None
    name = stripped[:pos].rstrip(" ")
    return name if name and name[0] != "'" else None


def _parse_block(lines: list[tuple[int, str]], source: str) -> classad2.ClassAd:
    """Parse one ad; fast whole-block parse first, line by line only to locate an error."""
    body = [(no, line) for no, line in lines if not line.lstrip().startswith("#")]
    names = [_line_name(line) for _, line in body]
    if all(n and n.isascii() and n.isprintable() for n in names):
        try:
            ad = classad2.parseOne("\n".join(line for _, line in body), classad2.ParserType.Old)
        except (ValueError, classad2.ClassAdException):
            ad = None
        if ad is not None and all(name in ad for name in names):
            return ad
    ad = classad2.ClassAd()
    for no, line in body:
        if line.lstrip().startswith("#"):
            continue
        error = _insert_line(ad, line)
        if error:
            raise AdParseError(error, no, line, source)
    return ad


def parse_old_ads(text: str, source: str = "<input>") -> list[classad2.ClassAd]:
    """Read ads in `condor_q -long` form: blank lines, ``...``, ``***`` and ``-- `` lines separate."""
    _check_size(text, source)
    ads: list[classad2.ClassAd] = []
    block: list[tuple[int, str]] = []
    for no, line in enumerate(text.split("\n"), start=1):
        _check_expression(line, no, line, source)
        if _SEPARATOR.match(line):
            if block:
                ads.append(_parse_block(block, source))
                block = []
            continue
        block.append((no, line))
    if block:
        ads.append(_parse_block(block, source))
    return ads


def parse_json_ads(text: str, source: str = "<input>") -> list[classad2.ClassAd]:
    """Read `condor_q -json` output (a list of objects, expressions as ``/Expr(...)/`` strings)."""
    _check_size(text, source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AdParseError(f"not valid JSON: {exc.msg}", exc.lineno, "", source) from None
    except RecursionError:
        raise AdParseError("JSON nested too deeply", 0, "", source) from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise AdParseError("JSON job ads must be an object or a list of objects", 0, "", source)
    ads = []
    for index, item in enumerate(data):
        # classad2's JSON reader crashes (KeyError, SystemError) on some non-ASCII or control
        # characters in names; no HTCondor attribute name has one.
        bad = next((k for k in item if not k.isascii() or not k.isprintable()), None)
        if bad is not None:
            raise AdParseError(f"ad #{index + 1}: attribute name {bad[:40]!r} is not printable ASCII", 0, "", source)
        for expr in _json_expressions(item):
            _check_expression(expr, 0, expr, source)
        # classad2 recognises expressions only in the escaped "\/Expr(...)\/" spelling.
        encoded = json.dumps(item).replace("/", "\\/")
        try:
            ads.append(classad2.parseOne(encoded, classad2.ParserType.JSON))
        except (ValueError, classad2.ClassAdException) as exc:
            raise AdParseError(f"ad #{index + 1} is not a JSON ClassAd: {exc}", 0, "", source) from None
    return ads


def parse_job_ads(text: str, source: str = "<input>") -> list[classad2.ClassAd]:
    """Read job ads in either form, telling JSON from old text by the first characters."""
    head = text.lstrip()[:200]
    if head.startswith("{") or re.match(r"\[\s*(\{|\])", head):
        return parse_json_ads(text, source)
    return parse_old_ads(text, source)


def _to_python(value: object) -> object:
    if isinstance(value, classad2.Value):
        return None
    if isinstance(value, classad2.ClassAd):
        return {k: _to_python(value.eval(k)) for k in value.keys()}
    if isinstance(value, list):
        return [_to_python(v.eval() if isinstance(v, classad2.ExprTree) else v) for v in value]
    if isinstance(value, classad2.ExprTree):
        return _to_python(value.eval())
    return value


def evaluate_ad(ad: classad2.ClassAd) -> dict[str, object]:
    """Every attribute evaluated in the ad's own scope (MY only), as plain Python values.

    Undefined and error become None, nested ads dicts, lists lists; this is what the pod builder,
    which must not depend on classad2, reads.
    """
    return {name: _to_python(ad.eval(name)) for name in ad.keys()}


def to_json_dict(ad: classad2.ClassAd, names: Iterable[str] | None = None) -> dict[str, object]:
    """The ad in classad2's JSON form (expressions as ``/Expr(...)/`` strings), sorted by name.

    Private attributes are left out, as sPrintAd leaves them out: they are claim secrets.
    """
    data = json.loads(ad.printJson())
    keys = sorted(data) if names is None else [n for n in names if n in data]
    keys = [k for k in keys if not is_private(k)]
    return {k: data[k] for k in keys}


def to_json_value(value: object) -> object:
    """One value in classad2's JSON form."""
    one = classad2.ClassAd()
    one["X"] = value
    return json.loads(one.printJson())["X"]
