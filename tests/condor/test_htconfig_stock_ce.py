"""A stock HTCondor-CE (tests/fixtures/stock_ce) read as its job router reads it.

HTCondor-CE's 01-ce-router-defaults.conf says ``LOCAL_CONFIG_FILE =
/usr/share/condor-ce/condor_ce_router_defaults|``: the router runs that program and reads the
``Env`` post-route transform from its output (htcondor-ce src/condor_ce_router_defaults), and
01-common-auth-defaults.conf uses the ``security:recommended`` metaknob. Both only exist for a reader
that runs commands and expands metaknobs as HTCondor does.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from ce_k8s.condor.cli_route import load_config
from ce_k8s.condor.config import CondorConfig, Origin
from ce_k8s.condor.diagnostics import Severity
from ce_k8s.condor.routing import RouterConfig
from tests.fixtures.stock_ce import copy_stock_ce

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@pytest.fixture
def ce(tmp_path):
    return copy_stock_ce(tmp_path / "ce")


def command_line(ce) -> Origin:
    path = ce.defaults_dir / "01-ce-router-defaults.conf"
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("LOCAL_CONFIG_FILE"):
            return Origin(str(path), number)
    raise AssertionError("no LOCAL_CONFIG_FILE line")


def program_transform(ce, env: dict[str, str]) -> str:
    """The Env body as the program prints it, read the way config.cpp getline reads lines."""
    out = subprocess.run([str(ce.router_defaults)], env=env, capture_output=True, text=True, check=True).stdout
    body = out.split("JOB_ROUTER_TRANSFORM_Env @=jrt\n", 1)[1].split("\n@jrt", 1)[0]
    lines, pending = [], ""
    for raw in body.split("\n"):
        part = raw.strip()
        if pending:
            part = pending + part
            pending = ""
        if part.endswith("\\"):
            pending = part[:-1]
            continue
        if part and not part.startswith("#"):
            lines.append(part)
    return "\n".join(lines)


def test_env_transform_comes_from_the_router_defaults_program(ce):
    cfg = CondorConfig.load(ce.condor_config, run_commands=True, environ=ENV)
    assert cfg.read_by_htcondor
    assert cfg.raw("JOB_ROUTER_TRANSFORM_Env") == program_transform(ce, ENV)
    origin = cfg.origin("JOB_ROUTER_TRANSFORM_Env")
    assert origin == command_line(ce)
    assert origin.via.startswith("line ") and origin.via.endswith(f"of the output of `{ce.router_defaults}|`")
    assert cfg.raw("JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES").split()[-1] == "Env"
    router = RouterConfig.from_config(cfg)
    assert "Env" in [t.name for t in router.post_transforms]
    assert not [d for d in cfg.diagnostics if d.severity >= Severity.WARNING]


def test_the_program_sees_the_environment(ce):
    """advertise_pilots_value(): DISABLE_GLIDEIN_ADS=true makes the EVALMACRO default empty."""
    env = {**ENV, "DISABLE_GLIDEIN_ADS": "true"}
    cfg = CondorConfig.load(ce.condor_config, run_commands=True, environ=env)
    assert cfg.raw("JOB_ROUTER_TRANSFORM_Env").splitlines()[0] == 'EVALMACRO default_env ""'
    plain = CondorConfig.load(ce.condor_config, run_commands=True, environ=ENV)
    assert plain.raw("JOB_ROUTER_TRANSFORM_Env").splitlines()[0].startswith("EVALMACRO default_env ifThenElse(")


def test_no_commands_leaves_env_out_and_says_where(ce):
    cfg, _notes = load_config(str(ce.condor_config), no_commands=True)
    assert cfg.raw("JOB_ROUTER_TRANSFORM_Env") is None
    assert "Env" not in cfg.raw("JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES").split()
    notes = [d for d in cfg.diagnostics if d.severity == Severity.NOTE and "not run" in d.message]
    where = command_line(ce)
    assert [(d.file, d.line) for d in notes] == [(where.file, where.line)]
    assert str(ce.router_defaults) in notes[0].message


def test_security_metaknob_is_expanded_in_both_readers(ce):
    auth = ce.defaults_dir / "01-common-auth-defaults.conf"
    use_line = next(n for n, line in enumerate(auth.read_text().splitlines(), 1) if line.lower().startswith("use "))
    for run_commands in (False, True):
        cfg = CondorConfig.load(ce.condor_config, run_commands=run_commands, environ=ENV)
        knob = "SEC_DEFAULT_ENCRYPTION"
        assert cfg.raw(knob) is not None
        assert cfg.origin(knob) == Origin(str(auth), use_line)
        assert not [d for d in cfg.diagnostics if "was not expanded" in d.message or "not supported" in d.message]


def test_stock_ce_readers_agree_apart_from_the_command(ce):
    ours = CondorConfig.load(ce.condor_config, environ=ENV, detected_specials=True)
    theirs = CondorConfig.load(ce.condor_config, run_commands=True, environ=ENV)
    mine = ours.raw_items()
    htc = theirs.raw_items()
    differing = {k for k in set(mine) | set(htc) if mine.get(k) != htc.get(k)}
    assert differing == {"job_router_transform_env", "job_router_post_route_transform_names"}
