"""ce-k8s's transform engine against HTCondor 25.14's own TransformClassAd (tests/condor/xform_oracle.py).

Every configuration of test_xform_router.py, and a stock HTCondor-CE (tests/fixtures/stock_ce) with
its own pre/post-route transforms and the example pilots, is routed twice: by RouterConfig, and by
HTCondor's libcondor_utils driven the way JobRouter.cpp drives it. Both must choose the same route,
load the same routes, fail the same jobs and produce the same routed ad (the router's own stamps
aside). The expected values are therefore HTCondor's, computed by HTCondor's code.
"""

from __future__ import annotations

from pathlib import Path

import classad2
import pytest
import test_xform_router as cases
import xform_oracle  # tests/condor is on sys.path (pytest's rootdir-relative test imports)

from ce_k8s.condor import wire
from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.routing import RouterConfig

ROOT = Path(__file__).resolve().parents[2]
P = cases.PILOT
FQAN = 'x509UserProxyFirstFQAN = "/cms/Role=pilot/Capability=NULL"'
TYPO = (cases.PRE_IF.replace("JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Size",
                             "JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = Typo")
        + "JOB_ROUTER_TRANSFORM_Typo @=jrt\n  SETT Foo 1\n@jrt\n")
NESTED = (cases.COMPLEX_IF_ROUTE.replace("if MY.RequestCpus > 1", "if defined MY.xcount\n  if xcount > 1")
          .replace("    SET Big true\n  endif", "    SET Big true\n  endif\n  endif"))
TRAIL = cases.ESCAPES.replace("  SET VoMacro", "  EVALSET Trail 1 2\n  EVALSET Broken 1 +\n  SET VoMacro")
NO_CPUS = P.replace("RequestCpus = 1\n", "")

CONFIGS = [
    ("complex-if-route", cases.COMPLEX_IF_ROUTE, P + "RequestCpus = 8"),
    ("nested-if-true", NESTED, P + "xcount = 8"),
    ("nested-if-false", NESTED, P + "xcount = 1"),
    ("pre-if-true", cases.PRE_IF, NO_CPUS + "RequestCpus = 8"),
    ("pre-if-false", cases.PRE_IF, P),
    ("pre-if-undefined", cases.PRE_IF, NO_CPUS),
    ("pre-if-string", cases.PRE_IF, NO_CPUS + 'RequestCpus = "eight"'),
    ("escapes", cases.ESCAPES, P + FQAN),
    ("trailing-text", TRAIL, P + FQAN),
    ("xform-test-odd", cases.XFORM_TEST_ROUTES, P + "RouteMe = 1"),
    ("xform-test-even", cases.XFORM_TEST_ROUTES, NO_CPUS.replace("ProcId = 3", "ProcId = 4") + "RouteMe = 1"),
    ("xform-test-undefined", cases.XFORM_TEST_ROUTES, P),
    ("xform-test-string", cases.XFORM_TEST_ROUTES, P + 'RouteMe = "yes"'),
    ("dollar-functions", cases.FUNCS, P),
    ("whole-node-grid", cases.WHOLE_NODE, P + "WantWholeNode = true"),
    ("whole-node-vanilla", cases.WHOLE_NODE, P.replace('"pilot"', '"local"') + "WantWholeNode = true"),
    ("unknown-keyword-post", TYPO, P),
    ("transform-ends-body", "JOB_ROUTER_ROUTE_General @=jrt\n  REQUIREMENTS true\n  GridResource = \"batch x\"\n"
     + "\n".join("  " + line for line in cases.GENERAL_RULES.split("\n")) + "\n  SET After 1\n  FROB x\n@jrt\n"
     "JOB_ROUTER_ROUTE_NAMES = General\n", P + "ExitBySignal = false\nNumCkpts = 3\nStdErr = 1"),
]


def compare(config: Path | str, job_text: str, router: RouterConfig) -> None:
    theirs = xform_oracle.run_oracle(config, job_text, vanilla_to_grid=True)
    job = classad2.parseOne(job_text, classad2.ParserType.Old)
    assert router.enabled == theirs.routing_enabled
    assert sorted(r.name for r in router.routes) == sorted(r.name for r in theirs.routes if r.valid)
    route = router.choose_route(job)
    assert (route.name if route else None) == theirs.route
    if route is None:
        return
    ours = router.route_job(job, route)
    assert ours.failed == theirs.failed, (ours.diagnostics, theirs.errors)
    if not ours.failed:
        assert xform_oracle.ad_differences(ours.ad, theirs.ad()) == []


@pytest.mark.parametrize("label,config,job_text", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_same_result_as_htcondor(tmp_path, label, config, job_text):
    path = tmp_path / "condor_config"
    path.write_text(config)
    compare(path, job_text, RouterConfig.from_config(CondorConfig.from_text(config, str(path))))


def test_same_result_as_htcondor_with_user_maps(tmp_path):
    """02-ce-condor-defaults.conf's UidAcctGroup and x509AcctGroup with map files (userMap)."""
    (tmp_path / "u.map").write_text("* pilot cms_pilots\n* /^usatlas[0-9]+$/ atlas\n")
    (tmp_path / "x.map").write_text("* /^\\/cms\\/Role=pilot/ cms_fqan\n")
    config = cases.ACCT_GROUPS.format(uid_map=tmp_path / "u.map", x509_map=tmp_path / "x.map",
                                      pre="UidAcctGroup x509AcctGroup")
    path = tmp_path / "condor_config"
    path.write_text(config)
    router = RouterConfig.from_config(CondorConfig.from_text(config, str(path)))
    for job_text in (P, P.replace('"pilot"', '"usatlas3"'), P.replace('"pilot"', '"bob"') + FQAN,
                     P.replace('"pilot"', '"bob"')):
        compare(path, job_text, router)


@pytest.mark.parametrize("names", ["Slurm_Cluster", "Condor_Pool Slurm_Cluster"])
def test_stock_ce_with_its_transforms_and_the_example_pilots(stock_ce_layout, tmp_path, names):
    """A stock HTCondor-CE (condor and slurm packages), its pre/post-route transforms plus the
    accounting-group ones, read with its commands run (the router-defaults program adds Env)."""
    ce = stock_ce_layout.copy_stock_ce(tmp_path / "ce", batch=("condor", "slurm"))
    (ce.root / "etc/condor-ce/uid_acct_group.map").write_text("* atlas01 atlas\n* cmspilot cms\n")
    ce.write_site("99-local.conf", f"JOB_ROUTER_ROUTE_NAMES = {names}\nJOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = "
                  "$(JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES) UidAcctGroup x509AcctGroup\n")
    router = RouterConfig.from_config(CondorConfig.load(str(ce.condor_config), run_commands=True))
    pilots = sorted((ROOT / "examples").glob("pilot-*.ad"))
    assert pilots
    for path in pilots:
        text = path.read_text()
        wire.parse_old_ads(text, str(path))  # the example is a valid old-syntax ad
        compare(ce.condor_config, text, router)


# Route bodies exercising one statement form each: every keyword, each $FUNC(), if/elif/else forms,
# assignments (+=, self references, empty values with defaults), metadata lines, continuations.
ROUTE_JOB = ('ClusterId = 12\nProcId = 3\nJobUniverse = 5\nJobStatus = 1\nOwner = "pilot"\nRequestCpus = 2\n'
             'xcount = 4\nQueue = "prod"\nEnvironment = "A=1"\nMaxWallTime = 100\nWantWholeNode = true\n'
             'Tricky = "has $(w) inside"\n')
BODIES = [
    ('predefined-macros',
     'SET A "$(IsLinux)|$(IsWindows)|$(IsClusterAd)|$(Row)|$(Step)|$(XFormId)|$(LateMaterialization)"\n'
     'if defined Row\n SET B 1\nendif'),
    ('if-numbers', 'if 0.5\n SET A 1\nendif\nif -1\n SET B 1\nendif\nif 1e3\n SET C 1\nendif\nif 0\n SET D 1\nendif'),
    ('if-version-forms', 'if version > 25.0.0\n SET A 1\nendif\nif version <= 8.9\n SET B 1\nendif\n'
     'if version != 25.14.1\n SET C 1\nendif\nif version == 25.14\n SET D 1\nendif'),
    ('if-defined-forms', 'x = 1\nif defined x\n SET A 1\nendif\nif defined true\n SET B 1\nendif\n'
     'if defined 0\n SET C 1\nendif\nif defined IsLinux\n SET D 1\nendif\nif defined yes\n SET E 1\nendif'),
    ('colon-outside-if', ':SET A 1\nSET B 2'),
    ('colon-before-and-inside-if', ':if true\n:SET A 1\n:endif\nif true\n:SET C 1\nendif\nSET B 2'),
    ('heredoc', 'X @=EOT\none\n# dropped\n  two\n@EOT\nSET A "$(X)"\nSET B 1'),
    ('evalmacro-classad', 'EVALMACRO R = [a = 1; b = "x"]\nSET B "$(R)"\nEVALMACRO L {1, 2}\nSET L "$(L)"'),
    ('odd-attribute-names', 'SET A.B 1\nSET C=1 2\nEVALSET D.E 3'),
    ('plus-attr', '+Foo = 1\nSET A "$(MY.Foo)"\n-Owner =\nSET B "[$(MY.Owner)]"\nif defined MY.Foo\n SET C 1\nendif'),
    ('keyword-lower-args', 'set a = 1\ndelete A'),
    ('default-expr', 'DEFAULT RequestMemory ifThenElse(RequestCpus > 1, 2000, 1000)'),
    ('if-else-nested', 'if defined MY.xcount\n if $(MY.xcount:0)\n  SET A 1\n else\n  SET A 2\n endif\n'
     'else\n SET A 3\nendif'),
    ('choice-bad',
     'list = a, b\n'
     'SET A "$CHOICE(5, list)"\n'
     'SET B "$CHOICE(x, list)"\n'
     'SET C "$CHOICE(1, nolist)"\n'
     'SET D "[$CHOICE(0,list)]"'),
    ('substr-more',
     'v = abcdef\n'
     'SET A "$SUBSTR(v, -3, 2)"\n'
     'SET B "$SUBSTR(v, 10)"\n'
     'SET C "$SUBSTR(v, 1, -2)"\n'
     'SET D "$SUBSTR(v)"'),
    ('fname-more',
     'f = /a/b/c.tar.gz\n'
     'SET A "$Fdb(f)"\n'
     'SET B "$Fxb(f)"\n'
     'SET C "$Fqa(f)"\n'
     'g = c:\\\\x\\\\y.txt\n'
     'SET D "$Fnx(g)"\n'
     'SET E "$Fddn(f)"\n'
     'SET F "$F(f)"'),
    ('int-fmt',
     'v = 7\n'
     'SET A "$INT(v,%5d)"\n'
     'SET B "$INT(v,%s)"\n'
     'SET C "$REAL(v,%x)"\n'
     'SET D "$REAL(nonum)"\n'
     'SET E "$INT(3.9)"\n'
     'SET F "$REAL(1/3)"'),
    ('string-more',
     'SET A "$STRING(undefined_name)"\n'
     's = strcat("a", "b")\n'
     'SET B "$STRING(s)"\n'
     'SET C "$STRING(s,%-4s|)"'),
    ('eval-more',
     'SET A "$EVAL(Owner)"\n'
     'SET B $EVAL(xcount * 2)\n'
     'SET C "$EVAL(strcat("x", "y"))"\n'
     'SET D "$EVAL({1,2})"\n'
     'SET E "$EVAL(Nope)"\n'
     'SET F "$EVAL(1.5)"'),
    ('env-more',
     'SET A "$ENV(CE_K8S_NOPE)"\n'
     'SET B "$ENV(CE_K8S_NOPE:)"'),
    ('random-integer-fixed', 'SET A $RANDOM_INTEGER(4, 4)\nSET B $RANDOM_INTEGER(5, 1)'),
    ('nested-functions', 'w = nope nope\nv = 2\nSET I "$EVAL($(w))"\nSET J $EVAL($(v)+1)\nSET K "$SUBSTR($(w),1)"\n'
     'SET L "$INT($(v))"\nSET M "$ENV(HOME_NOPE:$(w))"'),
    ('macro-in-my-value', 'SET A "$(MY.Tricky)"\nSET B "$(DOLLAR)(w) $(dollar)"'),
    ('set-quoted-first', 'SET A "x y"'),
    ('default-undef', 'DEFAULT Queue 1\nDEFAULT Nope undefined\nDEFAULT Nope2 3'),
    ('copy-regex', 'COPY /^Max(.+)/ Copied\\1\nRENAME /^Request(.+)/ Req\\1\nDELETE /^want/'),
    ('evalset-list', 'EVALSET L {1, 2, Owner}\nEVALSET C [a = 1; b = Owner]\nEVALSET U undefined\nEVALSET E error'),
    ('evalmacro-list',
     'EVALMACRO m {1, "a"}\n'
     'SET L $(m)\n'
     'EVALMACRO s strcat("x", Owner)\n'
     'SET S "$(s)"\n'
     'EVALMACRO r 1.5\n'
     'SET Rl $(r)'),
    ('eval-func',
     'SET E $EVAL(RequestCpus * 2)\n'
     'x = 3\n'
     'SET F $EVAL(x)\n'
     'SET G "$EVAL(Owner)"\n'
     'SET H "$EVAL(nope nope)"'),
    ('choice', 'list = a, b, c\nSET C "$CHOICE(1, list)"\nSET D "$CHOICE(2, x, y, z)"'),
    ('substr', 'v = abcdef\nSET S "$SUBSTR(v, 2)"\nSET T "$SUBSTR(v, 1, 2)"\nSET U "$SUBSTR(v, -2)"'),
    ('fname',
     'f = /a/b/c.txt\n'
     'SET A "$Fnx(f)"\n'
     'SET B "$Fp(f)"\n'
     'SET C "$Fd(f)"\n'
     'SET D $Fq(f)\n'
     'SET E "$BASENAME(f)"\n'
     'SET G "$DIRNAME(f)"'),
    ('plus-assign', 'x = a\nx += b\nx +,= c\nSET X "$(x)"'),
    ('self-ref', 'x = 1\nx = $(x) 2\nSET X "$(x)"'),
    ('my-attr', 'SET A "$(MY.Owner)"\nSET B $(MY.RequestCpus)\nSET C "$(MY.Nope:dflt)"\nSET D "$(MY.Environment)"'),
    ('if-forms',
     'if $(undefined_macro)\n'
     ' SET A 1\n'
     'else\n'
     ' SET A 2\n'
     'endif\n'
     'if ! defined MY.Nope\n'
     ' SET B 1\n'
     'endif\n'
     'if version >= 24.0\n'
     ' SET C 1\n'
     'endif\n'
     'if defined MY.xcount\n'
     ' SET D 1\n'
     'elif true\n'
     ' SET D 2\n'
     'else\n'
     ' SET D 3\n'
     'endif'),
    ('if-yes-no', 'if yes\n SET A 1\nendif\nif f\n SET B 1\nendif\nif 0.0\n SET C 1\nendif\nif 2\n SET D 1\nendif'),
    ('if-colon', ':if true\n:SET A 1\nendif'),
    ('evalmacro-if', 'EVALMACRO big $(MY.RequestCpus:0) > 1\nif $(big)\n SET Big true\nendif'),
    ('name-line', 'NAME Other\nSET A 1'),
    ('universe-vanilla', 'UNIVERSE vanilla\nSET A 1'),
    ('universe-num', 'UNIVERSE 5\nSET A 1'),
    ('target-universe-5', 'TargetUniverse = 5\nSET A 1'),
    ('gridresource-macro', 'site = foo\nGridResource = "batch $(site)"'),
    ('req-in-if', 'if false\nREQUIREMENTS false\nendif\nSET A 1'),
    ('set-target', 'SET Requirements TARGET.Memory > 10 && MY.RequestCpus > 1'),
    ('set-strings', 'SET P "a\\b"\nSET Q "\\"quoted\\""'),
    ('evalset-strings', 'EVALSET P "a\\\\b"\nEVALSET Q strcat("x", "\\"")'),
    ('copy-invalid', 'COPY Owner 1bad\nSET After 1'),
    ('rename-missing', 'RENAME Nope Other\nDELETE Nope2\nSET After 1'),
    ('comments-cont', '# c\nSET A strcat("x", \\\n  "y")\n# SET B 1\nSET C 1 \\\n# comment inside\n + 2'),
    ('case-kw', 'set A 1\nEvalSet B 2\ncopy A C'),
    ('maxjobs', 'MaxJobs = 5\nMaxIdleJobs = 2\nSET A 1'),
    ('edit-in-place', 'EditJobInPlace = true\nSET A 1'),
    ('transform-1', 'SET A 1\nTRANSFORM 1\nSET B 2'),
    ('transform-space', 'SET A 1\nTRANSFORM \nSET B 2'),
    ('eval-undefined-set', 'SET A $(nope)\nSET B "$(nope)"'),
    ('int-real',
     'v = 7\n'
     'SET A $INT(v)\n'
     'SET B $REAL(v)\n'
     'w = 2.5\n'
     'SET C $INT(w)\n'
     'SET D $REAL(w)\n'
     'SET E $INT(1+2)\n'
     'SET F $REAL(true)'),
    ('string-func', 'q = "a b"\nSET A "$STRING(q)"\nn = 12\nSET B "$STRING(n)"\nSET C "$STRING(n,x%sy)"'),
    ('dollar-dollar', 'SET A "$$(Memory)"\nSET B "$(DOLLAR)"'),
    ('empty-default', 'x =\nSET A "$(x:dflt)"\ny = $(x)\nSET B "$(y:dflt2)"'),
    ('elif-complex', 'if defined MY.Nope\n SET A 1\nelif RequestCpus == 2\n SET A 2\nendif'),
    ('elif-complex-false', 'if defined MY.Nope\n SET A 1\nelif RequestCpus == 3\n SET A 2\nelse\n SET A 3\nendif'),
    ('if-true-then-complex-elif', 'if true\n SET A 1\nelif nonsense here\n SET A 2\nendif'),
    ('if-bang-complex', 'if ! (RequestCpus == 3)\n SET A 1\nendif'),
    ('if-defined-number', 'if defined 1\n SET A 1\nendif'),
    ('if-macro-string', 'v = hello\nif $(v)\n SET A 1\nendif'),
    ('if-my-true', 'if $(MY.WantWholeNode)\n SET A 1\nendif'),
    ('evalset-macro-if', 'EVALMACRO q strcmp(Queue, "prod") == 0\nif $(q)\n SET IsProd true\nendif'),
    ('set-no-value', 'SET A'),
    ('delete-regex-bad', 'DELETE /(unclosed/\nSET After 1'),
    ('regex-no-close', 'DELETE /abc\nSET After 1'),
    ('nested-macro', 'a = b\nb_c = deep\nSET X "$($(a)_c)"'),
]


@pytest.mark.parametrize("label,body", BODIES, ids=[b[0] for b in BODIES])
def test_route_body_same_as_htcondor(tmp_path, label, body):
    config = ("JOB_ROUTER_ROUTE_R @=jrt\n  REQUIREMENTS true\n  GridResource = \"batch slurm\"\n"
              f"{body}\n@jrt\nJOB_ROUTER_ROUTE_NAMES = R\n")
    path = tmp_path / "condor_config"
    path.write_text(config)
    compare(path, ROUTE_JOB, RouterConfig.from_config(CondorConfig.from_text(config, str(path))))


def _transform_cases():
    """tests/fixtures/transform_cases.py, loaded by path (tests/ is not a package)."""
    import importlib.util

    path = ROOT / "tests" / "fixtures" / "transform_cases.py"
    spec = importlib.util.spec_from_file_location("ce_k8s_tests_transform_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


TRANSFORM_CASES = _transform_cases()


@pytest.mark.parametrize("case", sorted(TRANSFORM_CASES))
def test_ce_k8s_route_json_same_as_htcondor_on_timing_and_failures(tmp_path, case):
    """`ce-k8s route --json` against HTCondor 25.14.1's TransformClassAd on the cases that the real
    condor_job_router_info showed it got wrong (docs/real-condor.md, "Route fidelity"): a macro
    expanded when the statement using it runs, not at its definition, and a post-route transform
    that fails submits nothing. Where HTCondor gives the job up, the JSON has no routed ad and the
    error names the route and the failing transform."""
    config, extra = TRANSFORM_CASES[case]
    path = tmp_path / "condor_config"
    path.write_text(config)
    job_text = (ROOT / "examples" / "pilot-cpu8.ad").read_text() + extra
    assert xform_oracle.differences_from_ce_k8s(path, job_text, ce_config=str(path), workdir=tmp_path) == []
    job_file = tmp_path / "job.ad"
    job_file.write_text(job_text)
    _rc, (ours,) = xform_oracle.ce_k8s_route_json(path, job_file)
    theirs = xform_oracle.run_oracle(path, job_text)
    if theirs.failed:
        assert ours["routed_ad"] is None and ours["submitted"] is False
        assert any("routed by Timing" in e and "transform Late" in e for e in ours["errors"]), ours["errors"]
    elif "edited_in_place" in ours:
        # EditJobInPlace: no routed job; on a Kubernetes route an error says why that is a mistake
        assert ours["routed_ad"] is None and ours["submitted"] is False and "Timed" in ours["edited_in_place"]
        assert any("route Timing: EditJobInPlace" in e for e in ours["errors"]), ours["errors"]
    else:
        assert ours["submitted"] is True and "Timed" in ours["routed_ad"]
