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

The reader is in parts, each a module of its own: the vocabulary (``config_types.py``: origins,
errors, versions, built-in defaults), reading sources (``config_reader.py``) with its if
statements (``config_if.py``) and metaknobs (``config_metaknobs.py``), macro expansion
(``config_expand.py``) and HTCondor's reader's values taken in (``config_adopt.py``).
:class:`CondorConfig` holds the table, builds the parts and answers the queries.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, MutableSequence
from pathlib import Path
from typing import overload

from ce_k8s.condor.config_adopt import adopt, note_commands, reinsert_specials
from ce_k8s.condor.config_expand import (  # noqa: F401 - _is_dollar ... are xform_macros.py's
    Expander,
    _is_dollar,
    _is_filename_func,
    _next_macro,
    eval_literal,
    finish,
)
from ce_k8s.condor.config_metaknobs import _expand_meta_args, _metaknob_items  # noqa: F401 - tests use them
from ce_k8s.condor.config_reader import ConfigReader
from ce_k8s.condor.config_types import (  # noqa: F401 - the public names are this module's
    _BUILTIN_DEFAULTS,
    _WS,
    BUILTIN_DEFAULT_NAMES,
    BUILTIN_ORIGIN_FILE,
    DEFAULT_EXCLUDE_REGEXP,
    PLUS_EQUALS_SINCE,
    ConfigError,
    Entry,
    Origin,
    Version,
    installed_version,
    parse_version,
)
from ce_k8s.condor.diagnostics import Diagnostic, Severity

log = logging.getLogger(__name__)


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


class CondorConfig:
    """An HTCondor configuration: knob name (case-insensitive) -> raw value, origin and lines."""

    def __init__(self, environ: Mapping[str, str] | None = None, *, version: Version | None = None,
                 subsystem: str | None = "JOB_ROUTER") -> None:
        self._table: dict[str, Entry] = {}
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
        self._commands_skipped = "--no-commands"  # why commands were not run, for their NOTEs
        # the parts (module docstring): they read and write this object's table and findings
        self._expander = Expander(self)
        self._reader = ConfigReader(self)

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
        other knobs HTCondor sets itself (``reinsert_specials``), as the router sees them; it is
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
                cfg._reader.read_file(Path(root), 0)
            for d in dirs:
                cfg._reader.read_dir(d, None)
            cfg._reader.read_locals()
            cfg._reader.apply_environment()
            if detected_specials:
                reinsert_specials(cfg)
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
            adopt(cfg, result)
            return cfg
        if pending is not None:
            if while_reading is not None:
                try:
                    while_reading()
                except BaseException:
                    pending.cancel()
                    raise
            adopt(cfg, pending.result())
        note_commands(cfg)
        return cfg

    @classmethod
    def from_text(
        cls, text: str, name: str = "<string>", *, environ: Mapping[str, str] | None = None
    ) -> CondorConfig:
        """Parse configuration text (no LOCAL_CONFIG_* processing, no environment overrides)."""
        cfg = cls(environ)
        cfg.read_text(text, name)
        note_commands(cfg)
        return cfg

    def read_text(self, text: str, name: str = "<string>") -> None:
        """Parse more configuration text on top of this one, as if it were one more file."""
        self._reader.read_source(name, text, 0)

    def copy(self) -> CondorConfig:
        """An independent copy (``converted_config`` edits a copy, never the caller's object)."""
        new = CondorConfig(self._environ, version=self.version, subsystem=self.subsystem)
        new._table = {k: Entry(e.name, e.value, e.origin, e.lines, e.segments) for k, e in self._table.items()}
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

    def _entry(self, name: str) -> Entry | None:
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
        value = finish(self._expander.expand(raw, (name.lower(),), where))
        return value if value != "" else default

    def expand(self, text: str, where: Origin | None = None) -> str:
        """Expand every macro in ``text`` against this configuration."""
        return finish(self._expander.expand(text, (), where or Origin("<expression>", 0)))

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
        result = eval_literal(v)
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
        result = eval_literal(v)
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

    # ---- internals: lookups --------------------------------------------------------------------

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


def default_config_paths() -> list[Path]:
    """The shipped ``config.d/`` then ``routes/``: from the source tree, else ``sys.prefix/share``."""
    root = Path(__file__).resolve().parents[2]
    tree = [root / "config.d", root / "routes"]
    if (root / "pyproject.toml").is_file() and tree[0].is_dir():
        return tree
    share = Path(sys.prefix) / "share" / "ce-k8s"
    return [share / "config.d", share / "routes"]
