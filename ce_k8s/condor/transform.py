"""The HTCondor transform language, as condor_job_router runs it (xform_utils.cpp, config.cpp).

Routes (``JOB_ROUTER_ROUTE_<name>``) and pre/post-route transforms (``JOB_ROUTER_TRANSFORM_<name>``)
are programs in this language. The router reads their text *unexpanded* and runs it line by
line against the job ad being built, with one macro set shared by every transform applied to one
job. The wheel exports no transform API we can call safely in-process, so this re-implements it;
what a site's routes do to a pilot must be answerable without a CE, and the pod is built from the
result. docs/routes.md, "What ce-k8s models of the transform language", lists the rules and what
is not modelled. Macros and ``$(...)`` are in xform_macros.py, expressions in xform_expr.py,
``if`` conditions in xform_cond.py. The rules that are easy to get wrong:

* Loading (``MacroStreamXFormSource::open``) strips NAME/UNIVERSE/REQUIREMENTS/TRANSFORM lines
  and stops at a TRANSFORM line; it fails only on an unparsable REQUIREMENTS.
* The body runs through ``Parse_macros``: ``name = value`` assigns a macro, anything else goes
  to the statement handler (``ParseRulesCallback``). An unknown keyword, a missing argument,
  broken ``if`` nesting or an invalid ``if`` condition stop the parse: the transform FAILS.
  A bad expression in SET/EVALSET/EVALMACRO, a failing ``$FUNC()`` or an invalid new attribute
  name is logged as an ERROR and the transform carries on (a WARNING diagnostic here).
* ``SET``/``DEFAULT`` parse old ClassAd syntax; ``EVALSET``/``EVALMACRO`` and complex ``if``
  conditions parse NEW syntax (``ClassAd::EvaluateExpr(string)``).
* ``$(...)`` is expanded per line at the moment the line runs; ``$(MY.x)`` is the *unparsed*
  attribute value; lookups fall through to config macros; ``$$(...)`` is kept for matchmaking.
* ``DEFAULT`` tests presence (``Lookup``), so a literal ``undefined`` is not replaced.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import classad2

from ce_k8s.condor.config import PLUS_EQUALS_SINCE, parse_version
from ce_k8s.condor.diagnostics import Diagnostic, Severity
from ce_k8s.condor.wire import unparse_old
from ce_k8s.condor.xform_cond import ConditionContext, ConditionError, IfStack, test_condition
from ce_k8s.condor.xform_expr import (
    _boolean_equiv,
    evaluate_in,
    is_error_value,
    is_number,
    is_undefined_value,
    parse_new_expr,
    parse_old_expr,
    value_to_macro_text,
)
from ce_k8s.condor.xform_macros import MacroError, MacroSet, expand_macros, expand_self

# Re-exported: routing, check, the CLIs and the tests import these from here.
__all__ = [
    "MacroError", "MacroSet", "Transform", "TransformError", "_boolean_equiv", "evaluate_in", "expand_macros",
    "is_error_value", "is_number", "is_undefined_value", "parse_new_expr", "parse_old_expr", "universe_number",
    "value_to_macro_text",
]

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import Origin

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
# is_valid_param_name (config.cpp): what a macro name may hold once its $(...) are expanded
_MACRO_NAME = re.compile(r"[A-Za-z0-9_./]+")
# HTCONDOR-3831 ("Do not EXCEPT invalid $ functions in transforms and submit files", config.cpp,
# xform_utils.cpp, JobRouter.cpp): first released in 25.13.2; the 25.0 LTS series and everything
# older EXCEPT instead.
MACRO_ERRORS_LOGGED_SINCE = (25, 13, 2)


def _macro_errors_except(version: str) -> bool:
    """Whether the modelled HTCondor dies (EXCEPT) on a failing ``$FUNCTION()`` in a transform."""
    try:
        return parse_version(version) < MACRO_ERRORS_LOGGED_SINCE
    except ValueError:
        return False


def _before_plus_equals(version: str) -> bool:
    """Whether the modelled HTCondor predates `X += v` (config.py PLUS_EQUALS_SINCE)."""
    try:
        return parse_version(version) < PLUS_EQUALS_SINCE
    except ValueError:
        return False


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


# --------------------------------------------------------------------------------------------
# Parsed statements


@dataclass
class _Line:
    """One logical line of a transform body with the physical line it started on."""

    kind: str  # "assign", "stmt", "bad" (unknown keyword), "if", "elif", "else", "endif"
    text: str
    lineno: int  # 0-based offset in the body
    keyword: str = ""
    name: str = ""  # macro name for "assign"
    value: str = ""  # raw value for "assign", condition for if/elif, the rest of a statement
    plus: str | None = None  # "+=" assignments: the separator ("" for a space)
    message: str = ""  # for "bad" lines that are not an unknown keyword


# MacroStreamXFormSource::open strips these statements from the body before it is run.
_STRIPPED = ("name", "universe", "requirements", "transform")
_PLUS_SEPARATORS = ",;|&"  # CONFIG_PLUS_SEP_CHARSET


def _xform_statement(line: str) -> tuple[str, str] | None:
    """is_xform_statement for the four metadata keywords: (KEYWORD, arguments) or None.

    The keyword must be followed by white space on the same line, and the arguments must not
    start with ``=`` or ``:`` (``NAME = x`` assigns the macro NAME). A bare ``TRANSFORM`` with
    nothing after it is therefore *not* stripped here (it is a no-op statement later).
    """
    body = line.lstrip(" \t")
    low = body.lower()
    for word in _STRIPPED:
        if low.startswith(word) and len(body) > len(word) and body[len(word)].isspace():
            args = body[len(word) :].lstrip()
            if args[:1] in ("=", ":"):
                return None
            return word.upper(), args
    return None


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join ``\\`` continuations (a comment line inside one is dropped) and trim each line."""
    out: list[tuple[int, str]] = []
    pending: str | None = None
    start = 0
    for no, physical in lines:
        line = physical.rstrip("\r")
        if pending is not None:
            if line.strip().startswith("#"):
                continue
            line = pending + line.strip()
        else:
            start = no
            if line.strip().startswith("#"):
                continue  # a comment never continues (CONFIG_GETLINE_OPT_COMMENT_DOESNT_CONTINUE)
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1]
            continue
        pending = None
        out.append((start, line.strip()))
    if pending is not None:
        out.append((start, pending.strip()))
    return out


def _split_line(line: str) -> tuple[str, str, str, str | None]:
    """Parse_macros' split of a line: ("assign", name, rhs, plus-separator) or ("stmt", "", "", None).

    A word, then ``=`` (or ``+=``) with nothing else before it, is a macro assignment; any
    other shape (a second word before the operator, ``:``, no operator) goes to the transform's
    statement handler.
    """
    n = len(line)
    i = 0
    while i < n and not line[i].isspace() and line[i] not in "=:":
        i += 1
    name = line[:i]
    if i < n and line[i] == "=":
        return "assign", name, line[i + 1 :].strip(), None
    if i >= n or line[i] == ":":
        return "stmt", "", "", None
    j = i
    while j < n and line[j].isspace():
        j += 1
    if j < n and line[j] not in "=:@+":
        return "stmt", "", "", None  # a word before the operator: a statement
    if j < n and line[j] == "=":
        return "assign", name, line[j + 1 :].strip(), None
    if line[j : j + 2] == "@=":
        return "heredoc", name, line[j + 2 :].strip(), None
    if j < n and line[j] == "+":
        k = j + 1
        sep = ""
        if k < n and line[k] in _PLUS_SEPARATORS:
            sep = line[k]
            k += 1
            if k < n and line[k] == sep:
                sep += sep
                k += 1
        if k < n and line[k] == "=":
            return "assign", name, line[k + 1 :].strip(), sep
    return "stmt", "", "", None


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
    """One transform: metadata stripped at load, the body run line by line like Parse_macros.

    Loading (``MacroStreamXFormSource::open``) only strips NAME/UNIVERSE/REQUIREMENTS/TRANSFORM
    lines and fails only on an unparsable REQUIREMENTS. Everything else — unknown keywords,
    missing arguments, broken ``if`` nesting, invalid ``if`` conditions — is found when the body
    is run: by ``validate`` (ValidateXForm, which the router runs on routes only) or by ``run``
    (TransformClassAd, for every job), and then only on lines that are reached.
    """

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
        self.body: list[_Line] = []  # every logical line in order, conditionals included
        self.lines: list[_Line] = []  # every assignment and statement (kinds assign/stmt/bad)
        self.ignored_after: int | None = None  # body line of a TRANSFORM statement that ended the body
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

    def diagnostic(self, severity: Severity, message: str, lineno: int | None = None) -> Diagnostic:
        where = self.where(lineno) if lineno is not None else self.origin
        if where is None:
            return Diagnostic("<config>", 0, severity, message)
        return Diagnostic(where.file, where.line, severity, message)

    @classmethod
    def parse(cls, name: str, text: str, origin: Origin | None = None,
              line_numbers: list[int] | None = None) -> Transform:
        """Load a transform body; raise TransformError (with file:line) only for a bad REQUIREMENTS.

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
        kept: list[tuple[int, str]] = []
        for no, physical in enumerate(text.split("\n")):
            meta = _xform_statement(physical.rstrip("\r"))
            if meta is None:
                kept.append((no, physical))
                continue
            word, args = meta
            self._metadata(word, args, no)
            if word == "TRANSFORM":
                after = [line.strip() for line in text.split("\n")[no + 1 :]]
                if any(line and not line.startswith("#") for line in after):
                    self.ignored_after = no
                break  # MacroStreamXFormSource::open stops reading at a TRANSFORM statement
        here: _Line | None = None  # an open `NAME @=TAG` block and the lines gathered so far
        depth = 0  # if/endif nesting, for the leading ':' rule
        gathered: list[str] = []
        for lineno, line in _logical_lines(kept):
            if not line:
                continue
            if here is not None:
                if line == "@" + here.value:
                    self._add(_Line("assign", here.text, here.lineno, name=here.name, value="\n".join(gathered)))
                    here, gathered = None, []
                else:
                    gathered.append(line)
                continue
            if line.startswith(":") and (depth > 0 or re.match(r"^:if(\s|$)", line)):
                line = line[1:]  # Parse_macros ignores a leading ':' inside an if body, or before an if
            low = line.lower()
            if re.match(r"^if(\s|$)", low):
                depth += 1
            elif re.match(r"^endif(\s|$)", low):
                depth = max(0, depth - 1)
            if _split_line(line)[0] == "heredoc":
                _, name, tag, _ = _split_line(line)
                here = _Line("heredoc", line, lineno, name=name, value=tag)
                continue
            self._add(self._classify(line, lineno))
        if here is not None:
            # Parse_macros: "Found end-of-file while scanning for '@TAG'" fails the parse.
            self._add(_Line("bad", here.text, here.lineno, keyword="@=" + here.value,
                            message=f"Found end-of-file while scanning for '@{here.value}'"))

    def _add(self, item: _Line) -> None:
        self.body.append(item)
        if item.kind in ("assign", "stmt", "bad"):
            self.lines.append(item)

    def _classify(self, line: str, lineno: int) -> _Line:
        lower = line.lower()
        for word in ("if", "elif", "else", "endif"):
            if lower.startswith(word) and (len(line) == len(word) or line[len(word)].isspace()):
                return _Line(word, line, lineno, value=line[len(word) :].strip())
        kind, name, rhs, plus = _split_line(line)
        if kind == "assign":
            return _Line("assign", line, lineno, name=name, value=rhs, plus=plus)
        first = line.split(None, 1)[0]
        rest = line[len(first) :].strip()
        word = first.upper()
        if word not in _KEYWORDS:
            return _Line("bad", line, lineno, keyword=first, value=rest)
        return _Line("stmt", line, lineno, keyword=word, value=rest)

    def _metadata(self, word: str, rest: str, lineno: int) -> None:
        if word == "NAME":
            if rest.strip():
                self.statement_name = rest.strip()
        elif word == "UNIVERSE":
            self.universe_text = rest.strip()
            number = universe_number(rest)
            self.universe = number or None
            if not number:
                self.warnings.append(f"unknown universe {rest.strip()!r}; the route's TargetUniverse applies")
        elif word == "REQUIREMENTS":
            if not rest.strip():
                return
            expr = parse_old_expr(rest)
            if expr is None:
                raise self._error(f"invalid REQUIREMENTS : {rest.strip()}", lineno)
            self.requirements = rest.strip()
            self.requirements_expr = expr
            self.requirements_origin = self.where(lineno)
        elif word == "TRANSFORM":
            args = rest.strip()
            if args and args not in ("1", "0"):
                self.warnings.append("TRANSFORM arguments (iteration) are ignored by the job router")

    # ---- evaluation ---------------------------------------------------------------------

    def requirements_match(self, ad: classad2.ClassAd) -> bool:
        """MacroStreamXFormSource::matches: no REQUIREMENTS → True; else only a boolean-equivalent true.

        The evaluation itself succeeds even when the value is ERROR or UNDEFINED, so those (and
        strings) are "does not match"; the transform is skipped for the job.
        """
        if self.requirements_expr is None:
            return True
        return _boolean_equiv(evaluate_in(ad, self.requirements_expr)) is True

    def assignments(self) -> dict[str, str]:
        """Every macro assignment in the body, last one wins (ignores ``if``; see ``validate``)."""
        found: dict[str, str] = {}
        for line in self.lines:
            if line.kind == "assign":
                found[line.name.lower()] = line.value
        return found

    def apply(self, ad: classad2.ClassAd, macros: MacroSet) -> list[str]:
        """Run against ``ad`` (mutated in place); the logged errors as ``file:line: message`` text.

        Raises TransformError where the router fails the transform (and so the job).
        """
        return [f"{d.file}:{d.line}: {d.message}" if d.line else d.message for d in self.run(ad, macros)]

    def run(self, ad: classad2.ClassAd, macros: MacroSet) -> list[Diagnostic]:
        """TransformClassAd: run the body against the job; WARNING diagnostics for what is logged.

        Raises TransformError for what makes TransformClassAd return < 0 (the router then
        removes the routed job: JobRouter::FinishSubmitJob → GracefullyRemoveJob).
        """
        found: list[Diagnostic] = []
        self._execute(ad, macros, found)
        return found

    def validate(self, macros: MacroSet) -> list[Diagnostic]:
        """ValidateXForm: run with no job, checking keywords and conditions, filling ``macros``.

        Raises TransformError when the router would reject the route at load.
        """
        found: list[Diagnostic] = []
        self._execute(None, macros, found)
        return found

    def _execute(self, ad: classad2.ClassAd | None, macros: MacroSet, found: list[Diagnostic]) -> None:
        stack = IfStack()
        for line in self.body:
            if line.kind in ("if", "elif", "else", "endif"):
                self._conditional(stack, line, ad, macros, found)
                continue
            if not stack.enabled():
                continue
            if line.kind == "assign":
                self._assign(line, ad, macros, found)
            elif ad is None:
                self._check_statement(line)
            else:
                self._statement(line, ad, macros, found)
        if stack.inside_if():
            raise self._error("endif(s) not found before end-of-file", self.body[-1].lineno if self.body else 0)

    def _conditional(self, stack: IfStack, line: _Line, ad: classad2.ClassAd | None, macros: MacroSet,
                     found: list[Diagnostic]) -> None:
        if line.kind == "if":
            value = stack.enabled()
            if value:
                value = self._test(line, ad, macros, found)
            stack.begin_if(value)
        elif line.kind == "elif":
            value = stack.elif_wanted()
            if value:
                value = self._test(line, ad, macros, found)
            if not stack.begin_elif(value):
                raise self._error("elif is not allowed after else" if stack.inside_else()
                                  else "elif without matching if", line.lineno)
        elif line.kind == "else":
            if not stack.begin_else():
                raise self._error("else is not allowed after else" if stack.inside_else()
                                  else "else without matching if", line.lineno)
        elif not stack.end_if():
            raise self._error("endif without matching if", line.lineno)

    def _test(self, line: _Line, ad: classad2.ClassAd | None, macros: MacroSet, found: list[Diagnostic]) -> bool:
        errors: list[str] = []

        def evaluate(text: str) -> object:
            expr = parse_new_expr(text)
            return evaluate_in(ad, expr) if expr is not None and ad is not None else classad2.Value.Error

        ctx = ConditionContext(
            lookup=macros.lookup,
            has_attr=(lambda attr: bool(macros.local_or_default("MY." + attr)) or (ad is not None and attr in ad)),
            evaluate=evaluate if ad is not None else None,
            version=macros.version,
        )
        try:
            value = test_condition(line.value, lambda text: expand_macros(text, macros, ad, errors), ctx)
        except ConditionError as exc:
            self._macro_errors(found, line, errors, macros)
            reason = f" because {exc}" if str(exc) else ""
            raise self._error(f"{line.value} is not a valid {line.kind} condition{reason}", line.lineno) from None
        self._macro_errors(found, line, errors, macros)
        return value

    def _macro_errors(self, found: list[Diagnostic], line: _Line, errors: list[str], macros: MacroSet,
                      prefix: str = "") -> None:
        """Failing ``$FUNCTION()`` calls on this line: logged and carried on from since HTCondor 25.13.2
        (a WARNING), but before that config.cpp EXCEPTs on them and the job router dies
        (HTCONDOR-3831; seen on the real 23.9.6: ``ERROR "$INT() macro: ..." at line N in file
        config.cpp``). Modelling an older HTCondor, the first one fails the transform, with why."""
        if errors and _macro_errors_except(macros.version):
            raise self._error(f"{errors[0]}: HTCondor {macros.version} EXCEPTs on a failing $FUNCTION() in a "
                              f"transform (before {'.'.join(map(str, MACRO_ERRORS_LOGGED_SINCE))}): "
                              "condor_job_router dies, condor_master restarts it, and it dies again each time "
                              "it routes this job", line.lineno)
        for message in errors:
            self._note(found, line, prefix + message)

    def _note(self, found: list[Diagnostic], line: _Line, message: str) -> None:
        """Something the router logs as an ERROR and carries on from: a WARNING for the admin."""
        diag = self.diagnostic(Severity.WARNING, f"{self.name}: {message}", line.lineno)
        found.append(diag)
        log.info("transform %s", diag)

    def _assign(self, line: _Line, ad: classad2.ClassAd | None, macros: MacroSet, found: list[Diagnostic]) -> None:
        """Parse_macros on a ``name = value`` line: when it runs, only the *name* is expanded in full
        and the *value* only where it refers to itself (``expand_self_macro``); the rest of the
        value is stored as written and expanded by the statement that uses it (docs/routes.md, "What
        ce-k8s models of the transform language"; findings F3 to F7 in docs/real-condor.md)."""
        if not line.name:
            # Parse_macros refuses a line with nothing before its '=': the body is invalid, so a route
            # with it is never loaded; a lone submit '+' or '-' is accepted (both checked with
            # HTCondor's code through tests/condor/xform_oracle.py)
            raise self._error("a macro assignment has no name before its '='", line.lineno)
        if line.plus is not None and _before_plus_equals(macros.version):
            # before 25.11 Parse_macros knows no `+=`: the line is a statement whose keyword is the
            # name, so the transform fails (a route with it is not loaded), seen on the real 23.9.6
            raise self._error(f"{line.name} is not a valid transform keyword ('+=' came in HTCondor "
                              f"{'.'.join(map(str, PLUS_EQUALS_SINCE))}; the modelled {macros.version} "
                              "reads it as a statement)", line.lineno)
        errors: list[str] = []
        name = line.name
        if "$" in name:
            # `$(A)_X = 5` defines the macro that $(A) names *now* (Parse_macros: expand_macro(name))
            name = expand_macros(name, macros, ad, errors)
        if not name or (name[0] not in "+-" and not _MACRO_NAME.fullmatch(name)):
            # is_valid_param_name fails: Parse_macros stops, so the transform fails (`A-B = 1` too)
            self._macro_errors(found, line, errors, macros)
            raise self._error(f"Illegal Identifier: <{name}>", line.lineno)
        value = line.value
        if name[0] in "+-":
            # Submit syntax: `+Attr = x` / `-Attr =` set the macro MY.Attr (Parse_macros), raw, not the ad.
            macros.set("MY." + name[1:], value if name[0] == "+" else "")
            return
        if line.plus is not None:
            current = macros.lookup(name)
            if current:
                sep = " " if not line.plus else (f" {line.plus} " if len(line.plus) == 2 else line.plus)
                value = current + sep + value
        value = expand_self(value, name, macros, ad, errors)
        self._macro_errors(found, line, errors, macros)
        macros.set(name, value)

    def _check_statement(self, line: _Line) -> None:
        """ValidateRulesCallback: a known keyword, something after it (bar TRANSFORM), a closed regex."""
        if line.kind == "bad":
            raise self._error(line.message or f"{line.keyword} is not a valid transform keyword", line.lineno)
        if not line.value:
            if line.keyword == "TRANSFORM":
                return
            raise self._error(f"{line.keyword} needs an argument", line.lineno)
        if line.keyword in _REGEX_KEYWORDS and line.value.startswith("/") and _regex_token(line.value) is None:
            raise self._error("invalid regex", line.lineno)

    def _statement(self, line: _Line, ad: classad2.ClassAd, macros: MacroSet, found: list[Diagnostic]) -> None:
        self._check_statement(line)
        word = line.keyword
        rest = line.value
        if not rest:
            return  # TRANSFORM with no arguments
        regex = _regex_token(rest) if word in _REGEX_KEYWORDS else None
        if regex is not None:
            pattern, _flags, remainder = regex
            if _KEYWORDS[word] == 2 and not remainder:
                raise self._error(f"{word} needs 2 arguments", line.lineno)
            self._regex_op(word, pattern, remainder, line, ad, macros, found)
            return
        toks = _tokens(rest)
        attr = toks[0][1]
        if attr.endswith((",", "=")):
            attr = attr[:-1]
        rhs_text = rest[toks[0][0] :]
        if _KEYWORDS[word] == 2:
            remaining = toks[1:]
            if remaining and remaining[0][1] in ("=", ","):
                remaining = remaining[1:]
            if not remaining:
                raise self._error(f"{word} needs 2 arguments", line.lineno)
            rhs_text = rest[remaining[0][0] :]
        errors: list[str] = []
        rhs = expand_macros(rhs_text, macros, ad, errors)
        self._macro_errors(found, line, errors, macros, f"ERROR in transform {self.name} : ")
        if word in ("SET", "DEFAULT"):
            if word == "DEFAULT" and attr in ad:
                return
            self._set(attr, rhs, line, ad, found, word)
        elif word == "EVALSET":
            self._evalset(attr, rhs, line, ad, found)
        elif word == "EVALMACRO":
            expr = parse_new_expr(rhs)
            if expr is None:
                self._note(found, line, f"ERROR: EVALMACRO {attr} could not evaluate : {rhs.strip()}")
                return
            macros.set(attr, value_to_macro_text(evaluate_in(ad, expr)))
        elif word == "DELETE":
            if attr in ad:
                del ad[attr]
        elif word in ("COPY", "RENAME"):
            self._copy(word, attr, rhs.strip(), line, ad, found)
        # NAME / UNIVERSE / REQUIREMENTS / TRANSFORM left in the body (no white space after
        # the keyword at load) are envelope information: nothing to do here.

    def _set(self, attr: str, rhs: str, line: _Line, ad: classad2.ClassAd, found: list[Diagnostic],
             word: str) -> None:
        # ClassAd::Insert takes any non-empty name (`SET A.B 1` makes an attribute "A.B").
        if not attr or "\x00" in attr:
            self._note(found, line, f"ERROR: could not set {attr} to {rhs.strip()}")
            return
        expr = parse_old_expr(rhs)
        if expr is None:
            self._note(found, line, f"ERROR: {word} {attr} invalid expression : {rhs.strip()}")
            return
        ad[attr] = expr

    def _evalset(self, attr: str, rhs: str, line: _Line, ad: classad2.ClassAd, found: list[Diagnostic]) -> None:
        expr = parse_new_expr(rhs)
        if expr is None:
            self._note(found, line, f"ERROR: EVALSET {attr} could not evaluate : {rhs.strip()}")
            return
        value = evaluate_in(ad, expr)
        if not attr or "\x00" in attr:
            self._note(found, line, f"ERROR: could not set {attr} to {value_to_macro_text(value)}")
            return
        try:
            ad[attr] = value
        except (ValueError, TypeError, classad2.ClassAdException):
            literal = parse_old_expr(unparse_old(value))
            if literal is None:
                self._note(found, line, f"ERROR: could not set {attr} to {value_to_macro_text(value)}")
                return
            ad[attr] = literal

    def _copy(self, word: str, attr: str, new: str, line: _Line, ad: classad2.ClassAd,
              found: list[Diagnostic]) -> None:
        if not _ATTR_NAME.match(new):
            self._note(found, line, f"ERROR: {word} {attr} new name {new} is not valid")
            return
        if attr not in ad:
            return
        expr = ad.lookup(attr)
        if word == "RENAME":
            del ad[attr]
        ad[new] = expr

    def _regex_op(self, word: str, pattern: str, replacement_raw: str, line: _Line, ad: classad2.ClassAd,
                  macros: MacroSet, found: list[Diagnostic]) -> None:
        try:
            regex = re.compile(pattern, re.IGNORECASE)
        except re.error as exc:
            self._note(found, line, f"ERROR: Error compiling regex '{pattern}'. {exc}. this entry will be ignored.")
            return
        errors: list[str] = []
        replacement = expand_macros(replacement_raw, macros, ad, errors).strip() if replacement_raw else ""
        self._macro_errors(found, line, errors, macros, f"ERROR in transform {self.name} : ")
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
                self._copy(word, name, matched[name], line, ad, found)

    def static_problems(self) -> list[Diagnostic]:
        """Lines that fail the transform whenever they are reached (for pre/post-route transforms,
        which the router loads without validating): unknown keywords, missing arguments, and macro
        names that are invalid as written (a name with ``$(...)`` is only known when the line runs)."""
        found: list[Diagnostic] = []
        depth = 0
        for line in self.body:
            if line.kind == "if":
                depth += 1
            elif line.kind == "endif":
                depth = max(0, depth - 1)
            elif line.kind in ("stmt", "bad") or (line.kind == "assign" and line.name and "$" not in line.name
                                                   and line.name[0] not in "+-"
                                                   and not _MACRO_NAME.fullmatch(line.name)):
                try:
                    if line.kind == "assign":
                        raise self._error(f"Illegal Identifier: <{line.name}>", line.lineno)
                    self._check_statement(line)
                except TransformError as exc:
                    scope = "every job it is applied to" if depth == 0 else "every job that reaches this line"
                    found.append(self.diagnostic(Severity.ERROR, f"{self.name}: {exc.message}: the router "
                                                 f"loads the transform, then fails {scope} (the routed job "
                                                 "is removed)", line.lineno))
        return found


def statement_lines(transform: Transform) -> list[tuple[str, str, Origin | None]]:
    """(keyword or 'assign', text, origin) of each statement, for ``routes check``."""
    return [(line.keyword or line.kind, line.text, transform.where(line.lineno)) for line in transform.lines]
