"""``routes check``: findings with file, line and the router's severity (docs/routes.md, "ce-k8s routes
check" and "Severity: errors, warnings, notes"), exit codes and ``--strict``.

The severity cases marked "stock CE" are built from HTCondor-CE's own files (tests/fixtures/stock_ce/).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ce_k8s.cli import main
from ce_k8s.condor import check
from ce_k8s.condor.check import check_config, config_diagnostics, router_diagnostics
from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.diagnostics import Diagnostic, Severity
from ce_k8s.condor.routing import RouterConfig

# Kubernetes routes (GridResource = "batch k8s"): routes check builds a trial pod only for those
# (docs/routes.md, "CEs with other backends"), and the pod builder's verdict is part of the check.
GOOD = """CE_K8S_IMAGE = registry.example.org/pilot:1
JOB_ROUTER_SOURCE_JOB_CONSTRAINT = target.JobUniverse =?= 5
JOB_ROUTER_ROUTE_Gpu @=jrt
    REQUIREMENTS (RequestGPUs ?: 0) > 0
    SET K8sNamespace "gpu"
    GridResource = "batch k8s"
@jrt
JOB_ROUTER_ROUTE_Rest @=jrt
    SET K8sNamespace "pilots"
    GridResource = "batch k8s"
@jrt
JOB_ROUTER_ROUTE_NAMES = Gpu Rest
"""


def findings(text: str) -> list[str]:
    return [str(d) for d in check_config(CondorConfig.from_text(text, "r.conf"))]


def test_good_config_has_no_findings():
    assert findings(GOOD) == []


def test_shipped_config_is_clean():
    assert [str(d) for d in check_config(CondorConfig.load())] == []


def test_unknown_keyword_is_an_error_with_file_and_line():
    assert findings(GOOD.replace('SET K8sNamespace "gpu"', "SETT K8sNamespace 1")) == [
        "r.conf:5: error: SETT is not a valid transform keyword (route Gpu is not loaded)"]


def test_an_illegal_macro_name_in_a_post_route_transform_is_an_error_at_its_line():
    """`A-B = 1` fails is_valid_param_name: Parse_macros stops, so the router fails every job the
    transform applies to (F6 in docs/real-condor.md, seen on the real 25.14.1 and 23.9.6); a name
    with `$(...)` is only known when the line runs, so it is left to `route`."""
    text = GOOD + "JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = Late\nJOB_ROUTER_TRANSFORM_Late @=jrt\n" \
                  "    A-B = 1\n    $(Dyn)_X = 2\n@jrt\n"
    static = [str(d) for d in check_config(CondorConfig.from_text(text, "r.conf")) if "Illegal" in d.message]
    assert any(line.startswith("r.conf:15: error: Late: Illegal Identifier: <A-B>: the router loads the transform")
               for line in static), static
    assert not any("$(Dyn)_X" in line for line in static)


def test_unparsable_expression_is_a_warning():
    """The router logs an expression it cannot parse and routes the job without it (ParseRulesCallback;
    HTCondor's own code does so in tests/condor/xform_oracle.py): a warning, not an error."""
    out = findings(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespace "gpu"\n    EVALSET X (1 + $(y)'))
    assert out == ["r.conf:6: warning: route Gpu: EVALSET X: unparsable expression: (1 + $(y)"]


def test_evalset_is_checked_in_new_syntax():
    """EVALSET's expression is new ClassAd syntax, where a doubled backslash is one backslash and
    the string ends at the next quote; in old syntax (SET) that quote is escaped and the string never
    ends. So the same text is fine for EVALSET and unparsable for SET."""
    text = 'strcat("a' + "\\\\" + '")'           # strcat("a\\") in the file
    assert findings(GOOD.replace('SET K8sNamespace "gpu"', f'SET K8sNamespace "gpu"\n    EVALSET X {text}')) == []
    out = findings(GOOD.replace('SET K8sNamespace "gpu"', f'SET K8sNamespace "gpu"\n    SET X {text}'))
    assert len(out) == 1 and "warning: route Gpu: SET X: unparsable expression" in out[0], out


def test_macros_are_not_reported_as_syntax_errors():
    assert findings(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespace "gpu-$(MY.Owner)"\n'
                                 "    EVALSET BatchRuntime 60 * $(default_maxWallTime:60)")) == []


def test_listed_but_undefined_is_an_error_and_a_sites_unlisted_route_a_warning():
    out = findings(GOOD.replace("NAMES = Gpu Rest", "NAMES = Gpu Ghost"))
    assert any(line.startswith("r.conf:12: error: ") and "lists Ghost, but JOB_ROUTER_ROUTE_Ghost is not defined"
               in line for line in out), out
    assert "r.conf:8: warning: route Rest is defined but not listed in JOB_ROUTER_ROUTE_NAMES, so it is disabled" in out


def test_route_shadowed_by_an_earlier_catch_all_is_a_warning():
    """First match wins, so a route after one that takes every job can never match."""
    out = findings(GOOD.replace("NAMES = Gpu Rest", "NAMES = Rest Gpu"))
    assert out == ["r.conf:3: warning: route Gpu can never match: the earlier route Rest takes every job "
                   "(no REQUIREMENTS)"]
    out = findings(GOOD.replace("(RequestGPUs ?: 0) > 0", "1 + 1 == 2"))
    assert out == ["r.conf:8: warning: route Rest can never match: the earlier route Gpu takes every job "
                   "(REQUIREMENTS 1 + 1 == 2 is always true)"]


def test_conservative_about_always_true():
    """An expression that references the job is not provably always true."""
    assert findings(GOOD.replace("(RequestGPUs ?: 0) > 0", "x =?= undefined || true")) == []


def test_target_in_route_requirements_is_a_warning():
    out = findings(GOOD.replace("(RequestGPUs ?: 0) > 0", "TARGET.RequestGPUs > 0"))
    assert len(out) == 1 and out[0].startswith("r.conf:4: warning: route Gpu: REQUIREMENTS uses TARGET.")


def test_route_name_characters_are_an_error():
    out = findings(GOOD.replace("Rest", "Rest.1"))
    assert "r.conf:8: error: route name 'Rest.1' may contain only letters, digits and '_'" in out


def test_k8s_attribute_typo_is_a_warning_and_runtime_attribute_an_error():
    out = findings(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespce "gpu"\n    SET K8sPodName "x"'))
    assert any(": warning: " in p and "K8sNamespce is not a Kubernetes attribute" in p for p in out), out
    assert any(": error: " in p and "K8sPodName is written by ce-k8s itself" in p for p in out), out


def test_pod_builder_rejection_is_an_error():
    out = findings(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespace "Not_A_Namespace"'))
    assert len(out) == 1 and out[0].startswith("r.conf:3: error: route Gpu: the pod builder rejects it (")


def test_missing_pre_route_transform_is_an_error():
    out = findings(GOOD + "JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Base\n")
    assert len(out) == 1 and out[0].startswith("r.conf:13: error: ")
    assert "JOB_ROUTER_TRANSFORM_Base" in out[0] and "not defined" in out[0]


def test_bad_regex_and_copy_target_are_warnings():
    """Both are logged by the router, which carries on with the rest of the route."""
    out = findings(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespace "gpu"\n    COPY /([a/ x\n'
                                "    RENAME A 1bad"))
    assert any(": warning: " in p and "bad regular expression" in p for p in out), out
    assert any(": warning: " in p and "new name '1bad' is not valid" in p for p in out), out


def test_problems_inside_a_route_that_is_not_enabled_are_notes():
    """The router loads only listed routes, so what is wrong inside an unlisted one changes nothing."""
    text = GOOD.replace("NAMES = Gpu Rest", "NAMES = Gpu") + (
        "JOB_ROUTER_ROUTE_Spare @=jrt\n    REQUIREMENTS TARGET.x == 1\n    GridResource = \"batch k8s\"\n"
        "    EVALSET X (1 +\n@jrt\n")
    spare = [d for d in check_config(CondorConfig.from_text(text, "r.conf")) if "Spare" in d.message]
    unlisted = [d for d in spare if "is defined but not listed" in d.message]
    inside = [d for d in spare if d not in unlisted]
    assert [d.severity for d in unlisted] == [Severity.WARNING]      # the site's own route, never tried
    assert inside and {d.severity for d in inside} == {Severity.NOTE}, inside
    assert any("unparsable expression" in d.message for d in inside)
    assert any("TARGET." in d.message for d in inside)


# -- the CLI ---------------------------------------------------------------------------------------

def test_cli_prints_severity_lines_and_a_summary_and_exits_on_errors_only(tmp_path: Path, capsys):
    good = tmp_path / "good.conf"
    good.write_text(GOOD)
    assert main(["routes", "check", "--config", str(good)]) == 0
    assert capsys.readouterr().out == ("OK: 2 route(s) in order: Gpu Rest; 0 pre-route and 0 post-route "
                                       "transform(s); 0 errors, 0 warnings, 0 notes\n")
    shadowed = tmp_path / "shadowed.conf"
    shadowed.write_text(GOOD.replace("NAMES = Gpu Rest", "NAMES = Rest Gpu"))
    assert main(["routes", "check", "--config", str(shadowed)]) == 0          # a warning alone: exit 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"{shadowed}:3: warning: route Gpu can never match: the earlier route Rest takes every "
                        "job (no REQUIREMENTS)")
    assert lines[1].startswith("OK: 2 route(s) in order: Rest Gpu;") and lines[1].endswith(
        "0 errors, 1 warning, 0 notes")
    assert main(["routes", "check", "--strict", "--config", str(shadowed)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("FAILED: ") and "1 warning" in last and "--strict" in last
    broken = tmp_path / "broken.conf"
    broken.write_text(GOOD.replace('SET K8sNamespace "gpu"', "SETT K8sNamespace 1"))
    assert main(["routes", "check", "--config", str(broken)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{broken}:5: error: SETT is not a valid transform keyword")
    assert out[-1].startswith("FAILED: ") and "1 error" in out[-1]
    assert main(["routes", "check", "--config", str(tmp_path / "missing.conf")]) == 2


# -- severities of the reader's and the router model's findings --------------------------------------

class _OldReader:
    """A configuration reader from before severities: only a ``warnings`` list of strings."""

    def __init__(self, warnings: list[str]) -> None:
        self.warnings = warnings


def test_reader_strings_are_classified_when_the_reader_has_no_diagnostics():
    cfg = _OldReader([
        "a.conf:3: 'use security: recommended' (a metaknob) is not supported; ignored",
        "a.conf:4: 'use feature: GPUs' (a metaknob) is not supported; ignored",
        "a.conf:5: LOCAL_CONFIG_FILE = /usr/share/condor-ce/condor_ce_router_defaults| is a command; ce-k8s "
        "never runs commands from the configuration, so its output is not read",
        "a.conf:6: Warning: the site said so",
    ])
    assert [(d.line, d.severity) for d in config_diagnostics(cfg)] == [
        (3, Severity.NOTE), (4, Severity.WARNING), (5, Severity.NOTE), (6, Severity.WARNING)]


def test_reader_diagnostics_are_used_as_they_are():
    class Reader:
        diagnostics = [Diagnostic("b.conf", 1, Severity.ERROR, "x")]
        warnings = ["b.conf:1: y"]
    assert config_diagnostics(Reader()) == [Diagnostic("b.conf", 1, Severity.ERROR, "x")]


def test_router_strings_are_classified_when_the_model_has_no_diagnostics():
    router = RouterConfig.from_config(CondorConfig.from_text(GOOD.replace("NAMES = Gpu Rest", "NAMES = Gpu Ghost"),
                                                             "r.conf"))

    class OldRouter:
        errors = ["r.conf:5: SETT is not a valid transform keyword (route Gpu is not loaded)"]
        warnings = ["r.conf:12: JOB_ROUTER_ROUTE_NAMES lists Ghost, but JOB_ROUTER_ROUTE_Ghost is not defined; "
                    "it is skipped",
                    "r.conf:8: route Rest is defined but not listed in JOB_ROUTER_ROUTE_NAMES, so it is disabled"]
        routes = router.routes
        disabled = router.disabled
        route_names = router.route_names
        config = router.config

    assert [(d.line, d.severity) for d in router_diagnostics(OldRouter())] == [
        (5, Severity.ERROR), (12, Severity.ERROR), (8, Severity.WARNING)]


# -- built from HTCondor-CE's own files (stock CE) ----------------------------------------------------

@pytest.fixture
def installed_ce(stock_ce, tmp_path):
    """The stock CE plus `ce-k8s install` (knobs, the shipped routes, hook launchers)."""
    assert main(["install", "--config-dir", str(stock_ce.config_dir), "--hooks-dir", str(tmp_path / "hooks")]) == 0
    return stock_ce


def _diagnostics(ce) -> list[Diagnostic]:
    return check_config(CondorConfig.load(str(ce.condor_config)))


def test_stock_ce_shipped_batch_routes_not_enabled_are_notes(installed_ce, stock_ce_layout):
    """Every 02-ce-<batch> file defines its route; after ce-k8s's routing file lists only ours, each
    of the six is defined and not enabled: a note at its definition, never a warning or error."""
    found = _diagnostics(installed_ce)
    assert max(d.severity for d in found) == Severity.NOTE, [str(d) for d in found]
    for batch, route in stock_ce_layout.BATCH_ROUTES.items():
        notes = [d for d in found if f"route {route} " in d.message]
        assert len(notes) == 1 and notes[0].severity == Severity.NOTE, (route, notes)
        assert Path(notes[0].file).name == f"02-ce-{batch}.conf" and "not enabled" in notes[0].message


def test_stock_ce_metaknob_and_router_defaults_command_are_never_above_a_note(installed_ce):
    """`use security:recommended` cannot change routing; `LOCAL_CONFIG_FILE = ...|` is a command that
    ce-k8s may not run. Whatever the reader says about them is at most a note."""
    for d in _diagnostics(installed_ce):
        if "01-common-auth-defaults.conf" in d.file or "condor_ce_router_defaults" in d.message:
            assert d.severity == Severity.NOTE, str(d)


def test_stock_ce_slurm_route_listed_first_makes_ours_unreachable_a_warning(installed_ce, capsys):
    """Enabling the CE's Slurm_Cluster (no REQUIREMENTS) in front of ours: every later route can
    never match. A warning: exit 0, and 1 with --strict."""
    installed_ce.write_site("99-local.conf", "JOB_ROUTER_ROUTE_NAMES = Slurm_Cluster $(JOB_ROUTER_ROUTE_NAMES)\n")
    found = _diagnostics(installed_ce)
    unreachable = [d for d in found if "can never match" in d.message]
    assert {d.severity for d in unreachable} == {Severity.WARNING} and len(unreachable) == 4, unreachable
    assert all("the earlier route Slurm_Cluster takes every job" in d.message for d in unreachable)
    assert not any("Slurm_Cluster" in d.message and "not enabled" in d.message for d in found)
    config = str(installed_ce.condor_config)
    assert main(["routes", "check", "--config", config]) == 0
    assert main(["routes", "check", "--strict", "--config", config]) == 1
    capsys.readouterr()


def test_stock_ce_listed_route_that_does_not_exist_is_an_error(installed_ce, capsys):
    installed_ce.write_site("99-local.conf", "JOB_ROUTER_ROUTE_NAMES = $(JOB_ROUTER_ROUTE_NAMES) Slurm_Clustr\n")
    errors = [d for d in _diagnostics(installed_ce) if d.severity == Severity.ERROR]
    assert len(errors) == 1 and "Slurm_Clustr" in errors[0].message and errors[0].file.endswith("99-local.conf")
    assert main(["routes", "check", "--config", str(installed_ce.condor_config)]) == 1
    capsys.readouterr()


def test_stock_ce_unknown_keyword_is_an_error_when_enabled_and_a_note_when_not(installed_ce):
    """The site's copy of the Slurm route with a typo: nothing happens while it is not listed; listed,
    the router refuses to load it."""
    site = installed_ce.config_dir / "02-ce-slurm.conf"
    site.write_text(site.read_text().replace('GridResource = "batch slurm"',
                                             'GridResource = "batch slurm"\n  SETT BatchQueue "long"'))
    found = _diagnostics(installed_ce)
    slurm = [d for d in found if "SETT" in d.message]
    assert slurm and {d.severity for d in slurm} == {Severity.NOTE}, slurm
    assert max(d.severity for d in found) == Severity.NOTE, [str(d) for d in found if d.severity]
    installed_ce.write_site("99-local.conf", "JOB_ROUTER_ROUTE_NAMES = $(JOB_ROUTER_ROUTE_NAMES) Slurm_Cluster\n")
    slurm = [d for d in _diagnostics(installed_ce) if "SETT" in d.message]
    assert slurm and {d.severity for d in slurm} == {Severity.ERROR}, slurm
    assert Path(slurm[0].file).name == "02-ce-slurm.conf"


def test_stock_ce_kubernetes_route_the_pod_builder_rejects_is_an_error(installed_ce):
    installed_ce.write_site("99-local.conf", "CE_K8S_NAMESPACE = Not_A_Namespace\n")
    errors = [d for d in _diagnostics(installed_ce) if d.severity == Severity.ERROR]
    assert errors and all("the pod builder rejects it" in d.message or "CE_K8S_" in d.message for d in errors)


def test_shipped_batch_route_recognised_by_name_and_file_only(stock_ce):
    """A route of the site's own in a 02-ce-* file is the site's (a warning when not listed)."""
    stock_ce.write_site("02-ce-slurm.conf", (stock_ce.config_dir / "02-ce-slurm.conf").read_text()
                        + 'JOB_ROUTER_ROUTE_Mine @=jrt\n  GridResource = "batch slurm"\n@jrt\n')
    router = RouterConfig.from_config(CondorConfig.load(str(stock_ce.condor_config)))
    by_name = {route.name: route for route in router.disabled}
    assert check.shipped_batch_route(by_name["Condor_Pool"]) == "condor"
    assert check.shipped_batch_route(by_name["Mine"]) is None
    mine = [d for d in check_config(CondorConfig.load(str(stock_ce.condor_config)), router)
            if "route Mine " in d.message]
    assert [d.severity for d in mine] == [Severity.WARNING]
