"""A faithful reader of HTCondor configuration, as condor's param system reads it.

Why our own reader: the router reads route and transform bodies with ``param_unexpanded`` and the
PyPI wheel only offers the *expanded* ``param`` (jobrouter-protocol.md §6), which damages ``$(MY.x)``
and ``$(var)`` in route text. So ce-k8s parses the CE's configuration itself, following
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
* a relative ``include`` path is relative to the current directory, as in HTCondor.

Security: nothing here ever runs a program. ``LOCAL_CONFIG_FILE = cmd |``, ``include command`` and
``include : cmd |`` are recorded as warnings naming file and line and skipped.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import classad2

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

#: HTCondor 25's LOCAL_CONFIG_DIR_EXCLUDE_REGEXP default (read from htcondor2.param 25.14.1).
DEFAULT_EXCLUDE_REGEXP = (
    r"^((\..*)|(.*\.pl)|(.*\.py)|(.*\.sh)|(.*~)|(#.*)|(.*\.rpmsave)|(.*\.rpmnew)|(.*\.dpkg-old)"
    r"|(.*\.dpkg-dist)|(.*\.cfsaved))$"
)


def _condor_version() -> tuple[int, int, int]:
    """The HTCondor version `if version ...` compares against: the installed wheel's (25.x)."""
    try:
        parts = [int(p) for p in re.findall(r"\d+", classad2.version())[:3]]
        if len(parts) == 3:
            return (parts[0], parts[1], parts[2])
    except Exception:  # pragma: no cover - defensive: an odd version string
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
    """Where a knob was set: the file and the line holding its NAME."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


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


class _IfFrame:
    __slots__ = ("else_seen", "line", "state", "taken")

    def __init__(self, state: bool, line: int) -> None:
        self.line = line
        self.state = state
        self.taken = state
        self.else_seen = False


class CondorConfig:
    """An HTCondor configuration: knob name (case-insensitive) -> raw value, origin and lines."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._table: dict[str, _Entry] = {}
        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._builtin_cache: dict[str, str] = {}
        #: "file:line: message" for non-fatal problems (commands skipped, obsolete syntax ...).
        self.warnings: list[str] = []
        #: every file read, in order (like ``condor_config_val -config``).
        self.sources: list[str] = []

    # ---- construction ------------------------------------------------------------------

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
    ) -> CondorConfig:
        """Read a condor_config file (then its LOCAL_CONFIG_DIR/LOCAL_CONFIG_FILE), or a directory
        of config files, or (``None``) the shipped default: config.d/ then routes/.

        ``_CONDOR_<KNOB>`` environment variables override files, as in HTCondor.
        """
        cfg = cls(environ)
        if path is None:
            dirs = default_config_paths()
            if not any(d.is_dir() for d in dirs):
                raise ConfigError(
                    "<default>", 0, "embedded default configuration not found in " + ", ".join(map(str, dirs))
                )
            for d in dirs:
                if d.is_dir():
                    cfg._read_dir(d, None)
        else:
            p = Path(path)
            if p.is_dir():
                cfg._read_dir(p, None)
            elif p.exists():  # a file, or /dev/null (what htcondor2 sets when it finds no config)
                cfg._read_file(p, 0)
            else:
                raise ConfigError(str(p), 0, "configuration file not found")
        cfg._read_locals()
        cfg._apply_environment()
        return cfg

    @classmethod
    def from_text(
        cls, text: str, name: str = "<string>", *, environ: Mapping[str, str] | None = None
    ) -> CondorConfig:
        """Parse configuration text (no LOCAL_CONFIG_* processing, no environment overrides)."""
        cfg = cls(environ)
        cfg.read_text(text, name)
        return cfg

    def read_text(self, text: str, name: str = "<string>") -> None:
        """Parse more configuration text on top of this one, as if it were one more file."""
        self._read_source(name, text, 0)

    def copy(self) -> CondorConfig:
        """An independent copy (``converted_config`` edits a copy, never the caller's object)."""
        new = CondorConfig(self._environ)
        new._table = {k: _Entry(e.name, e.value, e.origin, e.lines, e.segments) for k, e in self._table.items()}
        new._builtin_cache = dict(self._builtin_cache)
        new.warnings = list(self.warnings)
        new.sources = list(self.sources)
        return new

    def unset(self, name: str) -> None:
        """Remove a knob (it falls back to its built-in default, if any)."""
        self._table.pop(name.lower(), None)

    # ---- queries -----------------------------------------------------------------------

    def raw(self, name: str) -> str | None:
        """The unexpanded value (``param_unexpanded``), or None when not defined at all."""
        entry = self._table.get(name.lower())
        if entry is not None:
            return entry.value
        return self._builtin(name)

    def lookup_macro(self, name: str) -> str | None:
        """Raw value for the transform language's fall-through to config macros (§4.1)."""
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
        entry = self._table.get(name.lower())
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
        entry = self._table.get(name.lower())
        if entry is None:
            return None
        if entry.lines is not None:
            return list(entry.lines)
        return [(entry.origin.line, entry.value)]

    def line_of(self, name: str, offset: int) -> int | None:
        """File line holding character ``offset`` of the raw value (continuations and @= blocks)."""
        entry = self._table.get(name.lower())
        if entry is None:
            return None
        line = entry.origin.line
        for off, ln in entry.segments:
            if off > offset:
                break
            line = ln
        return line

    def names(self) -> list[str]:
        """Every knob set by a config source (not built-in defaults), first spelling, in order."""
        return [e.name for e in self._table.values()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.raw(name) is not None

    # ---- internals: lookups and expansion ----------------------------------------------------

    def _builtin(self, name: str) -> str | None:
        key = name.upper()
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
            else:
                raise ConfigError(
                    where.file,
                    where.line,
                    f"${m.func}(...) is not supported by ce-k8s (it expands $(X), $(X:default), "
                    "$ENV(X) and $(DOLLAR))",
                )
            s = s[: m.start] + rep + s[m.end :]
            pos = m.start  # HTCondor rescans from the substitution point

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
        key = name.lower()
        s = text
        pos = 0
        count = 0
        while True:
            m = _next_macro(s, pos, lambda mm: not (mm.func == "" and mm.name.lower() == key))
            if m is None:
                return s
            count += 1
            if count > _MAX_SUBSTITUTIONS:
                raise ConfigError(where.file, where.line, f"self reference to {name} never ends")
            previous = self.raw(name)
            rep = previous if previous else (m.default or "")
            s = s[: m.start] + rep + s[m.end :]
            pos = m.start

    def _insert(self, name: str, value: str, origin: Origin, lines: tuple[tuple[int, str], ...] | None,
                segments: Segments = ()) -> None:
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
            self.warnings.append(f"{where}: cannot open LOCAL_CONFIG_DIR {directory}: {exc.strerror}")
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
                self.warnings.append(f"{where}: LOCAL_CONFIG_DIR {d} is not a directory; skipped")
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
                self.warnings.append(
                    f"{where}: LOCAL_CONFIG_FILE = {value.strip()} is a command; ce-k8s never runs "
                    "commands from the configuration, so its output is not read"
                )
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

    def _eval_if(self, e: str) -> bool:
        low = e.lower()
        if _NUMBER_RE.fullmatch(e):
            return float(e) != 0
        if low in ("true", "yes", "t"):
            return True
        if low in ("false", "no", "f"):
            return False
        if low.startswith("version") and (len(e) == 7 or not (e[7].isalnum() or e[7] == "_")):
            return self._eval_version(e[7:].strip(_WS))
        if low.startswith("defined") and (len(e) == 7 or e[7] in _WS):
            arg = e[7:].strip(_WS)
            if not arg:
                return False
            if _NAME_RE.fullmatch(arg) and not _NUMBER_RE.fullmatch(arg):
                if arg.lower() in ("true", "false"):
                    return True
                value = self.raw(arg)
                if value is None and arg.lower() in ("yes", "no", "t", "f"):
                    return True
                return bool(value)
            if _NUMBER_RE.fullmatch(arg):
                return True
            if arg.lower().startswith("use "):
                return False  # metaknobs are not modelled: nothing is "defined use ..."
            raise ValueError("defined argument must be param name, boolean, or number")
        if _NAME_RE.fullmatch(e):
            raise ValueError("expression is not a conditional")
        raise ValueError("complex conditionals are not supported")

    @staticmethod
    def _eval_version(rest: str) -> bool:
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
        ours = _condor_version()
        theirs = (int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else ours[2])
        diff = (ours > theirs) - (ours < theirs)
        result = diff == op or (or_equal and diff == 0)
        return not result if negated else result

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
        if line[i] in "=:":
            op = line[i]
            j = i + 1
        else:
            j = i
            while j < n and line[j] in _WS:
                j += 1
            word = j
            while j < n and line[j] not in "=:@":
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
        rhs = line[j:].lstrip(_WS)
        origin = Origin(src, lineno)
        keyword = (name[1:] if name.startswith("@") else name).lower()
        if op == ":" and keyword == "include":
            self._include(src, lineno, extra, rhs, depth)
            return None
        if op == ":" and keyword == "use":
            self.warnings.append(f"{origin}: 'use {extra}: {rhs}' (a metaknob) is not supported; ignored")
            return None
        if op == ":" and keyword == "error":
            raise ConfigError(src, lineno, f"Error: {self.expand(rhs, origin)}")
        if op == ":" and keyword == "warning":
            self.warnings.append(f"{origin}: Warning: {self.expand(rhs, origin)}")
            return None
        if op == ":":
            self.warnings.append(f"{origin}: obsolete use of ':' for parameter assignment at {name} : {rhs}")
        if extra:
            self.warnings.append(f"{origin}: text {extra!r} between {name} and '{op}' is ignored")
        if "$" in name:
            name = self.expand(name, origin)
        if not _NAME_RE.fullmatch(name):
            raise ConfigError(src, lineno, f"illegal identifier: <{name}>")
        if op == "@":
            return (name, rhs, origin)
        self._insert(name, self._expand_self(rhs, name, origin), origin, None, _shift(segs, len(line) - len(rhs)))
        return None

    def _include(self, src: str, lineno: int, options: str, rhs: str, depth: int) -> None:
        words = options.split()
        must_exist = True
        is_command = False
        if words and words[0] in ("ifexist", "ifexists"):
            must_exist = False
            words = words[1:]
        if words and words[0] in ("output", "command"):
            is_command = True
            words = words[1:]
            if words[:1] == ["into"]:
                words = words[2:]
        if words:
            raise ConfigError(src, lineno, f"unexpected keyword(s) '{options}' after include")
        target = self.expand(rhs, Origin(src, lineno)).strip(_WS)
        if is_command or "|" in target:
            self.warnings.append(
                f"{src}:{lineno}: 'include' of a command ({target}) skipped: ce-k8s never runs commands "
                "from the configuration"
            )
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
