"""HTCondor's own configuration reader, run in a child process: every knob as the job router stores it.

Why a child: ``htcondor2.reload_config()`` reads ``CONDOR_CONFIG`` once per process and, on a broken
configuration, prints HTCondor's error and exits the process (docs/internals.md, "ce_k8s.condor.config").
Why HTCondor's reader at all: it runs the configuration's commands (``LOCAL_CONFIG_FILE = cmd |``,
``include command : cmd``) exactly as the router does (condor_config.cpp ``process_locals`` /
``process_config_source``, config.cpp ``Open_macro_source``: argv split by ``ArgList``, no shell, the
caller's environment and working directory, a failing ``LOCAL_CONFIG_FILE`` command is fatal, the
exit status of an ``include command`` is ignored), expands metaknobs from its own table, and
applies ``+=``, ``if``/``elif`` and self references with its own code.

The child sets the subsystem to ``JOB_ROUTER`` before reading (``htcondor2.set_subsystem``), so
``$(SUBSYSTEM)`` and ``JOB_ROUTER.`` prefixed self references resolve as the router sees them, then
walks HTCondor's table with ``foreach_param`` (condor_config.cpp) and reports, for every knob, the
*raw* stored value (``hash_iter_value``: unexpanded, as ``param_unexpanded``
returns it) and where it was set (``hash_iter_meta`` + ``config_source_by_id``: file and line, the
command string for command output, and the metaknob id for knobs a ``use`` line set). These
functions take and return C types (a ``HASHITER&`` is a pointer), so ctypes can call them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: Seconds HTCondor's reader may take; a configuration command that hangs hangs the router too.
READER_TIMEOUT = 120.0
#: HTCondor's name for the built-in values it detects (hostnames, OS, ...).
DETECTED_SOURCE = "<Detected>"
#: HTCondor's name for its param table; a file that sets a knob to its default value is recorded so.
DEFAULT_SOURCE = "<Default>"
ENVIRONMENT_SOURCE = "<Environment>"

# Runs in ``python -I``: imports only htcondor2, ctypes, glob, json, os, sys.
_CHILD = r"""
import sys
try:
    import ctypes, glob, json, os
    import htcondor2  # reads CONDOR_CONFIG, which the parent set to /dev/null: nothing runs twice
    htcondor2.set_subsystem(sys.argv[1])
except Exception as exc:
    sys.stderr.write("cannot start HTCondor's reader: %r" % (exc,))
    sys.exit(%(unavailable)d)
os.environ["CONDOR_CONFIG"] = sys.argv[2]  # what the configuration's commands see, as on the CE
htcondor2.reload_config()  # on a configuration it refuses, HTCondor prints why and exits 1
try:
    libs = os.path.join(os.path.dirname(os.path.dirname(htcondor2.__file__)), "htcondor.libs")
    lib = ctypes.CDLL(sorted(glob.glob(os.path.join(libs, "libcondor_utils*.so*")))[0])
except Exception as exc:
    sys.stderr.write("cannot load libcondor_utils: %r" % (exc,))
    sys.exit(%(unavailable)d)

class Meta(ctypes.Structure):
    _fields_ = [("param_id", ctypes.c_short), ("index", ctypes.c_short), ("flags", ctypes.c_int),
                ("source_id", ctypes.c_short), ("source_line", ctypes.c_short),
                ("source_meta_id", ctypes.c_short), ("source_meta_off", ctypes.c_short)]

def fn(name, restype, *argtypes):
    try:
        f = getattr(lib, name)
    except AttributeError:
        sys.stderr.write("libcondor_utils has no %s" % name)
        sys.exit(%(unavailable)d)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f

key = fn("_Z13hash_iter_keyR8HASHITER", ctypes.c_char_p, ctypes.c_void_p)
value = fn("_Z15hash_iter_valueR8HASHITER", ctypes.c_char_p, ctypes.c_void_p)
meta = fn("_Z14hash_iter_metaR8HASHITER", ctypes.POINTER(Meta), ctypes.c_void_p)
source = fn("_Z19config_source_by_idi", ctypes.c_char_p, ctypes.c_int)
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_void_p)
each = fn("_Z13foreach_paramiPFbPvR8HASHITERES_", None, ctypes.c_int, CALLBACK, ctypes.c_void_p)
dec = lambda b: None if b is None else b.decode("utf-8", "surrogateescape")
rows = []

def visit(user, it):
    m = meta(it)
    where = m.contents if m else None
    rows.append([dec(key(it)), dec(value(it)), dec(source(where.source_id)) if where else None,
                 where.source_line if where else 0, where.source_meta_id if where else -1])
    return True

each(0, CALLBACK(visit), None)  # defaults too: a file setting a knob to its default is recorded as one
sys.stdout.write(json.dumps({"version": htcondor2.version(), "knobs": rows}))
"""
#: The child's exit status when HTCondor's reader cannot run at all (not HTCondor refusing the configuration).
UNAVAILABLE_STATUS = 3
_CHILD = _CHILD.replace("%(unavailable)d", str(UNAVAILABLE_STATUS))


@dataclass(frozen=True)
class HTKnob:
    """One knob as HTCondor stored it: raw value and the source (file or ``cmd |``) and line."""

    name: str
    value: str
    source: str
    line: int
    meta_id: int = -1  # >= 0 when a metaknob (``use CATEGORY : NAME``) set it


@dataclass
class HTReadResult:
    """What HTCondor's reader found; ``error`` holds HTCondor's own message when it refused."""

    knobs: list[HTKnob] = field(default_factory=list)
    error: str | None = None
    unavailable: str | None = None  # why HTCondor's reader could not run at all (no wheel, no symbol)
    version: str | None = None
    synthetic_root: str | None = None  # the root file written for a directory input (not the CE's)


class PendingRead:
    """A running reader: start it before our own parse so both use the two cores at once."""

    def __init__(self, proc: subprocess.Popen[bytes], tmpdir: tempfile.TemporaryDirectory[str] | None,
                 root: str | None) -> None:
        self._proc = proc
        self._tmpdir = tmpdir
        self._root = root

    def cancel(self) -> None:
        """End the reader and every command it started (they share a process group, which a
        terminal's Ctrl-C does not reach: the child runs in its own session)."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # pragma: no cover - it ended meanwhile
            pass
        self._proc.communicate()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()

    def result(self, timeout: float | None = None) -> HTReadResult:
        timeout = READER_TIMEOUT if timeout is None else timeout
        try:
            out, err = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # end them all, or a command holding our stderr would keep communicate() waiting
            self.cancel()
            return HTReadResult(error=f"HTCondor's configuration reader did not finish in {timeout:g} s "
                                "(a configuration command may hang)", synthetic_root=self._root)
        except BaseException:  # Ctrl-C while waiting: leave nothing running behind us
            self.cancel()
            raise
        finally:
            if self._tmpdir is not None:
                self._tmpdir.cleanup()
        message = err.decode("utf-8", "replace").strip()
        if self._proc.returncode == UNAVAILABLE_STATUS:
            return HTReadResult(unavailable=message or "HTCondor's reader could not start",
                                synthetic_root=self._root)
        if self._proc.returncode != 0:
            return HTReadResult(error=message or f"HTCondor's configuration reader exited with status "
                                f"{self._proc.returncode}", synthetic_root=self._root)
        try:
            data = json.loads(out.decode("utf-8", "surrogateescape"))
        except ValueError:
            return HTReadResult(error=f"HTCondor's configuration reader printed no result: {message}",
                                synthetic_root=self._root)
        if message:
            log.debug("HTCondor's configuration reader said: %s", message)
        knobs = [HTKnob(row[0], row[1] if row[1] is not None else "", row[2] or "", int(row[3] or 0), int(row[4]))
                 for row in data["knobs"]]
        return HTReadResult(knobs, version=data.get("version"), synthetic_root=self._root)


def start_reader(root: str | None = None, dirs: Sequence[Path] = (), *, environ: Mapping[str, str] | None = None,
                 subsystem: str = "JOB_ROUTER") -> PendingRead:
    """Start HTCondor's reader on a root config file, or on directories read as ``LOCAL_CONFIG_DIR``.

    A directory input (``--config DIR`` or the shipped default) has no root file, so a temporary one
    holding only ``LOCAL_CONFIG_DIR = <dirs>`` is written; its own knob is reported with
    ``synthetic_root`` so the caller can drop it. The child inherits ``environ`` (default: ours) and
    our working directory, as a command run by the router inherits the router's; only
    ``CONDOR_CONFIG`` is set (to the root, as the CE's wrappers set it).
    """
    tmpdir = None
    if root is None:
        tmpdir = tempfile.TemporaryDirectory(prefix="ce-k8s-config-")
        root = os.path.join(tmpdir.name, "condor_config")
        Path(root).write_text("LOCAL_CONFIG_DIR = " + ", ".join(str(d) for d in dirs) + "\n", encoding="utf-8")
        synthetic: str | None = root
    else:
        synthetic = None
    env = dict(os.environ if environ is None else environ)
    # importing htcondor2 already reads CONDOR_CONFIG (and would run its commands a first time):
    # the child imports it with no configuration and then points CONDOR_CONFIG at the real one
    env["CONDOR_CONFIG"] = "/dev/null"
    proc = subprocess.Popen([sys.executable, "-I", "-c", _CHILD, subsystem, str(root)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    return PendingRead(proc, tmpdir, synthetic)


def read(root: str | None = None, dirs: Sequence[Path] = (), *, environ: Mapping[str, str] | None = None,
         subsystem: str = "JOB_ROUTER") -> HTReadResult:
    """``start_reader(...).result()``."""
    return start_reader(root, dirs, environ=environ, subsystem=subsystem).result()


# ---- HTCondor's metaknob table, in-process ------------------------------------------------------


class MetaknobsUnavailable(Exception):
    """The installed wheel's libcondor_utils (HTCondor's metaknob table) cannot be loaded."""


_meta_functions: tuple[object, object, object] | None = None


def _metaknob_functions() -> tuple[object, object, object]:
    """``param_meta_table``, ``param_meta_value`` and ``param_default_string`` (param_info.cpp) from
    the wheel's libcondor_utils.

    They take and return plain C types (a table is an opaque pointer), so ctypes calls them without
    HTCondor's configuration being loaded: the metaknob and default tables are compiled into the library.
    """
    global _meta_functions
    if _meta_functions is None:
        import ctypes
        import glob

        try:
            import classad2

            libs = os.path.join(os.path.dirname(os.path.dirname(classad2.__file__)), "htcondor.libs")
            found = sorted(glob.glob(os.path.join(libs, "libcondor_utils*.so*")))
            if not found:
                raise OSError(f"no libcondor_utils in {libs}")
            lib = ctypes.CDLL(found[0])
            table = lib._Z16param_meta_tablePKcPi
            value = lib._Z16param_meta_valuePKcS0_Pi
            default = lib._Z20param_default_stringPKcS0_
        except (ImportError, OSError, AttributeError) as exc:
            raise MetaknobsUnavailable(str(exc)) from exc
        table.restype = ctypes.c_void_p
        table.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        value.restype = ctypes.c_char_p
        value.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p]
        default.restype = ctypes.c_char_p
        default.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        _meta_functions = (table, value, default)
    return _meta_functions


def _c_string(text: str) -> bytes | None:
    """``text`` for a C string argument; None when it cannot be one (a NUL: no HTCondor name has one)."""
    if "\0" in text:
        return None
    return text.encode("utf-8", "replace")


def metaknob_category_exists(category: str) -> bool:
    """Whether HTCondor knows the metaknob category (``if defined use CATEGORY``)."""
    table, _value, _default = _metaknob_functions()
    c_category = _c_string(category)
    return c_category is not None and bool(table(c_category, None))  # type: ignore[operator]


def metaknob_text(category: str, name: str) -> str | None:
    """The raw text of ``use CATEGORY : NAME`` from HTCondor's table, or None when it has no such metaknob."""
    _table, value, _default = _metaknob_functions()
    c_category, c_name = _c_string(category), _c_string(name)
    if c_category is None or c_name is None:
        return None
    text = value(c_category, c_name, None)  # type: ignore[operator]
    return None if text is None else text.decode("utf-8", "surrogateescape")


def param_default(name: str, subsystem: str | None = "JOB_ROUTER") -> str | None:
    """HTCondor's built-in default for a knob (raw; the subsystem's own default first), or None: what
    a self reference or ``+=`` finds when no configuration line set the knob yet (config.cpp ``lookup_macro``)."""
    _table, _value, default = _metaknob_functions()
    c_name = _c_string(name)
    if c_name is None:
        return None
    text = default(c_name, _c_string(subsystem) if subsystem else None)  # type: ignore[operator]
    return None if text is None else text.decode("utf-8", "surrogateescape")
