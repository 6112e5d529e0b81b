"""Which HTCondor ce-k8s models: ``--htcondor-version``, ``if version`` and old-syntax routes.

Sources: JobRouter.cpp history in htcondor/htcondor — HTCONDOR-2260 (first in 23.5.0; the 24.0
LTS series keeps it) turned ``JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES``' default from true to
false in ``JobRouter::config``; HTCONDOR-3118 ("*** 24.10.0 features" in
docs/version-history/v24-version.hist) removed the old ClassAd route syntax, so 24.10.0 and every
25.x only name ``JOB_ROUTER_ENTRIES`` in a warning. config.cpp ``Evaluate_config_if_version``
compares ``if version`` with the running HTCondor's version.
"""

from __future__ import annotations

import argparse

import pytest

from ce_k8s.condor.cli_route import add_config_arguments, load_config
from ce_k8s.condor.config import CondorConfig, installed_version, parse_version
from ce_k8s.condor.diagnostics import Severity
from ce_k8s.condor.routing import RouterConfig

ENTRIES = """\
JOB_ROUTER_ENTRIES @=jre
[ GridResource = "batch pbs"; name = "Local_PBS"; set_remote_queue = "cms"; Requirements = true; ]
@jre
JOB_ROUTER_ROUTE_NAMES = Local_PBS
"""


def write(tmp_path, text: str):
    root = tmp_path / "condor_config"
    root.write_text(text)
    return str(root)


def errors(cfg: CondorConfig) -> list:
    return [d for d in cfg.diagnostics if d.severity == Severity.ERROR]


def test_the_default_model_is_the_installed_wheel_and_it_ignores_old_entries(tmp_path):
    """25.x: JOB_ROUTER_ENTRIES is not read; routes check gets an ERROR at the knob; no job is routed."""
    assert installed_version() >= (24, 10, 0)
    root = write(tmp_path, ENTRIES)
    cfg, notes = load_config(root)
    assert cfg.version == installed_version()
    assert notes == []
    [error] = errors(cfg)
    assert (error.file, error.line) == (root, 1)
    assert "JOB_ROUTER_ENTRIES" in error.message and "'ce-k8s routes convert'" in error.message
    assert [r.name for r in RouterConfig.from_config(cfg).routes] == []


def test_htcondor_23_0_reads_old_entries_so_they_are_converted(tmp_path):
    """Before 23.5.0 JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES defaults to true."""
    cfg, notes = load_config(write(tmp_path, ENTRIES), htcondor_version=(23, 0, 0))
    assert not errors(cfg)
    assert len(notes) == 1 and "23.0.0 still reads" in notes[0]
    assert [r.name for r in RouterConfig.from_config(cfg).routes] == ["Local_PBS"]


def test_htcondor_24_0_needs_the_deprecated_entries_knob(tmp_path):
    """23.5.0 .. 24.9.x: entries only with JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES = true."""
    off, notes = load_config(write(tmp_path, ENTRIES), htcondor_version=(24, 0, 3))
    assert notes == [] and not errors(off)
    warnings = [d for d in off.diagnostics if d.severity == Severity.WARNING]
    assert len(warnings) == 1 and "JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES is false" in warnings[0].message
    assert RouterConfig.from_config(off).routes == []
    on, notes = load_config(write(tmp_path, ENTRIES + "JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES = true\n"),
                            htcondor_version=(24, 0, 3))
    assert [r.name for r in RouterConfig.from_config(on).routes] == ["Local_PBS"] and len(notes) == 1
    # HTCondor-CE 5/6 set the knob false themselves (01-ce-router-defaults.conf before HTCONDOR-3279)
    ce, _ = load_config(write(tmp_path, ENTRIES + "JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES = False\n"),
                        htcondor_version=(23, 0, 0))
    assert RouterConfig.from_config(ce).routes == []


def test_the_boundary_is_24_10_0(tmp_path):
    root = write(tmp_path, ENTRIES + "JOB_ROUTER_USE_DEPRECATED_ROUTER_ENTRIES = true\n")
    assert not errors(load_config(root, htcondor_version=(24, 9, 9))[0])
    assert errors(load_config(root, htcondor_version=(24, 10, 0))[0])


def test_if_version_follows_the_modelled_version(tmp_path):
    """The HTCondor reader cannot speak for another version where `if version` is decided
    differently: ce-k8s's own values are used and a NOTE says so (at the if line)."""
    root = write(tmp_path, "if version >= 24.10.0\n  NEW = yes\nelse\n  NEW = no\nendif\nA = 1\n")
    cfg = CondorConfig.load(root, run_commands=True, version=(23, 0, 0))
    assert cfg.get("NEW") == "no" and not cfg.read_by_htcondor
    [note] = cfg.diagnostics
    assert (note.line, note.severity) == (1, Severity.NOTE) and "23.0.0" in note.message
    same = CondorConfig.load(root, run_commands=True)
    assert same.get("NEW") == "yes" and same.read_by_htcondor and not same.diagnostics
    # a version test both versions decide alike does not stop HTCondor's reader from being used
    assert CondorConfig.load(root, run_commands=True, version=(25, 0, 0)).read_by_htcondor


@pytest.mark.parametrize("text,expected", [
    ("23.0.0", (23, 0, 0)), ("24.0", (24, 0, 0)), ("v25.14.1", (25, 14, 1)), ("25.14.1-1.el9", (25, 14, 1)),
    ("$CondorVersion: 24.0.3 2024-12-05 BuildID: 767171 PackageID: 24.0.3-1 $", (24, 0, 3)),
    # condor_ce_version (htcondor-ce src/condor_ce_version): the CE's own version comes first
    ("$HTCondorCEVersion: 25.0.1 $\n$CondorVersion: 24.0.3 2024-12-05 BuildID: 767171 $\n"
     "$CondorPlatform: x86_64_AlmaLinux9 $", (24, 0, 3)),
])
def test_version_option_accepts_what_condor_version_prints(text, expected):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert parser.parse_args(["--htcondor-version", text]).htcondor_version == expected
    assert parse_version(text) == expected


def test_version_option_rejects_nonsense():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--htcondor-version", "latest"])
    assert parser.parse_args([]).htcondor_version is None and parser.parse_args([]).no_commands is False


def test_no_commands_option_reaches_the_reader(tmp_path):
    marker = tmp_path / "ran"
    cmd = tmp_path / "cmd.sh"
    cmd.write_text(f"#!/bin/sh\ntouch {marker}\necho 'X = 1'\n")
    cmd.chmod(0o755)
    root = write(tmp_path, f"LOCAL_CONFIG_FILE = {cmd} |\n")
    cfg, _ = load_config(root, no_commands=True)
    assert not marker.exists() and cfg.raw("X") is None
    assert [(d.line, d.severity) for d in cfg.diagnostics] == [(1, Severity.NOTE)]
    cfg, _ = load_config(root)
    assert marker.exists() and cfg.raw("X") == "1"


def test_plus_equals_before_25_11_is_a_plain_assignment(tmp_path):
    """HTCONDOR-3734 added `+=` in 25.11.0; before, Parse_macros took the '+' for a stray word before
    '=' (ignored), so `X += b` replaced X. Modelling such a version, HTCondor 25's reader cannot be used."""
    root = write(tmp_path, "X = a\nX += b\nY = p\nY +,= q\n")
    old = CondorConfig.load(root, run_commands=True, version=(25, 0, 0))
    assert (old.raw("X"), old.raw("Y")) == ("b", "q")
    assert not old.read_by_htcondor
    warnings = [d for d in old.diagnostics if d.severity == Severity.WARNING]
    assert [(d.line, "replacing the value so far" in d.message) for d in warnings] == [(2, True), (4, True)]
    new = CondorConfig.load(root, run_commands=True)
    assert (new.raw("X"), new.raw("Y")) == ("a b", "p,q") and new.read_by_htcondor


def test_routes_check_and_route_take_the_options(tmp_path, capsys):
    """End to end through the CLI: the same old-syntax file fails routes check for the installed
    HTCondor (an error naming `ce-k8s routes convert`) and passes for 23.0.0, where it is converted."""
    from ce_k8s.cli import main

    root = write(tmp_path, ENTRIES)
    assert main(["routes", "check", "--config", root]) == 1
    out = capsys.readouterr().out
    assert f"{root}:1: error: JOB_ROUTER_ENTRIES is old-syntax route configuration" in out
    assert main(["routes", "check", "--config", root, "--htcondor-version", "23.0.0"]) == 0
    captured = capsys.readouterr()
    assert "1 route(s) in order: Local_PBS" in captured.out and "23.0.0 still reads" in captured.err
    ad = tmp_path / "job.ad"
    ad.write_text('ClusterId = 1\nProcId = 0\nJobUniverse = 5\nJobStatus = 1\nOwner = "u"\n')
    main(["route", "--jobads", str(ad), "--config", root, "--htcondor-version", "23.0.0", "--json"])
    assert '"route": "Local_PBS"' in capsys.readouterr().out
    main(["route", "--jobads", str(ad), "--config", root, "--json"])
    assert '"route": null' in capsys.readouterr().out
