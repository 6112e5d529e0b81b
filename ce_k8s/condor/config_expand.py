"""Macro expansion in HTCondor configuration: ``$(X)``, ``$(X:default)``, ``$ENV()``, ``$INT()`` ...

The scanner of config.cpp ``next_config_macro`` (``_next_macro``, which the transform language
reuses: ``xform_macros.py``), use-time expansion (``expand_macro``, :meth:`Expander.expand`),
definition-time self references (``expand_self_macro``, :meth:`Expander.expand_self`) and the
typed functions ``$INT``/``$REAL``/``$STRING`` (``evaluate_macro_func``). The rules are listed in
``config.py``'s module docstring; an :class:`Expander` is the part of a
:class:`~ce_k8s.condor.config.CondorConfig` that expands against its knobs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import classad2

from ce_k8s.condor.config_types import _WS, ConfigError, Origin

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import CondorConfig

log = logging.getLogger("ce_k8s.condor.config")

_IDCHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./")
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_DEFAULT_EXTRA = frozenset("$ ,\\:")  # characters allowed after the ':' of $(X:default) (config.cpp)
_SPECIAL_FUNCS = frozenset(
    {"ENV", "RANDOM_CHOICE", "RANDOM_INTEGER", "CHOICE", "SUBSTR", "INT", "REAL", "STRING", "EVAL",
     "BASENAME", "DIRNAME"}
)
_MAX_SUBSTITUTIONS = 10000


@dataclass
class _Macro:
    """One ``$(...)``/``$FUNC(...)`` reference found in a string (config.cpp next_config_macro)."""

    start: int
    end: int  # index just after ')'
    func: str  # "" for $(...), else the function name
    body: str
    colon: int | None  # offset in body just after the first ':' (IDCHAR_COLON bodies only)

    @property
    def name(self) -> str:
        return self.body if self.colon is None else self.body[: self.colon - 1]

    @property
    def default(self) -> str | None:
        return None if self.colon is None else self.body[self.colon :]


def _is_filename_func(func: str) -> bool:
    return func.startswith("F") and all(c.lower() in "pnxdqabfwu" for c in func[1:])


def _next_macro(s: str, pos: int, skip: Callable[[_Macro], bool]) -> _Macro | None:
    """Find the next config macro at or after ``pos``, the way HTCondor's scanner does."""
    t = pos
    n = len(s)
    while True:
        d = s.find("$", t)
        if d < 0:
            return None
        p = d + 1
        double = p < n and s[p] == "$"
        if double:
            p += 1
        q = p
        while q < n and s[q] in _ALNUM:
            q += 1
        if q >= n or s[q] != "(" or double:
            t = max(q, d + 1)
            continue
        func = s[d + 1 : q]
        if func and func not in _SPECIAL_FUNCS and not _is_filename_func(func):
            t = q
            continue
        body_start = q + 1
        colon: int | None = None
        if func in ("", "ENV"):
            i = body_start
            ok = True
            while i < n and s[i] != ")":
                c = s[i]
                i += 1
                if c == ":" and colon is None:
                    colon = i - body_start
                    continue
                if colon is not None:
                    if c == "(":
                        close = s.find(")", i)
                        if close >= 0:
                            i = close + 1
                            continue
                    elif c in _DEFAULT_EXTRA:
                        continue
                if c not in _IDCHARS:
                    ok = False
                    break
            if not ok or i >= n:
                t = body_start
                continue
            end = i
        else:
            end = s.find(")", body_start)
            if end < 0:
                t = body_start
                continue
        macro = _Macro(d, end + 1, func, s[body_start:end], colon)
        if skip(macro):
            t = end
            continue
        return macro


def _is_dollar(m: _Macro) -> bool:
    return m.func == "" and m.body.lower() == "dollar"



_PRINTF = re.compile(r"^([^%]*)%([-+ #0]*\d*(?:\.\d*)?)(?:l{0,2}|h{0,2}|[jzt]?)([a-zA-Z])(.*)$", re.DOTALL)
_PRINTF_KINDS = {"d": "di", "f": "eEfFgG", "s": "s"}


def _c_format(fmt: str, value: object, kind: str, where: Origin) -> str:
    """printf ``fmt`` with one conversion of ``kind`` (validatePrintfFormat); a bad format yields itself."""
    m = _PRINTF.match(fmt)
    if m is None or "%" in m.group(4).replace("%%", "") or m.group(3) not in _PRINTF_KINDS[kind]:
        log.info("%s: %r is not a valid format specifier; HTCondor uses the format text itself", where, fmt)
        return fmt
    conversion = m.group(3).replace("i", "d")
    return m.group(1) + ("%" + m.group(2) + conversion) % value + m.group(4).replace("%%", "%")


def _format_g16(value: float) -> str:
    """C's ``%.16G``."""
    return f"{value:.16G}"


def _classad_number(text: str, integer: bool) -> float | int | None:
    """string_is_long_param / string_is_double_param (condor_config.cpp): a literal, else a ClassAd
    expression evaluating to a number (booleans count; an integer truncates a real)."""
    stripped = text.strip(_WS)
    try:
        return int(stripped) if integer else float(stripped)
    except ValueError:
        pass
    try:
        value = classad2.ExprTree(text).eval()
    except Exception:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float) and not isinstance(value, classad2.Value):
        return int(value) if integer else float(value)
    return None


def eval_literal(text: str) -> object:
    """``text`` as a ClassAd expression's value, None when it does not evaluate to a plain value."""
    try:
        value = classad2.ExprTree(text).eval()
    except Exception:
        return None
    return None if isinstance(value, classad2.Value) else value  # UNDEFINED/ERROR are IntEnums


def finish(text: str) -> str:
    """The last step of expand_macro: every $(DOLLAR) becomes '$'."""
    s = text
    pos = 0
    while True:
        m = _next_macro(s, pos, lambda mm: not _is_dollar(mm))
        if m is None:
            return s
        s = s[: m.start] + "$" + s[m.end :]
        pos = m.start + 1


class Expander:
    """The macro expansion of one configuration ``cfg``: its knobs, subsystem and environment."""

    def __init__(self, cfg: CondorConfig) -> None:
        self.cfg = cfg

    def expand(self, text: str, stack: tuple[str, ...], where: Origin) -> str:
        """Expand macros (all but $(DOLLAR)); ``stack`` holds the knobs being expanded (loops)."""
        s = text
        pos = 0
        count = 0
        while True:
            m = _next_macro(s, pos, _is_dollar)
            if m is None:
                return s
            count += 1
            if count > _MAX_SUBSTITUTIONS:
                raise ConfigError(
                    where.file, where.line, f"macro expansion did not finish after {_MAX_SUBSTITUTIONS} steps"
                )
            if m.func == "":
                name = m.name
                raw = self.cfg.raw(name)
                if raw:
                    key = name.lower()
                    if key in stack:
                        chain = [*stack[stack.index(key) :], key]
                        names = " -> ".join(self._spelling(k) for k in chain)
                        raise ConfigError(where.file, where.line, f"macro expansion loop: {names}")
                    rep = self.expand(raw, (*stack, key), where)
                else:
                    rep = m.default or ""
            elif m.func == "ENV":
                env_value = self.cfg._environ.get(m.name)
                if env_value is None and m.default is None:
                    env_value = "UNDEFINED"
                rep = env_value if env_value else (m.default or "")
            elif m.func in ("INT", "REAL", "STRING"):
                rep = self._typed_macro(m.func, m.body, stack, where)
            else:
                raise ConfigError(
                    where.file,
                    where.line,
                    f"${m.func}(...) is not supported by ce-k8s (it expands $(X), $(X:default), $ENV(X), "
                    "$INT(), $REAL(), $STRING() and $(DOLLAR))",
                )
            s = s[: m.start] + rep + s[m.end :]
            pos = m.start  # HTCondor rescans from the substitution point

    def _typed_macro(self, func: str, body: str, stack: tuple[str, ...], where: Origin) -> str:
        """``$INT(X[,fmt])``, ``$REAL(X[,fmt])``, ``$STRING(X[,fmt])`` (config.cpp ``evaluate_macro_func``).

        X names a knob (else it is the text itself), which is expanded and evaluated as a ClassAd
        expression. HTCondor's failures are not fatal: a value that is not a number expands to
        nothing, a bad format to the format's own text (``might_EXCEPT`` logs and carries on).
        """
        name, comma, fmt = body.partition(",")
        value = self.cfg.raw(name)
        if value is None:
            value = name
        if "$" in value:
            value = self.expand(value, stack, where)
        if func == "STRING":
            try:
                result = classad2.ExprTree(value).eval()
            except Exception:
                result = None
            if isinstance(result, str):
                value = result
            return _c_format(fmt, value, "s", where) if comma else value
        number = _classad_number(value, func == "INT")
        if number is None:
            log.info("%s: $%s(%s): %s does not evaluate to %s; HTCondor expands it to nothing", where, func, body,
                     value, "an integer" if func == "INT" else "a real")
            return ""
        if func == "INT":
            return _c_format(fmt, int(number), "d", where) if comma else str(int(number))
        if not comma:
            return _format_g16(float(number))
        text = _c_format(fmt, float(number), "f", where)
        return text if "." in text or text == fmt else text + ".0"

    def _spelling(self, key: str) -> str:
        entry = self.cfg._table.get(key)
        return entry.name if entry is not None else key.upper()


    def expand_self(self, text: str, name: str, where: Origin) -> str:
        """Definition-time expansion of ``$(NAME)``/``$(NAME:default)`` to the previous value."""
        selves = {name.lower()}
        if self.cfg.subsystem and name.lower().startswith(self.cfg.subsystem.lower() + ".") and len(name) > len(
                self.cfg.subsystem) + 1:
            selves.add(name[len(self.cfg.subsystem) + 1 :].lower())  # SUBSYS.X = $(X): $(X) is a self reference too
        s = text
        pos = 0
        count = 0
        while True:
            m = _next_macro(s, pos, lambda mm: not (mm.func == "" and mm.name.lower() in selves))
            if m is None:
                return s
            count += 1
            if count > _MAX_SUBSTITUTIONS:
                raise ConfigError(where.file, where.line, f"self reference to {name} never ends")
            previous = self.previous(m.name)
            rep = previous if previous else (m.default or "")
            s = s[: m.start] + rep + s[m.end :]
            pos = m.start

    def previous(self, name: str) -> str | None:
        """config.cpp ``lookup_macro`` at definition time (self references, ``+=``): the knob as the
        modelled daemon sees it, else HTCondor's param-table default (from the installed wheel)."""
        value = self.cfg.raw(name)
        if value is not None:
            return value
        from ce_k8s.condor import htconfig

        try:
            return htconfig.param_default(name, self.cfg.subsystem)
        except htconfig.MetaknobsUnavailable:
            return None
