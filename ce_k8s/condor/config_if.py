"""``if``/``elif``/``else``/``endif`` in HTCondor configuration (config.cpp ``Test_config_if_expression``).

The conditions HTCondor accepts: numbers, booleans, ``version [op] X.Y[.Z]`` (against the modelled
version, remembering a test the installed wheel would decide differently), ``defined NAME`` and
``defined use CATEGORY[:NAME]``; anything else is an error naming file and line. A
:class:`Conditionals` is the part of a reader (``config_reader.py``) that keeps the if stack.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ce_k8s.condor.config_metaknobs import defined_use
from ce_k8s.condor.config_types import _NAME_RE, _WS, ConfigError, Origin, Version, installed_version

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config_reader import ConfigReader

_MAX_IF_DEPTH = 63
_NUMBER_RE = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_IF_RE = re.compile(r"(if|elif|else|endif)(?:[ \t\n\v\f\r]+|$)", re.IGNORECASE)


class _IfFrame:
    __slots__ = ("else_seen", "line", "state", "taken")

    def __init__(self, state: bool, line: int) -> None:
        self.line = line
        self.state = state
        self.taken = state
        self.else_seen = False


class Conditionals:
    """The if statements of one reader; ``statement`` updates the stack of open ifs."""

    def __init__(self, reader: ConfigReader) -> None:
        self.reader = reader
        self._where: Origin | None = None  # the if/elif line being tested

    def statement(self, ifs: list[_IfFrame], kw: str, expr: str, src: str, lineno: int) -> None:
        outer = all(f.state for f in ifs)
        if kw == "if":
            if len(ifs) >= _MAX_IF_DEPTH:
                raise ConfigError(src, lineno, "if nesting too deep")
            ifs.append(_IfFrame(self._test(expr, src, lineno, "if") if outer else False, lineno))
            return
        if kw == "endif":
            if not ifs:
                raise ConfigError(src, lineno, "endif without matching if")
            ifs.pop()
            return
        if not ifs or ifs[-1].else_seen:
            what = "elif" if kw == "elif" else "else"
            raise ConfigError(
                src, lineno, f"{what} is not allowed after else" if ifs else f"{what} without matching if"
            )
        frame = ifs[-1]
        outer = all(f.state for f in ifs[:-1])
        if kw == "else":
            frame.state = not frame.taken
            frame.else_seen = True
            return
        ok = (not frame.taken) and outer and self._test(expr, src, lineno, "elif")
        frame.state = ok
        frame.taken = frame.taken or ok

    def _test(self, expr: str, src: str, lineno: int, kw: str) -> bool:
        self._where = self.reader.pin or Origin(src, lineno)
        expanded = False
        if "$" in expr:
            expr = self.reader.cfg.expand(expr, Origin(src, lineno)).rstrip(_WS)
            expanded = True
        e = expr.strip(_WS)
        inverted = e.startswith("!")
        if inverted:
            e = e[1:].lstrip(_WS)
        if expanded and not e:
            return inverted  # an empty expansion is false
        try:
            value = self._eval(e)
        except ValueError as exc:
            raise ConfigError(src, lineno, f"{e} is not a valid {kw} condition because {exc}") from None
        return value != inverted

    def _eval(self, e: str) -> bool:
        low = e.lower()
        if _NUMBER_RE.fullmatch(e):
            return float(e) != 0
        if low in ("true", "yes", "t"):
            return True
        if low in ("false", "no", "f"):
            return False
        if low.startswith("version") and (len(e) == 7 or not (e[7].isalnum() or e[7] == "_")):
            return self._eval_version(e[7:].strip(_WS), self._where)
        if low.startswith("defined") and (len(e) == 7 or e[7] in _WS):
            arg = e[7:].strip(_WS)
            if not arg:
                return False
            if _NAME_RE.fullmatch(arg) and not _NUMBER_RE.fullmatch(arg):
                if arg.lower() in ("true", "false"):
                    return True
                value = self.reader.cfg._expander.previous(arg)  # lookup_macro: param-table defaults count
                if value is None and arg.lower() in ("yes", "no", "t", "f"):
                    return True
                return bool(value)
            if _NUMBER_RE.fullmatch(arg):
                return True
            if arg.lower().startswith("use "):
                return defined_use(arg[4:].lstrip(_WS))
            raise ValueError("defined argument must be param name, boolean, or number")
        if _NAME_RE.fullmatch(e):
            raise ValueError("expression is not a conditional")
        raise ValueError("complex conditionals are not supported")

    def _eval_version(self, rest: str, where: Origin | None = None) -> bool:
        """``if version [op] X.Y[.Z]`` (config.cpp ``Evaluate_config_if_version``) against the modelled
        version; remembers a test the installed wheel would decide differently (HTCondor's reader
        then cannot speak for the modelled version)."""
        negated = rest.startswith("!")
        if negated:
            rest = rest[1:]
        op = 0
        or_equal = False
        if rest[:1] in ("<", "=", ">"):
            op = {"<": -1, "=": 0, ">": 1}[rest[0]]
            rest = rest[1:]
        if rest[:1] == "=":
            or_equal = True
            rest = rest[1:]
        rest = rest.strip(_WS)
        if rest[:1] in ("v", "V"):
            rest = rest[1:]
        m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", rest)
        if not m or int(m.group(1)) < 6:
            raise ValueError("the version literal is invalid")

        def decide(ours: Version) -> bool:
            theirs = (int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else ours[2])
            diff = (ours > theirs) - (ours < theirs)
            result = diff == op or (or_equal and diff == 0)
            return not result if negated else result

        modelled = decide(self.reader.cfg.version)
        if where is not None and self.reader.cfg._version_sensitive is None and decide(installed_version()) != modelled:
            self.reader.cfg._version_sensitive = where
        return modelled
