"""``if``/``elif``/``else``/``endif`` in transform bodies, as HTCondor's config parser runs them.

Transforms are read by the same ``Parse_macros`` loop as configuration files (config.cpp), so
their conditionals follow the configuration rules, with one addition for transforms: a condition
that is not a simple one is evaluated as a ClassAd expression against the job, when there is a job.
What matters (config.cpp, ``Test_config_if_expression`` / ``Evaluate_config_if`` /
``ConfigIfStack``; see docs/routes.md, "What ce-k8s models of the transform language"):

* ``$(...)`` in the condition is expanded first; a condition that expands to nothing is false.
* Numbers, ``true``/``false``, ``yes``/``no``/``t``/``f``, ``defined <name>`` and
  ``version <op> <x.y.z>`` are evaluated without an ad.
* Anything else is "complex". With a job ad (``TransformClassAd``) it is parsed as a *new*
  ClassAd expression and evaluated against the job: true is true; false, UNDEFINED, ERROR or a
  non-boolean make the line an invalid ``if`` — the parse stops and the transform FAILS (the
  code returns the boolean as its validity flag). Without an ad (``ValidateXForm`` when the
  router loads a route) a complex condition is always invalid, so the route is not loaded.
* Only conditions on enabled lines are evaluated; broken nesting is an error when it is reached.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import classad2

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


class ConditionError(ValueError):
    """The condition is not a valid ``if`` condition (Parse_macros stops with this message)."""


def characterize(expr: str, keyword_check: bool) -> str:
    """Characterize_config_if_expression: the shape of a condition, by the characters it uses.

    Returns one of ``empty``, ``number``, ``bool``, ``identifier``, ``version``, ``ifdef``,
    ``macro`` or ``complex``.
    """
    begin = expr
    text = expr.strip()
    digit, flt, ident, alpha, space, cmp_, logic, group, colon, other, money, macro, sum_ = (
        1 << i for i in range(13))
    found = 0
    scanned = text[1:] if text.startswith("-") else text  # a leading minus is not a sum
    n = len(scanned)
    for i, ch in enumerate(scanned):
        nxt = scanned[i + 1] if i + 1 < n else ""
        if ch.isdigit():
            found |= digit
        elif ch == ".":
            found |= flt if (found == digit or not nxt or nxt.isdigit()) else ident
        elif ch in "eE":
            found |= flt if (found & ~flt) == digit else alpha
        elif ch in "-+":
            if found != (digit | flt):
                found |= sum_
        elif ch.isalpha() and ch.isascii():
            found |= alpha
        elif ch in "_/":
            found |= ident
        elif ch in "<=>":
            found |= cmp_
        elif ch == "!" and nxt == "=":
            found |= cmp_
        elif ch == "$":
            found |= money | (macro if nxt == "(" else 0)
        elif ch.isspace():
            if nxt and not nxt.isspace():
                found |= space
        elif ch in "&|":
            found |= logic
        elif ch in "{|}()[]":
            found |= group
        elif ch == ":":
            found |= colon
        else:
            found |= other
    low = text.lower()
    word = begin.strip().lower()
    if found == 0:
        return "empty"
    if found in (digit, digit | flt):
        return "number"
    if found == alpha:
        if low in ("true", "false"):
            return "bool"
        if keyword_check and word == "version":
            return "version"
        if keyword_check and word == "defined":
            return "ifdef"
    if found in (alpha, alpha | digit, alpha | digit | flt, alpha | ident, alpha | ident | digit,
                 alpha | ident | digit | flt):
        return "identifier"
    if found in (alpha | space | cmp_ | digit, alpha | space | cmp_ | digit | flt):
        return "version" if keyword_check and word.startswith("version") else "complex"
    if found in (alpha | space, alpha | space | colon, alpha | space | ident, alpha | space | ident | colon,
                 alpha | space | digit, alpha | space | digit | ident, alpha | space | digit | flt,
                 alpha | space | digit | ident | flt):
        return "ifdef" if keyword_check and word.startswith("defined") else "complex"
    if found & macro and not found & ~(money | ident | alpha | digit | macro | colon):
        return "macro"
    return "complex"


@dataclass
class ConditionContext:
    """What a condition can see: macro lookup, ``defined MY.x``, the job ad and the version."""

    lookup: Callable[[str], str | None]
    has_attr: Callable[[str], bool]
    evaluate: Callable[[str], object] | None  # new-syntax evaluation against the job; None without ad
    version: str


def _version_compare(have: str, text: str) -> int | None:
    """-1/0/1 for ``have`` vs the version literal ``text``; None when the literal is invalid."""
    m = _VERSION.match(text.lstrip("vV"))
    if m is None or int(m.group(1)) < 6:
        return None
    hv = [int(x) for x in re.findall(r"\d+", have)[:3]] + [0, 0, 0]
    want = [int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) is not None else hv[2]]
    return (hv[:3] > want) - (hv[:3] < want)


def _crufty(word: str) -> bool | None:
    low = word.lower()
    if low in ("yes", "t"):
        return True
    if low in ("no", "f"):
        return False
    return None


def _evaluate(expr: str, ctx: ConditionContext) -> bool:
    """Evaluate_config_if for an expanded, trimmed, non-negated condition; raise when invalid."""
    kind = characterize(expr, True)
    if kind == "number":
        return float(expr) != 0
    if kind == "bool":
        return expr.strip().lower() == "true"
    if kind == "identifier" and _crufty(expr.strip()) is not None:
        return bool(_crufty(expr.strip()))
    if kind == "version":
        rest = expr.strip()[7:].lstrip()
        negated = rest.startswith("!")
        rest = rest[1:] if negated else rest
        op = 0
        if rest[:1] in ("<", "=", ">"):
            op = "<=>".index(rest[0]) - 1
            rest = rest[1:]
        or_equal = rest.startswith("=")
        rest = rest[1:] if or_equal else rest
        diff = _version_compare(ctx.version, rest.strip())
        if diff is None:
            raise ConditionError("the version literal is invalid")
        result = diff == op or (or_equal and diff == 0)
        return not result if negated else result
    if kind == "ifdef":
        name = expr.strip()[7:].strip()
        if not name:
            return False
        inner = characterize(name, False)
        if inner == "identifier":
            if name[:3].upper() == "MY.":
                return ctx.has_attr(name[3:])
            value = ctx.lookup(name)
            if value is None and _crufty(name) is not None:
                value = "true"
            return bool(value)
        if inner in ("number", "bool"):
            return True
        raise ConditionError("defined argument must be param name, boolean, or number")
    if kind == "complex" and ctx.evaluate is not None:
        value = ctx.evaluate(expr)
        if isinstance(value, bool):
            truth: bool | None = value
        elif isinstance(value, int | float) and not isinstance(value, classad2.Value):
            truth = value != 0
        else:
            truth = None
        if truth is True:
            return True
        if truth is False:
            raise ConditionError("")  # HTCondor returns the value as the validity flag: false is invalid
    if kind == "complex":
        raise ConditionError("complex conditionals are not supported")
    raise ConditionError("expression is not a conditional")


def test_condition(expr: str, expand: Callable[[str], str], ctx: ConditionContext) -> bool:
    """Test_config_if_expression: expand, strip one ``!``, evaluate; raise ConditionError if invalid."""
    expanded = False
    if "$" in expr:
        expr = expand(expr).rstrip()
        expanded = True
    expr = expr.lstrip()
    inverted = expr.startswith("!")
    if inverted:
        expr = expr[1:].lstrip()
    if expanded and not expr:
        value = False
    else:
        value = _evaluate(expr, ctx)
    return not value if inverted else value


class IfStack:
    """ConfigIfStack: the yes/no state of each nesting level, as bit masks like HTCondor keeps it."""

    def __init__(self) -> None:
        self.state = 1
        self.estate = 0
        self.istate = 0
        self.top = 1

    def enabled(self) -> bool:
        mask = self.top | (self.top - 1)
        return (self.state & mask) == mask

    def inside_if(self) -> bool:
        return self.top > 1

    def inside_else(self) -> bool:
        return self.top > 1 and not (self.istate & self.top)

    def begin_if(self, value: bool) -> bool:
        self.top <<= 1
        self.istate |= self.top
        if value:
            self.state |= self.top
            self.estate |= self.top
        else:
            self.state &= ~self.top
            self.estate &= ~self.top
        return self.top < (1 << 63)

    def begin_else(self) -> bool:
        if not self.istate & self.top:
            return False
        self.istate &= ~self.top
        if (self.estate | self.state) & self.top:
            self.state &= ~self.top
        else:
            self.state |= self.top
        return self.top > 1

    def elif_wanted(self) -> bool:
        """An elif is evaluated only when no earlier branch was taken and every outer level is on."""
        return not (self.estate & self.top) and (self.state & (self.top - 1)) == (self.top - 1)

    def begin_elif(self, value: bool) -> bool:
        if not self.istate & self.top:
            return False
        if self.estate & self.top:
            self.state &= ~self.top
        elif value:
            self.estate |= self.top
            self.state |= self.top
        else:
            self.state &= ~self.top
        return self.top > 1

    def end_if(self) -> bool:
        self.istate &= ~self.top
        self.top >>= 1
        if not self.top:
            self.top = self.state = 1
            self.istate = self.estate = 0
            return False
        return True
