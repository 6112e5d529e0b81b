"""ClassAd expressions in transforms: old syntax for SET/DEFAULT/REQUIREMENTS, new for EVALSET.

HTCondor parses a transform's ``SET``/``DEFAULT`` values and ``REQUIREMENTS`` with the old-syntax
parser (``ParseClassAdRvalExpr``, the whole text must be one expression) and ``EVALSET``,
``EVALMACRO`` and complex ``if`` conditions with ``ClassAd::EvaluateExpr(string)``, the new-syntax
parser with ``full=false`` (xform_utils.cpp, classad.cpp). The two read string escapes
differently, so each statement must use its own.
"""

from __future__ import annotations

import re

import classad2

from ce_k8s.condor.wire import unparse_old

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
    if not body:
        return None
    if "\n" in body or "\r" in body:
        return _parse_old_multiline(body)
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


def _parse_old_multiline(body: str) -> classad2.ExprTree | None:
    """An old-syntax expression with line breaks inside string literals (a heredoc macro, or an
    EVALMACRO of a ClassAd, expanded into a SET): HTCondor's parser takes the break as part of the
    string. classad2's old-syntax reader is line based, so the string literals are rewritten in
    new-syntax form (backslashes doubled, the break as ``\\n``) and the new-syntax parser reads it;
    a break outside a string literal is a parse error."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch in "\r\n":
            return None
        if ch != '"':
            out.append(ch)
            i += 1
            continue
        out.append('"')
        i += 1
        while i < n and body[i] != '"':
            if body[i] == "\\" and i + 1 < n and body[i + 1] == '"':
                out.append('\\"')
                i += 2
                continue
            out.append({"\\": "\\\\", "\n": "\\n", "\r": "\\r"}.get(body[i], body[i]))
            i += 1
        if i >= n:
            return None
        out.append('"')
        i += 1
    try:
        return classad2.ExprTree("".join(out))
    except (ValueError, classad2.ClassAdException):
        return None


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
    """Evaluate with the ad as MY and no TARGET (docs/hook-protocol.md §4.4: ``TARGET.x`` is undefined)."""
    try:
        return expr.eval(ad)
    except (ValueError, TypeError, classad2.ClassAdException):
        return classad2.Value.Error


def value_to_macro_text(value: object) -> str:
    """XFormValueToString (EVALMACRO): strings without quotes, anything else as the old-syntax
    unparser writes it; a ClassAd value in old syntax is one ``name = value`` line per attribute."""
    if isinstance(value, str):
        return value
    if isinstance(value, classad2.ClassAd):
        return "".join(f"{name} = {unparse_old(value.lookup(name))}\n" for name in value.keys())
    return unparse_old(value)



_CONTINUES_EXPRESSION = re.compile(r"^(?:[-+*/%&|^<>=!?:.\[(]|is\b|isnt\b)", re.IGNORECASE)


def parse_new_expr(text: str) -> classad2.ExprTree | None:
    """Parse as ClassAd::EvaluateExpr(string) does: NEW syntax, one expression, rest ignored.

    EVALSET, EVALMACRO and complex ``if`` conditions go through ``ClassAdParser::ParseExpression``
    with ``full=false`` (classad.cpp), so string escapes are new-syntax (``"\\\\1"`` is ``\\1``)
    and text after a complete expression is dropped, while an expression that breaks off in the
    middle (``False && ==5``) does not parse.
    """
    body = text.strip()
    if not body:
        return None
    try:
        return classad2.ExprTree(body)
    except (ValueError, classad2.ClassAdException):
        pass
    for gap in reversed(list(re.finditer(r"\s+", body))):
        tail = body[gap.end() :]
        if _CONTINUES_EXPRESSION.match(tail):
            continue
        try:
            return classad2.ExprTree(body[: gap.start()])
        except (ValueError, classad2.ClassAdException):
            continue
    return None
