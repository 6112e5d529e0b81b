"""The raw HTCondor config reader (ce_k8s.condor.config).

Rules come from HTCondor's config.cpp (a faithful raw reader: ``@=`` blocks, ``\\``
continuations, ``#`` comments, LOCAL_CONFIG_DIR in sorted order, ``$(X)`` for non-route knobs),
condor_config.cpp (LOCAL_CONFIG_DIR / LOCAL_CONFIG_FILE, docs/internals.md "ce_k8s.condor.config"); the
expected values were checked against ``htcondor2.param`` 25.14.1 (see test_config_oracle.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ce_k8s.condor.config import (
    DEFAULT_EXCLUDE_REGEXP,
    CondorConfig,
    ConfigError,
    Origin,
    default_config_paths,
)
from ce_k8s.condor.diagnostics import Severity


def cfg_of(text: str, name: str = "test.conf", **kw) -> CondorConfig:
    return CondorConfig.from_text(text, name, **kw)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---- statements ---------------------------------------------------------------------------


def test_assignment_names_are_case_insensitive_and_keep_first_spelling():
    """config.cpp insert_macro: keys are case-insensitive; HTCondor keeps the key of the first definition."""
    c = cfg_of("Foo = 1\nFOO = 2\nbar=3\n")
    assert c.get("foo") == "2" and c.raw("FoO") == "2"
    assert c.names() == ["Foo", "bar"]
    assert c.origin("FOO") == Origin("test.conf", 2)


def test_colon_assignment_is_accepted_with_htcondor_warning():
    """config.cpp: 'NAME : value' is the obsolete form; HTCondor 25 warns and assigns."""
    c = cfg_of("A = 1\nB : two\n")
    assert c.get("B") == "two"
    assert c.warnings == ["test.conf:2: obsolete use of ':' for parameter assignment at B : two"]


def test_hash_is_a_comment_only_at_line_start():
    """config.cpp getline: '#' after text is part of the value."""
    c = cfg_of("# comment\n   # indented comment\nF = value # not a comment\n")
    assert c.get("F") == "value # not a comment"
    assert c.names() == ["F"]


def test_leading_and_trailing_whitespace_is_trimmed():
    c = cfg_of("   G   =   indented   \t\n")
    assert c.raw("G") == "indented"


def test_backslash_continuation_joins_lines_keeping_the_space_before_it():
    """getline_implementation: '\\' continuation; a '#' line inside must itself end in '\\' (only its last char
    stays)."""
    c = cfg_of("H = line1 \\\n    line2 \\\n# comment in continuation \\\n    line3\nNEXT = x\n")
    assert c.raw("H") == "line1 line2 line3"
    assert c.origin("NEXT") == Origin("test.conf", 5)


def test_comment_line_ending_a_continuation_leaves_its_last_character():
    """getline_implementation: a '#' line after a continuation counts as whitespace but its last char."""
    c = cfg_of("H = a \\\n# xy\n")
    assert c.raw("H") == "a y"


def test_blank_line_ends_a_continuation():
    c = cfg_of("H = a \\\n\nI = b\n")
    assert c.raw("H") == "a "  # the space before the backslash stays (htcondor2 agrees)
    assert c.raw("I") == "b"


def test_here_block_drops_comments_blank_lines_and_indentation():
    """Parse_macros: comment lines and indentation inside @= blocks are removed (htcondor2 25.14.1)."""
    text = (
        "ROUTE @=jrt\n"
        "  # comment inside\n"
        '  SET Foo "bar"\n'
        "\n"
        "    SET Baz 1   \n"
        "  H = x \\\n"
        "   y\n"
        "@jrt\n"
        "AFTER = 1\n"
    )
    c = cfg_of(text)
    assert c.raw("ROUTE") == 'SET Foo "bar"\nSET Baz 1\nH = x y'
    assert c.origin("ROUTE") == Origin("test.conf", 1)
    assert c.raw_lines("ROUTE") == [(3, 'SET Foo "bar"'), (5, "SET Baz 1"), (6, "H = x y")]
    assert c.get("AFTER") == "1"


def test_here_block_keeps_dollar_macros_unexpanded_in_raw():
    """JobRouter.cpp reads route bodies with param_unexpanded; $(MY.x) must survive."""
    c = cfg_of('JOB_ROUTER_ROUTE_K @=jrt\nSET Namespace "cms-$(MY.Owner)"\nSET X $(FULL_HOSTNAME)\n@jrt\n')
    assert c.raw("JOB_ROUTER_ROUTE_K") == 'SET Namespace "cms-$(MY.Owner)"\nSET X $(FULL_HOSTNAME)'


def test_unterminated_here_block_names_the_opening_line():
    with pytest.raises(ConfigError) as err:
        cfg_of("A = 1\nROUTE @=jrt\nSET A 1\n@JRT\n")
    assert str(err.value).startswith("test.conf:2: ")
    assert "@jrt" in str(err.value)


def test_line_without_operator_is_an_error_with_file_and_line():
    with pytest.raises(ConfigError) as err:
        cfg_of("A = 1\njust words\n")
    assert (err.value.file, err.value.line) == ("test.conf", 2)
    assert str(err.value).startswith("test.conf:2: ")


def test_section_header_lines_are_ignored():
    """config.cpp: a line without operator starting with '[' is an ini-style comment."""
    assert cfg_of("[Global]\nA = 1\n").names() == ["A"]


def test_illegal_identifier_is_an_error():
    with pytest.raises(ConfigError, match=r"test.conf:1: illegal identifier: <A\$B>"):
        cfg_of("A$B = 1\n")


def test_knob_name_may_be_built_from_macros():
    c = cfg_of("N = nm\n$(N)_K = named\n")
    assert c.get("nm_K") == "named"


def test_error_and_warning_keywords():
    c = cfg_of("X = 3\nwarning : careful $(X)\n")
    assert c.warnings == ["test.conf:2: Warning: careful 3"]
    with pytest.raises(ConfigError, match=r"test.conf:1: Error: stop here"):
        cfg_of("error : stop here\n")


def test_empty_value_is_defined_but_get_returns_default():
    """HTCondor param(): a knob that expands to nothing counts as unset."""
    c = cfg_of("E =\n")
    assert c.raw("E") == ""
    assert c.get("E") is None
    assert c.get("E", "dflt") == "dflt"
    assert c.get("NOT_THERE", "d") == "d" and c.raw("NOT_THERE") is None


# ---- include -------------------------------------------------------------------------------------


def test_include_reads_the_file_and_ifexist_skips_a_missing_one(tmp_path):
    inc = write(tmp_path / "inc.conf", "INC = included\n")
    c = cfg_of(f"include : {inc}\ninclude ifexist : {tmp_path}/missing.conf\n")
    assert c.get("INC") == "included"
    assert c.origin("INC") == Origin(str(inc), 1)
    assert str(inc) in c.sources


def test_include_path_may_use_macros(tmp_path):
    write(tmp_path / "inc.conf", "INC = yes\n")
    c = cfg_of(f"DIR = {tmp_path}\ninclude : $(DIR)/inc.conf\n")
    assert c.get("INC") == "yes"


def test_missing_include_is_an_error_at_the_include_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        cfg_of(f"A = 1\ninclude : {tmp_path}/nope.conf\n")
    assert str(err.value) == f"test.conf:2: can't open file {tmp_path}/nope.conf: No such file or directory"


def test_relative_include_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    """condor_config: includes are opened with fopen, so relative to the CWD (as HTCondor)."""
    write(tmp_path / "sub" / "rel.conf", "REL = ok\n")
    monkeypatch.chdir(tmp_path)
    assert cfg_of("include : sub/rel.conf\n").get("REL") == "ok"


def test_include_command_is_not_run_and_noted_by_the_parser_alone(tmp_path):
    """config.cpp fixup_pipe_source: `include command : cmd` is the source "cmd |"; without HTCondor's
    reader nothing runs and a NOTE names the line and the command whose output is missing."""
    marker = tmp_path / "ran"
    c = cfg_of(f"include command : touch {marker}\ninclude : touch {marker} |\nA = 1\n")
    assert not marker.exists()
    assert c.warnings == []  # a NOTE, not a warning: the router itself runs them without complaint
    notes = [d for d in c.diagnostics if d.severity == Severity.NOTE]
    assert [(d.file, d.line) for d in notes] == [("test.conf", 1), ("test.conf", 2)]
    assert f"`touch {marker} |`" in notes[0].message and "not run (--no-commands)" in notes[0].message
    assert c.commands == [(Origin("test.conf", 1), f"touch {marker} |"), (Origin("test.conf", 2), f"touch {marker} |")]
    assert c.get("A") == "1"


def test_command_source_with_a_pipe_not_at_the_end_is_an_error():
    """config.cpp Open_macro_source: is_valid_command wants the '|' last."""
    with pytest.raises(ConfigError, match=r"test.conf:1: not a valid command, \| must be at the end"):
        cfg_of("include : echo a | cat\n")


def test_bad_include_keyword_is_an_error():
    with pytest.raises(ConfigError, match=r"test.conf:1: unexpected keyword"):
        cfg_of("include sometimes : /x\n")


def test_include_loop_is_stopped(tmp_path):
    loop = tmp_path / "loop.conf"
    loop.write_text(f"include : {loop}\n")
    with pytest.raises(ConfigError, match="nested too deep"):
        CondorConfig.load(loop)


# ---- if / elif / else / endif ------------------------------------------------------------------


def test_if_defined_else():
    c = cfg_of("A = 1\nif defined A\n X = yes\nelse\n X = no\nendif\nif defined NOPE\n Y = yes\nelse\n Y = no\nendif\n")
    assert (c.get("X"), c.get("Y")) == ("yes", "no")


def test_elif_chain_with_version_and_booleans():
    text = (
        "if defined NOTDEF\n B = 1\nelif version >= 8.0.0\n B = ver\nelse\n B = no\nendif\n"
        "if false\n C = 1\nelif true\n C = 2\nelif true\n C = 3\nendif\n"
        "if version < 8.0\n D = old\nelse\n D = new\nendif\n"
        "if ! version >= 99.0\n E = yes\nendif\n"
    )
    c = cfg_of(text)
    assert (c.get("B"), c.get("C"), c.get("D"), c.get("E")) == ("ver", "2", "new", "yes")


def test_if_on_numbers_crufty_bools_and_expanded_macros():
    c = cfg_of(
        "ONE = 1\nZERO = 0\nif $(ONE)\n A = a\nendif\nif $(ZERO)\n B = b\nendif\n"
        "if $(UNSET_KNOB)\n C = c\nendif\nif yes\n D = d\nendif\nif 0.0\n E = e\nendif\n"
    )
    assert (c.get("A"), c.get("B"), c.get("C"), c.get("D"), c.get("E")) == ("a", None, None, "d", None)


def test_nested_if_inside_false_branch_is_not_evaluated():
    c = cfg_of("if false\n if complex > thing\n X = 1\n endif\nelse\n X = 2\nendif\n")
    assert c.get("X") == "2"


def test_if_errors_name_the_line():
    with pytest.raises(ConfigError, match=r"^t:2: else without matching if"):
        cfg_of("A = 1\nelse\n", "t")
    with pytest.raises(ConfigError, match=r"^t:4: elif is not allowed after else"):
        cfg_of("if true\nelse\nA = 1\nelif true\nendif\n", "t")
    with pytest.raises(ConfigError, match=r"^t:1: if without endif"):
        cfg_of("if true\nA = 1\n", "t")
    with pytest.raises(ConfigError, match=r"^t:1: .*complex conditionals are not supported"):
        cfg_of("if $(A) == 2\nendif\n", "t")
    with pytest.raises(ConfigError, match=r"^t:1: .*not a conditional"):
        cfg_of("if foo\nendif\n", "t")
    with pytest.raises(ConfigError, match=r"^t:1: .*version literal is invalid"):
        cfg_of("if version >= 5.1\nendif\n", "t")


def test_colon_prefixed_if_lines_are_accepted():
    """config.cpp: a leading ':' on if lines and if bodies is ignored (pre-8.1.5 compatibility)."""
    assert cfg_of(":if defined A\n:X = 1\n:endif\nA = 1\n").get("X") is None
    assert cfg_of("A = 1\n:if defined A\n:X = 1\n:endif\n").get("X") == "1"


# ---- expansion -------------------------------------------------------------------------------------


def test_expansion_of_macros_defaults_env_and_dollar(monkeypatch):
    monkeypatch.setenv("CE_K8S_TEST_HOME", "/home/x")
    monkeypatch.delenv("CE_K8S_TEST_UNSET", raising=False)
    c = cfg_of(
        "A = 1\nB = two\n"
        "C = $(A) $(B) $(NOPE) [$(NOPE:dflt)] $ENV(CE_K8S_TEST_HOME) $ENV(CE_K8S_TEST_UNSET) "
        "$ENV(CE_K8S_TEST_UNSET:edef) $(DOLLAR)(A) $$(A) $(MY.Owner)\n"
    )
    assert c.get("C") == "1 two  [dflt] /home/x UNDEFINED edef $(A) $$(A) "
    assert c.raw("C").startswith("$(A) $(B)")


def test_expansion_is_lazy_and_nested():
    c = cfg_of("X = $(Y)-$(Z:$(W))\nY = y\nW = w\nDOLLARS = $(dollar)$(DOLLAR)\n")
    assert c.get("X") == "y-w"
    assert c.get("DOLLARS") == "$$"


def test_text_that_is_not_a_macro_stays():
    """next_config_macro: bodies with characters outside the allowed set are left alone."""
    c = cfg_of("Z2 = $(UNDEF:a b,c$d:e)\nZ3 = $(UNDEF:x=y)\nZ4 = $(has space)\nZ5 = $(open\nZ6 = $FOO(bar)\n")
    assert [c.get(k) for k in ("Z2", "Z3", "Z4", "Z5", "Z6")] == [
        "a b,c$d:e", "$(UNDEF:x=y)", "$(has space)", "$(open", "$FOO(bar)",
    ]


def test_self_reference_uses_the_previous_value():
    """config.cpp expand_self_macro: 'X = $(X) more' appends at definition time."""
    c = cfg_of(
        "D = first\nD = $(D) second\nE = $(E) only\n"
        "JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES) Mine\n"
        "JOB_ROUTER_NAME = $(JOB_ROUTER_NAME)-x\nS = $(S:start) $(OTHER)\nOTHER = late\n"
    )
    assert c.get("D") == "first second"
    assert c.get("E") == " only"
    assert c.get("JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES") == " Mine"
    assert c.get("JOB_ROUTER_NAME") == "jobrouter-x"  # falls back to the built-in default
    assert c.raw("S") == "start $(OTHER)" and c.get("S") == "start late"


def test_expansion_loop_is_an_error_naming_the_knob():
    c = cfg_of("A = 1\nQ1 = $(Q2)\nQ2 = x $(Q1)\n")
    with pytest.raises(ConfigError) as err:
        c.get("Q1")
    assert str(err.value) == "test.conf:2: macro expansion loop: Q1 -> Q2 -> Q1"


def test_loop_through_a_default_is_caught():
    with pytest.raises(ConfigError, match="loop: A -> A"):
        cfg_of("A = $(B:$(A))\n").get("A")


def test_unsupported_macro_function_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"test.conf:1: \$RANDOM_CHOICE\(\.\.\.\) is not supported"):
        cfg_of("I = $RANDOM_CHOICE(a,b)\n").get("I")


def test_environment_for_env_macro_can_be_injected():
    c = cfg_of("P = $ENV(SITE)\n", environ={"SITE": "here"})
    assert c.get("P") == "here"


def test_builtin_defaults_exist_without_any_file():
    c = cfg_of("")
    assert c.get("JOB_ROUTER_NAME") == "jobrouter"
    assert c.get_int("JOB_ROUTER_POLLING_PERIOD", 0) == 10
    assert c.get("FULL_HOSTNAME") and c.get("HOSTNAME")
    assert "." not in c.get("HOSTNAME")
    assert c.origin("JOB_ROUTER_NAME") == Origin("<built-in default>", 0)
    assert c.names() == []
    assert cfg_of("JOB_ROUTER_NAME = htcondor-ce\n").get("JOB_ROUTER_NAME") == "htcondor-ce"


# ---- typed getters ------------------------------------------------------------------------------------


def test_get_bool_forms_and_errors():
    c = cfg_of("T1 = True\nT2 = yes\nT3 = 1\nT4 = 2 > 1\nF1 = FALSE\nF2 = 0\nBAD = maybe\nREF = $(T1)\n")
    assert [c.get_bool(k, False) for k in ("T1", "T2", "T3", "T4", "REF")] == [True] * 5
    assert [c.get_bool(k, True) for k in ("F1", "F2")] == [False, False]
    assert c.get_bool("UNSET", True) is True
    with pytest.raises(ConfigError, match=r"test.conf:7: BAD = 'maybe' is not a boolean"):
        c.get_bool("BAD", False)


def test_get_int_forms_and_errors():
    c = cfg_of("N = 42\nE = 6 * 7\nBAD = lots\nNEG = -3\n")
    assert (c.get_int("N", 0), c.get_int("E", 0), c.get_int("NEG", 0), c.get_int("U", 7)) == (42, 42, -3, 7)
    with pytest.raises(ConfigError, match=r"test.conf:3: BAD = 'lots' is not an integer"):
        c.get_int("BAD", 0)


def test_lookup_macro_returns_the_raw_value():
    c = cfg_of("ROUTED_JOB_MAX_TIME = $(X)0\nX = 4\n")
    assert c.lookup_macro("routed_job_max_time") == "$(X)0"
    assert c.lookup_macro("FULL_HOSTNAME")
    assert c.lookup_macro("nope") is None


# ---- files, directories, LOCAL_CONFIG_* ------------------------------------------------------------------


def test_local_config_dir_is_read_in_name_order_with_exclusions(tmp_path):
    """condor_config.cpp get_config_dir_file_list: files in each directory in sorted order, later values win."""
    d = tmp_path / "config.d"
    write(d / "10-a.conf", "DIR1 = a\nORDER = $(ORDER) a\n")
    write(d / "20-b.conf", "DIR1 = b\nORDER = $(ORDER) b\n")
    write(d / "30-c.conf~", "DIR1 = tilde\n")
    write(d / ".40-hidden", "DIR1 = hidden\n")
    write(d / "50.py", "DIR1 = py\n")
    write(d / "55-x.conf.rpmsave", "DIR1 = rpmsave\n")
    write(d / "60noext", "DIR2 = noext\n")
    write(d / "Z-upper.conf", "ORDER = $(ORDER) Z\n")
    (d / "70-subdir").mkdir()
    write(d / "70-subdir" / "inner.conf", "DIR1 = inner\n")
    root = write(tmp_path / "condor_config", f"LOCAL_CONFIG_DIR = {d}\n")
    c = CondorConfig.load(root)
    assert c.get("DIR1") == "b"
    assert c.get("DIR2") == "noext"
    assert c.get("ORDER") == " a b Z"  # byte order: digits, upper case, then lower case
    assert c.sources == [str(root), str(d / "10-a.conf"), str(d / "20-b.conf"), str(d / "60noext"),
                         str(d / "Z-upper.conf")]


def test_local_config_dir_list_and_custom_exclude(tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    write(a / "1.conf", "X = a\n")
    write(b / "1.conf", "X = $(X) b\n")
    write(b / "2.skip", "X = skipped\n")
    root = write(tmp_path / "cc", f"LOCAL_CONFIG_DIR = {a}, {b}\nLOCAL_CONFIG_DIR_EXCLUDE_REGEXP = \\.skip$\n")
    c = CondorConfig.load(root)
    assert c.get("X") == "a b"


def test_default_exclude_regexp_is_htcondors():
    import re

    rx = re.compile(DEFAULT_EXCLUDE_REGEXP)
    for skipped in (".hidden", "x.py", "x.sh", "x.pl", "x~", "#x#", "x.rpmsave", "x.rpmnew", "x.dpkg-old",
                    "x.dpkg-dist", "x.cfsaved"):
        assert rx.search(skipped), skipped
    for kept in ("01-ce-router.conf", "99-local.conf", "noext", "x.conf.bak"):
        assert not rx.search(kept), kept


def test_local_config_file_list_missing_file_and_command(tmp_path):
    one = write(tmp_path / "one.conf", "ONE = 1\n")
    root = write(tmp_path / "cc", f"LOCAL_CONFIG_FILE = {one}, {tmp_path}/missing.conf\n")
    with pytest.raises(ConfigError) as err:
        CondorConfig.load(root)
    assert str(err.value) == f"{root}:1: can't read config source {tmp_path}/missing.conf"

    root.write_text(f"REQUIRE_LOCAL_CONFIG_FILE = false\nLOCAL_CONFIG_FILE = {one} {tmp_path}/missing.conf\n")
    assert CondorConfig.load(root).get("ONE") == "1"

    marker = tmp_path / "ran"
    root.write_text(f"LOCAL_CONFIG_FILE = /bin/touch {marker} |\n")
    c = CondorConfig.load(root)
    assert not marker.exists()
    assert [str(d) for d in c.diagnostics] == [
        f"{root}:1: note: the configuration runs the command `/bin/touch {marker} |` and reads its output as "
        "configuration; it was not run (--no-commands), so the knobs it sets are missing"
    ]


def test_local_config_file_may_extend_its_own_list(tmp_path):
    two = write(tmp_path / "two.conf", "TWO = 2\n")
    one = write(tmp_path / "one.conf", f"LOCAL_CONFIG_FILE = $(LOCAL_CONFIG_FILE) {two}\n")
    root = write(tmp_path / "cc", f"LOCAL_CONFIG_FILE = {one}\n")
    assert CondorConfig.load(root).get("TWO") == "2"


def test_load_directory_reads_it_like_local_config_dir(tmp_path):
    write(tmp_path / "02-b.conf", "V = $(V) b\n")
    write(tmp_path / "01-a.conf", "V = a\n")
    write(tmp_path / "03.conf~", "V = nope\n")
    assert CondorConfig.load(tmp_path).get("V") == "a b"


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="configuration file not found"):
        CondorConfig.load(tmp_path / "nope")


def test_dev_null_is_an_empty_config():
    """htcondor2 sets CONDOR_CONFIG=/dev/null when it finds none; that must read as empty."""
    assert CondorConfig.load(os.devnull).names() == []


def test_condor_environment_overrides_files(tmp_path):
    root = write(tmp_path / "cc", "A = file\nB = file\n")
    c = CondorConfig.load(root, environ={"_CONDOR_A": "env", "_condor_B": "$(B)+env", "OTHER": "x"})
    assert c.get("A") == "env" and c.get("B") == "file+env"
    assert c.origin("A") == Origin("<environment>", 0)


def test_embedded_default_loads_config_d_then_routes():
    paths = default_config_paths()
    assert [p.name for p in paths] == ["config.d", "routes"]
    root = Path(__file__).resolve().parents[2]
    assert paths == [root / "config.d", root / "routes"]
    c = CondorConfig.load(None, environ={})
    assert all(any(s.startswith(str(p)) for p in paths) for s in c.sources)
    files = sorted(str(f) for f in (root / "config.d").glob("*.conf")) + sorted(
        str(f) for f in (root / "routes").glob("*.conf"))
    assert c.sources == files


def test_installed_default_paths_use_sys_prefix(monkeypatch, tmp_path):
    import sys

    import ce_k8s.condor.config as config_mod

    fake = tmp_path / "site-packages" / "ce_k8s" / "condor" / "config.py"
    monkeypatch.setattr(config_mod, "__file__", str(fake))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    assert config_mod.default_config_paths() == [
        tmp_path / "venv" / "share" / "ce-k8s" / "config.d",
        tmp_path / "venv" / "share" / "ce-k8s" / "routes",
    ]
    with pytest.raises(ConfigError, match="embedded default configuration not found"):
        config_mod.CondorConfig.load(None)


def test_copy_and_unset_do_not_touch_the_original():
    c = cfg_of("A = 1\nB = 2\n")
    d = c.copy()
    d.unset("a")
    d.read_text("C = 3\n", "more")
    assert c.get("A") == "1" and c.get("C") is None
    assert d.get("A") is None and d.get("C") == "3" and d.origin("C") == Origin("more", 1)


def test_line_of_maps_offsets_to_physical_lines():
    c = cfg_of("A = 1\nL = one \\\n  two \\\n  three\nH @=x\nfirst\n# gone\nsecond \\\nthird\n@x\n")
    raw = c.raw("L")
    assert raw == "one two three"
    assert [c.line_of("L", raw.index(w)) for w in ("one", "two", "three")] == [2, 3, 4]
    h = c.raw("H")
    assert h == "first\nsecond third"
    assert [c.line_of("H", h.index(w)) for w in ("first", "second", "third")] == [6, 8, 9]
    assert c.line_of("nope", 0) is None


# ---- +=, metaknob arguments, the legacy warnings view ---------------------------------------


def test_plus_equals_needs_its_equals_sign():
    """config.cpp Parse_macros: '+' and an optional separator must be followed by '='."""
    with pytest.raises(ConfigError, match=r"test.conf:2: syntax error, '\+' must be followed by '='"):
        cfg_of("X = a\nX +- b\n")
    with pytest.raises(ConfigError, match=r"illegal identifier: <X\+>"):
        cfg_of("X+= b\n")  # no space: '+' is part of the name, as in HTCondor


def test_plus_equals_keeps_line_numbers_of_the_new_text():
    c = cfg_of("X = first\nX += second \\\n  third\n")
    assert c.raw("X") == "first second third"
    assert c.line_of("X", 0) == 2 and c.line_of("X", len("first second ")) == 3


def test_metaknob_arguments_expand_like_expand_meta_args():
    """config.cpp expand_meta_args: $(0) all, $(N), $(N+) from N on, $(0#) count, $(N?) 1/0, :default."""
    from ce_k8s.condor.config import _expand_meta_args, _metaknob_items

    text = "A=$(0)|B=$(1)|C=$(2+)|D=$(0#)|E=$(3?)|F=$(4:dflt)|G=$(2?)"
    assert _expand_meta_args(text, "x, y ,z") == "A=x, y ,z|B=x|C=y, z|D=3|E=1|F=dflt|G=1"
    assert _expand_meta_args("$(1?) $(1:none)", "") == "0 none"
    assert _metaknob_items("recommended, Foo(a, (b, c)) Bar") == [
        ("recommended", None), ("Foo", "a, (b, c)"), ("Bar", None)]


def test_warnings_view_shows_warnings_and_errors_and_appends_warnings():
    c = cfg_of("B : two\n")
    assert c.warnings == ["test.conf:1: obsolete use of ':' for parameter assignment at B : two"]
    c.warnings.append("x.conf:3: something")
    c.warnings.extend(["y.conf:4: more"])
    assert [(d.file, d.line, d.severity) for d in c.diagnostics[1:]] == [
        ("x.conf", 3, Severity.WARNING), ("y.conf", 4, Severity.WARNING)]
    assert len(c.warnings) == 3 and c.copy().warnings == list(c.warnings)


def test_origin_via_is_not_part_of_equality():
    assert Origin("f", 1, "use security : recommended") == Origin("f", 1)
    assert str(Origin("f", 1, "anything")) == "f:1"
