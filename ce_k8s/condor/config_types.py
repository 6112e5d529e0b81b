"""The configuration reader's vocabulary: where a knob was set, errors naming file and line, versions.

Shared by ``config.py`` (:class:`~ce_k8s.condor.config.CondorConfig`, which re-exports the public
names) and its parts (``config_reader.py``, ``config_expand.py``, ``config_if.py``,
``config_adopt.py``): a knob's table entry, the HTCondor version modelled, and the few built-in
defaults ce-k8s relies on when no file sets them.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import classad2

log = logging.getLogger("ce_k8s.condor.config")

_WS = " \t\n\v\f\r"  # C isspace()
_NAME_RE = re.compile(r"[A-Za-z0-9_./]+")
#: knobs HTCondor sets itself after reading the configuration (condor_config.cpp reinsert_specials)
_SPECIAL_KNOBS = ("TILDE", "HOSTNAME", "FULL_HOSTNAME", "SUBSYSTEM", "LOCALNAME", "USERNAME", "REAL_UID", "REAL_GID",
                  "PID", "PPID", "IP_ADDRESS", "IP_ADDRESS_IS_IPV6")

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



Segments = tuple[tuple[int, int], ...]


@dataclass
class Entry:
    """One knob in a configuration's table."""

    name: str  # spelling of the first definition (HTCondor keeps the first key)
    value: str  # raw (unexpanded, self references already resolved)
    origin: Origin
    lines: tuple[tuple[int, str], ...] | None = None  # @= blocks: (file line, kept text) per line
    segments: tuple[tuple[int, int], ...] = ()  # (offset in value, file line) where each physical line starts

