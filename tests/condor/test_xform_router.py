"""The transform language as condor_job_router runs it, on HTCondor's and HTCondor-CE's own configurations.

Each test names the file its configuration comes from and where the expected value comes from:
HTCondor's source (xform_utils.cpp, config.cpp, JobRouter.cpp — read in docs/routes.md, "What
ce-k8s models of the transform language"), HTCondor's own ClassAd library (classad2), or the
HTCondor-CE file that states the intent.
"""

from __future__ import annotations

from pathlib import Path

import classad2
import pytest

from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.diagnostics import Severity
from ce_k8s.condor.routing import RouterConfig

PILOT = """ClusterId = 12
ProcId = 3
JobUniverse = 5
JobStatus = 1
Owner = "pilot"
RequestCpus = 1
"""


def job(extra: str = "", base: str = PILOT) -> classad2.ClassAd:
    return classad2.parseOne(base + extra, classad2.ParserType.Old)


def router(text: str) -> RouterConfig:
    return RouterConfig.from_config(CondorConfig.from_text(text, "ce.conf"))


def routed(r: RouterConfig, ad: classad2.ClassAd):
    route = r.choose_route(ad)
    assert route is not None
    return r.route_job(ad, route)


def messages(diags, severity: Severity) -> list[str]:
    return [d.message for d in diags if d.severity == severity]


# ---- 5: route validation at load; `if` in pre/post-route transforms per job ----------------------

# htcondor-ce config/01-ce-router-defaults.conf, JOB_ROUTER_TRANSFORM_Cpus, says "'if' can't handle
# complex expressions yet so we evaluate it here" and computes the test with EVALMACRO first. These
# routes write the condition directly, which is what the comment warns about.
COMPLEX_IF_ROUTE = """
JOB_ROUTER_ROUTE_Big @=jrt
  REQUIREMENTS true
  GridResource = "batch slurm"
  if MY.RequestCpus > 1
    SET Big true
  endif
@jrt
JOB_ROUTER_ROUTE_Rest @=jrt
  REQUIREMENTS true
  GridResource = "batch slurm"
@jrt
JOB_ROUTER_ROUTE_NAMES = Big Rest
"""


def test_route_with_complex_if_is_invalid_at_load_and_never_chosen():
    """JobRoute::ParseNext runs ValidateXForm with no job ad; config.cpp Evaluate_config_if then
    calls any non-simple condition "complex conditionals are not supported" and the route is dropped."""
    r = router(COMPLEX_IF_ROUTE)
    assert [x.name for x in r.routes] == ["Rest"]
    errors = messages(r.diagnostics, Severity.ERROR)
    assert any("MY.RequestCpus > 1 is not a valid if condition because complex conditionals are not supported"
               in m and "route Big" in m for m in errors), errors
    bad = [d for d in r.diagnostics if d.severity == Severity.ERROR]
    assert bad[0].file == "ce.conf" and bad[0].line == 5  # the `if` line
    assert r.choose_route(job("RequestCpus = 8")).name == "Rest"


def test_complex_if_under_a_branch_not_taken_at_load_validates_and_runs_per_job():
    """Parse_macros only evaluates conditions on enabled lines: under `if defined MY.xcount`
    (false with no job) the complex `if` is not seen by ValidateXForm, so the route loads; per job
    it is evaluated against the job (new ClassAd syntax), true runs the body, false fails the job."""
    r = router(COMPLEX_IF_ROUTE.replace("if MY.RequestCpus > 1", "if defined MY.xcount\n  if xcount > 1")
               .replace("    SET Big true\n  endif", "    SET Big true\n  endif\n  endif"))
    assert [x.name for x in r.routes] == ["Big", "Rest"]
    ok = routed(r, job("xcount = 8"))
    assert not ok.failed and ok.ad.eval("Big") is True
    bad = routed(r, job("xcount = 1"))
    assert bad.failed
    assert any("xcount > 1 is not a valid if condition" in m for m in messages(bad.diagnostics, Severity.ERROR))
    skipped = routed(r, job())
    assert not skipped.failed and "Big" not in skipped.ad


PRE_IF = """
JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Size
JOB_ROUTER_TRANSFORM_Size @=jrt
  if RequestCpus > 1
    SET Size "big"
  endif
@jrt
JOB_ROUTER_ROUTE_Rest @=jrt
  REQUIREMENTS true
  GridResource = "batch slurm"
@jrt
JOB_ROUTER_ROUTE_NAMES = Rest
"""


def test_pre_route_complex_if_is_evaluated_against_the_job():
    """Pre-route transforms are not validated (JobRouter::config only opens them), so routing stays
    enabled; TransformClassAd evaluates the condition against the job: true → the body runs."""
    r = router(PRE_IF)
    assert r.enabled and not messages(r.diagnostics, Severity.ERROR)
    result = routed(r, job("RequestCpus = 8", base=PILOT.replace("RequestCpus = 1\n", "")))
    assert not result.failed and result.ad.eval("Size") == "big"


@pytest.mark.parametrize("cpus", ["RequestCpus = 1", "", 'RequestCpus = "eight"'])
def test_pre_route_complex_if_false_or_not_boolean_fails_the_job(cpus):
    """config.cpp Evaluate_config_if returns the condition's value as its *validity*: false,
    UNDEFINED or a non-boolean make the `if` invalid, Parse_macros stops, TransformClassAd < 0,
    ApplyRoutingJobEdits fails and FinishSubmitJob removes the job (GracefullyRemoveJob)."""
    r = router(PRE_IF)
    result = routed(r, job(cpus, base=PILOT.replace("RequestCpus = 1\n", "")))
    assert result.failed
    assert any("JobRouter failure in pre-route transform Size" in m and "is not a valid if condition" in m
               for m in messages(result.diagnostics, Severity.ERROR))


# ---- 6: EVALSET/EVALMACRO parse NEW ClassAd syntax, SET old syntax -------------------------------

ESCAPES = r"""
JOB_ROUTER_ROUTE_Vo @=jrt
  REQUIREMENTS regexp("\/cms\/Role\=pilot", x509UserProxyFirstFQAN)
  GridResource = "batch slurm"
  EVALSET VoNew regexps("^/([^/]+)/.*", x509UserProxyFirstFQAN, "\\1")
  SET VoOld regexps("^/([^/]+)/.*", x509UserProxyFirstFQAN, "\\1")
  EVALMACRO vo regexps("^/([^/]+)/.*", x509UserProxyFirstFQAN, "\\1")
  SET VoMacro "$(vo)"
@jrt
JOB_ROUTER_ROUTE_NAMES = Vo
"""


def test_evalset_and_evalmacro_use_new_syntax_escapes_set_uses_old():
    """REQUIREMENTS from htcondor-ce docs/v24/configuration/writing-job-routes.md ("VOMS attribute").
    ClassAd::EvaluateExpr(string) (EVALSET/EVALMACRO) uses the new-syntax parser, where "\\\\1" is
    backslash-1; SET uses the old-syntax parser, where the backslashes stay. The values are what
    HTCondor's own ClassAd library computes for each reading."""
    r = router(ESCAPES)
    result = routed(r, job('x509UserProxyFirstFQAN = "/cms/Role=pilot/Capability=NULL"'))
    fqan = job('x509UserProxyFirstFQAN = "/cms/Role=pilot/Capability=NULL"')
    new_value = classad2.ExprTree(r'regexps("^/([^/]+)/.*", x509UserProxyFirstFQAN, "\\1")').eval(fqan)
    old_value = classad2.parseOne(r'X = regexps("^/([^/]+)/.*", x509UserProxyFirstFQAN, "\\1")',
                                  classad2.ParserType.Old).lookup("X").eval(fqan)
    assert new_value == "cms" and old_value == "\\cms"  # the two readings differ
    assert result.ad.eval("VoNew") == new_value
    assert result.ad.eval("VoOld") == old_value
    assert result.ad.eval("VoMacro") == new_value


def test_evalset_ignores_text_after_a_complete_expression():
    """ClassAdParser::ParseExpression(buf) defaults to full=false: `1 2` is 1, while an expression
    broken in the middle does not parse (logged, the transform carries on)."""
    r = router(ESCAPES.replace("  SET VoMacro", "  EVALSET Trail 1 2\n  EVALSET Broken 1 +\n  SET VoMacro"))
    result = routed(r, job('x509UserProxyFirstFQAN = "/cms/Role=pilot"'))
    assert not result.failed and result.ad.eval("Trail") == 1 and "Broken" not in result.ad
    assert any("EVALSET Broken could not evaluate" in m for m in messages(result.diagnostics, Severity.WARNING))


# ---- 7: a TRANSFORM statement ends the body --------------------------------------------------------

# HTCondor src/condor_tests/cmd_transform_ads.run, "general" rules (they end with `TRANSFORM 1`).
GENERAL_RULES = """SET ClusterId 200
DEFAULT Fooo "test"
COPY ExitBySignal TransferIn
RENAME NumCkpts NumCheckPoints
DELETE TransferInputSizeMB
DELETE /(.+)Err/
TRANSFORM 1"""


def test_lines_after_transform_are_not_part_of_the_route():
    """MacroStreamXFormSource::open stops at the first TRANSFORM statement; what follows is never
    run. The route here is cmd_transform_ads' "general" rules plus a line after TRANSFORM."""
    cfg = ("JOB_ROUTER_ROUTE_General @=jrt\n  REQUIREMENTS true\n  GridResource = \"batch slurm\"\n"
           + "\n".join("  " + line for line in GENERAL_RULES.split("\n"))
           + "\n  SET After 1\n  FROB x\n@jrt\nJOB_ROUTER_ROUTE_NAMES = General\n")
    r = router(cfg)
    assert [x.name for x in r.routes] == ["General"]  # the unknown keyword after TRANSFORM is not seen
    ad = job("ExitBySignal = false\nNumCkpts = 3\nTransferInputSizeMB = 1\nStdErr = 1\nMyErr = 2")
    result = r.route_job(ad, r.routes[0])
    assert not result.failed
    assert "After" not in result.ad
    assert result.ad.eval("ClusterId") == 200 and result.ad.eval("Fooo") == "test"
    # VanillaToGrid resets NumCkpts to 0 before the route runs; RENAME then moves it.
    assert result.ad.eval("NumCheckPoints") == 0 and "NumCkpts" not in result.ad
    assert "TransferInputSizeMB" not in result.ad and "StdErr" not in result.ad and "MyErr" not in result.ad
    assert any("not part of the body" in m for m in messages(r.diagnostics, Severity.WARNING))


def test_bare_transform_without_trailing_space_does_not_end_the_body():
    """is_xform_statement needs white space after the keyword, so a bare `TRANSFORM` (as in
    cmd_transform_ads.run's "regex" rules) is not stripped at load; ParseRulesCallback accepts it
    as a no-op and the lines after it still run."""
    r = router("JOB_ROUTER_ROUTE_A @=jrt\n  REQUIREMENTS true\n  GridResource = \"batch x\"\nTRANSFORM\n"
               "  SET After 1\n@jrt\nJOB_ROUTER_ROUTE_NAMES = A\n")
    result = routed(r, job())
    assert not result.failed and result.ad.eval("After") == 1


# ---- 8: route REQUIREMENTS that are ERROR, UNDEFINED or not boolean do not match ------------------

# HTCondor src/condor_tests/job_router_xform.run: four routes, REQUIREMENTS `RouteMe && (ProcId & 1)`.
XFORM_TEST_ROUTES = """
JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Defaults
JOB_ROUTER_TRANSFORM_Defaults @=jrd
  DELETE RouteMe
  SET RoutedJob true
  SET Requirements true
  SET CollHost "$(COLLECTOR_NAME)"
@jrd
COLLECTOR_NAME = jira902
JOB_ROUTER_ROUTE_NAMES = Production1 Analysis3 Production2 Analysis4
JOB_ROUTER_ROUTE_Production1 @=rt
  UNIVERSE Vanilla
  REQUIREMENTS RouteMe && (ProcId & 1)
  SET ProductionJob 1
  SET ProductionRun 1
  SET Requirements target.slotId & 1
@rt
JOB_ROUTER_ROUTE_Production2 @=rt
  UNIVERSE VANILLA
  REQUIREMENTS RouteMe && (ProcId & 1)
  SET ProductionJob 1
  SET ProductionRun 2
  SET Requirements !(target.slotId & 1)
@rt
JOB_ROUTER_ROUTE_Analysis3 @=rt
  UNIVERSE 5
  REQUIREMENTS RouteMe && !(ProcId & 1)
  SET ProductionJob 0
  SET AnalysisRun 3
  SET Requirements target.slotId & 1
@rt
JOB_ROUTER_ROUTE_Analysis4 @=rt
  UNIVERSE vanilla
  Requirements RouteMe && !(ProcId & 1)
  SET ProductionJob 0
  SET AnalysisRun  4
  SET Requirements !(target.slotId & 1)
@rt
"""


@pytest.mark.parametrize("extra,expected", [
    ("RouteMe = 1\nProcId = 3", "Production1"),  # the test's own expectation: odd procs to production
    ("RouteMe = 1\nProcId = 4", "Analysis3"),
    ("RouteMe = 0\nProcId = 3", None),  # route_me = 0 jobs stay unrouted in the test
    ("ProcId = 3", None),  # UNDEFINED && ... is UNDEFINED: not a boolean
    ('RouteMe = "yes"\nProcId = 3', None),  # ERROR: not a boolean
])
def test_route_requirements_must_be_boolean_true(extra, expected):
    """MacroStreamXFormSource::matches: the value must be boolean-equivalent true (numbers count);
    ERROR, UNDEFINED and strings are "does not match"."""
    r = router(XFORM_TEST_ROUTES)
    base = PILOT.replace("ProcId = 3\n", "")
    chosen = r.choose_route(job(extra, base=base))
    assert (chosen.name if chosen else None) == expected


def test_job_router_xform_pre_route_defaults_and_universe():
    """job_router_xform.run checks the routed job: the pre-route Defaults ran (RouteMe deleted,
    COLLECTOR_NAME from the config: the jira902 regression) and the route's UNIVERSE is vanilla."""
    r = router(XFORM_TEST_ROUTES)
    result = routed(r, job("RouteMe = 1", base=PILOT))
    assert not result.failed and result.ad.eval("ProductionRun") == 1
    assert "RouteMe" not in result.ad and result.ad.eval("CollHost") == "jira902"
    assert result.ad.eval("JobUniverse") == 5


# ---- 9: userMap() with CLASSAD_USER_MAPFILE_<name> ------------------------------------------------

# htcondor-ce config/02-ce-condor-defaults.conf: the UidAcctGroup and x509AcctGroup transforms.
ACCT_GROUPS = """
CLASSAD_USER_MAPFILE_UidAGMap = {uid_map}
JOB_ROUTER_CLASSAD_USER_MAP_NAMES = $(JOB_ROUTER_CLASSAD_USER_MAP_NAMES) UidAGMap
JOB_ROUTER_TRANSFORM_UidAcctGroup @=jrt
   EVALMACRO uid_acct_groups UserMap("UidAGMap", Owner) ?: ""
   if defined uid_acct_groups
       EVALSET AcctGroup UserMap("UidAGMap", Owner, AcctGroup)
       EVALSET AccountingGroup join(".", AcctGroup, Owner)
   endif
@jrt
CLASSAD_USER_MAPFILE_x509AGMap = {x509_map}
JOB_ROUTER_CLASSAD_USER_MAP_NAMES = $(JOB_ROUTER_CLASSAD_USER_MAP_NAMES) x509AGMap
JOB_ROUTER_TRANSFORM_x509AcctGroup @=jrt
   EVALMACRO x509_acct_groups UserMap("x509AGMap", x509UserProxySubject) ?: ""
   if defined x509_acct_groups
       EVALSET AcctGroup UserMap("x509AGMap", x509UserProxySubject, AcctGroup)
       EVALSET AccountingGroup join(".", AcctGroup, Owner)
   elif defined MY.x509UserProxyFirstFQAN
      EVALMACRO x509_acct_groups UserMap("x509AGMap", x509UserProxyFirstFQAN) ?: ""
      if defined x509_acct_groups
         EVALSET AcctGroup UserMap("x509AGMap", x509UserProxyFirstFQAN, AcctGroup)
         EVALSET AccountingGroup join(".", AcctGroup, Owner)
      endif
   endif
@jrt
JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = {pre}
JOB_ROUTER_ROUTE_Rest @=jrt
  REQUIREMENTS true
  GridResource = "batch slurm"
@jrt
JOB_ROUTER_ROUTE_NAMES = Rest
"""


def acct_router(tmp_path: Path, pre: str) -> RouterConfig:
    uid_map = tmp_path / "uid_acct_group.map"
    uid_map.write_text("* pilot cms_pilots\n* /^usatlas[0-9]+$/ atlas\n")
    x509_map = tmp_path / "x509_acct_group.map"
    x509_map.write_text('* "/DC=org/DC=cilogon/C=US/O=Example/CN=Pilot" osg_pilots\n'
                        "* /^\\/cms\\/Role=pilot/ cms_fqan\n")
    return router(ACCT_GROUPS.format(uid_map=uid_map, x509_map=x509_map, pre=pre))


@pytest.mark.parametrize("owner,group", [("pilot", "cms_pilots"), ("usatlas7", "atlas"), ("nobody", None)])
def test_uid_acct_group_sets_accounting_group_from_the_map_file(tmp_path, owner, group):
    """The map file content decides (HTCondor's own userMap, loaded from the CE configuration's
    CLASSAD_USER_MAPFILE_UidAGMap); an unmapped owner gets no AcctGroup (the `if defined` guard)."""
    r = acct_router(tmp_path, "UidAcctGroup")
    assert not messages(r.diagnostics, Severity.ERROR)
    result = routed(r, job(f'Owner = "{owner}"', base=PILOT.replace('Owner = "pilot"\n', "")))
    assert not result.failed
    if group is None:
        assert "AcctGroup" not in result.ad and "AccountingGroup" not in result.ad
    else:
        assert result.ad.eval("AcctGroup") == group
        assert result.ad.eval("AccountingGroup") == f"{group}.{owner}"


@pytest.mark.parametrize("extra,group", [
    ('x509UserProxySubject = "/DC=org/DC=cilogon/C=US/O=Example/CN=Pilot"', "osg_pilots"),
    ('x509UserProxySubject = "/CN=other"\nx509UserProxyFirstFQAN = "/cms/Role=pilot/Capability=NULL"', "cms_fqan"),
    ('x509UserProxySubject = "/CN=other"', None),
])
def test_x509_acct_group_by_subject_then_fqan(tmp_path, extra, group):
    r = acct_router(tmp_path, "x509AcctGroup")
    result = routed(r, job(extra))
    assert not result.failed
    assert (result.ad.eval("AcctGroup") if "AcctGroup" in result.ad else None) == group


def test_user_map_names_without_a_file_is_a_warning(tmp_path):
    """reconfig_user_maps loads only the listed names that have a MAPFILE or MAPDATA knob."""
    r = router("JOB_ROUTER_CLASSAD_USER_MAP_NAMES = Ghost\nJOB_ROUTER_ROUTE_NAMES =\n")
    assert any("names Ghost" in m for m in messages(r.diagnostics, Severity.WARNING))


def test_missing_map_file_is_a_warning_and_usermap_is_undefined(tmp_path):
    r = router(ACCT_GROUPS.format(uid_map=tmp_path / "missing.map", x509_map=tmp_path / "missing2.map",
                                  pre="UidAcctGroup"))
    assert any('cannot load userMap "UidAGMap"' in m for m in messages(r.diagnostics, Severity.WARNING))
    result = routed(r, job())
    assert not result.failed and "AcctGroup" not in result.ad


def test_inline_map_data(tmp_path):
    """CLASSAD_USER_MAPDATA_<name> is used when there is no CLASSAD_USER_MAPFILE_<name>."""
    cfg = ACCT_GROUPS.format(uid_map="", x509_map=tmp_path / "x.map", pre="UidAcctGroup")
    cfg += "CLASSAD_USER_MAPDATA_UidAGMap @=end\n* pilot inline_group\n@end\n"
    r = router(cfg)
    assert routed(r, job()).ad.eval("AcctGroup") == "inline_group"


# ---- 10: an unknown keyword in a pre/post-route transform ----------------------------------------


def test_unknown_keyword_in_post_route_transform_fails_every_job():
    """JobRouter::config only opens pre/post-route transforms (no ValidateXForm), so routing stays
    enabled; ParseRulesCallback fails the transform for every job and FinishSubmitJob calls
    GracefullyRemoveJob. routes check sees it at load as an ERROR."""
    r = router(PRE_IF.replace("JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Size",
                              "JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = Typo")
               + "JOB_ROUTER_TRANSFORM_Typo @=jrt\n  SETT Foo 1\n@jrt\n")
    assert r.enabled and [t.name for t in r.post_transforms] == ["Typo"]
    load = [d for d in r.diagnostics if d.severity == Severity.ERROR]
    assert len(load) == 1 and "SETT is not a valid transform keyword" in load[0].message
    assert (load[0].file, load[0].line) == ("ce.conf", 14)
    for extra in ("", "RequestCpus = 8"):
        result = routed(r, job(extra))
        assert result.failed
        assert any("JobRouter failure in post-route transform Typo: SETT is not a valid transform keyword" in m
                   for m in messages(result.diagnostics, Severity.ERROR))


# ---- 4: $INT() / $REAL() / $STRING() in statements -----------------------------------------------

FUNCS = """
JOB_ROUTER_ROUTE_F @=jrt
  REQUIREMENTS true
  GridResource = "batch slurm"
  cpus = 3.7
  word = abc
  quoted = "hello"
  SET IntOk $INT(cpus)
  SET IntFmt "$INT(cpus,%03d)"
  SET RealFmt $REAL(cpus,%.2f)
  SET StrQuoted "$STRING(quoted)"
  SET StrLiteral "$STRING(word)"
  SET IntBad $INT(word)
  SET IntBadQuoted "$INT(word) $(word)"
  SET After 1
@jrt
JOB_ROUTER_ROUTE_NAMES = F
"""


def test_dollar_functions_in_statements():
    """config.cpp evaluate_macro_func: $INT/$REAL take a number or an expression that evaluates to
    one (string_is_long_param / string_is_double_param); $STRING uses the value when it is a
    string and the text itself otherwise (no error)."""
    result = routed(router(FUNCS), job())
    ad = result.ad
    assert ad.eval("IntOk") == 3 and ad.eval("IntFmt") == "003" and ad.eval("RealFmt") == 3.7
    assert ad.eval("StrQuoted") == "hello" and ad.eval("StrLiteral") == "abc"
    assert not result.failed and ad.eval("After") == 1


def test_dollar_int_of_a_non_number_is_logged_and_expands_to_nothing():
    """config.cpp, the char* expand_macro transforms use (evaluate_macro_func): a failing $INT()
    is reported through might_EXCEPT (the macro set's errors, logged by the router as
    "ERROR in route") and expands to nothing; the rest of the line is still expanded and the
    statement runs on the result. The expected values are what HTCondor's TransformClassAd gave
    for this route (tests/condor/xform_oracle.py)."""
    result = routed(router(FUNCS), job())
    warnings = messages(result.diagnostics, Severity.WARNING)
    assert any("$INT() macro: abc does not evaluate to an integer!" in m for m in warnings), warnings
    assert "IntBad" not in result.ad  # `SET IntBad ` has no expression left: logged, skipped
    assert result.ad.eval("IntBadQuoted") == " abc"
    assert not result.failed


# ---- issue 14.3: HTCondor-CE's WholeNode post-route transform on a grid route ---------------------

# htcondor-ce config/01-ce-router-defaults.conf, JOB_ROUTER_TRANSFORM_WholeNode (verbatim statement).
WHOLE_NODE = """
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = WholeNode
JOB_ROUTER_TRANSFORM_WholeNode @=jrt
    EVALMACRO test_want_whole_node $(MY.WantWholeNode:False) && $(TargetUniverse)==5
@jrt
JOB_ROUTER_TRANSFORM_Probe @=jrt
    SET WholeNodeMacro "$(test_want_whole_node:unset)"
@jrt
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES) Probe
JOB_ROUTER_ROUTE_Grid @=jrt
  REQUIREMENTS Owner == "pilot"
  GridResource = "batch slurm"
@jrt
JOB_ROUTER_ROUTE_Vanilla @=jrt
  REQUIREMENTS Owner == "local"
  TargetUniverse = 5
@jrt
JOB_ROUTER_ROUTE_NAMES = Grid Vanilla
"""


def test_whole_node_evalmacro_on_a_grid_route_is_a_warning_not_a_failure():
    """On a grid route $(TargetUniverse) is empty, so the expression is `False && ==5`, which does
    not parse: kw_EVALMACRO logs "could not evaluate" and breaks; TransformClassAd still returns 0,
    so the pilot is routed. The macro stays unset."""
    result = routed(router(WHOLE_NODE), job("WantWholeNode = true"))
    assert not result.failed
    warnings = messages(result.diagnostics, Severity.WARNING)
    assert any("EVALMACRO test_want_whole_node could not evaluate : true && ==5" in m for m in warnings), warnings
    assert not messages(result.diagnostics, Severity.ERROR)
    assert result.ad.eval("WholeNodeMacro") == "unset"


def test_whole_node_evalmacro_on_an_htcondor_route_evaluates():
    """With TargetUniverse = 5 in the route the expression is `true && 5==5`: the macro is true."""
    result = routed(router(WHOLE_NODE), job("WantWholeNode = true", base=PILOT.replace('"pilot"', '"local"')))
    assert not result.failed and not result.diagnostics
    assert result.ad.eval("WholeNodeMacro") == "true"


def test_an_invalid_route_that_is_not_listed_is_only_a_note():
    """JobRouter::config reads only the routes JOB_ROUTER_ROUTE_NAMES lists, so an invalid body in
    an unlisted route changes nothing the router does."""
    r = router(COMPLEX_IF_ROUTE.replace("JOB_ROUTER_ROUTE_NAMES = Big Rest", "JOB_ROUTER_ROUTE_NAMES = Rest"))
    assert [x.name for x in r.routes] == ["Rest"]
    assert not messages(r.diagnostics, Severity.ERROR)
    assert any("complex conditionals are not supported" in m and "not listed" in m
               for m in messages(r.diagnostics, Severity.NOTE))
