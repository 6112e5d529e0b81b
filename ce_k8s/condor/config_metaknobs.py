"""Metaknobs: the items of a ``use CATEGORY : NAME(args), ...`` line and the arguments in their text.

config.cpp ``MetaKnobAndArgs`` (:func:`_metaknob_items`), ``expand_meta_args``
(:func:`_expand_meta_args`) and ``if defined use`` (:func:`defined_use`). The metaknob texts
come from HTCondor's own table (``htconfig.metaknob_text``); the reader (``config_reader.py``)
reads a text in place of its ``use`` line.
"""

from __future__ import annotations

import re

from ce_k8s.condor.config_types import _WS

_META_ARG = re.compile(r"\$\((\d+)([?#+]?)(?::([^)]*))?\)")


def _metaknob_items(rhs: str) -> list[tuple[str, str | None]]:
    """The ``NAME`` or ``NAME(args)`` items of a ``use`` line (config.cpp ``MetaKnobAndArgs``):
    separated by commas or spaces; arguments run to the matching ``)``, nesting ``()`` and ``[]``."""
    items: list[tuple[str, str | None]] = []
    i, n = 0, len(rhs)
    while i < n:
        while i < n and (rhs[i] in _WS or rhs[i] == ","):
            i += 1
        start = i
        while i < n and rhs[i] not in _WS and rhs[i] not in ",(":
            i += 1
        if i == start:
            break
        name = rhs[start:i]
        while i < n and rhs[i] in _WS:
            i += 1
        args: str | None = None
        if i < n and rhs[i] == "(":
            depth, j = 0, i
            while j < n:
                if rhs[j] in "([":
                    depth += 1
                elif rhs[j] in ")]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            if j < n and rhs[j] == ")":
                args = rhs[i + 1 : j]
                i = j
            i += 1
            while i < n and rhs[i] in _WS:
                i += 1
        items.append((name, args))
    return items


def _expand_meta_args(text: str, argstr: str) -> str:
    """``$(0)`` all arguments, ``$(N)`` the Nth, ``$(N+)`` the Nth and later, ``$(0#)`` how many,
    ``$(N?)`` 1 or 0 for whether the Nth is non-empty, ``:default`` after any (config.cpp ``expand_meta_args``)."""
    args = [a.strip(_WS) for a in argstr.split(",")] if argstr.strip(_WS) else []

    def one(m: re.Match[str]) -> str:
        index, suffix, default = int(m.group(1)), m.group(2), m.group(3)
        if index <= 0:
            value = str(len(args)) if suffix in ("#", "+") else argstr
        elif suffix in ("#", "+"):
            value = ", ".join(args[index - 1 :]) if len(args) >= index else ""
            if not value and default is not None:
                value = default
        elif len(args) >= index:
            value = args[index - 1]
        else:
            value = default or ""
        value = value.strip(_WS)
        if suffix == "?":
            return "1" if value else "0"
        return value

    return _META_ARG.sub(one, text)


def defined_use(ref: str) -> bool:
    """``if defined use CATEGORY[:NAME]`` (config.cpp ``Test_config_if_expression``)."""
    from ce_k8s.condor import htconfig

    if any(c in ref for c in " \t\r"):
        raise ValueError("defined use meta argument with internal spaces will never match")
    category, _colon, name = ref.partition(":")
    try:
        if not htconfig.metaknob_category_exists(category):
            return False
        return not name or htconfig.metaknob_text(category, name) is not None
    except htconfig.MetaknobsUnavailable:
        return False
