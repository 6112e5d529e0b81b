"""Macro sets and ``$(...)`` expansion for transforms, as XFormHash and config.cpp do them.

One macro set per routed job, shared by the pre-route transforms, the route and the post-route
transforms; lookups fall through to the configuration (``also_in_config``) and to the few macros
the transform engine predefines. Expansion follows config.cpp's ``expand_macro`` (the ``char*``
one XFormHash uses) and ``evaluate_macro_func``: leftmost reference first, the raw value put in and
the line scanned again, ``$(DOLLAR)`` last; a failing ``$FUNC()`` is reported and expands to
nothing. docs/routes.md, "What ce-k8s models of the transform language", has the rules.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import classad2

from ce_k8s.condor.config import _is_dollar, _is_filename_func, _next_macro
from ce_k8s.condor.wire import unparse_old
from ce_k8s.condor.xform_expr import evaluate_in, is_number, parse_old_expr

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import CondorConfig

_MACRO_NAME = re.compile(r"^[A-Za-z0-9_.+]+$")
_MAX_EXPANSIONS = 2000

# The router's macro sets are XFormHash::Flavor::Basic (JobRouter.cpp), whose only predefined
# macros are these (xform_utils.cpp XFormBasicMacroDefaults; Row, Step, XFormId, ARCH... are not).
_PREDEFINED: dict[str, str] = {"IsClusterAd": "0", "IsLinux": "1", "IsWindows": "0", "Iterating": "0",
                               "LateMaterialization": "0"}


class MacroError(ValueError):
    """A ``$(...)`` reference that cannot be expanded (bad function call, index out of range).

    ``replacement`` is what HTCondor puts in its place when it carries on (usually nothing).
    """

    def __init__(self, message: str, replacement: str = "") -> None:
        super().__init__(message)
        self.replacement = replacement


# --------------------------------------------------------------------------------------------
# The macro set


class MacroSet:
    """Transform macros for one routed job, shared by pre-route, route and post-route transforms.

    Values are stored raw (submit syntax) and expanded when used, so ``$(var)`` sees the value
    the variable has when the using line runs. Lookups that miss fall through to config macros
    (``also_in_config``), then to the few macros the transform engine predefines.
    """

    def __init__(self, config: CondorConfig | None = None, version: str | None = None) -> None:
        self._config = config
        self._macros: dict[str, str] = {}
        # `if version ...` compares with the HTCondor being modelled (the configuration's), else ours.
        modelled = getattr(config, "version", None)
        if version is None and isinstance(modelled, tuple) and modelled:
            version = ".".join(str(part) for part in modelled)
        self.version = version or classad2.version()

    def set(self, name: str, raw_value: str) -> None:
        self._macros[name.lower()] = raw_value

    def local(self, name: str) -> str | None:
        return self._macros.get(name.lower())

    def names(self) -> list[str]:
        return sorted(self._macros)

    def lookup(self, name: str) -> str | None:
        """Raw value of a macro (config.cpp lookup_macro, for a name that is no job attribute)."""
        value = self.local_or_default(name)
        return value if value is not None else self.in_config(name)

    def local_or_default(self, name: str) -> str | None:
        """lookup_macro's first places: this macro set, then the predefined transform macros."""
        value = self._macros.get(name.lower())
        if value is not None:
            return value
        for key, predefined in _PREDEFINED.items():
            if key.lower() == name.lower():
                return predefined
        return None

    def in_config(self, name: str) -> str | None:
        """lookup_macro's last place (``also_in_config``): the configuration, unexpanded."""
        return self._config.lookup_macro(name) if self._config is not None else None

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


_DOLLAR_REF = re.compile(r"(?<!\$)\$\((?i:DOLLAR)\)")


def _next_reference(text: str) -> tuple[int, str, int, int] | None:
    """next_config_macro: the leftmost ``$name(...)`` reference as (start, name, body start, ``)``).

    The configuration reader scans the same way (config.cpp serves both), so its scanner is used:
    a function's body runs to the first ``)`` (``$INT($(x))`` has the body ``$(x``); a plain
    ``$(...)`` body must be a name (then ``:default``), otherwise the scan goes on inside it, which
    is how ``$($(a)_b)`` expands the inner reference first; ``$(DOLLAR)`` is skipped (replaced last).
    """
    found = _next_macro(text, 0, _is_dollar)
    if found is None:
        return None
    return found.start, found.func, found.end - 1 - len(found.body), found.end - 1


def _split_args(body: str) -> list[str]:
    return [part.strip() for part in body.split(",")]


class _Expander:
    """Expands ``$(...)`` references in one line against a macro set and the job ad."""

    def __init__(self, macros: MacroSet, ad: classad2.ClassAd | None, errors: list[str] | None = None) -> None:
        self.macros = macros
        self.ad = ad
        # With a sink, a failing $FUNC() is logged and expands to nothing, and the rest of the line
        # is still expanded (config.cpp, the char* expand_macro the transforms use: might_EXCEPT
        # records the message, evaluate_macro_func returns ""); without a sink it raises.
        self.errors = errors

    def report(self, message: str) -> None:
        """A problem HTCondor reports (might_EXCEPT) and carries on from with a substitute value."""
        if self.errors is None:
            raise MacroError(message)
        self.errors.append(message)

    def raw(self, name: str) -> str | None:
        """config.cpp lookup_macro: the macro set (``+Attr = x`` lines set ``MY.Attr`` there), the
        predefined macros, the job's attribute for ``MY.x``, then the configuration."""
        value = self.macros.local_or_default(name)
        if value is not None:
            return value
        if name[:3].upper() == "MY.":
            value = _my_attr_text(self.ad, name[3:])
            if value is not None:
                return value
        return self.macros.in_config(name)

    def value_of(self, name: str) -> str | None:
        raw = self.raw(name)
        return None if raw is None else self.expand(raw)

    def expand(self, text: str) -> str:
        """config.cpp ``expand_macro`` (the char* one XFormHash uses): replace the leftmost reference,
        rescan from the start, until none is left; then every ``$(DOLLAR)`` becomes ``$``."""
        for _ in range(_MAX_EXPANSIONS):
            found = _next_reference(text)
            if found is None:
                return _DOLLAR_REF.sub("$", text)
            start, func, body_start, end = found
            body = text[body_start:end]
            try:
                replacement = self._resolve(func, body)
            except MacroError as exc:
                if self.errors is None:
                    raise
                self.errors.append(str(exc))
                replacement = exc.replacement
            text = text[:start] + replacement + text[end + 1 :]
        raise MacroError("macro expansion does not terminate (a macro refers to itself?)")

    def _resolve(self, func: str, body: str) -> str:
        if func == "":
            # MACRO_ID_NORMAL: the raw value goes in (the rescan expands it); the default also
            # replaces a macro whose raw value is empty.
            name, sep, default = body.partition(":")
            value = self.raw(name)
            if sep and not value:
                return default
            return value or ""
        if func == "ENV":
            return _fn_env(self, body)
        if func.startswith("F") and func not in _FUNCTIONS:
            return _path_function(self, func[1:].lower(), body)
        return _FUNCTIONS[func](self, body)

    # helpers for the functions
    def text_or_literal(self, arg: str) -> str:
        """A function argument names a macro; when it does not, it is taken as literal text."""
        arg = arg.strip()
        if _MACRO_NAME.match(arg):
            value = self.value_of(arg)
            if value is not None:
                return value
        return self.expand(arg) if "$" in arg else arg



_PRINTF = re.compile(r"%[-+ #0]*\d*(?:\.\d*)?(?:hh|h|ll|l|L|q|j|z|t)?([diouxXeEfFgGaAcspn%])")
_PRINTF_TYPES = {"int": "diouxXc", "float": "eEfFgGaA", "string": "s"}


def _valid_format(fmt: str, kind: str) -> bool:
    """validatePrintfFormat (printf_format.cpp): exactly one conversion, of the value's type (%p is
    always accepted, %c for integers); a second conversion or %n makes the format unsafe."""
    conversions = [m.group(1) for m in _PRINTF.finditer(fmt) if m.group(1) != "%"]
    if len(conversions) != 1 or conversions[0] == "n":
        return False
    return conversions[0] == "p" or conversions[0] in _PRINTF_TYPES[kind]


def _format(fmt: str, value: object, kind: str, what: str) -> str:
    """An explicit format: HTCondor reports an invalid one and uses the format text itself."""
    if not _valid_format(fmt, kind):
        raise MacroError(f"{what} macro: '{fmt}' is not a valid format specifier!", replacement=fmt)
    try:
        return re.sub(r"%p", "%s", fmt) % (value,)
    except (TypeError, ValueError, OverflowError):
        raise MacroError(f"{what} macro: '{fmt}' is not a valid format specifier!", replacement=fmt) from None


def _evaluate_alone(text: str) -> object:
    """Old-syntax parse, evaluated in an empty ad (string_is_long_param / $STRING use no job)."""
    expr = parse_old_expr(text)
    return evaluate_in(classad2.ClassAd(), expr) if expr is not None else None


def _long_param(text: str) -> int | None:
    """string_is_long_param: an integer literal, else an expression whose value converts to one."""
    try:
        return int(text.strip())
    except ValueError:
        pass
    value = _evaluate_alone(text)
    if isinstance(value, bool):
        return int(value)
    if is_number(value):
        return int(value)  # EvalInteger truncates a real
    return None


def _fn_int(exp: _Expander, body: str) -> str:
    arg, _, fmt = body.partition(",")
    fmt = fmt.strip()
    if fmt and not _valid_format(fmt, "int"):
        raise MacroError(f"$INT() macro: '{fmt}' is not a valid format specifier!", replacement=fmt)
    text = exp.text_or_literal(arg)
    value = _long_param(text)
    if value is None:
        raise MacroError(f"$INT() macro: {text} does not evaluate to an integer!")
    return _format(fmt, value, "int", "$INT()") if fmt else str(value)


def _fn_real(exp: _Expander, body: str) -> str:
    arg, _, fmt = body.partition(",")
    fmt = fmt.strip()
    if fmt and not _valid_format(fmt, "float"):
        raise MacroError(f"$REAL() macro: '{fmt}' is not a valid format specifier!", replacement=fmt)
    text = exp.text_or_literal(arg)
    try:
        value: object = float(text.strip())
    except ValueError:
        value = _evaluate_alone(text)
        if isinstance(value, bool):
            value = float(value)
    if not is_number(value):
        raise MacroError(f"$REAL() macro: {text} does not evaluate to an real!")
    if not fmt:
        return f"{float(value):.16G}"
    out = _format(fmt, float(value), "float", "$REAL()")
    return out if "." in out else out + ".0"  # an explicit format still has to look like a real


def _fn_string(exp: _Expander, body: str) -> str:
    """$STRING: the value when it evaluates to a string, otherwise the text itself (not an error)."""
    arg, _, fmt = body.partition(",")
    fmt = fmt.strip()
    if fmt and not _valid_format(fmt, "string"):
        raise MacroError(f"$STRING macro: '{fmt}' is not a valid format specifier!", replacement=fmt)
    text = exp.text_or_literal(arg)
    value = _evaluate_alone(text)
    if isinstance(value, str):
        text = value
    return _format(fmt, text, "string", "$STRING()") if fmt else text


def _new_syntax_text(value: object) -> str:
    """ClassAdUnParser (new syntax) for a scalar value: reals as %.15E, as HTCondor prints them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return f'real("{"NaN" if value != value else ("INF" if value > 0 else "-INF")}")'
        return f"{value:.15E}"
    if isinstance(value, classad2.Value):
        return "undefined" if value == classad2.Value.Undefined else "error"
    if isinstance(value, int):
        return str(value)
    return unparse_old(value)


def _fn_eval(exp: _Expander, body: str) -> str:
    """$EVAL: evaluated against the job when there is one (config.cpp evaluate_macro_func).

    A string value goes in without quotes, anything else as the new-syntax unparser writes it.
    Text that does not parse becomes the macro-expanded text when it had ``$(...)`` in it, and
    nothing otherwise.
    """
    name = body.strip()
    raw = exp.raw(name) if _MACRO_NAME.match(name) else None
    source = raw if raw is not None else body
    text = exp.expand(source) if "$" in source else source
    expr = parse_old_expr(text)
    if expr is None:
        return text if "$" in source else ""
    value = evaluate_in(exp.ad if exp.ad is not None else classad2.ClassAd(), expr)
    return value if isinstance(value, str) else _new_syntax_text(value)


def _fn_env(exp: _Expander, body: str) -> str:
    """$ENV(NAME[:default]): the environment variable, else the default, else ``UNDEFINED``."""
    name, sep, default = body.partition(":")
    value = os.environ.get(name.strip())
    if value is None:
        return default if sep else "UNDEFINED"
    return value


def _string_to_long(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _fn_choice(exp: _Expander, body: str) -> str:
    """$CHOICE(index, list or a,b,c): a bad index is reported and taken as 0; items split on ','."""
    first, comma, rest = body.partition(",")
    index_text = exp.text_or_literal(first)
    index = _long_param(index_text)
    if index is None or index < 0:
        exp.report(f"$CHOICE() error: '{index_text}' is invalid index")
        index = 0
    if not comma:
        raise MacroError("$CHOICE() error: no list")
    if "," not in rest:
        listed = exp.raw(rest.strip())
        if listed is None:
            raise MacroError(f'$CHOICE() macro: no list named "{rest.strip()}"!')
        rest = exp.expand(listed)
    items = [item.strip() for item in rest.split(",")]
    if index >= len(items):
        raise MacroError(f"$CHOICE() config macro: index {index} is out of range!")
    return items[index]


def _fn_random_choice(exp: _Expander, body: str) -> str:
    items = [item.strip() for item in body.split(",") if item.strip()]
    if len(items) == 1:
        listed = exp.raw(items[0])
        if listed is not None:
            items = [item for item in re.split(r"[,\s]+", exp.expand(listed)) if item]
    if not items:
        raise MacroError("$RANDOM_CHOICE() macro is empty!")
    return random.choice(items)  # noqa: S311 - not security relevant, HTCondor semantics


def _fn_random_integer(exp: _Expander, body: str) -> str:
    """$RANDOM_INTEGER(min, max[, step]): bad values are reported and replaced, as HTCondor does."""
    args = [item.strip() for item in body.split(",")]
    low = _string_to_long(args[0]) if args and args[0] else None
    if low is None:
        exp.report("$RANDOM_INTEGER() config macro: invalid min!")
        low = 0
    high = _string_to_long(args[1]) if len(args) > 1 and args[1] else None
    if high is None:
        exp.report("$RANDOM_INTEGER() config macro: invalid max!")
        high = low
    step = 1
    if len(args) > 2 and args[2]:
        parsed = _string_to_long(args[2])
        step = parsed if parsed is not None else 1
    if step < 1:
        exp.report("$RANDOM_INTEGER() config macro: invalid step!")
        step = 1
    if low > high:
        exp.report("$RANDOM_INTEGER() config macro: min > max!")
        low = high
    count = (step + high - low) // step
    return str(low + random.randrange(count) * step)  # noqa: S311


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


def _int_arg(exp: _Expander, arg: str, what: str) -> int:
    text = exp.text_or_literal(arg)
    value = _long_param(text)
    if value is None:
        raise MacroError(f"{what}: {text!r} is not an integer")
    return value


def _basename_plus_dirs(path: str, num_dirs: int) -> int:
    """condor_basename_plus_dirs: where the last ``num_dirs`` directories and the file name start."""
    starts = [i + 1 for i, ch in enumerate(path) if ch in "/\\"]
    starts = starts[: max(0, len(starts) - num_dirs)]
    return starts[-1] if starts else 0


def _path_function(exp: _Expander, letters: str, body: str, which: str = "F") -> str:
    """``$F[xnpdabfwuq](name)``, ``$BASENAME(name[, suffix])``, ``$DIRNAME(name)``: pieces of a file
    name held by a macro (or written literally), as config.cpp evaluate_macro_func cuts them.

    On Linux only ``/`` separates directories (condor_basename); the extension is from the last
    ``.`` after the first character of the file name (condor_basename_extension_ptr).
    """
    kill_suffix = None
    if which == "BASENAME" and "," in body:
        body, _, kill_suffix = body.rpartition(",")
        kill_suffix = kill_suffix.lstrip()
    raw = exp.raw(body)
    value = body if raw is None else raw
    if "$" in value:
        value = exp.expand(value)
    parts = {"BASENAME": 3, "DIRNAME": 4}.get(which, 0)
    num_dirs = 0
    if which == "F":
        for ch in letters:
            parts |= {"x": 1, "n": 2, "p": 4, "d": 8}.get(ch, 0)
            num_dirs += ch == "d"
    quote = ("'" if "a" in letters else '"') if "q" in letters else ""
    bare = "b" in letters
    if len(value) > 1 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]  # strlen_unquote
    if "f" in letters and value and not os.path.isabs(value):
        value = os.path.join(os.getcwd(), value)
    if "w" in letters:
        value = value.replace("/", "\\")
    elif "u" in letters:
        value = value.replace("\\", "/")
    end = len(value)
    name_at = value.rfind("/") + 1
    dot = value.rfind(".", name_at + 1)
    ext_at = dot if dot > name_at else end
    cut = end - len(kill_suffix or "")
    if kill_suffix and cut >= name_at and value[cut:].lower() == kill_suffix.lower():
        ext_at = cut
        parts &= ~1
    if not name_at and parts & 3:
        parts &= ~(4 | 8)
    begin = 0
    kind = parts & 0xF
    if kind == 1:
        begin = ext_at + (1 if bare and ext_at < end else 0)
    elif kind == 3:
        begin = name_at
    elif kind == 2:
        begin, end = name_at, ext_at
    elif kind == 4:
        end = name_at - 1 if bare and name_at > 0 else name_at
    elif kind == 6:
        end = ext_at
    elif kind not in (0, 5, 7):
        if name_at > 0:
            begin = _basename_plus_dirs(value, num_dirs)
            if parts & 3 == 2:
                end = ext_at
            elif parts & 3 == 0:
                end = name_at - 1 if bare and name_at > 0 else name_at
        else:
            begin = end = 1
    result = value[begin:end] if begin <= end else ""
    return f"{quote}{result}{quote}" if quote else result


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
    "DIRNAME": lambda exp, body: _path_function(exp, "", body, "DIRNAME"),
    "BASENAME": lambda exp, body: _path_function(exp, "", body, "BASENAME"),
}


def expand_self(text: str, name: str, macros: MacroSet, ad: classad2.ClassAd | None = None,
                errors: list[str] | None = None) -> str:
    """config.cpp ``expand_self_macro``: what a ``name = value`` line in a transform expands at once.

    Only references to the macro being defined are replaced, by its value so far (``$(name)``,
    ``$(name:default)`` and the file-name functions ``$F...(name)``; SelfOnlyBody skips every other
    function). Every other ``$(...)`` stays in the stored value and is expanded when a statement
    that uses the macro runs, so it sees the values its macros have *then*
    (``A = 1``, ``B = $(B) $(A)``, ``A = 2``, ``SET X "$(B)"`` gives ``" 2"``). Expanding the
    whole value here was the bug this replaces (docs/routes.md, "What ce-k8s models of the transform
    language"; F3 to F7 in docs/real-condor.md).
    """
    self_name = name.lower()

    def other(m) -> bool:
        if m.func != "" and not _is_filename_func(m.func):
            return True
        return m.name.strip().lower() != self_name

    exp = _Expander(macros, ad, errors)
    for _ in range(_MAX_EXPANSIONS):
        found = _next_macro(text, 0, other)
        if found is None:
            return text
        body = found.body
        try:
            if found.func == "":
                value = exp.raw(found.name.strip())
                replacement = found.default if (found.colon is not None and not value) else (value or "")
            else:
                replacement = _path_function(exp, found.func[1:].lower(), body)
        except MacroError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            replacement = exc.replacement
        text = text[:found.start] + (replacement or "") + text[found.end:]
    raise MacroError(f"the self reference to {name} never ends")


def expand_macros(text: str, macros: MacroSet, ad: classad2.ClassAd | None = None,
                  errors: list[str] | None = None) -> str:
    """Expand every ``$(...)`` reference in one line.

    A bad ``$FUNC()`` call raises MacroError, unless ``errors`` is given: then it is recorded
    there and the call expands to nothing, as the router does. A macro that reaches itself through
    a function (`N = $INT(N) x`: SelfOnlyBody leaves `$INT(N)` for later) never ends; HTCondor
    recurses until it crashes, we raise MacroError instead.
    """
    try:
        return _Expander(macros, ad, errors).expand(text)
    except RecursionError:
        raise MacroError("macro expansion does not terminate (a macro refers to itself through a "
                         "$FUNCTION(); HTCondor crashes on it)") from None
