"""HTCondor's own reader's values taken into a :class:`~ce_k8s.condor.config.CondorConfig`.

``CondorConfig.load(run_commands=True)`` also reads with HTCondor's reader in a child
(``htconfig.py``); :func:`adopt` then takes every value from it, keeping ce-k8s's origin and line
map where both readers agree (``config.py``'s module docstring says why). Also HTCondor's
``reinsert_specials`` (the knobs it sets itself after reading) and the NOTE per command whose
output was not read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ce_k8s.condor.config_types import _SPECIAL_KNOBS, Entry, Origin, installed_version
from ce_k8s.condor.diagnostics import Severity

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ce_k8s.condor import htconfig
    from ce_k8s.condor.config import CondorConfig

log = logging.getLogger("ce_k8s.condor.config")


def reinsert_specials(cfg: CondorConfig, only: str | None = None) -> None:
    """condor_config.cpp ``reinsert_specials``: once every file and ``_CONDOR_`` variable is read,
    HTCondor sets HOSTNAME, FULL_HOSTNAME, SUBSYSTEM, LOCALNAME, USERNAME, ... itself, replacing
    whatever the configuration said (it only counted for definition-time uses: ``if``, self
    references, include paths)."""
    for name in _SPECIAL_KNOBS if only is None else (only.upper(),):
        entry = cfg._table.pop(name.lower(), None)
        if entry is not None:
            cfg._diag(Severity.NOTE, entry.origin, f"{name} is set by HTCondor itself after reading the "
                      "configuration (reinsert_specials), so this setting is replaced by the detected value")


def adopt(cfg: CondorConfig, result: htconfig.HTReadResult) -> None:
    """Take every value from HTCondor's reader, keeping our origin and line map where we agree."""
    from ce_k8s.condor import htconfig

    if result.unavailable is not None:
        cfg._diag(Severity.NOTE, Origin(cfg.sources[0] if cfg.sources else "<config>", 0),
                  f"HTCondor's own reader could not run ({result.unavailable}); the values are ce-k8s's own")
        cfg._commands_skipped = "HTCondor's reader could not run"
        return
    if result.error is not None:
        where = Origin(cfg.sources[0] if cfg.sources else "<config>", 0)
        for line, command in cfg.commands:  # HTCondor names a failing command by its source text
            if command.rstrip(" |") in result.error:
                where = line
                break
        cfg._diag(Severity.ERROR, where, "HTCondor's configuration reader refuses this configuration, so the "
                  f"job router would not start: {result.error}")
        return
    if cfg._version_sensitive is not None and cfg.version != installed_version():
        cfg._diag(Severity.NOTE, cfg._version_sensitive,
                  f"this line is read differently by the installed HTCondor "
                  f"{'.'.join(map(str, installed_version()))} and the modelled "
                  f"{'.'.join(map(str, cfg.version))}, so HTCondor's reader cannot speak for the modelled "
                  "version: the values are ce-k8s's own and the configuration's commands were not run")
        cfg._commands_skipped = "HTCondor's reader could not model this version"
        return
    commands: dict[str, Origin] = {}
    for where, command in cfg.commands:
        commands.setdefault(command, where)
    table: dict[str, Entry] = {}
    for knob in result.knobs:
        if knob.source == htconfig.DETECTED_SOURCE:
            cfg._builtin_cache[knob.name.upper()] = knob.value
            if knob.name.upper() in _SPECIAL_KNOBS:
                reinsert_specials(cfg, only=knob.name)
            continue
        if result.synthetic_root is not None and knob.source == result.synthetic_root:
            continue  # the LOCAL_CONFIG_DIR line written to read a directory input
        key = knob.name.lower()
        ours = cfg._table.get(key)
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
        table[key] = Entry(ours.name if ours else knob.name, knob.value, _ht_origin(knob, commands))
    ordered = {k: table[k] for k in cfg._table if k in table}
    ordered.update((k, e) for k, e in table.items() if k not in ordered)
    cfg._table = ordered
    cfg.read_by_htcondor = True


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


def note_commands(cfg: CondorConfig) -> None:
    """A NOTE per configuration command whose output was not read (HTCondor's reader did not run)."""
    if cfg.read_by_htcondor:
        return
    for where, command in cfg.commands:
        cfg._diag(Severity.NOTE, where, f"the configuration runs the command `{command}` and reads its "
                  f"output as configuration; it was not run ({cfg._commands_skipped}), so the knobs it sets "
                  "are missing")
