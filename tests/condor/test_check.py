"""``routes check`` (issue 2 item 7; jobrouter-protocol.md §4.1, §4.4; htcondor-ce.md §1.7)."""

from __future__ import annotations

from pathlib import Path

from ce_k8s.cli import main
from ce_k8s.condor.check import check_config
from ce_k8s.condor.config import CondorConfig

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


def problems(text: str) -> list[str]:
    return [str(p) for p in check_config(CondorConfig.from_text(text, "r.conf"))]


def test_good_config_has_no_problems():
    assert problems(GOOD) == []


def test_shipped_config_is_clean():
    assert [str(p) for p in check_config(CondorConfig.load())] == []


def test_unknown_keyword_with_file_and_line_section_4_1():
    assert problems(GOOD.replace('SET K8sNamespace "gpu"', "SETT K8sNamespace 1")) == [
        "r.conf:5: SETT is not a valid transform keyword (route Gpu is not loaded)"]


def test_unparsable_expression_section_4_1():
    out = problems(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespace "gpu"\n    EVALSET X (1 + $(y)'))
    assert out == ["r.conf:6: route Gpu: EVALSET X: unparsable expression: (1 + $(y)"]


def test_macros_are_not_reported_as_syntax_errors():
    assert problems(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespace "gpu-$(MY.Owner)"\n'
                                 "    EVALSET BatchRuntime 60 * $(default_maxWallTime:60)")) == []


def test_listed_but_undefined_and_defined_but_unlisted_section_4_1():
    out = problems(GOOD.replace("NAMES = Gpu Rest", "NAMES = Gpu Ghost"))
    assert ("r.conf:12: JOB_ROUTER_ROUTE_NAMES lists Ghost, but JOB_ROUTER_ROUTE_Ghost is not defined; "
            "it is skipped") in out
    assert ("r.conf:8: route Rest is defined but not listed in JOB_ROUTER_ROUTE_NAMES, so it is disabled") in out


def test_route_shadowed_by_an_earlier_catch_all_section_4_4():
    """§4.4: first match wins, so a route after one without REQUIREMENTS can never match."""
    out = problems(GOOD.replace("NAMES = Gpu Rest", "NAMES = Rest Gpu"))
    assert out == ["r.conf:3: route Gpu can never match: the earlier route Rest takes every job (no REQUIREMENTS)"]
    out = problems(GOOD.replace("(RequestGPUs ?: 0) > 0", "1 + 1 == 2").replace(
        "NAMES = Gpu Rest", "NAMES = Gpu Rest"))
    assert out == ["r.conf:8: route Rest can never match: the earlier route Gpu takes every job "
                   "(REQUIREMENTS 1 + 1 == 2 is always true)"]


def test_conservative_about_always_true():
    """An expression that references the job is not provably always true."""
    assert problems(GOOD.replace("(RequestGPUs ?: 0) > 0", "x =?= undefined || true")) == []


def test_target_in_route_requirements_warns_section_4_4():
    out = problems(GOOD.replace("(RequestGPUs ?: 0) > 0", "TARGET.RequestGPUs > 0"))
    assert len(out) == 1 and out[0].startswith("r.conf:4: route Gpu: REQUIREMENTS uses TARGET.")


def test_route_name_characters_section_1_7():
    out = problems(GOOD.replace("Rest", "Rest.1"))
    assert "r.conf:8: route name 'Rest.1' may contain only letters, digits and '_'" in out


def test_k8s_attribute_typos_and_runtime_attributes():
    out = problems(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespce "gpu"\n    SET K8sPodName "x"'))
    assert any("K8sNamespce is not a Kubernetes attribute" in p for p in out)
    assert any("K8sPodName is written by ce-k8s itself" in p for p in out)


def test_pod_builder_rejections_are_reported():
    out = problems(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespace "Not_A_Namespace"'))
    assert len(out) == 1 and out[0].startswith("r.conf:3: route Gpu: the pod builder rejects it (")


def test_missing_pre_route_transform_section_4_1():
    out = problems(GOOD + "JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Base\n")
    assert out == ["r.conf:13: JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES names Base, but JOB_ROUTER_TRANSFORM_Base is "
                   "not defined; routing is disabled"]


def test_bad_regex_and_copy_target():
    out = problems(GOOD.replace('SET K8sNamespace "gpu"', 'SET K8sNamespace "gpu"\n    COPY /([a/ x\n'
                                "    RENAME A 1bad"))
    assert any("bad regular expression" in p for p in out)
    assert any("new name '1bad' is not valid" in p for p in out)


def test_cli_exit_codes(tmp_path: Path, capsys):
    good = tmp_path / "good.conf"
    good.write_text(GOOD)
    assert main(["routes", "check", "--config", str(good)]) == 0
    assert "OK: 2 route(s) in order: Gpu Rest" in capsys.readouterr().out
    bad = tmp_path / "bad.conf"
    bad.write_text(GOOD.replace("NAMES = Gpu Rest", "NAMES = Rest Gpu"))
    assert main(["routes", "check", "--config", str(bad)]) == 1
    assert capsys.readouterr().out == (
        f"{bad}:3: route Gpu can never match: the earlier route Rest takes every job (no REQUIREMENTS)\n")
    assert main(["routes", "check", "--config", str(tmp_path / "missing.conf")]) == 2
