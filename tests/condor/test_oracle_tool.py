"""The transform oracle itself: pinned to its wheel, isolated from pytest, usable from the shell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import xform_oracle
from xform_oracle import OracleUnavailable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ORACLE = HERE / "xform_oracle.py"
JOB = 'ClusterId = 1\nProcId = 0\nJobUniverse = 5\nJobStatus = 1\nOwner = "u"\nRequestCpus = 2\n'


@pytest.fixture(scope="module", autouse=True)
def built() -> Path:
    try:
        return xform_oracle.shim_path()
    except OracleUnavailable as exc:
        pytest.fail(f"the transform oracle cannot run: {exc}")


def test_refuses_another_wheel_version(monkeypatch) -> None:
    monkeypatch.setattr(xform_oracle, "installed_wheel_version", lambda: "25.14.2")
    with pytest.raises(OracleUnavailable, match=r"25\.14\.1.*installed: 25\.14\.2"):
        xform_oracle.shim_path()


def test_shim_is_cached_per_source(built: Path) -> None:
    assert built.is_file() and xform_oracle.PINNED_WHEEL in built.name
    assert xform_oracle.shim_path() == built


def test_broken_configuration_ends_only_the_child(tmp_path: Path) -> None:
    config = tmp_path / "condor_config"
    config.write_text("A = 1\nJOB_ROUTER_ROUTE_X @x\n")
    result = xform_oracle.run_oracle(config, JOB)
    assert result.failed and result.config_error_line == 2, result


def test_applies_route_and_reports_macro_errors(tmp_path: Path) -> None:
    config = tmp_path / "condor_config"
    config.write_text("SITE = here\nJOB_ROUTER_ROUTE_NAMES = R\nJOB_ROUTER_ROUTE_R @=end\n  REQUIREMENTS true\n"
                      "  SET Where \"$(SITE)-$(MY.RequestCpus)\"\n  SET Bad $INT(nope)\n@end\n")
    result = xform_oracle.run_oracle(config, JOB)
    assert result.route == "R" and result.applied == ["route R"]
    assert result.ad().eval("Where") == "here-2"
    assert "Bad" not in result.ad()
    assert any("$INT()" in err and "nope" in err for err in result.errors), result.errors


def test_missing_transform_disables_routing(tmp_path: Path) -> None:
    config = tmp_path / "condor_config"
    config.write_text("JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Gone\nJOB_ROUTER_ROUTE_NAMES = R\n"
                      "JOB_ROUTER_ROUTE_R @=end\n  REQUIREMENTS true\n@end\n")
    result = xform_oracle.run_oracle(config, JOB)
    assert not result.routing_enabled and result.route is None
    assert any("JOB_ROUTER_TRANSFORM_Gone" in note for note in result.notes)


def test_given_bodies_share_one_macro_set_and_see_the_config(tmp_path: Path) -> None:
    config = tmp_path / "condor_config"
    config.write_text("SITE = there\n")
    bodies = {"pre": [["P", "tmp = $(MY.RequestCpus)\nSET Pre \"$(SITE)\""], ["Q", "REQUIREMENTS false\nSET Q 1"]],
              "route": ["R", "REQUIREMENTS RequestCpus == 2\nSET Route $(tmp) * 10"],
              "post": [["Z", "EVALSET Post Route + 1"]]}
    result = xform_oracle.run_oracle(config, JOB, bodies=bodies)
    assert result.applied == ["pre-route P", "route R", "post-route Z"], result
    ad = result.ad()
    assert (ad.eval("Pre"), ad.eval("Route"), ad.eval("Post")) == ("there", 20, 21)
    assert "Q" not in ad


def test_command_line_prints_the_routed_ad() -> None:
    done = subprocess.run([sys.executable, str(ORACLE), "--config", str(ROOT / "config.d"), "--config",
                           str(ROOT / "routes"), "--jobad", str(ROOT / "examples" / "pilot-cpu8.ad")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("# route: Pilots  applied: pre-route Base"), lines[:3]
    assert "RoutedJob = true" in lines
    assert "RequestCpus = 8" in lines


def test_command_line_routes_every_ad_of_a_json_file() -> None:
    done = subprocess.run([sys.executable, str(ORACLE), "--config", str(ROOT / "config.d"), "--config",
                           str(ROOT / "routes"), "--jobad", str(ROOT / "examples" / "pilots.json")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    headers = [line for line in done.stdout.splitlines() if line.startswith("# job ")]
    routes = [line.split()[2] for line in done.stdout.splitlines() if line.startswith("# route: ")]
    assert len(headers) == len(routes) >= 2, done.stdout[:500]
    assert "GPU_Pilots" in routes


def test_split_job_ads_reads_long_form_blocks() -> None:
    ads = xform_oracle.split_job_ads("# comment\nA = 1\nB = 2\n\n\nA = 3\n")
    assert ads == ["A = 1\nB = 2\n", "A = 3\n"]


def test_candidacy_follows_the_umbrella_constraint(tmp_path: Path) -> None:
    config = tmp_path / "condor_config"
    config.write_text("JOB_ROUTER_SOURCE_JOB_CONSTRAINT = target.RequestCpus < 4\nJOB_ROUTER_ROUTE_NAMES = R\n"
                      "JOB_ROUTER_ROUTE_R @=end\n  SET A 1\n@end\n")
    idle = xform_oracle.run_oracle(config, JOB)
    assert idle.candidate is True and idle.route == "R"
    assert idle.umbrella.startswith("(target.RequestCpus < 4) && ( (True) )"), idle.umbrella
    running = xform_oracle.run_oracle(config, JOB.replace("JobStatus = 1", "JobStatus = 2"))
    assert running.candidate is False and running.route == "R"
    assert any(note.startswith("not a candidate") for note in running.notes)
    too_big = xform_oracle.run_oracle(config, JOB.replace("RequestCpus = 2", "RequestCpus = 8"))
    assert too_big.candidate is False
