"""Reading HTCondor configuration sources into a :class:`~ce_k8s.condor.config.CondorConfig`.

config.cpp ``Parse_macros`` and ``getline_implementation`` (logical lines, ``NAME = value``,
``+=``, ``@=`` blocks, ``include``, ``use``, ``error``/``warning``), condor_config.cpp's
``LOCAL_CONFIG_DIR``/``LOCAL_CONFIG_FILE`` and the ``_CONDOR_`` environment; the rules are listed in
``config.py``'s module docstring. A :class:`ConfigReader` is the part of a configuration that
writes its table; the if statements are ``config_if.py``'s, macro expansion ``config_expand.py``'s.
Errors are :class:`~ce_k8s.condor.config_types.ConfigError`, naming file and line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ce_k8s.condor.config_if import _IF_RE, Conditionals, _IfFrame
from ce_k8s.condor.config_metaknobs import _META_ARG, _expand_meta_args, _metaknob_items
from ce_k8s.condor.config_types import (
    _NAME_RE,
    _WS,
    BUILTIN_ORIGIN_FILE,
    PLUS_EQUALS_SINCE,
    ConfigError,
    Entry,
    Origin,
    Segments,
    installed_version,
)
from ce_k8s.condor.diagnostics import Severity

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import CondorConfig

log = logging.getLogger("ce_k8s.condor.config")

_MAX_INCLUDE_DEPTH = 20
_LIST_SPLIT = re.compile(r"[\s,]+")
_PLUS_SEPARATORS = ",;|&*"  # config.cpp CONFIG_PLUS_SEP_CHARSET: allowed between '+' and '=' of '+='


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


class ConfigReader:
    """Reads sources into ``cfg``'s table. ``pin``: while a metaknob's text is read, the ``use``
    line every knob it sets is placed at."""

    def __init__(self, cfg: CondorConfig) -> None:
        self.cfg = cfg
        self.pin: Origin | None = None
        self.conditionals = Conditionals(self)

    def insert(self, name: str, value: str, origin: Origin, lines: tuple[tuple[int, str], ...] | None,
               segments: Segments = ()) -> None:
        if self.pin is not None:  # set by a metaknob's text: placed at the `use` line
            origin, lines, segments = self.pin, None, ()
        key = name.lower()
        entry = self.cfg._table.get(key)
        if entry is None:
            self.cfg._table[key] = Entry(name, value, origin, lines, segments)
        else:
            entry.value, entry.origin, entry.lines, entry.segments = value, origin, lines, segments


    def read_file(self, path: Path, depth: int) -> None:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(str(path), 0, f"can't open file {path}: {exc.strerror}") from exc
        self.cfg.sources.append(str(path))
        self.read_source(str(path), text, depth)

    def _exclude_regexp(self) -> re.Pattern[str]:
        pattern = self.cfg.get("LOCAL_CONFIG_DIR_EXCLUDE_REGEXP") or ""
        try:
            return re.compile(pattern)
        except re.error as exc:
            where = self.cfg.origin("LOCAL_CONFIG_DIR_EXCLUDE_REGEXP") or Origin(BUILTIN_ORIGIN_FILE, 0)
            raise ConfigError(where.file, where.line, f"LOCAL_CONFIG_DIR_EXCLUDE_REGEXP: {exc}") from exc

    def read_dir(self, directory: Path, where: Origin | None) -> None:
        """Every file in the directory not excluded, in byte order of the path (condor_config.cpp)."""
        exclude = self._exclude_regexp()
        try:
            entries = list(directory.iterdir())
        except OSError as exc:
            if where is None:
                raise ConfigError(str(directory), 0, f"cannot open directory: {exc.strerror}") from exc
            self.cfg._diag(Severity.NOTE, where, f"cannot open LOCAL_CONFIG_DIR {directory}: {exc.strerror}; "
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
            self.read_file(Path(file), 0)

    def read_locals(self) -> None:
        """LOCAL_CONFIG_DIR, then LOCAL_CONFIG_FILE, then LOCAL_CONFIG_DIR again if it changed."""
        before = self.cfg.get("LOCAL_CONFIG_DIR")
        if before:
            self._read_dirs(before)
        self._read_local_files()
        after = self.cfg.get("LOCAL_CONFIG_DIR")
        if after and after != before:
            self._read_dirs(after)

    def _read_dirs(self, value: str) -> None:
        where = self.cfg.origin("LOCAL_CONFIG_DIR") or Origin("<LOCAL_CONFIG_DIR>", 0)
        for d in _split_list(value):
            path = Path(d)
            if not path.is_dir():
                self.cfg._diag(Severity.NOTE, where, f"LOCAL_CONFIG_DIR {d} is not a directory; HTCondor skips it")
                continue
            self.read_dir(path, where)

    def _read_local_files(self) -> None:
        value = self.cfg.get("LOCAL_CONFIG_FILE")
        if not value:
            return
        done: list[str] = []
        remaining: list[str] = []
        while True:
            where = self.cfg.origin("LOCAL_CONFIG_FILE") or Origin("<LOCAL_CONFIG_FILE>", 0)
            if "|" in value:
                # condor_config.cpp process_locals: a value with a '|' is one command, not a list
                command = value.strip(_WS)
                if not command.endswith("|"):
                    raise ConfigError(where.file, where.line, f"LOCAL_CONFIG_FILE = {command}: not a valid command, "
                                      "| must be at the end")
                self.cfg.commands.append((where, command))
                return
            remaining = [s for s in _split_list(value) if s not in done]
            if not remaining:
                return
            source = remaining[0]
            path = Path(source)
            if path.is_file():
                self.read_file(path, 0)
            elif self.cfg.get_bool("REQUIRE_LOCAL_CONFIG_FILE", True):
                raise ConfigError(where.file, where.line, f"can't read config source {source}")
            done.append(source)
            value = self.cfg.get("LOCAL_CONFIG_FILE") or ""

    def apply_environment(self) -> None:
        for key, value in self.cfg._environ.items():
            if len(key) > 8 and key[:8].lower() == "_condor_":
                name = key[8:]
                if not _NAME_RE.fullmatch(name):
                    continue
                origin = Origin("<environment>", 0)
                self.insert(name, self.cfg._expander.expand_self(value, name, origin), origin, None)

    def read_source(self, src: str, text: str, depth: int) -> None:
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
                    value = self.cfg._expander.expand_self("\n".join(t for _, t in here_lines), name, origin)
                    self.insert(name, value, origin, tuple(here_lines), tuple(here_segs))
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
                self.conditionals.statement(ifs, kw.group(1).lower(), line[kw.end() :], src, lineno)
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
                self.cfg._diag(Severity.NOTE, origin, f"use {category} : {knob} was not expanded: HTCondor's metaknob "
                               f"table could not be loaded ({exc}); the knobs it sets are missing")
                continue
            if text is None:
                raise ConfigError(origin.file, origin.line, f"use {category}: does not recognise {knob}")
            if self.cfg.version[:2] != installed_version()[:2]:
                self.cfg._diag(Severity.NOTE, origin, f"use {category} : {knob} is expanded from the metaknob table of "
                               f"the installed HTCondor {'.'.join(map(str, installed_version()))}, not from "
                               f"{'.'.join(map(str, self.cfg.version))}'s")
            if args is not None or _META_ARG.search(text):
                text = _expand_meta_args(text, args or "")
            previous = self.pin
            self.pin = previous or Origin(origin.file, origin.line, f"use {category} : {knob}")
            try:
                self.read_source(f"<use {category}:{knob}>", text, depth + 1)
            finally:
                self.pin = previous

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
            self._use(origin, self.cfg.expand(extra, origin) if "$" in extra else extra, rhs, depth)
            return None
        if op == ":" and keyword == "error":
            raise ConfigError(src, lineno, f"Error: {self.cfg.expand(rhs, origin)}")
        if op == ":" and keyword == "warning":
            self.cfg._diag(Severity.WARNING, origin, f"Warning: {self.cfg.expand(rhs, origin)}")
            return None
        if op == ":":
            self.cfg._diag(Severity.WARNING, origin, f"obsolete use of ':' for parameter assignment at {name} : {rhs}")
        if extra:
            self.cfg._diag(Severity.WARNING, origin, f"text {extra!r} between {name} and '{op}' is ignored")
        if "$" in name:
            name = self.cfg.expand(name, origin)
        if not _NAME_RE.fullmatch(name):
            raise ConfigError(src, lineno, f"illegal identifier: <{name}>")
        if op == "@":
            return (name, rhs, origin)
        segments = _shift(segs, len(line) - len(rhs))
        if op == "+" and self.cfg.version < PLUS_EQUALS_SINCE:
            # before 25.11.0 the '+' (and a separator) was a stray word before '=' (ignored): X = text
            op = "="
            self.cfg._diag(Severity.WARNING, origin,
                           f"HTCondor {'.'.join(map(str, self.cfg.version))} has no '+=' "
                           f"(it came in {'.'.join(map(str, PLUS_EQUALS_SINCE))}): it reads this line as "
                           f"{name} = {rhs}, replacing the value so far")
            if installed_version() >= PLUS_EQUALS_SINCE and self.cfg._version_sensitive is None:
                self.cfg._version_sensitive = origin
        if op == "+":
            previous = self.cfg._expander.previous(name)  # lookup_macro: the knob's value, else its default
            if previous:
                joint = f" {plus_sep} " if len(plus_sep) == 2 else (plus_sep or " ")
                prefix = previous + joint
                rhs = prefix + rhs
                segments = ((0, lineno), *((off + len(prefix), ln) for off, ln in segments))
        self.insert(name, self.cfg._expander.expand_self(rhs, name, origin), origin, None, segments)
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
        target = self.cfg.expand(rhs, Origin(src, lineno)).strip(_WS)
        if into is not None:
            # Parse_macros: the FILE is read if it exists (the command is not run); else HTCondor runs
            # the command and keeps its output there (Copy_macro_source_into)
            if into.endswith("|"):
                raise ConfigError(src, lineno, "destination for 'include into' may not be a script")
            cache = self.cfg.expand(into, Origin(src, lineno)).strip(_WS)
            if not cache:
                raise ConfigError(src, lineno, "destination for 'include into' expanded to ''")
            if Path(cache).is_file():
                if depth + 1 >= _MAX_INCLUDE_DEPTH:
                    raise ConfigError(src, lineno, "includes nested too deep")
                self.read_file(Path(cache), depth + 1)
                return
        if is_command or "|" in target:
            # config.cpp fixup_pipe_source / Open_macro_source: `include command : cmd` is named
            # "cmd |"; a source with a '|' is a command only if it ends with one
            if "|" not in target:
                target += " |"
            elif not target.endswith("|"):
                raise ConfigError(src, lineno, "not a valid command, | must be at the end")
            self.cfg.commands.append((Origin(src, lineno), target))
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
        self.read_file(path, depth + 1)

