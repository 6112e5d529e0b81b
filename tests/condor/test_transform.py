"""The transform language (docs/hook-protocol.md §4.1; HTCondor config docs for $FUNC macros)."""

from __future__ import annotations

import classad2
import pytest

from ce_k8s.condor.config import CondorConfig, Origin
from ce_k8s.condor.transform import (
    MacroError,
    MacroSet,
    Transform,
    TransformError,
    expand_macros,
    parse_old_expr,
    universe_number,
)
from ce_k8s.condor.wire import unparse_old


def ad_of(text: str) -> classad2.ClassAd:
    return classad2.parseOne(text, classad2.ParserType.Old)


def run(body: str, job: str = "", config: CondorConfig | None = None, macros: MacroSet | None = None):
    ad = ad_of(job)
    t = Transform.parse("T", body)
    errors = t.apply(ad, macros if macros is not None else MacroSet(config))
    return ad, errors


def text(ad: classad2.ClassAd, name: str) -> str:
    return unparse_old(ad.lookup(name))


# ---- metadata and line classification -------------------------------------------------------


def test_metadata_statements_are_stripped_and_recorded_section_4_1():
    """docs/hook-protocol.md §4.1: NAME, UNIVERSE, REQUIREMENTS and TRANSFORM are metadata, not run against the ad."""
    t = Transform.parse("T", "NAME Other\nUNIVERSE vanilla\nREQUIREMENTS Owner == \"x\"\nSET A 1\nTRANSFORM")
    assert t.statement_name == "Other"
    assert t.universe == 5
    assert t.requirements == 'Owner == "x"'
    ad = ad_of("Owner = \"y\"")
    t.apply(ad, MacroSet(None))
    assert set(ad.keys()) == {"Owner", "A"}


def test_keyword_followed_by_equals_is_a_macro_assignment_section_4_1():
    """is_xform_statement: `NAME = x` assigns the macro NAME; `SET A = 1` is a statement."""
    t = Transform.parse("T", "NAME = fromMacro\nSET Got \"$(NAME)\"")
    assert t.statement_name is None
    ad, _ = run("NAME = fromMacro\nSET Got \"$(NAME)\"")
    assert ad.eval("Got") == "fromMacro"


def test_universe_names_and_numbers():
    """CondorUniverseNumberEx: names are case-insensitive, numbers are taken as they are."""
    assert universe_number("VANILLA") == 5
    assert universe_number("grid") == 9
    assert universe_number("7") == 7
    assert universe_number("bogus") == 0


def test_keywords_are_case_insensitive_section_4_1():
    ad, errors = run("set A 1\nEvalSet B A + 1\ncopy B C")
    assert errors == []
    assert (ad.eval("A"), ad.eval("B"), ad.eval("C")) == (1, 2, 2)


# ---- SET / DEFAULT / EVALSET / EVALMACRO ------------------------------------------------------


def test_set_stores_the_unevaluated_expression_section_4_1():
    ad, _ = run("SET Double RequestCpus * 2", "RequestCpus = 4")
    assert text(ad, "Double") == "RequestCpus * 2"
    assert ad.eval("Double") == 8


def test_equals_or_comma_between_arguments_section_4_1():
    """docs/hook-protocol.md §4.1: for two-argument keywords an `=` or `,` between the arguments is allowed."""
    ad, errors = run("SET A = 1\nSET B , 2\nEVALMACRO M = 3\nSET C $(M)\nCOPY A, D")
    assert errors == []
    assert (ad.eval("A"), ad.eval("B"), ad.eval("C"), ad.eval("D")) == (1, 2, 3, 1)


def test_bad_set_expression_is_logged_and_skipped_section_4_1():
    """docs/hook-protocol.md §4.1: a SET that does not parse is logged; the transform carries on."""
    ad, errors = run("SET Bad (1 +\nSET Good 1")
    assert "Bad" not in ad
    assert ad.eval("Good") == 1
    assert len(errors) == 1 and "SET Bad invalid expression" in errors[0]


def test_set_requires_the_whole_text_to_parse_section_4_1():
    """ParseClassAdRvalExpr is called with full=true: `1 2` is an error, not `1`."""
    ad, errors = run("SET Bad 1 2")
    assert "Bad" not in ad and errors
    assert parse_old_expr("1 2") is None
    assert parse_old_expr("(1) + (2") is None
    assert parse_old_expr("1) + (2") is None


def test_set_value_uses_old_syntax_strings():
    """Old ClassAd strings escape only the quote; a backslash stays a backslash."""
    ad, _ = run(r'SET P "a\b"' + "\n" + r'SET R regexp("\/cms\/Role\=pilot", Fqan)', 'Fqan = "/cms/Role=pilot"')
    assert ad.eval("P") == "a\\b"
    assert ad.eval("R") is True


def test_set_inserts_any_attribute_name_as_classad_insert_does():
    """xform_utils.cpp kw_SET: ClassAd::Insert takes any non-empty name, so `SET A.B 1` and
    `SET A=1 2` make attributes "A.B" and "A=1" (what HTCondor's TransformClassAd gives)."""
    ad, errors = run("SET A=1 2\nSET A.B 1\nSET C 3")
    assert sorted(ad.keys()) == ["A.B", "A=1", "C"] and errors == []


def test_default_only_sets_absent_attributes_lookup_quirk_section_4_1():
    """docs/hook-protocol.md §4.1: DEFAULT checks Lookup(), so a literal `undefined` is NOT replaced
    (HTCondor's documentation says it is)."""
    ad, _ = run("DEFAULT A 1\nDEFAULT B 2\nDEFAULT C 3", "A = undefined\nB = 7")
    assert text(ad, "A") == "undefined"
    assert ad.eval("B") == 7
    assert ad.eval("C") == 3


def test_evalset_stores_the_value_section_4_1():
    """docs/hook-protocol.md §4.1: EVALSET stores the value; a list value is copied as the list it evaluates to, whose
    elements ClassAd evaluation leaves as written (XFormCopyValueToTree copies the ExprList)."""
    ad, _ = run("EVALSET Mem maxMemory ?: 2000\nEVALSET L { 1, 1 + 1 }\nEVALSET S strcat(\"a\", Owner)",
                'maxMemory = 16000\nOwner = "x"')
    assert text(ad, "Mem") == "16000"
    assert text(ad, "L") == "{ 1,1 + 1 }"
    assert ad.eval("S") == "ax"


def test_evalset_sees_only_the_job_target_is_undefined_section_4_4():
    """EVALSET evaluates against the ad being transformed only: TARGET.x is undefined."""
    ad, _ = run("EVALSET T TARGET.Cpus\nEVALSET M MY.Cpus", "Cpus = 4")
    assert text(ad, "T") == "undefined"
    assert ad.eval("M") == 4


def test_evalmacro_strings_unquoted_other_values_unparsed_section_4_1():
    ad, _ = run('EVALMACRO S strcat("a", "b")\nEVALMACRO B 1 == 1\nEVALMACRO U nothing\n'
                'SET Out "$(S)-$(B)-$(U)"')
    assert ad.eval("Out") == "ab-true-undefined"


# ---- COPY / RENAME / DELETE -------------------------------------------------------------------


def test_copy_rename_delete_plain_section_4_1():
    ad, _ = run("COPY A B\nRENAME C D\nDELETE E\nCOPY Missing X", "A = 1 + 1\nC = 3\nE = 4")
    assert text(ad, "B") == "1 + 1"
    assert "C" not in ad and ad.eval("D") == 3
    assert "E" not in ad and "X" not in ad


def test_regex_forms_are_case_insensitive_with_groups_section_4_1():
    """docs/hook-protocol.md §4.1: /re/ matches names case-insensitively; \\0…\\9 substitute the groups."""
    ad, _ = run(
        "RENAME /^authtoken(.*)$/ orig_\\0\nCOPY /^OnExitHold(.*)$/ Saved_\\1\nDELETE /^tmp_/",
        'AuthTokenIssuer = "i"\nAuthTokenSubject = "s"\nOnExitHoldReason = "r"\ntmp_a = 1\nTMP_b = 2\nkeep = 3',
    )
    assert ad.eval("orig_AuthTokenIssuer") == "i" and ad.eval("orig_AuthTokenSubject") == "s"
    assert "AuthTokenIssuer" not in ad
    assert ad.eval("Saved_Reason") == "r" and ad.eval("OnExitHoldReason") == "r"
    assert "tmp_a" not in ad and "TMP_b" not in ad and ad.eval("keep") == 3


def test_regex_replacement_keeps_backslash_beyond_group_count():
    ad, _ = run("COPY /^(A)$/ X\\1\\5", "A = 1")
    assert "XA" not in ad  # \5 is not a group: the name "XA\5" is invalid, nothing is copied
    ad, errors = run("COPY /^(A)$/ X\\1", "A = 1")
    assert ad.eval("XA") == 1 and errors == []


# ---- macro expansion --------------------------------------------------------------------------


def test_my_attr_expands_to_the_unparsed_value_section_4_1():
    """docs/hook-protocol.md §4.1: $(MY.attr) is the unparsed value: strings without quotes, expressions unevaluated."""
    ad, _ = run('SET S "ns-$(MY.Owner)"\nSET E $(MY.Expr)\nSET N "$(MY.Missing:none)"',
                'Owner = "cms"\nExpr = 1 + 2')
    assert ad.eval("S") == "ns-cms"
    assert text(ad, "E") == "1 + 2"
    assert ad.eval("N") == "none"


def test_var_uses_the_value_at_that_moment_section_4_1():
    """docs/hook-protocol.md §4.1: $(var) uses the value at the moment the line runs, not the last one in the file."""
    ad, _ = run("X = 1\nSET A $(X)\nX = 2\nSET B $(X)")
    assert (ad.eval("A"), ad.eval("B")) == (1, 2)


def test_default_and_undefined_macros():
    ad, _ = run('SET A $(nothing:5)\nSET B "[$(nothing)]"\nE =\nSET C "[$(E:x)]"')
    assert ad.eval("A") == 5
    assert ad.eval("B") == "[]"
    assert ad.eval("C") == "[x]"  # config.cpp MACRO_ID_NORMAL: an empty value takes the default too


def test_dollar_dollar_is_kept_for_matchmaking_section_4_1():
    ad, _ = run('SET G "$$(TotalMemory:0)"\nSET H "$$([TotalCpus ?: JobCpus])"')
    assert ad.eval("G") == "$$(TotalMemory:0)"
    assert ad.eval("H") == "$$([TotalCpus ?: JobCpus])"


def test_fall_through_to_config_macros_section_4_1():
    """docs/hook-protocol.md §4.1: lookups fall through to config macros (also_in_config)."""
    cfg = CondorConfig.from_text("ROUTED_JOB_MAX_TIME = 4320\nSITE = $(NAME_PART)-x\nNAME_PART = abc\n")
    ad, _ = run('EVALSET R 60 * $(ROUTED_JOB_MAX_TIME)\nSET S "$(SITE)"', config=cfg)
    assert ad.eval("R") == 259200
    assert ad.eval("S") == "abc-x"


def test_nested_references_expand_innermost_first():
    ad, _ = run('Which = B\nB = found\nSET A "$($(Which))"\nSET C "$(none:$(B))"')
    assert ad.eval("A") == "found"
    assert ad.eval("C") == "found"


def test_self_reference_appends():
    ad, _ = run('L = a\nL = $(L) b\nSET X "$(L)"')
    assert ad.eval("X") == "a b"


def test_int_real_string_eval_functions():
    """HTCondor config docs: $INT/$REAL/$STRING evaluate and format, $EVAL unparses."""
    macros = MacroSet(None)
    macros.set("X", "2")
    macros.set("Y", "6")
    macros.set("XYArea", "$(X) * $(Y)")
    macros.set("Name", '"host.DOMAIN"')
    macros.set("LC", 'toLower($(Name))')
    macros.set("List", 'split("a,B,c")')
    assert expand_macros("$INT(XYArea)", macros) == "12"
    assert expand_macros("$INT(XYArea,%04d)", macros) == "0012"
    assert expand_macros("$INT(XYArea,Area=%d)", macros) == "Area=12"
    assert expand_macros("$REAL(XYArea,%.2f)", macros) == "12.00"
    assert expand_macros("$STRING(LC)", macros) == "host.domain"
    assert expand_macros("$STRING(LC,Name: %s)", macros) == "Name: host.domain"
    assert expand_macros("$EVAL(LC)", macros) == "host.domain"
    assert expand_macros("$EVAL(List)", macros) == '{ "a","B","c" }'
    with pytest.raises(MacroError):
        expand_macros("$INT(LC)", macros)


def test_int_evaluates_against_the_job():
    ad, _ = run("SET Shown \"$INT(MY.RequestCpus,%d cores)\"", "RequestCpus = 8")
    assert ad.eval("Shown") == "8 cores"


def test_substr_choice_random_functions():
    macros = MacroSet(None)
    macros.set("Name", "abcdef")
    macros.set("Colors", "red, green, blue")
    assert expand_macros("$SUBSTR(Name, 2)", macros) == "cdef"
    assert expand_macros("$SUBSTR(Name, 0, -2)", macros) == "abcd"
    assert expand_macros("$SUBSTR(Name, 1, 3)", macros) == "bcd"
    assert expand_macros("$SUBSTR(Name, -1)", macros) == "f"
    assert expand_macros("$SUBSTR(Name, 4, -3)", macros) == ""
    assert expand_macros("$CHOICE(1, Colors)", macros) == "green"
    assert expand_macros("$CHOICE(2, x, y, z)", macros) == "z"
    with pytest.raises(MacroError):
        expand_macros("$CHOICE(3, x, y, z)", macros)
    assert expand_macros("$RANDOM_CHOICE(7)", macros) == "7"
    assert expand_macros("$RANDOM_CHOICE(1,2,3)", macros) in {"1", "2", "3"}
    assert int(expand_macros("$RANDOM_INTEGER(0, 8, 2)", macros)) in {0, 2, 4, 6, 8}


def test_path_functions():
    macros = MacroSet(None)
    macros.set("F", "/tmp/dir/simulate.exe")
    assert expand_macros("$Fn(F)", macros) == "simulate"
    assert expand_macros("$Fx(F)", macros) == ".exe"
    assert expand_macros("$Fxb(F)", macros) == "exe"
    assert expand_macros("$Fp(F)", macros) == "/tmp/dir/"
    assert expand_macros("$Fd(F)", macros) == "dir/"
    assert expand_macros("$Fdb(F)", macros) == "dir"
    assert expand_macros("$Fnxq(F)", macros) == '"simulate.exe"'
    assert expand_macros("$BASENAME(F)", macros) == "simulate.exe"
    assert expand_macros("$DIRNAME(F)", macros) == "/tmp/dir/"
    # evaluate_macro_func: a name that is no macro is taken as the file name itself (HTCondor gives "undefinedname").
    assert expand_macros("$Fq(undefinedname)", macros) == "\"undefinedname\""


def test_env_function(monkeypatch):
    monkeypatch.setenv("CE_K8S_TEST_ENV", "v1")
    macros = MacroSet(None)
    assert expand_macros("$ENV(CE_K8S_TEST_ENV)-$ENV(CE_K8S_NOPE:dflt)", macros) == "v1-dflt"


def test_unknown_function_is_left_alone():
    assert expand_macros("$NOPE(x) $(", MacroSet(None)) == "$NOPE(x) $("


# ---- if / elif / else -------------------------------------------------------------------------


def test_if_defined_my_and_macro_section_4_1():
    body = """
if defined MY.xcount
    SET Branch "job"
elif defined default_xcount
    SET Branch "route"
else
    SET Branch "none"
endif
"""
    assert run(body, "xcount = 8")[0].eval("Branch") == "job"
    assert run("default_xcount = 4\n" + body)[0].eval("Branch") == "route"
    assert run(body)[0].eval("Branch") == "none"


def test_if_boolean_forms_and_negation_section_4_1():
    for cond, expected in [("true", True), ("yes", True), ("1", True), ("false", False), ("no", False),
                           ("0", False), ("! true", False), ("! defined MY.Nope", True), ("$(empty)", False)]:
        ad, _ = run(f"if {cond}\nSET Hit true\nelse\nSET Hit false\nendif")
        assert ad.eval("Hit") is expected, cond


def test_if_on_an_evalmacro_result_section_4_1():
    """docs/hook-protocol.md §4.1: complex conditions are computed first with EVALMACRO (as the CE's
    Cpus transform does)."""
    body = "EVALMACRO big ($(MY.RequestCpus:0)) > 1\nif $(big)\nSET Big true\nelse\nSET Big false\nendif"
    assert run(body, "RequestCpus = 8")[0].eval("Big") is True
    assert run(body, "RequestCpus = 1")[0].eval("Big") is False
    assert run(body)[0].eval("Big") is False


def test_if_version():
    macros = MacroSet(None, version="25.14.1")
    for cond, expected in [("version >= 25.0", True), ("version >= 25.15", False), ("version == 25.14", True),
                           ("version < 24.0.1", False), ("version <= 25.14.1", True)]:
        ad, _ = run(f"if {cond}\nSET Hit true\nelse\nSET Hit false\nendif", macros=macros)
        assert ad.eval("Hit") is expected, cond
    # config.cpp Evaluate_config_if: a version with fewer than two fields is an invalid literal.
    with pytest.raises(TransformError, match="the version literal is invalid"):
        run("if version == 25\nSET Hit true\nendif", macros=macros)


def test_nested_if_and_not_taken_branches_do_nothing():
    body = "if true\n  if false\n    SET A 1\n  else\n    SET B 2\n  endif\nelse\n  SET C 3\nendif"
    ad, _ = run(body)
    assert set(ad.keys()) == {"B"}


def test_if_with_non_boolean_value_is_a_structural_error():
    """config.cpp Evaluate_config_if: a string is evaluated against the job, and is not a boolean."""
    with pytest.raises(TransformError, match="is not a valid if condition because complex conditionals"):
        run('V = "hello world"\nif $(V)\nSET A 1\nendif')


# ---- structure and errors ---------------------------------------------------------------------


def test_unknown_keyword_is_a_structural_error_with_file_and_line_section_4_1():
    """ParseRulesCallback: an unknown keyword fails the transform when the line is run (not at load:
    MacroStreamXFormSource::open only strips metadata); the error names the config file and line."""
    t = Transform.parse("T", "SET A 1\nFROB A 2", Origin("routes/x.conf", 10), line_numbers=[11, 12])
    with pytest.raises(TransformError) as info:
        t.apply(ad_of(""), MacroSet(None))
    assert str(info.value) == "routes/x.conf:12: FROB is not a valid transform keyword"
    with pytest.raises(TransformError):
        t.validate(MacroSet(None))


def test_missing_argument_is_a_structural_error_section_4_1():
    """ParseRulesCallback: nothing after the keyword, or one argument to a two-argument keyword, fails."""
    with pytest.raises(TransformError, match="SET needs an argument"):
        run("SET")
    with pytest.raises(TransformError, match="SET needs 2 arguments"):
        run("SET A")
    with pytest.raises(TransformError, match="SET needs 2 arguments"):
        run("SET A =")
    # A bare REQUIREMENTS is not stripped at load (no white space after it) and fails when run.
    with pytest.raises(TransformError, match="REQUIREMENTS needs an argument"):
        run("REQUIREMENTS")
    # ValidateRulesCallback does not count arguments: `SET A` passes route validation.
    Transform.parse("T", "SET A").validate(MacroSet(None))


def test_unparsable_requirements_is_a_structural_error():
    with pytest.raises(TransformError, match="invalid REQUIREMENTS"):
        Transform.parse("T", "REQUIREMENTS Owner ==")


@pytest.mark.parametrize("body,message", [  # config.cpp ConfigIfStack::line_is_if / Parse_macros messages
    ("if true\nSET A 1", "endif\\(s\\) not found before end-of-file"),
    ("else\nSET A 1", "else without matching if"),
    ("endif", "endif without matching if"),
    ("if true\nelse\nelse\nendif", "else is not allowed after else"),
    ("if\nendif", "is not a valid if condition because expression is not a conditional"),
])
def test_broken_if_nesting(body, message):
    t = Transform.parse("T", body)  # loads: open() does not look at if/else
    with pytest.raises(TransformError, match=message):
        t.apply(ad_of(""), MacroSet(None))


def test_line_numbers_default_to_offsets_from_the_knob():
    """Without a line map, line k of an @= block is k+1 lines after the knob's NAME line."""
    with pytest.raises(TransformError) as info:
        Transform.parse("T", "SET A 1\nBOGUS", Origin("f.conf", 5)).apply(ad_of(""), MacroSet(None))
    assert info.value.origin == Origin("f.conf", 7)


def test_continuation_lines_are_joined():
    ad, _ = run('SET A strcat("x", \\\n   "y")\nSET B 1')
    assert ad.eval("A") == "xy" and ad.eval("B") == 1


def test_comments_and_blank_lines_are_ignored():
    ad, errors = run("# a comment\n\n   # indented comment\nSET A 1")
    assert errors == [] and ad.eval("A") == 1


# ---- transform REQUIREMENTS (pre/post-route rule) ---------------------------------------------


@pytest.mark.parametrize("req,job,expected", [
    ("BatchQueue is undefined", "", True),
    ("BatchQueue is undefined", 'BatchQueue = "q"', False),
    ("Missing == 1", "", False),  # UNDEFINED is not a boolean -> false
    ("1", "", True),  # numbers count as booleans (IsBooleanValueEquiv)
    ('"text"', "", False),
    ("error", "", False),  # evaluates (to ERROR), which is no boolean: MacroStreamXFormSource::matches
])
def test_transform_requirements_rule_section_4_1(req, job, expected):
    t = Transform.parse("T", f"REQUIREMENTS {req}\nSET A 1")
    assert t.requirements_match(ad_of(job)) is expected


def test_macro_set_shared_between_transforms_section_4_1():
    """docs/hook-protocol.md §4.1: one macro set per routed job; a macro set in one transform is seen by the next."""
    macros = MacroSet(None)
    ad = ad_of("")
    Transform.parse("Pre", "default_xcount = 4").apply(ad, macros)
    Transform.parse("Post", "EVALSET RequestCpus $(default_xcount:1)").apply(ad, macros)
    assert ad.eval("RequestCpus") == 4


# ---- $EVAL, $(DOLLAR), defaults (config.cpp evaluate_macro_func; values checked with xform_oracle) --


def test_eval_of_unparsable_text_is_empty_unless_it_was_expanded():
    """$EVAL keeps the macro-expanded text when the text had $(...) in it, else expands to nothing."""
    ad, _ = run('x = 3\nw = nope nope\nSET F $EVAL(x)\nSET G "$EVAL(Owner)"\nSET H "$EVAL(nope nope)"\n'
                'SET I "$EVAL($(w))"', 'Owner = "pilot"')
    assert ad.eval("F") == 3 and ad.eval("G") == "pilot" and ad.eval("H") == ""
    # A function's body ends at the first ')': $EVAL gets "$(w", which stays as text, and the
    # rescan then expands the "$(w)" that this leaves behind.
    assert ad.eval("I") == "nope nope"


def test_function_bodies_do_not_nest():
    """next_config_macro: a function body runs to the first ')', so a reference inside it is cut
    short (values as HTCondor's TransformClassAd gives them, via xform_oracle)."""
    ad, _ = run('w = nope nope\nv = 2\nSET J $EVAL($(v)+1)\nSET K "$SUBSTR($(w),1)"')
    assert "J" not in ad  # `$(v+1)` is left, which SET cannot parse
    assert ad.eval("K") == ",1)"


def test_dollar_macro_is_a_literal_dollar_after_expansion():
    ad, _ = run('SET A "$$(Memory)"\nSET B "$(DOLLAR)(x)"\nx = y\n')
    assert ad.eval("A") == "$$(Memory)" and ad.eval("B") == "$(x)"


def test_default_replaces_an_empty_macro_too():
    """MACRO_ID_NORMAL: `$(x:d)` uses d when x is undefined *or* its raw value is empty."""
    ad, _ = run('x =\nSET A "$(x:dflt)"\ny = $(x)\nSET B "$(y:dflt2)"')
    assert ad.eval("A") == "dflt" and ad.eval("B") == ""


def test_plus_attribute_lines_set_my_macros_not_the_ad():
    """Parse_macros (submit syntax): `+Attr = x` sets the macro MY.Attr, which lookup_macro finds
    before the job's attribute; `-Attr =` sets it empty. The ad itself is not changed."""
    ad, _ = run('+Foo = 1\nSET A "$(MY.Foo)"\n-Owner =\nSET B "[$(MY.Owner)]"', 'Owner = "pilot"')
    assert ad.eval("A") == "1" and "Foo" not in ad
    assert ad.eval("B") == "[]" and ad.eval("Owner") == "pilot"


def test_heredoc_macro_in_a_body():
    """Parse_macros reads `NAME @=TAG` ... `@TAG` inside a transform too (lines trimmed, comments
    dropped, joined with newlines); a SET of it keeps the line break in the string."""
    ad, _ = run('X @=EOT\none\n# dropped\n  two\n@EOT\nSET A "$(X)"\nSET B 1')
    assert ad.eval("A") == "one\ntwo" and ad.eval("B") == 1
    with pytest.raises(TransformError, match="Found end-of-file while scanning for '@EOT'"):
        run("X @=EOT\none\nSET B 1")
