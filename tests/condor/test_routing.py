"""The route table and routing pipeline (docs/hook-protocol.md §1.1, §2.2, §4.1, §4.4)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import classad2
import pytest

from ce_k8s.condor import wire
from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.routing import RouterConfig, vanilla_to_grid

JOB = """ClusterId = 12
ProcId = 3
JobUniverse = 5
JobStatus = 1
Owner = "pilot"
User = "pilot@ce.example.org"
GlobalJobId = "ce#12.3#100"
QDate = 100
RequestCpus = 1
"""


def job(extra: str = "") -> classad2.ClassAd:
    return classad2.parseOne(JOB + extra, classad2.ParserType.Old)


def router(text: str) -> RouterConfig:
    return RouterConfig.from_config(CondorConfig.from_text(text, "test.conf"))


BASIC = """
JOB_ROUTER_SOURCE_JOB_CONSTRAINT = target.JobUniverse =?= 5
JOB_ROUTER_ROUTE_A @=jrt
  REQUIREMENTS Owner == "a"
  SET Chosen "A"
@jrt
JOB_ROUTER_ROUTE_B @=jrt
  SET Chosen "B"
@jrt
JOB_ROUTER_ROUTE_NAMES = A B
"""


# ---- loading ----------------------------------------------------------------------------------


def test_routes_in_route_names_order_and_unlisted_disabled_section_4_1():
    """docs/hook-protocol.md §4.1: JOB_ROUTER_ROUTE_NAMES is the order and the only enabled routes."""
    r = router(BASIC.replace("NAMES = A B", "NAMES = B") + "JOB_ROUTER_ROUTE_C @=x\nSET X 1\n@x\n")
    assert [x.name for x in r.routes] == ["B"]
    assert sorted(x.name for x in r.disabled) == ["A", "C"]
    assert any("route A is defined but not listed" in w for w in r.warnings)


def test_listed_route_without_definition_is_skipped_with_a_warning_section_4_1():
    r = router(BASIC.replace("NAMES = A B", "NAMES = A Missing B"))
    assert [x.name for x in r.routes] == ["A", "B"]
    assert r.undefined_routes == ["Missing"]
    assert any("lists Missing" in w and w.startswith("test.conf:") for w in r.warnings)


def test_route_names_unset_means_no_routes_section_1_1():
    r = router(BASIC.replace("JOB_ROUTER_ROUTE_NAMES = A B", ""))
    assert r.routes == [] and len(r.disabled) == 2
    assert r.choose_route(job('Owner = "a"')) is None


def test_name_statement_is_overridden_by_the_knob_name_with_a_warning_section_4_1():
    """docs/hook-protocol.md §4.1: the route's name is always the <name> of the knob; a different NAME is overridden."""
    r = router(BASIC.replace('SET Chosen "A"', 'NAME Other\n  SET Chosen "A"'))
    assert r.routes[0].name == "A"
    assert any('The Name specified in JOB_ROUTER_ROUTE_A was "Other". using A instead.' in w for w in r.warnings)


def test_requirements_needed_without_source_constraint_section_4_1():
    """docs/hook-protocol.md §4.1: a route must have REQUIREMENTS unless JOB_ROUTER_SOURCE_JOB_CONSTRAINT is defined."""
    r = router(BASIC.replace("JOB_ROUTER_SOURCE_JOB_CONSTRAINT = target.JobUniverse =?= 5", ""))
    assert [x.name for x in r.routes] == ["A"]
    assert any("route B: Missing Requirements" in e for e in r.errors)


def test_route_with_unknown_keyword_is_not_loaded_with_file_and_line_section_4_1():
    r = router(BASIC.replace('SET Chosen "B"', "FROB x"))
    assert [x.name for x in r.routes] == ["A"]
    assert any(e.startswith("test.conf:8: FROB is not a valid transform keyword") for e in r.errors)


@pytest.mark.parametrize("extra", [
    "JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Nope\n",
    "JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = Bad\nJOB_ROUTER_TRANSFORM_Bad @=x\nREQUIREMENTS Owner ==\n@x\n",
])
def test_missing_or_invalid_pre_post_transform_disables_routing_section_4_1(extra):
    """JobRouter::config: a missing pre/post-route transform, or one whose open() fails (an
    unparsable REQUIREMENTS), sets m_enable_job_routing = false."""
    r = router(BASIC + extra)
    assert r.enabled is False and r.errors
    assert r.choose_route(job('Owner = "a"')) is None
    assert r.is_candidate(job('Owner = "a"')) is False


def test_old_syntax_knobs_warn_section_1_2():
    r = router(BASIC + "JOB_ROUTER_ENTRIES = [ name = \"x\"; ]\n")
    assert any("JOB_ROUTER_ENTRIES is no longer supported" in w for w in r.warnings)


def test_old_syntax_route_body_is_an_error_section_1_2():
    r = router(BASIC + 'JOB_ROUTER_ROUTE_Old = [ TargetUniverse = 5; ]\nJOB_ROUTER_ROUTE_NAMES = A B Old\n')
    assert [x.name for x in r.routes] == ["A", "B"]
    assert any("old ClassAd syntax" in e for e in r.errors)


# ---- per-route macros -------------------------------------------------------------------------


def test_per_route_macros_and_defaults_section_4_1():
    """docs/hook-protocol.md §4.1: MaxJobs/MaxIdleJobs fall back to the knobs, then 100/50;
    FailureRateThreshold 0.03."""
    r = router(BASIC)
    a = r.routes[0]
    assert (a.max_jobs, a.max_idle_jobs, a.failure_rate_threshold) == (100, 50, 0.03)
    assert (a.target_universe, a.grid_resource) == (9, "")
    r = router(BASIC + "JOB_ROUTER_DEFAULT_MAX_JOBS_PER_ROUTE = 10000\n"
               "JOB_ROUTER_DEFAULT_MAX_IDLE_JOBS_PER_ROUTE = 2000\n")
    assert (r.routes[0].max_jobs, r.routes[0].max_idle_jobs) == (10000, 2000)
    body = ('MaxJobs = 7\n  MaxIdleJobs = 2 * 3\n  FailureRateThreshold = 0.5\n  GridResource = "batch k8s"\n'
            '  SET Chosen "A"')
    r = router(BASIC.replace('SET Chosen "A"', body))
    a = r.routes[0]
    assert (a.max_jobs, a.max_idle_jobs, a.failure_rate_threshold, a.grid_resource) == (7, 6, 0.5, "batch k8s")
    assert a.route_info_line() == '[ Name = "A"; GridResource = "batch k8s"; TargetUniverse = 9 ]'


def test_universe_statement_wins_over_target_universe_macro_section_4_1():
    r = router(BASIC.replace('SET Chosen "A"', "TargetUniverse = 5\n  GridResource = \"x\"")
               .replace('SET Chosen "B"', "UNIVERSE vanilla\n  TargetUniverse = 9"))
    a, b = r.routes
    assert a.target_universe == 5 and a.grid_resource == ""  # GridResource read only for grid routes
    assert b.target_universe == 5
    assert a.route_info_line() == '[ Name = "A"; TargetUniverse = 5 ]'


# ---- selection --------------------------------------------------------------------------------


def test_first_match_in_order_section_4_4():
    r = router(BASIC)
    assert r.choose_route(job('Owner = "a"')).name == "A"
    assert r.choose_route(job()).name == "B"


def test_round_robin_among_matching_routes_section_4_4():
    """docs/hook-protocol.md §4.4: JOB_ROUTER_ROUND_ROBIN_SELECTION picks among all matches with a counter."""
    r = router(BASIC + "JOB_ROUTER_ROUND_ROBIN_SELECTION = true\n")
    picks = [r.choose_route(job('Owner = "a"')).name for _ in range(4)]
    assert picks == ["A", "B", "A", "B"]
    assert r.choose_route(job()).name == "B"


def test_accepting_callback_skips_full_routes_section_4_4():
    r = router(BASIC)
    assert r.choose_route(job('Owner = "a"'), accepting=lambda route: route.name != "A").name == "B"


def test_target_in_route_requirements_never_matches_section_4_4():
    """docs/hook-protocol.md §4.4: route REQUIREMENTS are evaluated with MY only, so TARGET.x is UNDEFINED."""
    r = router(BASIC.replace('REQUIREMENTS Owner == "a"', 'REQUIREMENTS TARGET.Owner == "a"'))
    assert r.choose_route(job('Owner = "a"')).name == "B"
    verdict = r.explain(job('Owner = "a"'))[0]
    assert verdict.result is None and "TARGET.x is undefined here" in verdict.reason
    r = router(BASIC.replace('REQUIREMENTS Owner == "a"', 'REQUIREMENTS MY.Owner == "a"'))
    assert r.choose_route(job('Owner = "a"')).name == "A"


def test_explain_reports_each_route():
    r = router(BASIC)
    verdicts = r.explain(job())
    assert [(v.route, v.result) for v in verdicts] == [("A", False), ("B", True)]
    assert 'Owner == "a"' in verdicts[0].reason


@pytest.mark.parametrize("extra,candidate", [
    ("", True),
    ("JobStatus = 5", False),
    ('Managed = "External"', False),
    ('Managed = "ScheddDone"', False),
    ('Managed = "Schedd"', True),
    ("Owner = undefined", False),
    ('RoutedBy = "jobrouter"', False),
    ('RoutedBy = "other-router"', True),
    ("StageInStart = 5", False),
    ("StageInStart = 5\nStageInFinish = 6", True),
    ("ProcId = -1", False),
    ("JobUniverse = 7", False),
])
def test_umbrella_constraint_built_in_terms_section_4_4(extra, candidate):
    """docs/hook-protocol.md §4.4: source constraint AND route requirements AND the built-in candidate terms."""
    r = router(BASIC)
    assert r.is_candidate(job(extra)) is candidate
    if not candidate:
        assert any(v.result is not True for v in r.candidate_verdicts(job(extra)))


def test_umbrella_constraint_text_section_4_4():
    r = router(BASIC)
    text = r.umbrella_constraint()
    assert text.startswith("(target.JobUniverse =?= 5) && ((Owner == \"a\") || (True)) && (target.ProcId >= 0")
    assert 'target.RoutedBy isnt "jobrouter"' in text
    assert r.umbrella_constraint([]).count("(false)") == 1


# ---- VanillaToGrid ------------------------------------------------------------------------------


def test_vanilla_to_grid_deletes_and_resets_section_2_2():
    ad = job('OsUser = "x"\nRemoteWallClockTime = 5.0\nAutoClusterId = 3\nStageInStart = 1\nTimerRemove = 9\n'
             'SUBMIT_Iwd = "/x"\nNumSystemHolds = 4\nJobStatus = 2\nCurrentHosts = 1\nGridResource = "hook"\n'
             'UserLog = "/l"\nExitBySignal = true')
    vanilla_to_grid(ad, 9, "batch k8s")
    for gone in ("ClusterId", "ProcId", "GlobalJobId", "User", "OsUser", "QDate", "RemoteWallClockTime",
                 "AutoClusterId", "StageInStart", "TimerRemove", "SUBMIT_Iwd", "CurrentHosts", "UserLog"):
        assert gone not in ad, gone
    assert ad.eval("JobStatus") == 1 and ad.eval("NumSystemHolds") == 0 and ad.eval("ExitBySignal") is False
    assert wire.unparse_old(ad.lookup("RemoteUserCpu")) == "0.0"
    assert (ad.eval("JobUniverse"), ad.eval("Remote_JobUniverse")) == (9, 5)
    assert ad.eval("GridResource") == "batch k8s"


def test_vanilla_to_grid_empty_grid_resource_overwrites_the_hooks_section_2_2():
    """docs/hook-protocol.md §2.2: for grid routes GridResource is always set, even to empty."""
    ad = job('GridResource = "from hook"')
    vanilla_to_grid(ad, 9, None)
    assert ad.eval("GridResource") == ""
    ad = job('GridResource = "kept"')
    vanilla_to_grid(ad, 5, "ignored")
    assert ad.eval("GridResource") == "kept" and ad.eval("JobUniverse") == 5


def test_vanilla_to_grid_undoes_output_remaps_unless_sandboxed_section_2_2():
    extra = ('Out = "_condor_stdout"\nErr = "_condor_stderr"\n'
             'TransferOutputRemaps = "_condor_stdout=/f/o;_condor_stderr=/f/e"')
    ad = job(extra)
    vanilla_to_grid(ad, 9, "x")
    assert (ad.eval("Out"), ad.eval("Err")) == ("/f/o", "/f/e") and "TransferOutputRemaps" not in ad
    ad = job(extra)
    vanilla_to_grid(ad, 9, "x", sandboxed=True)
    assert ad.eval("Out") == "_condor_stdout" and "TransferOutputRemaps" in ad


def test_vanilla_to_grid_without_job_universe_is_the_daemon_abort_section_2_2():
    ad = job()
    del ad["JobUniverse"]
    with pytest.raises(ValueError, match="lacks universe"):
        vanilla_to_grid(ad, 9, "x")
    r = router(BASIC)
    routed = r.route_job(job(), r.routes[1], translated=ad)
    assert routed.failed and "lacks universe" in routed.errors[0]


# ---- route_job --------------------------------------------------------------------------------

PIPELINE = BASIC + """
JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Pre
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = Post Skipped Sees
JOB_ROUTER_TRANSFORM_Pre @=x
  from_pre = 8
  SET PreRan true
@x
JOB_ROUTER_TRANSFORM_Post @=x
  EVALSET Combined $(from_pre) + $(from_route:0)
@x
JOB_ROUTER_TRANSFORM_Skipped @=x
  REQUIREMENTS PreRan =!= true
  SET SkippedRan true
@x
JOB_ROUTER_TRANSFORM_Sees @=x
  REQUIREMENTS Chosen is "B"
  SET SeesRouteResult true
@x
"""


def test_route_job_pipeline_shares_one_macro_set_section_4_1():
    """docs/hook-protocol.md §4.1: pre-route, route, post-route in order with one macro set; transform REQUIREMENTS
    are tested against the ad being built at that point."""
    r = router(PIPELINE.replace('SET Chosen "B"', 'SET Chosen "B"\n  from_route = 2'))
    routed = r.route_job(job("RoutedToJobId = \"9.9\""), r.routes[1])
    ad = routed.ad
    assert not routed.failed and routed.errors == []
    assert ad.eval("Combined") == 10
    assert ad.eval("PreRan") is True and "SkippedRan" not in ad and ad.eval("SeesRouteResult") is True
    assert (ad.eval("RoutedFromJobId"), ad.eval("RoutedBy"), ad.eval("RouteName")) == ("12.3", "jobrouter", "B")
    assert "RoutedToJobId" not in ad
    assert ad.eval("JobUniverse") == 9 and "ClusterId" not in ad


def test_route_job_uses_the_translated_ad_instead_of_the_job_section_2_2():
    """docs/hook-protocol.md §2.2: the translate hook's output replaces the routed ad completely."""
    r = router(BASIC)
    translated = job('FromHook = 1\nJobUniverse = 5')
    routed = r.route_job(job('OnlyInSource = 1'), r.routes[1], translated)
    assert routed.ad.eval("FromHook") == 1 and "OnlyInSource" not in routed.ad
    assert routed.ad.eval("RoutedFromJobId") == "12.3"


def test_route_job_does_not_touch_the_source_job():
    r = router(BASIC)
    source = job()
    r.route_job(source, r.routes[1])
    assert source.eval("JobUniverse") == 5 and "Chosen" not in source and source.eval("ClusterId") == 12


def test_edit_job_in_place_skips_vanilla_to_grid_and_stamps_section_2_2():
    r = router(BASIC.replace('SET Chosen "B"', 'EditJobInPlace = true\n  SET Chosen "B"'))
    routed = r.route_job(job(), r.routes[1])
    assert routed.ad.eval("Chosen") == "B" and routed.ad.eval("ClusterId") == 12
    assert "RoutedBy" not in routed.ad and routed.ad.eval("JobUniverse") == 5


def test_structural_error_at_run_time_fails_the_job_section_4_1():
    """At load $(MY.Owner) expands to nothing (no job), so the route validates; per job the
    condition is `pilot`, which config.cpp Evaluate_config_if calls "not a conditional"."""
    r = router(BASIC.replace('SET Chosen "B"', 'if $(MY.Owner)\n  SET X 1\n  endif'))
    routed = r.route_job(job(), r.routes[1])
    assert routed.failed
    assert "$(MY.Owner) is not a valid if condition because expression is not a conditional" in routed.errors[0]


def test_bad_set_in_route_is_logged_not_fatal_section_4_1():
    r = router(BASIC.replace('SET Chosen "B"', "SET Broken (1 +\n  SET Fine 1"))
    routed = r.route_job(job(), r.routes[1])
    assert not routed.failed and routed.ad.eval("Fine") == 1
    assert routed.errors and routed.errors[0].startswith("test.conf:")


def test_shared_proxy_needs_sandboxing_section_2_2():
    """JobRouter.cpp RoutedJob::PrepareSharedX509UserProxy: an invalid SharedX509UserProxy or an
    unsandboxed job fails, and FinishSubmitJob then removes the job (GracefullyRemoveJob)."""
    base = 'UseSharedX509UserProxy = true\n  SharedX509UserProxy = "/etc/proxy"\n  SET Chosen "B"'
    r = router(BASIC.replace('SET Chosen "B"', base))
    routed = r.route_job(job(), r.routes[1])
    assert routed.failed and "JobShouldBeSandboxed is false" in routed.errors[0]
    r = router(BASIC.replace('SET Chosen "B"', "JobShouldBeSandboxed = true\n  " + base.replace('"/etc/proxy"', "3")))
    routed = r.route_job(job(), r.routes[1])
    assert routed.failed and "SharedX509UserProxy is invalid" in routed.errors[0]
    r = router(BASIC.replace('SET Chosen "B"', "JobShouldBeSandboxed = true\n  " + base))
    routed = r.route_job(job(), r.routes[1])
    assert not routed.failed and routed.ad.eval("x509userproxy") == "/etc/proxy"


# ---- hooks ------------------------------------------------------------------------------------


def _hook(tmp_path: Path, name: str, mode: int = 0o755) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return str(path)


def test_hook_path_lookup_and_path_checks_section_1_1(tmp_path):
    """docs/hook-protocol.md §1.1: keyword from the job's HookKeyword wins; a path failing the checks
    is 'not configured'."""
    good = _hook(tmp_path, "good")
    noexec = _hook(tmp_path, "noexec", 0o644)
    worldw = _hook(tmp_path, "worldw", 0o777)
    os.chmod(worldw, 0o757)
    bad_dir = tmp_path / "open"
    bad_dir.mkdir()
    in_open = _hook(bad_dir, "hook")
    bad_dir.chmod(bad_dir.stat().st_mode | stat.S_IWOTH)
    cfg = (BASIC + "JOB_ROUTER_HOOK_KEYWORD = CE_K8S\n"
           f"CE_K8S_HOOK_TRANSLATE_JOB = {good}\nCE_K8S_HOOK_UPDATE_JOB_INFO = {noexec}\n"
           f"CE_K8S_HOOK_JOB_EXIT = {good}\nCE_K8S_HOOK_JOB_CLEANUP = {worldw}\n"
           f"OTHER_HOOK_TRANSLATE_JOB = {in_open}\nCE_K8S_ATTRS_TO_COPY = K8sPodName, K8sPodPhase K8sNodeName\n")
    r = router(cfg)
    j = job()
    assert r.hook_path(j, "TRANSLATE_JOB") == good
    assert r.hook_path(j, "UPDATE_JOB_INFO") is None
    assert r.hook_path(j, "JOB_FINALIZE") == good  # JOB_EXIT fallback
    assert r.hook_path(j, "JOB_CLEANUP") is None
    assert r.attrs_to_copy(j) == ["K8sPodName", "K8sPodPhase", "K8sNodeName"]
    other = job('HookKeyword = "OTHER"')
    assert r.hook_path(other, "TRANSLATE_JOB") is None  # parent directory is world-writable
    assert r.hook_path(other, "JOB_CLEANUP") is None and r.attrs_to_copy(other) == []
    with pytest.raises(ValueError):
        r.hook_path(j, "JOB_START")


def test_no_keyword_means_no_hooks_section_1_1():
    r = router(BASIC + "CE_K8S_HOOK_TRANSLATE_JOB = /bin/true\n")
    assert r.hook_path(job(), "TRANSLATE_JOB") is None
    assert r.hook_keyword is None
