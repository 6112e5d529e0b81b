"""``userMap()`` for transforms: the CE's map files, loaded into HTCondor's own userMap table.

HTCondor-CE's accounting-group recipes (``UidAcctGroup``, ``x509AcctGroup``) call the ClassAd
function ``userMap("<name>", <input>)``. The job router loads the maps it may use when it
reconfigures (classad_usermap.cpp, ``reconfig_user_maps``): the names in
``JOB_ROUTER_CLASSAD_USER_MAP_NAMES`` (the subsystem's ``<SUBSYS>_CLASSAD_USER_MAP_NAMES``), each
from ``CLASSAD_USER_MAPFILE_<name>`` or, failing that, the inline ``CLASSAD_USER_MAPDATA_<name>``.

We do not re-implement the map-file format or the function: the ``htcondor2`` wheel has both
(``load_a_config_usermap_file``; classad2 evaluation sees ``userMap`` once htcondor2 is imported).
The table is process-wide, so ``activate`` reloads it whenever a different configuration's maps
are wanted; the names and paths come from the CE configuration being read, never from the
process's own HTCondor configuration.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from ce_k8s.condor.diagnostics import Diagnostic, Severity

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor.config import CondorConfig, Origin

log = logging.getLogger(__name__)

NAMES_KNOB = "JOB_ROUTER_CLASSAD_USER_MAP_NAMES"

_active: tuple[UserMap, ...] | None = None


@dataclass(frozen=True)
class UserMap:
    """One map: its name, and the file or the inline data it comes from (with the knob's place)."""

    name: str
    path: str | None
    data: str | None
    file: str
    line: int


def _place(cfg: CondorConfig, knob: str) -> tuple[str, int]:
    origin: Origin | None = cfg.origin(knob)
    return (origin.file, origin.line) if origin is not None else ("<config>", 0)


def read_user_maps(cfg: CondorConfig) -> tuple[list[UserMap], list[Diagnostic]]:
    """The maps the job router of this configuration loads, and what is wrong with them."""
    maps: list[UserMap] = []
    found: list[Diagnostic] = []
    names = [n for n in re.split(r"[\s,]+", cfg.get(NAMES_KNOB) or "") if n]
    for name in names:
        file_knob = f"CLASSAD_USER_MAPFILE_{name}"
        data_knob = f"CLASSAD_USER_MAPDATA_{name}"
        path = (cfg.get(file_knob) or "").strip()
        if path:
            maps.append(UserMap(name, path, None, *_place(cfg, file_knob)))
            continue
        data = cfg.get(data_knob)
        if data is not None and data.strip():
            maps.append(UserMap(name, None, data, *_place(cfg, data_knob)))
            continue
        file, line = _place(cfg, NAMES_KNOB)
        found.append(Diagnostic(file, line, Severity.WARNING,
                                f"{NAMES_KNOB} names {name}, but neither {file_knob} nor {data_knob} is set: "
                                f'userMap("{name}", ...) is undefined for every job'))
    return maps, found


def activate(maps: list[UserMap]) -> list[Diagnostic]:
    """Make ``maps`` the process's userMap table (a no-op when they already are)."""
    global _active
    key = tuple(maps)
    if key == _active:
        return []
    if not key and not _active:
        _active = key  # nothing loaded and nothing wanted: no need to import htcondor2 at all
        return []
    import htcondor2

    # With no <SUBSYS>_CLASSAD_USER_MAP_NAMES in the process configuration this empties the table.
    htcondor2.reload_config_usermaps()
    found: list[Diagnostic] = []
    for entry in maps:
        problem = _load(htcondor2, entry)
        if problem:
            found.append(Diagnostic(entry.file, entry.line, Severity.WARNING,
                                    f'cannot load userMap "{entry.name}": {problem}; userMap("{entry.name}", ...) '
                                    "is undefined for every job"))
    _active = key
    return found


def _load(htcondor2: ModuleType, entry: UserMap) -> str | None:
    if entry.path is not None:
        try:
            htcondor2.load_a_config_usermap_file(entry.name, entry.path)
        except htcondor2.HTCondorException as exc:
            return str(exc)
        return None
    fd, path = tempfile.mkstemp(prefix="ce-k8s-usermap-", suffix=".map")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(entry.data or "")
        htcondor2.load_a_config_usermap_file(entry.name, path)
    except htcondor2.HTCondorException as exc:
        return str(exc)
    finally:
        os.unlink(path)
    return None
