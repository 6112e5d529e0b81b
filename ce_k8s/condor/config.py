"""A faithful reader of HTCondor configuration, as condor's param system reads it.

Why our own reader: the router reads route and transform bodies with ``param_unexpanded`` and the
transform engine needs the file line of every line of them, which no HTCondor API returns
(docs/internals.md, "ce_k8s.condor.config"). So ce-k8s parses the CE's configuration itself, following
``src/condor_utils/config.cpp`` (``Parse_macros``, ``getline_implementation``, ``expand_macro``,
``expand_self_macro``) and ``condor_config.cpp`` (``LOCAL_CONFIG_DIR`` / ``LOCAL_CONFIG_FILE``).
Behaviour that was checked against ``htcondor2.param`` 25.14.1 on this machine:

* a logical line is trimmed on both sides; a trailing ``\\`` joins the next physical line (the
  space before the ``\\`` is kept); a ``#`` line inside a continuation contributes only its last
  character, so it must itself end in ``\\`` to keep the continuation going;
* ``#`` starts a comment only at the start of a (trimmed) line: ``X = a # b`` has the value ``a # b``;
* ``NAME = value``; ``NAME : value`` is the obsolete form (accepted, with HTCondor's warning);
* ``NAME @=tag`` ... ``@tag``: the lines in between go through the same line reader, so comment
  lines and blank lines are dropped, indentation is removed and ``\\`` continuations are joined;
* ``$(NAME)`` in a value refers to the knob's *previous* value at definition time (self reference,
  falling back to the built-in default), every other ``$(...)`` is expanded when the value is used;
* ``$(X:default)``, ``$ENV(X)`` (``UNDEFINED`` when unset), ``$(DOLLAR)`` (expanded last),
  ``$$(X)`` left alone, ``$(has space)`` or ``$(X:a=b)`` are not macros and stay as written;
* ``LOCAL_CONFIG_DIR`` files are read in name order, except those matching
  ``LOCAL_CONFIG_DIR_EXCLUDE_REGEXP`` (dot files, ``~`` backups, ``.rpmsave``, ``.py`` ...);
* a relative ``include`` path is relative to the current directory, as in HTCondor;
  ``include command into FILE : cmd`` reads FILE when it exists (the command is not run then);
* lookups are the router's (config.cpp ``lookup_macro``): ``JOB_ROUTER.NAME`` before ``NAME``, and
  at definition time (self references, ``+=``, ``if defined``) HTCondor's param-table default
  (``param_default_string`` from the wheel) when no line set the knob yet;
* ``NAME += value`` (HTCondor 25.11+; config.cpp ``Parse_macros``): when NAME already has a
  non-empty value (its own, or its built-in default) the new value is that value, a space (or the
  separator written between ``+`` and ``=``: ``+,=`` joins with ``,``, ``+&&=`` with `` && ``) and
  the text; otherwise just the text. Self references in the text then expand as for ``=``. A
  modelled version before 25.11.0 reads the line as ``NAME = value`` (with a warning);
* ``$INT(X[,fmt])``, ``$REAL(X[,fmt])``, ``$STRING(X[,fmt])`` (config.cpp ``evaluate_macro_func``):
  X is a knob name (else the text itself), expanded, then evaluated as a ClassAd expression. A value
  that is not an integer/real expands to nothing (HTCondor logs an error and carries on); a
  ``$STRING`` value that does not evaluate to a string is used as written; a bad format is
  replaced by the format text;
* ``use CATEGORY : NAME[(args)], ...`` (config.cpp ``read_meta_config``): the metaknob's text comes
  from HTCondor's own table in the installed wheel (``param_meta_value`` in libcondor_utils, via
  ctypes) and is read as configuration in place of the line, with ``$(0)``, ``$(1)``, ``$(1+)``,
  ``$(0#)``, ``$(1?)`` arguments expanded (``expand_meta_args``); an unknown name is an error, as in
  HTCondor;
* ``if version >= X.Y.Z`` compares against the *modelled* HTCondor version (``version=``, default
  the installed wheel's), not necessarily the wheel's;
* with ``detected_specials`` (the router's view), HOSTNAME, FULL_HOSTNAME, SUBSYSTEM ... are
  HTCondor's own whatever a file says (condor_config.cpp ``reinsert_specials``).

Two readers. ``CondorConfig.load(..., run_commands=True)`` (what ``ce-k8s route`` and ``routes
check`` use) also runs HTCondor's own reader in a child process (ce_k8s.condor.htconfig): it runs
the configuration's commands, exactly as the router does, and every value is taken from it; this
parser then only supplies what HTCondor cannot give back: the NAME line of each knob, and the file
line of each line of a raw ``@=`` body (``raw_lines``, ``line_of``), for the knobs whose value it
read identically. A knob only HTCondor knows (set by a command's output, or by a line whose effect
this parser does not model) gets as origin the line that ran the command (``Origin.via`` says
which output line), or HTCondor's own source and line. Commands are run once, by HTCondor's reader
only: that is what the router does on every (re)configuration, it gives HTCondor's exact process
rules (argv splitting, environment, exit status) for free, and a line inside a program's output is
not a place an admin can edit anyway; the command's line is. If HTCondor's reader refuses the
configuration, its message becomes an ERROR diagnostic (the router would not start either).

Without ``run_commands`` (the default, and ``--no-commands``) nothing here ever runs a program:
``LOCAL_CONFIG_FILE = cmd |``, ``include command : cmd`` and ``include : cmd |`` become NOTE
diagnostics naming file and line and the command whose output is missing.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, MutableSequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, overload

import classad2

from ce_k8s.condor.diagnostics import Diagnostic, Severity

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor import htconfig

log = logging.getLogger(__name__)

_WS = " \t\n\v\f\r"  # C isspace()
_IDCHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./")
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_DEFAULT_EXTRA = frozenset("$ ,\\:")  # characters allowed after the ':' of $(X:default) (config.cpp)
_SPECIAL_FUNCS = frozenset(
    {"ENV", "RANDOM_CHOICE", "RANDOM_INTEGER", "CHOICE", "SUBSTR", "INT", "REAL", "STRING", "EVAL",
     "BASENAME", "DIRNAME"}
)
_MAX_INCLUDE_DEPTH = 20
_MAX_IF_DEPTH = 63
_MAX_SUBSTITUTIONS = 10000
_NAME_RE = re.compile(r"[A-Za-z0-9_./]+")
_NUMBER_RE = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_IF_RE = re.compile(r"(if|elif|else|endif)(?:[ \t\n\v\f\r]+|$)", re.IGNORECASE)
_LIST_SPLIT = re.compile(r"[\s,]+")
#: knobs HTCondor sets itself after reading the configuration (condor_config.cpp reinsert_specials)
_SPECIAL_KNOBS = ("TILDE", "HOSTNAME", "FULL_HOSTNAME", "SUBSYSTEM", "LOCALNAME", "USERNAME", "REAL_UID", "REAL_GID",
                  "PID", "PPID", "IP_ADDRESS", "IP_ADDRESS_IS_IPV6")
_PLUS_SEPARATORS = ",;|&*"  # config.cpp CONFIG_PLUS_SEP_CHARSET: allowed between '+' and '=' of '+='
_META_ARG = re.compile(r"\$\((\d+)([?#+]?)(?::([^)]*))?\)")

#: HTCondor 25's LOCAL_CONFIG_DIR_EXCLUDE_REGEXP default (read from htcondor2.param 25.14.1).
DEFAULT_EXCLUDE_REGEXP = (
    r"^((\..*)|(.*\.pl)|(.*\.py)|(.*\.sh)|(.*~)|(#.*)|(.*\.rpmsave)|(.*\.rpmnew)|(.*\.dpkg-old)"
    r"|(.*\.dpkg-dist)|(.*\.cfsaved))$"
)


Version = tuple[int, int, int]

#: HTCONDOR-3734 (config.cpp Parse_macros) added ``+=`` in HTCondor 25.11.0.
PLUS_EQUALS_SINCE: Version = (25, 11, 0)


def parse_version(text: str) -> Version:
    """``X.Y.Z`` as a tuple; also ``X.Y``, ``vX.Y.Z``, ``25.14.1-1.el9`` and what ``condor_version``
    prints (``$CondorVersion: 24.0.3 2024-12-05 ... $``) or ``condor_ce_version`` (a
    ``$HTCondorCEVersion: ...$`` line first: the ``$CondorVersion:`` one counts). ValueError otherwise."""
    number = r"(?<![\d.])(\d+)\.(\d+)(?:\.(\d+))?"
    m = re.search(r"\$CondorVersion:\s*" + number, text) or re.search(number, text)
    if not m:
        raise ValueError(f"not an HTCondor version: {text!r} (expected X.Y.Z)")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def installed_version() -> Version:
    """The installed htcondor wheel's version (``classad2.version()``): what ce-k8s models by default."""
    try:
        return parse_version(classad2.version())
    except ValueError:  # pragma: no cover - defensive: an odd version string
        log.debug("unparsable classad2 version, assuming 25.0.0")
    return (25, 0, 0)


def _hostnames() -> tuple[str, str]:
    """(FULL_HOSTNAME, HOSTNAME) of this machine, as HTCondor detects them."""
    host = socket.gethostname()
    try:
        full = socket.getfqdn(host)
    except OSError:  # pragma: no cover - resolver failure
        full = host
    if not full or full.startswith("localhost"):
        full = host
    return full, host.split(".")[0]


#: The few built-in defaults ce-k8s code relies on even when no file sets them. HTCondor's own
#: table is much larger; these are the ones our knobs and the router reference. Values are raw.
_BUILTIN_DEFAULTS: dict[str, Callable[[], str]] = {
    "FULL_HOSTNAME": lambda: _hostnames()[0],
    "HOSTNAME": lambda: _hostnames()[1],
    "JOB_ROUTER_NAME": lambda: "jobrouter",
    "JOB_ROUTER_POLLING_PERIOD": lambda: "10",
    "LOCAL_CONFIG_DIR_EXCLUDE_REGEXP": lambda: DEFAULT_EXCLUDE_REGEXP,
    "REQUIRE_LOCAL_CONFIG_FILE": lambda: "true",
}
BUILTIN_DEFAULT_NAMES: tuple[str, ...] = tuple(_BUILTIN_DEFAULTS)
BUILTIN_ORIGIN_FILE = "<built-in default>"


class ConfigError(Exception):
    """A configuration problem; ``str()`` is ``file:line: message`` so admins can jump to it."""

    def __init__(self, file: str, line: int, message: str) -> None:
        self.file = file
        self.line = line
        self.message = message
        super().__init__(f"{file}:{line}: {message}")


@dataclass(frozen=True)
class Origin:
    """Where a knob was set: the file and the line holding its NAME.

    ``via`` says how, when that line did not itself hold the value: ``use security : recommended``
    or ``line 3 of the output of `cmd |```. It is not part of equality or of ``str()``.
    """

    file: str
    line: int
    via: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class _LegacyWarnings(MutableSequence[str]):
    """``CondorConfig.warnings``: the WARNING and ERROR diagnostics as ``file:line: message`` strings.

    Code written before severities reads and extends this list; appending a string adds a WARNING.
    NOTEs are left out: they never made ``routes check`` fail and must not start to.
    """

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self._diagnostics = diagnostics

    def _visible(self) -> list[Diagnostic]:
        return [d for d in self._diagnostics if d.severity >= Severity.WARNING]

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index):
        texts = [f"{d.file}:{d.line}: {d.message}" for d in self._visible()]
        return texts[index]

    def __len__(self) -> int:
        return len(self._visible())

    def __setitem__(self, index, value) -> None:  # pragma: no cover - nobody edits warnings in place
        raise TypeError("CondorConfig.warnings is a view of CondorConfig.diagnostics")

    def __delitem__(self, index) -> None:  # pragma: no cover - see __setitem__
        raise TypeError("CondorConfig.warnings is a view of CondorConfig.diagnostics")

    def insert(self, index: int, value: str) -> None:
        self._diagnostics.append(Diagnostic.from_text(value, Severity.WARNING))

    def __eq__(self, other: object) -> bool:
        return list(self) == other if isinstance(other, list) else NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass
class _Entry:
    name: str  # spelling of the first definition (HTCondor keeps the first key)
    value: str  # raw (unexpanded, self references already resolved)
    origin: Origin
    lines: tuple[tuple[int, str], ...] | None = None  # @= blocks: (file line, kept text) per line
    segments: tuple[tuple[int, int], ...] = ()  # (offset in value, file line) where each physical line starts


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


Segments = tuple[tuple[int, int], ...]


def _logical_lines(text: str) -> Iterator[tuple[int, str, Segments]]:
    """(first physical line, logical line, segments) as config.cpp getline_implementation reads them.

    ``segments`` maps offsets in the logical line to the physical line each continued part came from.
    """
    phys = text.split("\n")
    if phys and phys[-1] == "":
        phys.pop()
    i = 0
    while i < len(phys):
        start = i + 1
        buf = ""
        first = True
        segs: list[tuple[int, int]] = []
        while i < len(phys):
            part = phys[i].strip(_WS)
            segs.append((len(buf), i + 1))
            i += 1
            in_comment = part.startswith("#")
            if in_comment and not first:
                # "pretend this is whitespace to the end of the line": only the last char survives
                part = part[-1:]
                in_comment = False
            buf += part
            if buf.endswith("\\"):
                buf = buf[:-1]
                if not in_comment:
                    first = False
                    continue
            break
        yield start, buf, tuple(segs)


def _shift(segs: Segments, start: int) -> Segments:
    """Segments of the text that begins at ``start`` of a logical line."""
    first = max((ln for off, ln in segs if off <= start), default=segs[0][1] if segs else 0)
    return ((0, first), *((off - start, ln) for off, ln in segs if off > start))


def _split_list(value: str) -> list[str]:
    return [item for item in _LIST_SPLIT.split(value.strip()) if item]


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


class _IfFrame:
    __slots__ = ("else_seen", "line", "state", "taken")

    def __init__(self, state: bool, line: int) -> None:
        self.line = line
        self.state = state
        self.taken = state
        self.else_seen = False


class CondorConfig:
    """An HTCondor configuration: knob name (case-insensitive) -> raw value, origin and lines."""

    def __init__(self, environ: Mapping[str, str] | None = None, *, version: Version | None = None,
                 subsystem: str | None = "JOB_ROUTER") -> None:
        self._table: dict[str, _Entry] = {}
        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._builtin_cache: dict[str, str] = {}
        #: non-fatal findings of the reader (commands not run, obsolete syntax, HTCondor's refusal ...).
        self.diagnostics: list[Diagnostic] = []
        #: every file read, in order (like ``condor_config_val -config``).
        self.sources: list[str] = []
        #: the HTCondor version modelled: ``if version`` and old-syntax routes follow it.
        self.version: Version = installed_version() if version is None else version
        #: the daemon whose view is modelled: ``SUBSYS.NAME`` wins over ``NAME`` in lookups.
        self.subsystem = subsystem
        #: (line that runs it, the command) for every configuration command met, run or not.
        self.commands: list[tuple[Origin, str]] = []
        #: True once HTCondor's own reader supplied the values (``load(run_commands=True)``).
        self.read_by_htcondor = False
        self._version_sensitive: Origin | None = None  # an `if version` the installed wheel decides differently
        self._pin: Origin | None = None  # metaknob text: every knob it sets is placed at the `use` line
        self._if_where: Origin | None = None  # the if/elif line being tested
        self._commands_skipped = "--no-commands"  # why commands were not run, for their NOTEs

    @property
    def warnings(self) -> MutableSequence[str]:
        """The legacy view: WARNING/ERROR diagnostics as ``file:line: message`` strings."""
        return _LegacyWarnings(self.diagnostics)

    def _diag(self, severity: Severity, where: Origin | None, message: str) -> None:
        where = where or Origin("<config>", 0)
        self.diagnostics.append(Diagnostic(where.file, where.line, severity, message))

    # ---- construction ------------------------------------------------------------------

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None,
        run_commands: bool = False, version: Version | None = None, detected_specials: bool = False,
        while_reading: Callable[[], object] | None = None,
    ) -> CondorConfig:
        """Read a condor_config file (then its LOCAL_CONFIG_DIR/LOCAL_CONFIG_FILE), or a directory
        of config files, or (``None``) the shipped default: config.d/ then routes/.

        ``_CONDOR_<KNOB>`` environment variables override files, as in HTCondor. ``run_commands``
        reads with HTCondor's own reader as well (it runs the configuration's commands; see the
        module docstring); ``version`` is the HTCondor version modelled (default: the installed one).
        ``detected_specials`` drops what the configuration says about HOSTNAME, FULL_HOSTNAME and the
        other knobs HTCondor sets itself (``_reinsert_specials``), as the router sees them; it is
        implied by ``run_commands`` (HTCondor's own table has them as detected values).
        ``while_reading`` is called while HTCondor's reader still runs (the caller's own start-up
        work overlaps with it instead of following it).
        """
        cfg = cls(environ, version=version)
        root: str | None = None
        dirs: list[Path] = []
        if path is None:
            dirs = [d for d in default_config_paths() if d.is_dir()]
            if not dirs:
                raise ConfigError(
                    "<default>", 0,
                    "embedded default configuration not found in " + ", ".join(map(str, default_config_paths())),
                )
        else:
            p = Path(path)
            command_root = str(path).rstrip(_WS).endswith("|") and not p.exists()
            if p.is_dir():
                dirs = [p]
            elif p.exists() or command_root:  # a file, /dev/null, or (condor_config.cpp find_file) "cmd |"
                root = str(path)
            else:
                raise ConfigError(str(p), 0, "configuration file not found")
        pending = None
        if run_commands:
            from ce_k8s.condor import htconfig

            pending = htconfig.start_reader(root, dirs, environ=environ)
        try:
            if root is not None and not Path(root).exists():
                cfg.commands.append((Origin("<CONDOR_CONFIG>", 0), root.strip(_WS)))
            elif root is not None:
                cfg._read_file(Path(root), 0)
            for d in dirs:
                cfg._read_dir(d, None)
            cfg._read_locals()
            cfg._apply_environment()
            if detected_specials:
                cfg._reinsert_specials()
        except BaseException as exc:
            if pending is None:
                raise
            if not isinstance(exc, ConfigError):
                pending.cancel()
                raise
            result = pending.result()
            if result.error is not None or result.unavailable is not None:
                raise
            # HTCondor read what this parser could not (e.g. a path only a command's output defines):
            # HTCondor is the reference, so its values are used, with its own origins.
            cfg._table.clear()
            cfg._diag(Severity.NOTE, Origin(exc.file, exc.line),
                      f"ce-k8s's own reader stopped here ({exc.message}) but HTCondor's reader did not; "
                      "the values are HTCondor's, without line numbers inside @= bodies")
            cfg._adopt(result)
            return cfg
        if pending is not None:
            if while_reading is not None:
                try:
                    while_reading()
                except BaseException:
                    pending.cancel()
                    raise
            cfg._adopt(pending.result())
        cfg._note_commands()
        return cfg

    def _reinsert_specials(self, only: str | None = None) -> None:
        """condor_config.cpp ``reinsert_specials``: once every file and ``_CONDOR_`` variable is read,
        HTCondor sets HOSTNAME, FULL_HOSTNAME, SUBSYSTEM, LOCALNAME, USERNAME, ... itself, replacing
        whatever the configuration said (it only counted for definition-time uses: ``if``, self
        references, include paths)."""
        for name in _SPECIAL_KNOBS if only is None else (only.upper(),):
            entry = self._table.pop(name.lower(), None)
            if entry is not None:
                self._diag(Severity.NOTE, entry.origin, f"{name} is set by HTCondor itself after reading the "
                           "configuration (reinsert_specials), so this setting is replaced by the detected value")

    def _adopt(self, result: htconfig.HTReadResult) -> None:
        """Take every value from HTCondor's reader, keeping our origin and line map where we agree."""
        from ce_k8s.condor import htconfig

        if result.unavailable is not None:
            self._diag(Severity.NOTE, Origin(self.sources[0] if self.sources else "<config>", 0),
                       f"HTCondor's own reader could not run ({result.unavailable}); the values are ce-k8s's own")
            self._commands_skipped = "HTCondor's reader could not run"
            return
        if result.error is not None:
            where = Origin(self.sources[0] if self.sources else "<config>", 0)
            for line, command in self.commands:  # HTCondor names a failing command by its source text
                if command.rstrip(" |") in result.error:
                    where = line
                    break
            self._diag(Severity.ERROR, where, "HTCondor's configuration reader refuses this configuration, so the "
                       f"job router would not start: {result.error}")
            return
        if self._version_sensitive is not None and self.version != installed_version():
            self._diag(Severity.NOTE, self._version_sensitive,
                       f"this line is read differently by the installed HTCondor "
                       f"{'.'.join(map(str, installed_version()))} and the modelled "
                       f"{'.'.join(map(str, self.version))}, so HTCondor's reader cannot speak for the modelled "
                       "version: the values are ce-k8s's own and the configuration's commands were not run")
            self._commands_skipped = "HTCondor's reader could not model this version"
            return
        commands: dict[str, Origin] = {}
        for where, command in self.commands:
            commands.setdefault(command, where)
        table: dict[str, _Entry] = {}
        for knob in result.knobs:
            if knob.source == htconfig.DETECTED_SOURCE:
                self._builtin_cache[knob.name.upper()] = knob.value
                if knob.name.upper() in _SPECIAL_KNOBS:
                    self._reinsert_specials(only=knob.name)
                continue
            if result.synthetic_root is not None and knob.source == result.synthetic_root:
                continue  # the LOCAL_CONFIG_DIR line written to read a directory input
            key = knob.name.lower()
            ours = self._table.get(key)
            if knob.source == htconfig.DEFAULT_SOURCE:
                # HTCondor keeps no place for a file line that sets a knob to its default value
                # (insert_macro marks it "matches default"); such a knob is ours, if we read it so
                if ours is not None and ours.value == knob.value:
                    table[key] = ours
                continue
            if ours is not None and ours.value == knob.value:
                table[key] = ours
                continue
            if ours is not None:
                log.debug("%s: ce-k8s read %r, HTCondor %r; HTCondor's value is used", knob.name, ours.value,
                          knob.value)
            table[key] = _Entry(ours.name if ours else knob.name, knob.value, self._ht_origin(knob, commands))
        ordered = {k: table[k] for k in self._table if k in table}
        ordered.update((k, e) for k, e in table.items() if k not in ordered)
        self._table = ordered
        self.read_by_htcondor = True

    @staticmethod
    def _ht_origin(knob: htconfig.HTKnob, commands: Mapping[str, Origin]) -> Origin:
        from ce_k8s.condor import htconfig

        command = commands.get(knob.source)
        if command is not None:
            return Origin(command.file, command.line, f"line {knob.line} of the output of `{knob.source}`")
        if knob.source == htconfig.ENVIRONMENT_SOURCE:
            return Origin("<environment>", 0)
        if knob.source.rstrip().endswith("|"):
            return Origin(knob.source, knob.line, f"line {knob.line} of the output of `{knob.source}`")
        if knob.meta_id >= 0:
            return Origin(knob.source, knob.line, "the metaknob used on this line")
        return Origin(knob.source, knob.line)

    def _note_commands(self) -> None:
        """A NOTE per configuration command whose output was not read (HTCondor's reader did not run)."""
        if self.read_by_htcondor:
            return
        for where, command in self.commands:
            self._diag(Severity.NOTE, where, f"the configuration runs the command `{command}` and reads its "
                       f"output as configuration; it was not run ({self._commands_skipped}), so the knobs it sets "
                       "are missing")

    @classmethod
    def from_text(
        cls, text: str, name: str = "<string>", *, environ: Mapping[str, str] | None = None
    ) -> CondorConfig:
        """Parse configuration text (no LOCAL_CONFIG_* processing, no environment overrides)."""
        cfg = cls(environ)
        cfg.read_text(text, name)
        cfg._note_commands()
        return cfg

    def read_text(self, text: str, name: str = "<string>") -> None:
        """Parse more configuration text on top of this one, as if it were one more file."""
        self._read_source(name, text, 0)

    def copy(self) -> CondorConfig:
        """An independent copy (``converted_config`` edits a copy, never the caller's object)."""
        new = CondorConfig(self._environ, version=self.version, subsystem=self.subsystem)
        new._table = {k: _Entry(e.name, e.value, e.origin, e.lines, e.segments) for k, e in self._table.items()}
        new._builtin_cache = dict(self._builtin_cache)
        new.diagnostics = list(self.diagnostics)
        new.sources = list(self.sources)
        new.commands = list(self.commands)
        new.read_by_htcondor = self.read_by_htcondor
        return new

    def unset(self, name: str) -> None:
        """Remove a knob (it falls back to its built-in default, if any)."""
        self._table.pop(name.lower(), None)

    # ---- queries -----------------------------------------------------------------------

    def _entry(self, name: str) -> _Entry | None:
        """The knob's entry as the modelled daemon looks it up: ``SUBSYS.NAME`` first (config.cpp
        ``lookup_macro``), then ``NAME``."""
        if self.subsystem and "." not in name:
            entry = self._table.get(f"{self.subsystem}.{name}".lower())
            if entry is not None:
                return entry
        return self._table.get(name.lower())

    def raw(self, name: str) -> str | None:
        """The unexpanded value (``param_unexpanded``), or None when not defined at all."""
        entry = self._entry(name)
        if entry is not None:
            return entry.value
        return self._builtin(name)

    def lookup_macro(self, name: str) -> str | None:
        """Raw value for the transform language's fall-through to config macros (xform_utils.cpp lookups)."""
        return self.raw(name)

    def get(self, name: str, default: str | None = None) -> str | None:
        """The expanded value, or ``default`` when undefined or empty (HTCondor ``param``)."""
        raw = self.raw(name)
        if raw is None:
            return default
        where = self.origin(name) or Origin(BUILTIN_ORIGIN_FILE, 0)
        value = self._finish(self._expand(raw, (name.lower(),), where))
        return value if value != "" else default

    def expand(self, text: str, where: Origin | None = None) -> str:
        """Expand every macro in ``text`` against this configuration."""
        return self._finish(self._expand(text, (), where or Origin("<expression>", 0)))

    def get_bool(self, name: str, default: bool) -> bool:
        """A boolean knob: true/false/yes/no/t/f, a number, or a ClassAd expression."""
        value = self.get(name)
        if value is None:
            return default
        v = value.strip(_WS)
        low = v.lower()
        if low in ("true", "yes", "t"):
            return True
        if low in ("false", "no", "f"):
            return False
        result = self._eval_literal(v)
        if isinstance(result, bool):
            return result
        if isinstance(result, int | float):
            return result != 0
        where = self.origin(name) or Origin(BUILTIN_ORIGIN_FILE, 0)
        raise ConfigError(where.file, where.line, f"{name} = {value!r} is not a boolean")

    def get_int(self, name: str, default: int) -> int:
        """An integer knob: a number or a ClassAd expression that evaluates to one."""
        value = self.get(name)
        if value is None:
            return default
        v = value.strip(_WS)
        try:
            return int(v)
        except ValueError:
            pass
        result = self._eval_literal(v)
        if isinstance(result, int) and not isinstance(result, bool):
            return result
        if isinstance(result, float) and result.is_integer():
            return int(result)
        where = self.origin(name) or Origin(BUILTIN_ORIGIN_FILE, 0)
        raise ConfigError(where.file, where.line, f"{name} = {value!r} is not an integer")

    def origin(self, name: str) -> Origin | None:
        """Where the knob was set (file, line of the NAME); built-ins report ``<built-in default>``."""
        entry = self._entry(name)
        if entry is not None:
            return entry.origin
        if name.upper() in _BUILTIN_DEFAULTS:
            return Origin(BUILTIN_ORIGIN_FILE, 0)
        return None

    def raw_lines(self, name: str) -> list[tuple[int, str]] | None:
        """(file line, text) of each line the raw value is made of, for line-accurate errors.

        For an ``@=`` block these are the kept lines (comments and blank lines are gone, as in
        HTCondor), each with the line it came from; otherwise one line at the NAME's line.
        """
        entry = self._entry(name)
        if entry is None:
            return None
        if entry.lines is not None:
            return list(entry.lines)
        return [(entry.origin.line, entry.value)]

    def line_of(self, name: str, offset: int) -> int | None:
        """File line holding character ``offset`` of the raw value (continuations and @= blocks)."""
        entry = self._entry(name)
        if entry is None:
            return None
        line = entry.origin.line
        for off, ln in entry.segments:
            if off > offset:
                break
            line = ln
        return line

    def raw_items(self) -> dict[str, str]:
        """Every knob a config source set, lower-case name -> raw value, as stored (no ``SUBSYS.``
        resolution): what HTCondor's own table holds, for comparisons."""
        return {key: entry.value for key, entry in self._table.items()}

    def names(self) -> list[str]:
        """Every knob set by a config source (not built-in defaults), first spelling, in order."""
        return [e.name for e in self._table.values()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.raw(name) is not None

    # ---- internals: lookups and expansion ----------------------------------------------------

    def _builtin(self, name: str) -> str | None:
        """A value HTCondor provides without any file: detected by HTCondor's reader when it ran
        (hostnames, OS, ``SUBSYSTEM`` ...), else our own short list."""
        key = name.upper()
        if key in self._builtin_cache:
            return self._builtin_cache[key]
        if key in ("SUBSYSTEM", "LOCALNAME") and self.subsystem:
            return self.subsystem
        factory = _BUILTIN_DEFAULTS.get(key)
        if factory is None:
            return None
        if key not in self._builtin_cache:
            self._builtin_cache[key] = factory()
        return self._builtin_cache[key]

    @staticmethod
    def _eval_literal(text: str) -> object:
        try:
            value = classad2.ExprTree(text).eval()
        except Exception:
            return None
        return None if isinstance(value, classad2.Value) else value  # UNDEFINED/ERROR are IntEnums

    def _expand(self, text: str, stack: tuple[str, ...], where: Origin) -> str:
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
                raw = self.raw(name)
                if raw:
                    key = name.lower()
                    if key in stack:
                        chain = [*stack[stack.index(key) :], key]
                        names = " -> ".join(self._spelling(k) for k in chain)
                        raise ConfigError(where.file, where.line, f"macro expansion loop: {names}")
                    rep = self._expand(raw, (*stack, key), where)
                else:
                    rep = m.default or ""
            elif m.func == "ENV":
                env_value = self._environ.get(m.name)
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
        value = self.raw(name)
        if value is None:
            value = name
        if "$" in value:
            value = self._expand(value, stack, where)
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

    @staticmethod
    def _finish(text: str) -> str:
        """The last step of expand_macro: every $(DOLLAR) becomes '$'."""
        s = text
        pos = 0
        while True:
            m = _next_macro(s, pos, lambda mm: not _is_dollar(mm))
            if m is None:
                return s
            s = s[: m.start] + "$" + s[m.end :]
            pos = m.start + 1

    def _spelling(self, key: str) -> str:
        entry = self._table.get(key)
        return entry.name if entry is not None else key.upper()

    def _expand_self(self, text: str, name: str, where: Origin) -> str:
        """Definition-time expansion of ``$(NAME)``/``$(NAME:default)`` to the previous value."""
        selves = {name.lower()}
        if self.subsystem and name.lower().startswith(self.subsystem.lower() + ".") and len(name) > len(
                self.subsystem) + 1:
            selves.add(name[len(self.subsystem) + 1 :].lower())  # SUBSYS.X = $(X): $(X) is a self reference too
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
            previous = self._previous(m.name)
            rep = previous if previous else (m.default or "")
            s = s[: m.start] + rep + s[m.end :]
            pos = m.start

    def _previous(self, name: str) -> str | None:
        """config.cpp ``lookup_macro`` at definition time (self references, ``+=``): the knob as the
        modelled daemon sees it, else HTCondor's param-table default (from the installed wheel)."""
        value = self.raw(name)
        if value is not None:
            return value
        from ce_k8s.condor import htconfig

        try:
            return htconfig.param_default(name, self.subsystem)
        except htconfig.MetaknobsUnavailable:
            return None

    def _insert(self, name: str, value: str, origin: Origin, lines: tuple[tuple[int, str], ...] | None,
                segments: Segments = ()) -> None:
        if self._pin is not None:  # set by a metaknob's text: placed at the `use` line
            origin, lines, segments = self._pin, None, ()
        key = name.lower()
        entry = self._table.get(key)
        if entry is None:
            self._table[key] = _Entry(name, value, origin, lines, segments)
        else:
            entry.value, entry.origin, entry.lines, entry.segments = value, origin, lines, segments

    # ---- internals: reading sources ------------------------------------------------------------

    def _read_file(self, path: Path, depth: int) -> None:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(str(path), 0, f"can't open file {path}: {exc.strerror}") from exc
        self.sources.append(str(path))
        self._read_source(str(path), text, depth)

    def _exclude_regexp(self) -> re.Pattern[str]:
        pattern = self.get("LOCAL_CONFIG_DIR_EXCLUDE_REGEXP") or ""
        try:
            return re.compile(pattern)
        except re.error as exc:
            where = self.origin("LOCAL_CONFIG_DIR_EXCLUDE_REGEXP") or Origin(BUILTIN_ORIGIN_FILE, 0)
            raise ConfigError(where.file, where.line, f"LOCAL_CONFIG_DIR_EXCLUDE_REGEXP: {exc}") from exc

    def _read_dir(self, directory: Path, where: Origin | None) -> None:
        """Every file in the directory not excluded, in byte order of the path (condor_config.cpp)."""
        exclude = self._exclude_regexp()
        try:
            entries = list(directory.iterdir())
        except OSError as exc:
            if where is None:
                raise ConfigError(str(directory), 0, f"cannot open directory: {exc.strerror}") from exc
            self._diag(Severity.NOTE, where, f"cannot open LOCAL_CONFIG_DIR {directory}: {exc.strerror}; "
                       "HTCondor skips it silently")
            return
        files = []
        for entry in entries:
            if entry.is_dir():
                continue
            if exclude.pattern and exclude.search(entry.name):
                log.debug("ignoring %s (LOCAL_CONFIG_DIR_EXCLUDE_REGEXP)", entry)
                continue
            files.append(str(entry))
        for file in sorted(files, key=lambda f: f.encode("utf-8", "surrogateescape")):
            self._read_file(Path(file), 0)

    def _read_locals(self) -> None:
        """LOCAL_CONFIG_DIR, then LOCAL_CONFIG_FILE, then LOCAL_CONFIG_DIR again if it changed."""
        before = self.get("LOCAL_CONFIG_DIR")
        if before:
            self._read_dirs(before)
        self._read_local_files()
        after = self.get("LOCAL_CONFIG_DIR")
        if after and after != before:
            self._read_dirs(after)

    def _read_dirs(self, value: str) -> None:
        where = self.origin("LOCAL_CONFIG_DIR") or Origin("<LOCAL_CONFIG_DIR>", 0)
        for d in _split_list(value):
            path = Path(d)
            if not path.is_dir():
                self._diag(Severity.NOTE, where, f"LOCAL_CONFIG_DIR {d} is not a directory; HTCondor skips it")
                continue
            self._read_dir(path, where)

    def _read_local_files(self) -> None:
        value = self.get("LOCAL_CONFIG_FILE")
        if not value:
            return
        done: list[str] = []
        remaining: list[str] = []
        while True:
            where = self.origin("LOCAL_CONFIG_FILE") or Origin("<LOCAL_CONFIG_FILE>", 0)
            if "|" in value:
                # condor_config.cpp process_locals: a value with a '|' is one command, not a list
                command = value.strip(_WS)
                if not command.endswith("|"):
                    raise ConfigError(where.file, where.line, f"LOCAL_CONFIG_FILE = {command}: not a valid command, "
                                      "| must be at the end")
                self.commands.append((where, command))
                return
            remaining = [s for s in _split_list(value) if s not in done]
            if not remaining:
                return
            source = remaining[0]
            path = Path(source)
            if path.is_file():
                self._read_file(path, 0)
            elif self.get_bool("REQUIRE_LOCAL_CONFIG_FILE", True):
                raise ConfigError(where.file, where.line, f"can't read config source {source}")
            done.append(source)
            value = self.get("LOCAL_CONFIG_FILE") or ""

    def _apply_environment(self) -> None:
        for key, value in self._environ.items():
            if len(key) > 8 and key[:8].lower() == "_condor_":
                name = key[8:]
                if not _NAME_RE.fullmatch(name):
                    continue
                origin = Origin("<environment>", 0)
                self._insert(name, self._expand_self(value, name, origin), origin, None)

    def _read_source(self, src: str, text: str, depth: int) -> None:
        ifs: list[_IfFrame] = []
        here: tuple[str, str, Origin] | None = None  # (name, tag, origin)
        here_lines: list[tuple[int, str]] = []
        here_segs: list[tuple[int, int]] = []
        here_len = 0
        for lineno, line, segs in _logical_lines(text):
            if not line or line.startswith("#"):
                continue
            if here is not None:
                if line[0] == "@" and line[1:] == here[1]:
                    name, _tag, origin = here
                    value = self._expand_self("\n".join(t for _, t in here_lines), name, origin)
                    self._insert(name, value, origin, tuple(here_lines), tuple(here_segs))
                    here = None
                    here_lines = []
                    here_segs = []
                    here_len = 0
                else:
                    if here_lines:
                        here_len += 1  # the "\n" joining the lines
                    here_segs.extend((here_len + off, ln) for off, ln in segs)
                    here_lines.append((lineno, line))
                    here_len += len(line)
                continue
            if line.startswith(":") and (ifs or re.match(r":if(\s|$)", line)):
                line = line[1:]
                segs = _shift(segs, 1)
            kw = _IF_RE.match(line)
            if kw:
                self._if_statement(ifs, kw.group(1).lower(), line[kw.end() :], src, lineno)
                continue
            if not all(f.state for f in ifs):
                continue
            here = self._statement(src, lineno, line, depth, segs)
        if here is not None:
            raise ConfigError(
                here[2].file, here[2].line, f"end of file while looking for '@{here[1]}' (unterminated @= value)"
            )
        if ifs:
            raise ConfigError(src, ifs[-1].line, "if without endif: endif(s) not found before end-of-file")

    def _if_statement(self, ifs: list[_IfFrame], kw: str, expr: str, src: str, lineno: int) -> None:
        outer = all(f.state for f in ifs)
        if kw == "if":
            if len(ifs) >= _MAX_IF_DEPTH:
                raise ConfigError(src, lineno, "if nesting too deep")
            ifs.append(_IfFrame(self._test_if(expr, src, lineno, "if") if outer else False, lineno))
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
        ok = (not frame.taken) and outer and self._test_if(expr, src, lineno, "elif")
        frame.state = ok
        frame.taken = frame.taken or ok

    def _test_if(self, expr: str, src: str, lineno: int, kw: str) -> bool:
        self._if_where = self._pin or Origin(src, lineno)
        expanded = False
        if "$" in expr:
            expr = self._finish(self._expand(expr, (), Origin(src, lineno))).rstrip(_WS)
            expanded = True
        e = expr.strip(_WS)
        inverted = e.startswith("!")
        if inverted:
            e = e[1:].lstrip(_WS)
        if expanded and not e:
            return inverted  # an empty expansion is false
        try:
            value = self._eval_if(e)
        except ValueError as exc:
            raise ConfigError(src, lineno, f"{e} is not a valid {kw} condition because {exc}") from None
        return value != inverted

    @staticmethod
    def _defined_use(ref: str) -> bool:
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

    def _eval_if(self, e: str) -> bool:
        low = e.lower()
        if _NUMBER_RE.fullmatch(e):
            return float(e) != 0
        if low in ("true", "yes", "t"):
            return True
        if low in ("false", "no", "f"):
            return False
        if low.startswith("version") and (len(e) == 7 or not (e[7].isalnum() or e[7] == "_")):
            return self._eval_version(e[7:].strip(_WS), self._if_where)
        if low.startswith("defined") and (len(e) == 7 or e[7] in _WS):
            arg = e[7:].strip(_WS)
            if not arg:
                return False
            if _NAME_RE.fullmatch(arg) and not _NUMBER_RE.fullmatch(arg):
                if arg.lower() in ("true", "false"):
                    return True
                value = self._previous(arg)  # lookup_macro: param-table defaults count
                if value is None and arg.lower() in ("yes", "no", "t", "f"):
                    return True
                return bool(value)
            if _NUMBER_RE.fullmatch(arg):
                return True
            if arg.lower().startswith("use "):
                return self._defined_use(arg[4:].lstrip(_WS))
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

        modelled = decide(self.version)
        if where is not None and self._version_sensitive is None and decide(installed_version()) != modelled:
            self._version_sensitive = where
        return modelled

    def _use(self, origin: Origin, category: str, rhs: str, depth: int) -> None:
        """``use CATEGORY : NAME[(args)], ...`` (config.cpp ``read_meta_config``): each metaknob's text,
        from HTCondor's own table, read as configuration in place of this line."""
        from ce_k8s.condor import htconfig

        category = category.strip(_WS)
        if not category:
            raise ConfigError(origin.file, origin.line, f"use needs a keyword before : {rhs}")
        if depth + 1 >= _MAX_INCLUDE_DEPTH:
            raise ConfigError(origin.file, origin.line, f"use {category}: {rhs} nesting too deep")
        for knob, args in _metaknob_items(rhs):
            try:
                text = htconfig.metaknob_text(category, knob)
            except htconfig.MetaknobsUnavailable as exc:
                self._diag(Severity.NOTE, origin, f"use {category} : {knob} was not expanded: HTCondor's metaknob "
                           f"table could not be loaded ({exc}); the knobs it sets are missing")
                continue
            if text is None:
                raise ConfigError(origin.file, origin.line, f"use {category}: does not recognise {knob}")
            if self.version[:2] != installed_version()[:2]:
                self._diag(Severity.NOTE, origin, f"use {category} : {knob} is expanded from the metaknob table of "
                           f"the installed HTCondor {'.'.join(map(str, installed_version()))}, not from "
                           f"{'.'.join(map(str, self.version))}'s")
            if args is not None or _META_ARG.search(text):
                text = _expand_meta_args(text, args or "")
            previous = self._pin
            self._pin = previous or Origin(origin.file, origin.line, f"use {category} : {knob}")
            try:
                self._read_source(f"<use {category}:{knob}>", text, depth + 1)
            finally:
                self._pin = previous

    def _statement(self, src: str, lineno: int, line: str, depth: int,
                   segs: Segments = ()) -> tuple[str, str, Origin] | None:
        """One ``NAME op value`` line; returns (name, tag, origin) when it opens an @= block."""
        n = len(line)
        i = 0
        while i < n and line[i] not in _WS and line[i] not in "=:":
            i += 1
        if i == n:
            if line.startswith("["):
                return None  # "[section]" lines are comments (ini-file compatibility)
            raise ConfigError(src, lineno, f"expected 'NAME = value', found {line!r}")
        name = line[:i]
        extra = ""
        plus_sep = ""
        if line[i] in "=:":
            op = line[i]
            j = i + 1
        else:
            j = i
            while j < n and line[j] in _WS:
                j += 1
            word = j
            while j < n and line[j] not in "=:@+":
                j += 1
            extra = line[word:j].strip(_WS)
            if j == n:
                raise ConfigError(src, lineno, f"syntax error, missing ':' or '=' in {line!r}")
            op = line[j]
            j += 1
            if op == "@":
                if j < n and line[j] == "=":
                    j += 1
                else:
                    raise ConfigError(src, lineno, f"syntax error, '@' must be followed by '=' in {line!r}")
            elif op == "+":
                # config.cpp Parse_macros: '+', an optional separator (once or twice), then '='
                if j < n and line[j] in _PLUS_SEPARATORS:
                    plus_sep = line[j] * (2 if j + 1 < n and line[j + 1] == line[j] else 1)
                    j += len(plus_sep)
                if j < n and line[j] == "=":
                    j += 1
                else:
                    raise ConfigError(src, lineno, f"syntax error, '+' must be followed by '=' in {line!r}")
        rhs = line[j:].lstrip(_WS)
        origin = Origin(src, lineno)
        keyword = (name[1:] if name.startswith("@") else name).lower()
        if op == ":" and keyword == "include":
            self._include(src, lineno, extra, rhs, depth)
            return None
        if op == ":" and keyword == "use":
            self._use(origin, self.expand(extra, origin) if "$" in extra else extra, rhs, depth)
            return None
        if op == ":" and keyword == "error":
            raise ConfigError(src, lineno, f"Error: {self.expand(rhs, origin)}")
        if op == ":" and keyword == "warning":
            self._diag(Severity.WARNING, origin, f"Warning: {self.expand(rhs, origin)}")
            return None
        if op == ":":
            self._diag(Severity.WARNING, origin, f"obsolete use of ':' for parameter assignment at {name} : {rhs}")
        if extra:
            self._diag(Severity.WARNING, origin, f"text {extra!r} between {name} and '{op}' is ignored")
        if "$" in name:
            name = self.expand(name, origin)
        if not _NAME_RE.fullmatch(name):
            raise ConfigError(src, lineno, f"illegal identifier: <{name}>")
        if op == "@":
            return (name, rhs, origin)
        segments = _shift(segs, len(line) - len(rhs))
        if op == "+" and self.version < PLUS_EQUALS_SINCE:
            # before 25.11.0 the '+' (and a separator) was a stray word before '=' (ignored): X = text
            op = "="
            self._diag(Severity.WARNING, origin, f"HTCondor {'.'.join(map(str, self.version))} has no '+=' "
                       f"(it came in {'.'.join(map(str, PLUS_EQUALS_SINCE))}): it reads this line as {name} = {rhs}, "
                       "replacing the value so far")
            if installed_version() >= PLUS_EQUALS_SINCE and self._version_sensitive is None:
                self._version_sensitive = origin
        if op == "+":
            previous = self._previous(name)  # lookup_macro: the knob's value, else its default
            if previous:
                joint = f" {plus_sep} " if len(plus_sep) == 2 else (plus_sep or " ")
                prefix = previous + joint
                rhs = prefix + rhs
                segments = ((0, lineno), *((off + len(prefix), ln) for off, ln in segments))
        self._insert(name, self._expand_self(rhs, name, origin), origin, None, segments)
        return None

    def _include(self, src: str, lineno: int, options: str, rhs: str, depth: int) -> None:
        # config.cpp parse_include_options: [ifexist] [command|output [into FILE]] (words after those ignored)
        words = options.split()
        must_exist = True
        is_command = False
        into: str | None = None
        if words and words[0] in ("ifexist", "ifexists"):
            must_exist = False
            words = words[1:]
        if words and words[0] in ("output", "command"):
            is_command = True
            if words[1:2] == ["into"]:
                if len(words) < 3:
                    raise ConfigError(src, lineno, f"unexpected keyword(s) '{options}' after include expected "
                                      "filename after keyword 'into'")
                into = words[2]
            words = []
        if words:
            raise ConfigError(src, lineno, f"unexpected keyword(s) '{options}' after include")
        target = self.expand(rhs, Origin(src, lineno)).strip(_WS)
        if into is not None:
            # Parse_macros: the FILE is read if it exists (the command is not run); else HTCondor runs
            # the command and keeps its output there (Copy_macro_source_into)
            if into.endswith("|"):
                raise ConfigError(src, lineno, "destination for 'include into' may not be a script")
            cache = self.expand(into, Origin(src, lineno)).strip(_WS)
            if not cache:
                raise ConfigError(src, lineno, "destination for 'include into' expanded to ''")
            if Path(cache).is_file():
                if depth + 1 >= _MAX_INCLUDE_DEPTH:
                    raise ConfigError(src, lineno, "includes nested too deep")
                self._read_file(Path(cache), depth + 1)
                return
        if is_command or "|" in target:
            # config.cpp fixup_pipe_source / Open_macro_source: `include command : cmd` is named
            # "cmd |"; a source with a '|' is a command only if it ends with one
            if "|" not in target:
                target += " |"
            elif not target.endswith("|"):
                raise ConfigError(src, lineno, "not a valid command, | must be at the end")
            self.commands.append((Origin(src, lineno), target))
            return
        if not target:
            raise ConfigError(src, lineno, "include needs a file name")
        path = Path(target)
        if not path.is_file():
            if not must_exist:
                return
            raise ConfigError(src, lineno, f"can't open file {target}: No such file or directory")
        if depth + 1 >= _MAX_INCLUDE_DEPTH:
            raise ConfigError(src, lineno, "includes nested too deep")
        self._read_file(path, depth + 1)


def default_config_paths() -> list[Path]:
    """The shipped ``config.d/`` then ``routes/``: from the source tree, else ``sys.prefix/share``."""
    root = Path(__file__).resolve().parents[2]
    tree = [root / "config.d", root / "routes"]
    if (root / "pyproject.toml").is_file() and tree[0].is_dir():
        return tree
    share = Path(sys.prefix) / "share" / "ce-k8s"
    return [share / "config.d", share / "routes"]
