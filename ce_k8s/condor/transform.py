"""The HTCondor transform language, as condor_job_router runs it (jobrouter-protocol.md §4.1).

Routes (``JOB_ROUTER_ROUTE_<name>``) and pre/post-route transforms (``JOB_ROUTER_TRANSFORM_<name>``)
are programs in this language. The router reads their text *unexpanded* and runs it line by
line against the job ad being built, with one macro set shared by every transform applied to one
job. We re-implement it because the ``htcondor`` wheel has no transform API (§6); what a site's
routes do to a pilot must be answerable without a CE, and the pod is built from the result.

Semantics that matter and are easy to get wrong (all from §4.1):

* ``NAME``/``UNIVERSE``/``REQUIREMENTS``/``TRANSFORM`` are metadata, stripped when loaded.
* A line ``name = value`` is a macro assignment; ``SET A = 1`` is a statement (the word before
  ``=`` has a space in it).
* ``$(...)`` is expanded per line at the moment the line runs; ``$(MY.x)`` is the *unparsed*
  attribute value; lookups fall through to config macros; ``$$(...)`` is kept for matchmaking.
* ``SET``/``DEFAULT`` store the unevaluated old-syntax expression, ``EVALSET`` the value;
  a bad expression is logged and skipped; only structural errors (unknown keyword, missing
  argument, broken ``if`` nesting) fail the transform.
* ``DEFAULT`` tests presence (``Lookup``), so a literal ``undefined`` is not replaced.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import classad2

from ce_k8s.condor.wire import unparse_old

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import CondorConfig, Origin

log = logging.getLogger(__name__)

# Statement keywords and their argument counts (xform_utils.cpp keyword table).
_KEYWORDS: dict[str, int] = {
    "COPY": 2,
    "DEFAULT": 2,
    "DELETE": 1,
    "EVALMACRO": 2,
    "EVALSET": 2,
    "NAME": 0,
    "RENAME": 2,
    "REQUIREMENTS": 0,
    "SET": 2,
    "TRANSFORM": 0,
    "UNIVERSE": 1,
}
_REGEX_KEYWORDS = frozenset({"COPY", "RENAME", "DELETE"})
_METADATA = frozenset({"NAME", "UNIVERSE", "REQUIREMENTS", "TRANSFORM"})

# condor_universe.h names; CondorUniverseNumberEx also takes the number itself.
UNIVERSES: dict[str, int] = {
    "standard": 1,
    "pipe": 2,
    "linda": 3,
    "pvm": 4,
    "vanilla": 5,
    "pvmd": 6,
    "scheduler": 7,
    "mpi": 8,
    "grid": 9,
    "java": 10,
    "parallel": 11,
    "local": 12,
    "vm": 13,
}

_ATTR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ASSIGNMENT = re.compile(r"^([A-Za-z0-9_.+]+)\s*=(.*)$", re.DOTALL)
_MACRO_NAME = re.compile(r"^[A-Za-z0-9_.+]+$")
# A macro reference starts with "$(" or "$NAME(" and is not the second "$" of "$$(".
_MACRO_START = re.compile(r"(?<!\$)\$([A-Za-z_]*)\(")
_FUNC_F = re.compile(r"^F[fpduwnxbqa]+$")
_MAX_EXPANSIONS = 2000

# Macros HTCondor's transform engine predefines (XFormMacroDefaults) that make sense offline.
_PREDEFINED: dict[str, str] = {"IsLinux": "1", "IsWindows": "0", "Row": "0", "Step": "0", "XFormId": "0",
                               "ItemIndex": "0", "Iterating": "0"}


def universe_number(text: str) -> int:
    """CondorUniverseNumberEx: a number, or a case-insensitive universe name; 0 when unknown."""
    word = text.strip()
    m = re.match(r"^[+-]?\d+", word)
    if m and int(m.group(0)) != 0:
        return int(m.group(0))
    return UNIVERSES.get(word.lower(), 0)


class TransformError(Exception):
    """A structural error: the router refuses the transform (or fails the job) because of it."""

    def __init__(self, message: str, origin: Origin | None = None) -> None:
        self.message = message
        self.origin = origin
        where = f"{origin.file}:{origin.line}: " if origin is not None else ""
        super().__init__(where + message)


class MacroError(ValueError):
    """A ``$(...)`` reference that cannot be expanded (bad function call, index out of range)."""


# --------------------------------------------------------------------------------------------
# Old-syntax expression parsing


def _scan_outside_strings(text: str) -> tuple[bool, int]:
    """Return (strings closed, paren depth never negative and final depth) for old syntax.

    Old-ClassAd strings only escape the quote (``\\"``); backslashes are otherwise literal.
    Quoted attribute names ('x y') are skipped the same way.
    """
    depth = 0
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch:
                j += 2 if text[j] == "\\" and j + 1 < n else 1
            if j >= n:
                return False, depth
            i = j + 1
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return False, depth
        i += 1
    return True, depth


def parse_old_expr(text: str) -> classad2.ExprTree | None:
    """Parse one old-syntax expression, requiring the whole text to be consumed.

    The router uses ``ParseClassAdRvalExpr`` (full=true), so ``1 2`` is an error; classad2's
    old-syntax reader would silently drop the ``2``. Wrapping the text in parentheses makes
    trailing garbage a parse error, provided the text's own parentheses balance.
    """
    body = text.strip()
    if not body or "\n" in body or "\r" in body:
        return None
    closed, depth = _scan_outside_strings(body)
    if not closed or depth != 0:
        return None
    try:
        checked = classad2.parseOne(f"X = ({body})\n_CeK8sEnd_ = 1", classad2.ParserType.Old)
        if "X" not in checked:
            return None
        parsed = classad2.parseOne(f"X = {body}\n_CeK8sEnd_ = 1", classad2.ParserType.Old)
    except (ValueError, classad2.ClassAdException):
        return None
    if "X" not in parsed:
        return None
    return parsed.lookup("X")


def _boolean_equiv(value: object) -> bool | None:
    """classad Value::IsBooleanValueEquiv: booleans, and numbers as non-zero; else None."""
    if isinstance(value, classad2.Value):  # UNDEFINED / ERROR (an IntEnum, so test it first)
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    return None


def is_number(value: object) -> bool:
    """An int or real result (not a bool, not UNDEFINED/ERROR, which classad2 makes ints)."""
    return isinstance(value, int | float) and not isinstance(value, bool | classad2.Value)


def is_error_value(value: object) -> bool:
    return isinstance(value, classad2.Value) and value == classad2.Value.Error


def is_undefined_value(value: object) -> bool:
    return isinstance(value, classad2.Value) and value == classad2.Value.Undefined


def evaluate_in(ad: classad2.ClassAd, expr: classad2.ExprTree) -> object:
    """Evaluate with the ad as MY and no TARGET (§4.4: ``TARGET.x`` is undefined)."""
    try:
        return expr.eval(ad)
    except (ValueError, TypeError, classad2.ClassAdException):
        return classad2.Value.Error


def value_to_macro_text(value: object) -> str:
    """EVALMACRO / $EVAL rendering: strings without quotes, anything else unparsed (old syntax)."""
    if isinstance(value, str):
        return value
    return unparse_old(value)


# --------------------------------------------------------------------------------------------
# The macro set


class MacroSet:
    """Transform macros for one routed job; shared by pre-route, route and post-route (§4.1).

    Values are stored raw (submit syntax) and expanded when used, so ``$(var)`` sees the value
    the variable has when the using line runs. Lookups that miss fall through to config macros
    (``also_in_config``), then to the few macros the transform engine predefines.
    """

    def __init__(self, config: CondorConfig | None = None, version: str | None = None) -> None:
        self._config = config
        self._macros: dict[str, str] = {}
        self.version = version or classad2.version()

    def set(self, name: str, raw_value: str) -> None:
        self._macros[name.lower()] = raw_value

    def local(self, name: str) -> str | None:
        return self._macros.get(name.lower())

    def names(self) -> list[str]:
        return sorted(self._macros)

    def lookup(self, name: str) -> str | None:
        """Raw value of a macro: local first, then the config, then the predefined table."""
        value = self._macros.get(name.lower())
        if value is not None:
            return value
        if self._config is not None:
            value = self._config.lookup_macro(name)
            if value is not None:
                return value
        for key, predefined in _PREDEFINED.items():
            if key.lower() == name.lower():
                return predefined
        return None

    def copy(self) -> MacroSet:
        clone = MacroSet(self._config, self.version)
        clone._macros = dict(self._macros)
        return clone


# --------------------------------------------------------------------------------------------
# Macro expansion


def _my_attr_text(ad: classad2.ClassAd | None, attr: str) -> str | None:
    """``$(MY.attr)``: the attribute's unparsed value, strings without their quotes."""
    if ad is None or not attr:
        return None
    try:
        expr = ad.lookup(attr)
    except KeyError:
        return None
    text = unparse_old(expr)
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        try:
            value = expr.eval()
        except (ValueError, TypeError, classad2.ClassAdException):
            value = None
        if isinstance(value, str):
            return value
    return text


def _split_args(body: str) -> list[str]:
    return [part.strip() for part in body.split(",")]


class _Expander:
    """Expands ``$(...)`` references in one line against a macro set and the job ad."""

    def __init__(self, macros: MacroSet, ad: classad2.ClassAd | None) -> None:
        self.macros = macros
        self.ad = ad

    def raw(self, name: str) -> str | None:
        if name[:3].upper() == "MY.":
            return _my_attr_text(self.ad, name[3:])
        return self.macros.lookup(name)

    def value_of(self, name: str) -> str | None:
        raw = self.raw(name)
        if raw is None:
            return None
        if name[:3].upper() == "MY.":
            return raw
        return self.expand(raw)

    def expand(self, text: str) -> str:
        """Expand innermost-leftmost references until none are left (as expand_macro loops)."""
        pos = 0
        for _ in range(_MAX_EXPANSIONS):
            found = self._next_reference(text, pos)
            if found is None:
                return text
            start, func, body_start, end = found
            body = text[body_start:end]
            replacement = self._resolve(func, body)
            if replacement is None:
                pos = end + 1  # left as written; keep scanning after it
                continue
            text = text[:start] + replacement + text[end + 1 :]
            pos = 0  # an enclosing reference may now be complete; rescan (expand_macro does too)
        raise MacroError("macro expansion does not terminate (a macro refers to itself?)")

    @staticmethod
    def _next_reference(text: str, pos: int) -> tuple[int, str, int, int] | None:
        while True:
            m = _MACRO_START.search(text, pos)
            if m is None:
                return None
            body_start = m.end()
            end = text.find(")", body_start)
            if end < 0:
                return None
            inner = _MACRO_START.search(text, body_start, end)
            if inner is not None:
                pos = inner.start()  # a reference nested in this one's body goes first
                continue
            return m.start(), m.group(1), body_start, end

    def _resolve(self, func: str, body: str) -> str | None:
        if func == "":
            name, sep, default = body.partition(":")
            name = name.strip()
            if not _MACRO_NAME.match(name):
                return None
            value = self.value_of(name)
            if value is None:
                return default if sep else ""
            return value
        handler = _FUNCTIONS.get(func)
        if handler is not None:
            return handler(self, body)
        if _FUNC_F.match(func):
            return _path_function(self, func[1:], body)
        return None  # not a function we know: HTCondor leaves it alone too

    # helpers for the functions
    def text_or_literal(self, arg: str) -> str:
        """A function argument names a macro; when it does not, it is taken as literal text."""
        arg = arg.strip()
        if _MACRO_NAME.match(arg):
            value = self.value_of(arg)
            if value is not None:
                return value
        return arg

    def evaluate(self, arg: str) -> object:
        text = self.text_or_literal(arg)
        expr = parse_old_expr(text)
        if expr is None:
            raise MacroError(f"cannot parse {text!r} as an expression")
        return evaluate_in(self.ad if self.ad is not None else classad2.ClassAd(), expr)


def _format(fmt: str, value: object, default: str) -> str:
    fmt = fmt.strip() if fmt.strip() else default
    try:
        return fmt % (value,)
    except (TypeError, ValueError) as exc:
        raise MacroError(f"bad format {fmt!r}: {exc}") from exc


def _fn_int(exp: _Expander, body: str) -> str:
    arg, _, fmt = body.partition(",")
    value = exp.evaluate(arg)
    if not is_number(value):
        raise MacroError(f"$INT({arg.strip()}) does not evaluate to a number")
    return _format(fmt, int(value), "%d")


def _fn_real(exp: _Expander, body: str) -> str:
    arg, _, fmt = body.partition(",")
    value = exp.evaluate(arg)
    if not is_number(value):
        raise MacroError(f"$REAL({arg.strip()}) does not evaluate to a number")
    return _format(fmt, float(value), "%.16G")


def _fn_string(exp: _Expander, body: str) -> str:
    arg, _, fmt = body.partition(",")
    value = exp.evaluate(arg)
    if not isinstance(value, str):
        raise MacroError(f"$STRING({arg.strip()}) does not evaluate to a string")
    return _format(fmt, value, "%s")


def _fn_eval(exp: _Expander, body: str) -> str:
    return value_to_macro_text(exp.evaluate(body))


def _fn_env(exp: _Expander, body: str) -> str:
    name, sep, default = body.partition(":")
    value = os.environ.get(name.strip())
    if value is None:
        return default if sep else ""
    return value


def _int_arg(exp: _Expander, arg: str, what: str) -> int:
    text = exp.text_or_literal(arg)
    try:
        return int(text)
    except ValueError:
        value = exp.evaluate(text)
        if not is_number(value) or not isinstance(value, int):
            raise MacroError(f"{what}: {text!r} is not an integer") from None
        return value


def _list_items(exp: _Expander, args: list[str]) -> list[str]:
    if len(args) == 1:
        listed = exp.value_of(args[0]) if _MACRO_NAME.match(args[0]) else None
        source = listed if listed is not None else args[0]
        return [item for item in re.split(r"[,\s]+", source) if item]
    return args


def _fn_choice(exp: _Expander, body: str) -> str:
    args = _split_args(body)
    if len(args) < 2:
        raise MacroError("$CHOICE needs an index and a list")
    index = _int_arg(exp, args[0], "$CHOICE index")
    items = _list_items(exp, args[1:])
    if index < 0 or index >= len(items):
        raise MacroError(f"$CHOICE index {index} is out of range for {len(items)} items")
    return items[index]


def _fn_random_choice(exp: _Expander, body: str) -> str:
    items = _list_items(exp, _split_args(body))
    if not items:
        raise MacroError("$RANDOM_CHOICE needs at least one item")
    return random.choice(items)  # noqa: S311 - not security relevant, HTCondor semantics


def _fn_random_integer(exp: _Expander, body: str) -> str:
    args = _split_args(body)
    if len(args) not in (2, 3):
        raise MacroError("$RANDOM_INTEGER needs min, max [, step]")
    low = _int_arg(exp, args[0], "$RANDOM_INTEGER min")
    high = _int_arg(exp, args[1], "$RANDOM_INTEGER max")
    step = _int_arg(exp, args[2], "$RANDOM_INTEGER step") if len(args) == 3 else 1
    if step <= 0 or high < low:
        raise MacroError("$RANDOM_INTEGER needs min <= max and a positive step")
    return str(random.randrange(low, high + 1, step))  # noqa: S311


def _fn_substr(exp: _Expander, body: str) -> str:
    args = _split_args(body)
    if len(args) not in (2, 3):
        raise MacroError("$SUBSTR needs name, start [, length]")
    text = exp.text_or_literal(args[0])
    start = _int_arg(exp, args[1], "$SUBSTR start")
    if start < 0:
        start = max(0, len(text) + start)
    rest = text[start:]
    if len(args) == 3:
        length = _int_arg(exp, args[2], "$SUBSTR length")
        rest = rest[:length] if length >= 0 else rest[: max(0, len(rest) + length)]
    return rest


def _path_function(exp: _Expander, letters: str, body: str) -> str:
    """``$F[fpduwnxbqa](name)``: pieces of a file name held by a macro (or written literally)."""
    arg = body.strip()
    value = exp.value_of(arg) if _MACRO_NAME.match(arg) and "/" not in arg else None
    path = value if value is not None else ("" if _MACRO_NAME.match(arg) and "/" not in arg else arg)
    if "f" in letters and path and not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    if "w" in letters:
        path = path.replace("/", "\\")
    elif "u" in letters:
        path = path.replace("\\", "/")
    sep = "\\" if "w" in letters else "/"
    cut = max(path.rfind("/"), path.rfind("\\"))
    directory, filename = (path[: cut + 1], path[cut + 1 :]) if cut >= 0 else ("", path)
    stem, dot, ext = filename.rpartition(".")
    if not dot:
        stem, ext = filename, ""
    parts: list[str] = []
    if "p" in letters:
        parts.append(directory)
    elif "d" in letters:
        trimmed = directory.rstrip("/\\")
        last = trimmed[max(trimmed.rfind("/"), trimmed.rfind("\\")) + 1 :]
        parts.append(last if "b" in letters or not last else last + sep)
    if "n" in letters:
        parts.append(stem)
    if "x" in letters and ext:
        parts.append(ext if "b" in letters else "." + ext)
    result = "".join(parts) if any(c in letters for c in "pdnx") else path
    if "q" in letters:
        quote = "'" if "a" in letters else '"'
        result = quote + result + quote
    return result


_FUNCTIONS: dict[str, Callable[[_Expander, str], str]] = {
    "INT": _fn_int,
    "REAL": _fn_real,
    "STRING": _fn_string,
    "EVAL": _fn_eval,
    "ENV": _fn_env,
    "CHOICE": _fn_choice,
    "RANDOM_CHOICE": _fn_random_choice,
    "RANDOM_INTEGER": _fn_random_integer,
    "SUBSTR": _fn_substr,
    "DIRNAME": lambda exp, body: _path_function(exp, "p", body),
    "BASENAME": lambda exp, body: _path_function(exp, "nx", body),
}


def expand_macros(text: str, macros: MacroSet, ad: classad2.ClassAd | None = None) -> str:
    """Expand every ``$(...)`` reference in one line (raises MacroError on a bad function call)."""
    return _Expander(macros, ad).expand(text)


# --------------------------------------------------------------------------------------------
# Parsed statements


@dataclass
class _Line:
    """One logical line of a transform body with the physical line it started on."""

    kind: str  # "assign", "stmt", "if", "elif", "else", "endif"
    text: str
    lineno: int  # 0-based offset in the body
    keyword: str = ""
    name: str = ""  # macro name for "assign"
    value: str = ""  # raw value for "assign", condition for if/elif


@dataclass
class _Block:
    """An if/elif/else chain; branches hold statements or nested blocks."""

    branches: list[tuple[_Line | None, list[_Line | _Block]]] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join ``\\`` continuations (a comment line inside one is dropped) and trim each line."""
    out: list[tuple[int, str]] = []
    pending: str | None = None
    start = 0
    for no, physical in enumerate(text.split("\n")):
        line = physical.rstrip("\r")
        if pending is not None:
            if line.strip().startswith("#"):
                continue
            line = pending + line.strip()
        else:
            start = no
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1]
            continue
        pending = None
        out.append((start, line.strip()))
    if pending is not None:
        out.append((start, pending.strip()))
    return out


def _statement_keyword(line: str) -> tuple[str, str] | None:
    """(KEYWORD, rest) when the line's first word is a keyword used as a statement.

    is_xform_statement: the keyword must be followed by white space and then something that
    is not ``=`` or ``:`` (``NAME = x`` assigns the macro NAME instead).
    """
    m = re.match(r"^(\S+)(\s+(.*))?$", line, re.DOTALL)
    if m is None:
        return None
    word = m.group(1).upper()
    rest = (m.group(3) or "").strip()
    return word, rest


def _tokens(text: str) -> list[tuple[int, str]]:
    return [(m.start(), m.group(0)) for m in re.finditer(r"\S+", text)]


def _regex_token(rest: str) -> tuple[str, str, str] | None:
    """Split ``/re/flags remainder`` into (pattern, flags, remainder); None when not a regex."""
    if not rest.startswith("/"):
        return None
    i = 1
    while i < len(rest):
        if rest[i] == "\\" and i + 1 < len(rest):
            i += 2
            continue
        if rest[i] == "/":
            break
        i += 1
    if i >= len(rest):
        return None
    pattern = rest[1:i]
    j = i + 1
    while j < len(rest) and not rest[j].isspace():
        j += 1
    return pattern, rest[i + 1 : j], rest[j:].strip()


def _substitute_groups(template: str, match: re.Match[str]) -> str:
    """``\\0``…``\\9`` in the replacement, for groups the match has (append_substituted_regex)."""
    count = (match.re.groups or 0) + 1
    out: list[str] = []
    i = 0
    while i < len(template):
        ch = template[i]
        if ch == "\\" and i + 1 < len(template) and template[i + 1].isdigit() and int(template[i + 1]) < count:
            out.append(match.group(int(template[i + 1])) or "")
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


class Transform:
    """One parsed transform: metadata stripped, statements kept in order for ``apply``."""

    def __init__(self, name: str, origin: Origin | None = None) -> None:
        self.name = name
        self.statement_name: str | None = None  # NAME statement, if any (the router may override)
        self.requirements: str | None = None
        self.requirements_expr: classad2.ExprTree | None = None
        self.requirements_origin: Origin | None = None
        self.universe: int | None = None
        self.universe_text: str | None = None
        self.origin = origin
        self.line_numbers: list[int] | None = None
        self.text = ""
        self._multiline = False
        self._program: list[_Line | _Block] = []
        self.lines: list[_Line] = []  # every non-metadata statement line, for checks
        self.warnings: list[str] = []

    # ---- parsing ------------------------------------------------------------------------

    def where(self, lineno: int) -> Origin | None:
        """File and line of body line ``lineno`` (0-based): the knob's line plus the offset."""
        if self.origin is None:
            return None
        from ce_k8s.condor.config import Origin

        if self.line_numbers is not None and 0 <= lineno < len(self.line_numbers):
            return Origin(self.origin.file, self.line_numbers[lineno])
        extra = lineno + 1 if self._multiline else lineno
        return Origin(self.origin.file, self.origin.line + extra)

    def _error(self, message: str, lineno: int) -> TransformError:
        return TransformError(message, self.where(lineno))

    @classmethod
    def parse(cls, name: str, text: str, origin: Origin | None = None,
              line_numbers: list[int] | None = None) -> Transform:
        """Parse a transform body; raise TransformError (with file:line) on structural errors.

        ``line_numbers`` maps each line of ``text`` to its line in the config file (the config
        reader drops comments inside ``@=`` blocks, so an offset from ``origin`` is not enough).
        """
        self = cls(name, origin)
        self.line_numbers = line_numbers
        self._parse_into(text)
        return self

    def _parse_into(self, text: str) -> None:
        self.text = text
        self._multiline = "\n" in text.strip("\n") or text.startswith("\n")
        if text.startswith("\n"):
            text = text[1:]
        stack: list[tuple[_Block, list[_Line | _Block], int]] = []
        current: list[_Line | _Block] = self._program
        for lineno, line in _logical_lines(text):
            if not line or line.startswith("#"):
                continue
            item = self._classify(line, lineno)
            if item is None:
                continue
            if item.kind == "if":
                block = _Block()
                body: list[_Line | _Block] = []
                block.branches.append((item, body))
                current.append(block)
                stack.append((block, current, lineno))
                current = body
            elif item.kind in ("elif", "else"):
                if not stack:
                    raise self._error(f"'{item.kind}' without 'if'", lineno)
                block = stack[-1][0]
                if block.branches[-1][0] is not None and block.branches[-1][0].kind == "else":
                    raise self._error(f"'{item.kind}' after 'else'", lineno)
                body = []
                block.branches.append((item, body))
                current = body
            elif item.kind == "endif":
                if not stack:
                    raise self._error("'endif' without 'if'", lineno)
                _, current, _ = stack.pop()
            else:
                current.append(item)
                self.lines.append(item)
        if stack:
            raise self._error("'if' without 'endif'", stack[-1][2])

    def _classify(self, line: str, lineno: int) -> _Line | None:
        lower = line.lower()
        for word in ("if", "elif"):
            if lower == word or lower.startswith(word + " ") or lower.startswith(word + "\t"):
                cond = line[len(word) :].strip()
                if not cond:
                    raise self._error(f"'{word}' without a condition", lineno)
                return _Line(word, line, lineno, value=cond)
        if lower in ("else", "endif"):
            return _Line(lower, line, lineno)
        assign = _ASSIGNMENT.match(line)
        if assign is not None:
            return _Line("assign", line, lineno, name=assign.group(1), value=assign.group(2).strip())
        kw = _statement_keyword(line)
        if kw is None:
            return None
        word, rest = kw
        if word not in _KEYWORDS:
            raise self._error(f"{line.split()[0]} is not a valid transform keyword", lineno)
        if word in _METADATA:
            self._metadata(word, rest, lineno)
            return None
        if not rest:
            raise self._error(f"{word} needs an argument", lineno)
        return _Line("stmt", line, lineno, keyword=word, value=rest)

    def _metadata(self, word: str, rest: str, lineno: int) -> None:
        if word == "NAME":
            if rest:
                self.statement_name = rest
        elif word == "UNIVERSE":
            if not rest:
                raise self._error("UNIVERSE needs an argument", lineno)
            self.universe_text = rest
            number = universe_number(rest)
            self.universe = number or None
            if not number:
                self.warnings.append(f"unknown universe {rest!r}; the route's TargetUniverse applies")
        elif word == "REQUIREMENTS":
            if not rest:
                raise self._error("REQUIREMENTS needs an expression", lineno)
            expr = parse_old_expr(rest)
            if expr is None:
                raise self._error(f"invalid REQUIREMENTS : {rest}", lineno)
            self.requirements = rest
            self.requirements_expr = expr
            self.requirements_origin = self.where(lineno)
        elif word == "TRANSFORM":
            args = rest.strip()
            if args and args not in ("1", "0"):
                self.warnings.append("TRANSFORM arguments (iteration) are ignored by the job router")

    # ---- evaluation ---------------------------------------------------------------------

    def requirements_match(self, ad: classad2.ClassAd) -> bool:
        """Pre/post-route rule (§4.1): no REQUIREMENTS → True; error → True; non-bool → False."""
        if self.requirements_expr is None:
            return True
        value = evaluate_in(ad, self.requirements_expr)
        if is_error_value(value):
            return True
        result = _boolean_equiv(value)
        return bool(result)

    def assignments(self) -> dict[str, str]:
        """Every macro assignment in the body, last one wins (the router's load-time view)."""
        found: dict[str, str] = {}
        for line in self.lines:
            if line.kind == "assign":
                found[line.name.lower()] = line.value
        return found

    def apply(self, ad: classad2.ClassAd, macros: MacroSet) -> list[str]:
        """Run the statements against ``ad`` (mutated in place); return the logged errors.

        Bad expressions are logged and skipped, as the router does; a structural error found
        only at run time (an ``if`` condition that is not a simple boolean) raises.
        """
        errors: list[str] = []
        self._run(self._program, ad, macros, errors)
        return errors

    def _run(self, program: list[_Line | _Block], ad: classad2.ClassAd, macros: MacroSet,
             errors: list[str]) -> None:
        for item in program:
            if isinstance(item, _Block):
                for head, body in item.branches:
                    if head is None or head.kind == "else" or self._condition(head, ad, macros):
                        self._run(body, ad, macros, errors)
                        break
            elif item.kind == "assign":
                self._assign(item, ad, macros, errors)
            else:
                self._statement(item, ad, macros, errors)

    def _note(self, errors: list[str], line: _Line, message: str) -> None:
        where = self.where(line.lineno)
        prefix = f"{where.file}:{where.line}: " if where is not None else ""
        text = f"{prefix}{self.name}: {message}"
        errors.append(text)
        log.info("transform %s", text)

    def _assign(self, line: _Line, ad: classad2.ClassAd, macros: MacroSet, errors: list[str]) -> None:
        value = line.value
        # A self reference (X = $(X) more) is expanded now, as insert_macro does.
        if re.search(r"\$\(\s*" + re.escape(line.name) + r"\s*[:)]", value, re.IGNORECASE):
            try:
                value = expand_macros(value, macros, ad)
            except MacroError as exc:
                self._note(errors, line, str(exc))
                return
        macros.set(line.name, value)

    def _condition(self, head: _Line, ad: classad2.ClassAd, macros: MacroSet) -> bool:
        cond = head.value.strip()
        negate = False
        if cond.startswith("!"):
            negate = True
            cond = cond[1:].strip()
        words = cond.split(None, 1)
        if words and words[0].lower() == "defined":
            if len(words) < 2:
                raise self._error("'defined' needs a name", head.lineno)
            result = self._is_defined(words[1].strip(), ad, macros)
        else:
            try:
                expanded = expand_macros(cond, macros, ad).strip()
            except MacroError as exc:
                raise self._error(f"cannot expand condition {cond!r}: {exc}", head.lineno) from exc
            result = self._simple_boolean(expanded, head, macros)
        return result != negate

    @staticmethod
    def _is_defined(name: str, ad: classad2.ClassAd, macros: MacroSet) -> bool:
        if name[:3].upper() == "MY.":
            return name[3:] in ad
        value = macros.lookup(name)
        return value is not None and value.strip() != ""

    def _simple_boolean(self, text: str, head: _Line, macros: MacroSet) -> bool:
        negate = False
        while text.startswith("!"):
            negate = not negate
            text = text[1:].strip()
        low = text.lower()
        if low.startswith("version"):
            return self._version(text[len("version") :].strip(), head, macros) != negate
        if low in ("", "false", "no", "0", "f", "n"):
            return negate
        if low in ("true", "yes", "1", "t", "y"):
            return not negate
        expr = parse_old_expr(text)
        value = evaluate_in(classad2.ClassAd(), expr) if expr is not None else None
        result = _boolean_equiv(value)
        if result is None:
            raise self._error(f"'{head.kind} {head.value}' is not a simple boolean ({text!r})", head.lineno)
        return result != negate

    def _version(self, text: str, head: _Line, macros: MacroSet) -> bool:
        m = re.match(r"^(==|>=|<=|>|<|!=)?\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?$", text)
        if m is None:
            raise self._error(f"bad version condition {text!r}", head.lineno)
        op = m.group(1) or "=="
        wanted = [int(g) for g in m.groups()[1:] if g is not None]
        have = [int(x) for x in re.findall(r"\d+", macros.version)[: len(wanted)]]
        have += [0] * (len(wanted) - len(have))
        return {
            "==": have == wanted,
            "!=": have != wanted,
            ">=": have >= wanted,
            "<=": have <= wanted,
            ">": have > wanted,
            "<": have < wanted,
        }[op]

    def _statement(self, line: _Line, ad: classad2.ClassAd, macros: MacroSet, errors: list[str]) -> None:
        word = line.keyword
        rest = line.value
        if word in _REGEX_KEYWORDS:
            regex = _regex_token(rest)
            if regex is not None:
                pattern, _flags, remainder = regex
                self._regex_op(word, pattern, remainder, line, ad, macros, errors)
                return
        toks = _tokens(rest)
        attr = toks[0][1]
        if attr.endswith((",", "=")):
            attr = attr[:-1]
        rhs_text = ""
        if _KEYWORDS[word] == 2:
            remaining = toks[1:]
            if remaining and remaining[0][1] in ("=", ","):
                remaining = remaining[1:]
            rhs_text = rest[remaining[0][0] :] if remaining else ""
        try:
            rhs = expand_macros(rhs_text, macros, ad) if rhs_text else ""
        except MacroError as exc:
            self._note(errors, line, f"{word} {attr}: {exc}")
            return
        if word in ("SET", "DEFAULT"):
            if word == "DEFAULT" and attr in ad:
                return
            self._set(attr, rhs, line, ad, errors, word)
        elif word == "EVALSET":
            self._evalset(attr, rhs, line, ad, errors)
        elif word == "EVALMACRO":
            expr = parse_old_expr(rhs)
            if expr is None:
                self._note(errors, line, f"EVALMACRO {attr} could not evaluate : {rhs}")
                return
            macros.set(attr, value_to_macro_text(evaluate_in(ad, expr)))
        elif word == "DELETE":
            if attr in ad:
                del ad[attr]
        elif word in ("COPY", "RENAME"):
            self._copy(word, attr, rhs.strip(), line, ad, errors)

    def _set(self, attr: str, rhs: str, line: _Line, ad: classad2.ClassAd, errors: list[str], word: str) -> None:
        if not _ATTR_NAME.match(attr):
            self._note(errors, line, f"could not set {attr} to {rhs} (invalid attribute name)")
            return
        expr = parse_old_expr(rhs)
        if expr is None:
            self._note(errors, line, f"{word} {attr} invalid expression : {rhs}")
            return
        ad[attr] = expr

    def _evalset(self, attr: str, rhs: str, line: _Line, ad: classad2.ClassAd, errors: list[str]) -> None:
        if not _ATTR_NAME.match(attr):
            self._note(errors, line, f"could not set {attr} (invalid attribute name)")
            return
        expr = parse_old_expr(rhs)
        if expr is None:
            self._note(errors, line, f"EVALSET {attr} could not evaluate : {rhs}")
            return
        value = evaluate_in(ad, expr)
        try:
            ad[attr] = value
        except (ValueError, TypeError, classad2.ClassAdException):
            literal = parse_old_expr(unparse_old(value))
            if literal is None:
                self._note(errors, line, f"could not set {attr} to the value of {rhs}")
                return
            ad[attr] = literal

    def _copy(self, word: str, attr: str, new: str, line: _Line, ad: classad2.ClassAd, errors: list[str]) -> None:
        if not _ATTR_NAME.match(new):
            self._note(errors, line, f"{word} {attr} new name {new!r} is not valid")
            return
        if attr not in ad:
            return
        expr = ad.lookup(attr)
        if word == "RENAME":
            del ad[attr]
        ad[new] = expr

    def _regex_op(self, word: str, pattern: str, replacement_raw: str, line: _Line, ad: classad2.ClassAd,
                  macros: MacroSet, errors: list[str]) -> None:
        try:
            regex = re.compile(pattern, re.IGNORECASE)
        except re.error as exc:
            self._note(errors, line, f"Error compiling regex '{pattern}'. {exc}. this entry will be ignored.")
            return
        try:
            replacement = expand_macros(replacement_raw, macros, ad).strip() if replacement_raw else ""
        except MacroError as exc:
            self._note(errors, line, f"{word}: {exc}")
            return
        matched: dict[str, str] = {}
        for name in list(ad.keys()):
            m = regex.search(name)
            if m is None:
                continue
            matched[name] = "" if word == "DELETE" else _substitute_groups(replacement, m)
        for name in sorted(matched):
            if word == "DELETE":
                if name in ad:
                    del ad[name]
            else:
                self._copy(word, name, matched[name], line, ad, errors)


def statement_lines(transform: Transform) -> list[tuple[str, str, Origin | None]]:
    """(keyword or 'assign', text, origin) of each statement, for ``routes check``."""
    return [(line.keyword or line.kind, line.text, transform.where(line.lineno)) for line in transform.lines]
