"""ce-k8s's transform engine against HTCondor's own, statement by statement.

Each case is a small configuration exercising one corner of the transform language (macro
expansion, $ functions, if/else, EVALMACRO, regex COPY/RENAME/DELETE, quoting, macro sharing
between pre-route, route and post-route transforms, route reading). No expected value is written
here: HTCondor 25.14.1's code (tests/condor/xform_oracle.py) computes it, and ``ce-k8s route``
must give the same route and routed ad attribute by attribute (see ORACLE.md for the steps that
are ce-k8s's on both sides).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import xform_oracle
from xform_oracle import OracleUnavailable

JOB = r"""ClusterId = 12
ProcId = 3
JobUniverse = 5
JobStatus = 1
Owner = "osg01"
RequestCpus = 4
RequestMemory = 2048
xcount = 8
queue = "prod"
WinPath = "C:\dir\file.txt"
Quoted = "say \"hi\""
Doubled = RequestCpus * 2
Undef = undefined
Flag = true
Real = 1.5
Big = 12345678901
MaxHosts = 1
MaxWallTime = 60
AuthTokenSubject = "abc"
AuthTokenIssuer = "https://issuer.example"
Environment = "A=1 B=2"
Requirements = (TARGET.Arch == "X86_64")
"""


def route(body: str, extra: str = "", name: str = "T") -> str:
    return (f"JOB_ROUTER_ROUTE_NAMES = {name}\nJOB_ROUTER_ROUTE_{name} @=end\n  REQUIREMENTS true\n"
            f"  UNIVERSE vanilla\n{body}\n@end\n{extra}")


def pre_post(pre: str, body: str, post: str) -> str:
    return ("JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Pre\nJOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = Post\n"
            f"JOB_ROUTER_TRANSFORM_Pre @=end\n{pre}\n@end\nJOB_ROUTER_TRANSFORM_Post @=end\n{post}\n@end\n"
            + route(body))


CASES: dict[str, str] = {
    # SET and its spellings, quoting and expressions
    "set-forms": route('  SET A 1\n  SET B = 2\n  SET D  "x y"\n  SET E = Owner\n  SET F RequestCpus * 2 + 1'),
    "set-no-space-before-equals": route("  SET A 1\n  SET C=3\n  SET D 4"),
    "set-comment-tail": route("  SET A 1 # not a comment\n  SET B \"x\" # trailing"),
    "set-bad-expression": route("  SET A (1 +\n  SET B 2"),
    # found by the atheris transform target: a line with nothing before its '=' (the route is not
    # loaded), and a lone submit '+' or '-' before it (accepted)
    "assignment-without-name": route("  = 5\n  SET A 1"),
    "assignment-lone-plus": route("  + = 3\n  SET A 1"),
    "assignment-lone-minus": route("  - = 3\n  SET A 1"),
    "set-backslash-string": route('  SET P "C:\\dir\\new"\n  SET Q "tab\\there"'),
    "set-from-macro-of-backslash": route('  SET P "$(MY.WinPath)"\n  SET Q $(MY.WinPath)\n  SET R $(MY.Quoted)'),
    "set-existing-other-case": route("  SET requestcpus 6\n  SET OWNER \"x\""),
    "default-existing-undefined": route("  DEFAULT Undef 5\n  DEFAULT Flag false\n  DEFAULT NewOne 7"),
    # MY. and config macros
    "my-macros": route('  SET A "$(MY.Owner)"\n  SET B $(MY.Doubled)\n  SET C "$(MY.Nope)"\n'
                       '  SET D "$(MY.Nope:fallback)"\n  SET E $(MY.Real)\n  SET F $(MY.Flag)\n  SET G "$(MY.Undef)"'),
    "config-macros": route('  SET A "$(SITE_NAME)"\n  SET B "$(SUBSYSTEM)"\n  SET C "$(NOT_A_KNOB:dflt)"\n'
                           '  SET D "$(JOB_ROUTER_NAME:none)"', extra="SITE_NAME = My Site\n"),
    "macro-shadows-config": route('  SITE_NAME = from-route\n  SET A "$(SITE_NAME)"',
                                  extra="SITE_NAME = from-config\n"),
    "dollar-dollar": route('  SET A "$$(Owner)"\n  SET B "$$([RequestCpus * 2])"\n  SET C "$(DOLLAR)"'),
    "env-function": route('  SET A "$ENV(HOME)"\n  SET B "$ENV(CE_K8S_SURELY_UNSET:unset)"'),
    # $ functions
    "int-real-functions": route('  SET A $INT(MY.RequestCpus)\n  SET B $REAL(MY.Real)\n  SET C "$INT(MY.Real,%05d)"\n'
                                '  SET D "$REAL(MY.RequestCpus,%.3f)"\n  X = 7\n  SET E $INT(X)'),
    "int-of-non-number": route("  SET A $INT(MY.Owner)\n  SET B 2"),
    "string-function": route('  SET A $STRING(MY.Owner)\n  SET B "$STRING(MY.Owner,%s-x)"'),
    "substr-choice": route('  L = alpha beta gamma\n  SET A "$SUBSTR(MY.Owner,1,3)"\n  SET B "$CHOICE(1,L)"\n'
                           '  SET C "$SUBSTR(MY.Owner,-2)"'),
    "filename-functions": route('  F = /a/b/c.tar.gz\n  SET A "$Fn(F)"\n  SET B "$Fx(F)"\n  SET C "$Fp(F)"\n'
                                '  SET D "$Fdb(F)"\n  SET E "$Fq(F)"'),
    # EVALSET / EVALMACRO
    "evalset-values": route('  EVALSET A RequestCpus * 2\n  EVALSET B Real * 2\n  EVALSET C strcat(Owner, "-", queue)\n'
                            '  EVALSET D Undef\n  EVALSET E 1/0\n  EVALSET F Big * 3\n  EVALSET G 10 / 4'),
    "evalset-lists-records": route('  EVALSET L {1, "a", RequestCpus}\n  EVALSET R [a = 1; b = RequestCpus]\n'
                                   '  EVALSET S split("a b c")'),
    "evalmacro": route('  EVALMACRO M = RequestCpus * 3\n  EVALMACRO S = strcat("x", Owner)\n  EVALMACRO U = Undef\n'
                       '  EVALMACRO R = Real * 3\n  SET A $(M)\n  SET B "$(S)"\n  SET C "$(U)"\n  SET D $(R)'),
    "evalmacro-bool": route("  EVALMACRO T = RequestCpus > 1\n  if $(T)\n    SET A 1\n  else\n    SET A 2\n  endif"),
    # if / elif / else
    "if-defined": route("  X = 1\n  if defined X\n    SET A 1\n  endif\n  if defined MY.Owner\n    SET B 1\n  endif\n"
                        "  if defined MY.Nope\n    SET C 1\n  else\n    SET C 2\n  endif"),
    "if-elif-version": route("  if version >= 99.0.0\n    SET A 1\n  elif version >= 8.0.0\n    SET A 2\n  else\n"
                             "    SET A 3\n  endif"),
    "if-expressions": route("  if $(MY.RequestCpus) > 2\n    SET A 1\n  endif\n  if false\n    SET B 1\n  elif true\n"
                            "    SET B 2\n  endif\n  if ! defined Y\n    SET C 1\n  endif"),
    "if-simple": route("  if false\n    SET B 1\n  elif true\n    SET B 2\n  endif\n  if ! defined Y\n    SET C 1\n"
                       "  endif\n  N = 3\n  if $(N)\n    SET D 1\n  endif\n  if 0\n    SET E 1\n  endif"),
    "if-undefined-macro": route("  if $(NOT_DEFINED_ANYWHERE)\n    SET A 1\n  else\n    SET A 2\n  endif"),
    # COPY / RENAME / DELETE
    "copy-rename-delete": route("  COPY Owner OwnerCopy\n  RENAME queue OrigQueue\n  DELETE Environment\n"
                                "  DELETE NotThere\n  RENAME NotThere Other\n  COPY NotThere Other2"),
    "regex-ops": route("  COPY /^Auth(.*)$/ orig_\\1\n  RENAME /^Max(.+)/ Limit\\1\n  DELETE /^Real$/\n"
                       "  COPY /^request(cpus|memory)$/i Orig\\0"),
    "regex-whole-match": route("  RENAME /^AuthToken.*$/ orig_\\0"),
    "rename-case-only": route("  RENAME Owner owner\n  COPY RequestCpus requestcpus"),
    "bad-regex": route("  DELETE /([/\n  SET A 1"),
    # statements the route reader handles
    "name-universe-in-body": route("  NAME Other\n  SET A 1", name="T"),
    "transform-stops-body": route("  SET A 1\n  TRANSFORM\n  SET B 2"),
    "unknown-command": route("  FROB A 1\n  SET B 2"),
    "continuation-lines": route("  SET A strcat(\"a\", \\\n     \"b\")\n  SET B 1"),
    "blank-and-tabs": route("\n\t SET A 1\n\n  \tSET B \"t\"\n"),
    # macros shared by pre-route, route and post-route transforms
    "shared-macros": pre_post('  tmp_cpus = $(MY.RequestCpus)\n  SET PreSaw "$(tmp_cpus)"',
                              '  default_queue = fast\n  SET RouteSaw "$(tmp_cpus)"',
                              '  SET PostSaw "$(default_queue)-$(tmp_cpus)"\n  EVALSET PostCpus RequestCpus + 1'),
    "pre-route-requirements": ("JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = Yes No Err\n"
                               "JOB_ROUTER_TRANSFORM_Yes @=end\n  REQUIREMENTS RequestCpus > 1\n  SET SawYes 1\n@end\n"
                               "JOB_ROUTER_TRANSFORM_No @=end\n  REQUIREMENTS RequestCpus > 100\n  SET SawNo 1\n@end\n"
                               "JOB_ROUTER_TRANSFORM_Err @=end\n  REQUIREMENTS Owner > 1\n  SET SawErr 1\n@end\n"
                               + route("  SET R 1")),
    "post-sees-route-edits": pre_post("  SET P 1", "  SET RequestCpus 16", "  EVALSET Double RequestCpus * 2"),
    "duplicate-transform-names": ("JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = A a A\n"
                                  "JOB_ROUTER_TRANSFORM_A @=end\n  SET Count $(MY.Count:0) + 1\n@end\n"
                                  + route("  SET R 1")),
    # route reading and selection
    "route-name-case": ("JOB_ROUTER_ROUTE_NAMES = pilots\nJOB_ROUTER_ROUTE_Pilots @=end\n  REQUIREMENTS true\n"
                        "  UNIVERSE vanilla\n  SET A 1\n@end\n"),
    "route-order-and-invalid": ("JOB_ROUTER_ROUTE_NAMES = Bad NoReq Good\n"
                                "JOB_ROUTER_ROUTE_Bad @=end\n  REQUIREMENTS true\n  SET A (\n@end\n"
                                "JOB_ROUTER_ROUTE_NoReq @=end\n  UNIVERSE vanilla\n  SET A 2\n@end\n"
                                "JOB_ROUTER_ROUTE_Good @=end\n  REQUIREMENTS RequestCpus == 4\n"
                                "  GridResource = \"batch x\"\n  SET A 3\n@end\n"),
    "target-universe-macro": ("JOB_ROUTER_ROUTE_NAMES = T\nJOB_ROUTER_ROUTE_T @=end\n  REQUIREMENTS true\n"
                              "  TargetUniverse = 5\n  SET A 1\n@end\n"),
    "grid-resource-quoting": ("JOB_ROUTER_ROUTE_NAMES = T\nJOB_ROUTER_ROUTE_T @=end\n  REQUIREMENTS true\n"
                              "  GridResource = batch   slurm  \n  SET A 1\n@end\n"),
    "requirements-error-poisons-candidacy": ("JOB_ROUTER_ROUTE_NAMES = E T\nJOB_ROUTER_ROUTE_E @=end\n"
                                             "  REQUIREMENTS Owner + 1\n  SET A 1\n@end\n"
                                             + route("  SET A 2").split("\n", 1)[1]),
    "source-constraint-excludes": route("  SET A 1", extra="JOB_ROUTER_SOURCE_JOB_CONSTRAINT = RequestCpus > 100\n"),
    "classad-route-in-new-knob": ("JOB_ROUTER_ROUTE_NAMES = Old T\n"
                                  "JOB_ROUTER_ROUTE_Old = [ name = \"Old\"; GridResource = \"batch pbs\"; ]\n"
                                  + route("  SET A 2").split("\n", 1)[1]),
    "edit-job-in-place": ("JOB_ROUTER_ROUTE_NAMES = T\nJOB_ROUTER_ROUTE_T @=end\n  REQUIREMENTS true\n"
                          "  EditJobInPlace = true\n  SET A 1\n@end\n"),
    "sandboxed-remaps": ("JOB_ROUTER_ROUTE_NAMES = T\nJOB_ROUTER_ROUTE_T @=end\n  REQUIREMENTS true\n"
                         "  GridResource = \"batch k\"\n  JobShouldBeSandboxed = RequestCpus > 1\n  SET A 1\n@end\n"),
    # more statement forms
    "commands-any-case": route("  set A 1\n  Set B 2\n  evalSet C RequestCpus + 1\n  default D 4\n  copy Owner E\n"
                               "  rename queue F\n  delete Environment"),
    "plus-and-my-assignments": route("  +Foo = 1\n  MY.Bar = 2\n  SET A \"$(Foo)$(Bar)\""),
    "heredoc-macro-in-body": route("  X @=EOT\n  one\n  two\n  @EOT\n  SET A \"$(X)\""),
    "lone-dollar-in-string": route('  SET A "cost $5 and $ alone"\n  SET B "$(MY.Owner)$"'),
    "evalset-string-escapes": route('  EVALSET A strcat("a\\"b", "\\\\", Quoted)\n  EVALSET B WinPath'),
    "macro-self-append": route('  X = a\n  X = $(X) b\n  Y = $(Y) c\n  SET A "$(X)"\n  SET B "$(Y)"'),
    "copy-rename-onto-existing": route("  COPY Owner RequestCpus\n  RENAME queue RequestMemory"),
    "set-undefined-and-error": route("  SET A undefined\n  SET B error\n  EVALSET C Nope\n  EVALSET D error"),
    "default-with-macro": route("  DEFAULT RequestGPUs $(gpus:1)\n  DEFAULT RequestCpus 99"),
    "my-list-and-record": route('  EVALSET L {1, 2}\n  EVALSET R [a = 1]', extra="") ,
    "macro-of-expression-attr": route("  SET A $(MY.Doubled) + 1\n  SET B \"$(MY.Requirements)\"\n"
                                      "  SET C ($(MY.Requirements)) && true"),
    "regex-no-group-target": route("  COPY /^Max(.+)/ TotalMax\n  RENAME /^Auth/ Renamed\\0"),
    "universe-names": ("JOB_ROUTER_ROUTE_NAMES = L\nJOB_ROUTER_ROUTE_L @=end\n  REQUIREMENTS true\n"
                       "  UNIVERSE local\n  SET A 1\n@end\n"),
    "universe-grid-number": ("JOB_ROUTER_ROUTE_NAMES = G\nJOB_ROUTER_ROUTE_G @=end\n  REQUIREMENTS true\n"
                             "  UNIVERSE 9\n  GridResource = \"batch pbs\"\n@end\n"),
    "target-universe-expression": ("JOB_ROUTER_ROUTE_NAMES = T\nJOB_ROUTER_ROUTE_T @=end\n  REQUIREMENTS true\n"
                                   "  TargetUniverse = 2 + 3\n  SET A 1\n@end\n"),
    "grid-resource-from-macro": ("BACKEND = slurm\nJOB_ROUTER_ROUTE_NAMES = T\nJOB_ROUTER_ROUTE_T @=end\n"
                                 "  REQUIREMENTS true\n  GridResource = \"batch $(BACKEND)\"\n@end\n"),
    "grid-resource-set-in-body": ("JOB_ROUTER_ROUTE_NAMES = T\nJOB_ROUTER_ROUTE_T @=end\n  REQUIREMENTS true\n"
                                  "  GridResource = \"batch k8s\"\n  SET GridResource \"batch other\"\n@end\n"),
    "edit-job-in-place-false": ("JOB_ROUTER_ROUTE_NAMES = T\nJOB_ROUTER_ROUTE_T @=end\n  REQUIREMENTS true\n"
                                "  EditJobInPlace = false\n  UNIVERSE vanilla\n  SET A 1\n@end\n"),
    "names-knob-and-duplicates": ("JOB_ROUTER_ROUTE_NAMES = NAMES B A B\n"
                                  "JOB_ROUTER_ROUTE_A @=end\n  REQUIREMENTS true\n  UNIVERSE vanilla\n  SET A 1\n@end\n"
                                  "JOB_ROUTER_ROUTE_B @=end\n  REQUIREMENTS RequestCpus > 10\n  UNIVERSE vanilla\n"
                                  "  SET B 1\n@end\n"),
    "route-names-commas": ("JOB_ROUTER_ROUTE_NAMES = B, A\n"
                           "JOB_ROUTER_ROUTE_A @=end\n  REQUIREMENTS true\n  UNIVERSE vanilla\n  SET A 1\n@end\n"
                           "JOB_ROUTER_ROUTE_B @=end\n  REQUIREMENTS true\n  UNIVERSE vanilla\n  SET B 1\n@end\n"),
    "old-syntax-only": ("JOB_ROUTER_ENTRIES @=end\n[ name = \"Old\"; GridResource = \"batch pbs\"; "
                        "Requirements = target.RequestCpus > 0; set_A = 1; ]\n@end\n"),
    "old-syntax-beside-new": ("JOB_ROUTER_ENTRIES @=end\n[ name = \"Old\"; GridResource = \"batch pbs\"; "
                              "Requirements = true; ]\n@end\n" + route("  SET A 2")),
    "transform-names-missing-one": ("JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = Here Gone\n"
                                    "JOB_ROUTER_TRANSFORM_Here @=end\n  SET H 1\n@end\n" + route("  SET A 2")),
    "pre-route-name-statement": ("JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = P\n"
                                 "JOB_ROUTER_TRANSFORM_P @=end\n  NAME Renamed\n  UNIVERSE grid\n  SET P 1\n@end\n"
                                 + route("  SET A 2")),
    "config-macro-in-requirements": ("WANT = 4\nJOB_ROUTER_ROUTE_NAMES = T\nJOB_ROUTER_ROUTE_T @=end\n"
                                     "  REQUIREMENTS RequestCpus == $(WANT)\n  UNIVERSE vanilla\n@end\n"),
    "subsys-prefixed-knob": route('  SET A "$(COLOR)"', extra="COLOR = plain\nJOB_ROUTER.COLOR = router\n"),
    # expression forms SET and EVALSET write back
    "set-expression-forms": route("  SET A {1,2,3}\n  SET B [a=1;b=2]\n  SET C 1e10\n  SET D .5\n  SET E -3\n"
                                  "  SET F !true\n  SET G \"a\" =?= \"A\"\n  SET H MY.x\n  SET I TARGET.x\n"
                                  "  SET J nosuchfunc(1)\n  SET K [a = 1].a\n  SET L {1,2}[0]\n  SET M \"x\" ?: \"y\""),
    "evalset-expression-forms": route("  EVALSET A {RequestCpus, 2}\n  EVALSET B [a = RequestCpus]\n"
                                      "  EVALSET C 1e10 * 3\n  EVALSET D 7 % 3\n  EVALSET E RequestCpus > 3 && Flag\n"
                                      "  EVALSET F int(Real * 3)\n  EVALSET G real(RequestCpus) / 3"),
    "nested-and-default-macros": route('  N = Own\n  Own_K = deep\n  SET A "$($(N)_K)"\n  D = dflt\n'
                                       '  SET B "$(NOPE:$(D))"\n  SET C "$(NOPE:a,b)"'),
    "int-real-of-expressions": route('  X = 3 * 4\n  Y = 1.0 / 3\n  SET A $INT(X)\n  SET B $REAL(Y)\n'
                                     '  SET C "$REAL(Y,%.2f)"\n  SET D $INT(MY.Doubled)'),
    "evalmacro-forms": route('  EVALMACRO L = {1, 2}\n  EVALMACRO R = [a = 1]\n  EVALMACRO S = "quoted"\n'
                             '  EVALMACRO E = error\n  SET A "$(L)"\n  SET B "$(R)"\n  SET C "$(S)"\n  SET D "$(E)"'),
    "attribute-name-forms": route("  SET A.B 1\n  SET C 2"),
    "rename-to-invalid-name": route("  RENAME Owner 1abc\n  SET C 2"),
    "regex-flags": route("  COPY /^max(.*)$/i Lim\\1\n  DELETE /^AUTH/i"),
    "copy-same-name": route("  COPY Owner Owner\n  RENAME queue queue"),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    try:
        xform_oracle.shim_path()
    except OracleUnavailable as exc:
        pytest.fail(f"the transform oracle cannot run: {exc}")
    return tmp_path_factory.mktemp("differential")


@pytest.mark.parametrize("name", sorted(CASES))
def test_ce_k8s_transforms_like_htcondor(workdir: Path, name: str) -> None:
    confdir = workdir / name
    confdir.mkdir()
    (confdir / "50-case.conf").write_text(CASES[name])
    diffs = xform_oracle.differences_from_ce_k8s(confdir, JOB, ce_config=confdir, workdir=workdir)
    assert not diffs, f"case {name}:\n{CASES[name]}\nce-k8s route differs from HTCondor:\n  " + "\n  ".join(diffs)


def test_cases_are_not_vacuous(workdir: Path) -> None:
    """Most cases are routed by HTCondor, so the comparison is about routed ads."""
    routed = 0
    for name in sorted(CASES):
        confdir = workdir / f"v-{name}"
        confdir.mkdir()
        (confdir / "50-case.conf").write_text(CASES[name])
        routed += xform_oracle.run_oracle(confdir, JOB).ad_text is not None
    assert routed >= len(CASES) * 3 // 4, routed
