"""Old-syntax route conversion (ce_k8s.condor.oldsyntax) and ``ce-k8s routes convert``.

The rules are docs/hook-protocol.md §4.2 (defaults ∪ entry, copy → delete → set → eval_set, TARGET.
removed from Requirements, TargetUniverse → UNIVERSE, OverrideRoutingEntry) and hook-protocol.md §1.2 (old syntax is
gone in 24.10+); the examples are the seed's Local_PBS_cms/Local_PBS_other slide and the CE v23
docs examples of htcondor-ce.md §1.7.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import classad2
import pytest

from ce_k8s.cli import main as cli_main
from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.oldsyntax import (
    ConversionError,
    convert,
    converted_config,
    has_old_syntax,
    route_statements,
)

# The seed's slide (003_71ee73ed4899fecb.txt, "Example Route"): a one-liner continued with '\'.
SEED = """\
JOB_ROUTER_ENTRIES = \\
   [ \\
     GridResource = "batch pbs"; \\
     TargetUniverse = 9; \\
     name = "Local_PBS_cms"; \\
     set_remote_queue = "cms"; \\
     Requirements = target.x509UserProxyVOName =?= "cms"; \\
   ] \\
   [ \\
     GridResource = "batch pbs"; \\
     TargetUniverse = 9; \\
     name = "Local_PBS_other"; \\
     set_remote_queue = "other"; \\
     Requirements = target.x509UserProxyVOName =!= "cms"; \\
   ]
"""

SEED_CONVERTED = """\
# Converted by 'ce-k8s routes convert' from old-syntax job routes:
#   JOB_ROUTER_ENTRIES (seed.conf:1)
# HTCondor 24.10 and later ignore those knobs: remove them and use these lines instead.
# Routes from JOB_ROUTER_ENTRIES skipped the pre/post-route transforms; these routes run them.

JOB_ROUTER_ROUTE_NAMES = Local_PBS_cms Local_PBS_other

# JOB_ROUTER_ENTRIES [1] at seed.conf:2
JOB_ROUTER_ROUTE_Local_PBS_cms @=jrt
# autoconversion of route 'Local_PBS_cms' from old route syntax
NAME Local_PBS_cms
UNIVERSE 9
REQUIREMENTS x509UserProxyVOName =?= "cms"

GridResource = "batch pbs"

# set_* rules
SET remote_queue "cms"
@jrt

# JOB_ROUTER_ENTRIES [2] at seed.conf:9
JOB_ROUTER_ROUTE_Local_PBS_other @=jrt
# autoconversion of route 'Local_PBS_other' from old route syntax
NAME Local_PBS_other
UNIVERSE 9
REQUIREMENTS x509UserProxyVOName =!= "cms"

GridResource = "batch pbs"

# set_* rules
SET remote_queue "other"
@jrt
"""

CE_V23_FIRST = """\
JOB_ROUTER_ENTRIES @=jre
[
  TargetUniverse = 5;
  name = "Condor_Pool";
]
[
  GridResource = "batch slurm";
  name = "My_Slurm";
]
@jre

JOB_ROUTER_ROUTE_NAMES = Condor_Pool My_Slurm
"""

CE_V23_FIRST_CONVERTED = """\
# Converted by 'ce-k8s routes convert' from old-syntax job routes:
#   JOB_ROUTER_ENTRIES (ce.conf:1)
# HTCondor 24.10 and later ignore those knobs: remove them and use these lines instead.
# Routes from JOB_ROUTER_ENTRIES skipped the pre/post-route transforms; these routes run them.

JOB_ROUTER_ROUTE_NAMES = Condor_Pool My_Slurm

# JOB_ROUTER_ENTRIES [1] at ce.conf:2
JOB_ROUTER_ROUTE_Condor_Pool @=jrt
# autoconversion of route 'Condor_Pool' from old route syntax
NAME Condor_Pool
UNIVERSE 5

@jrt

# JOB_ROUTER_ENTRIES [2] at ce.conf:6
JOB_ROUTER_ROUTE_My_Slurm @=jrt
# autoconversion of route 'My_Slurm' from old route syntax
NAME My_Slurm

GridResource = "batch slurm"
@jrt
"""

CE_V23_SECOND = """\
JOB_ROUTER_ENTRIES @=jre
[
  Requirements = (TARGET.queue == "prod");
  TargetUniverse = 5;
  set_IsProduction = True;
  name = "Production_Jobs";
]
[
  TargetUniverse = 5;
  set_IsProduction = False;
  name = "Condor_Pool";
]
@jre
"""

CE_V23_SECOND_ROUTES = """\
JOB_ROUTER_ROUTE_Production_Jobs @=jrt
# autoconversion of route 'Production_Jobs' from old route syntax
NAME Production_Jobs
UNIVERSE 5
REQUIREMENTS (queue == "prod")


# set_* rules
SET IsProduction true
@jrt

# JOB_ROUTER_ENTRIES [2] at ce.conf:8
JOB_ROUTER_ROUTE_Condor_Pool @=jrt
# autoconversion of route 'Condor_Pool' from old route syntax
NAME Condor_Pool
UNIVERSE 5


# set_* rules
SET IsProduction false
@jrt
"""

# The other CE v23 forms (htcondor-ce.md §1.7): regexp on TARGET.Owner, set_default_*, and global defaults through
# MERGE_JOB_ROUTER_DEFAULT_ADS + "JOB_ROUTER_DEFAULTS = $(JOB_ROUTER_DEFAULTS) [set_Periodic_Hold = ...;]".
CE_V23_DEFAULTS = """\
MERGE_JOB_ROUTER_DEFAULT_ADS = True
JOB_ROUTER_DEFAULTS = [ MaxIdleJobs = 20; set_default_maxMemory = 1000; ]
JOB_ROUTER_DEFAULTS = $(JOB_ROUTER_DEFAULTS) \\
    [set_Periodic_Hold = (NumJobStarts >= 1 && JobStatus == 1) || NumJobStarts > 1;]
JOB_ROUTER_ENTRIES @=jre
[
  Requirements = regexp("^usatlas", TARGET.Owner);
  GridResource = "batch slurm";
  name = "Atlas";
  set_default_xcount = 8;
  set_default_maxWallTime = 60;
  MaxIdleJobs = 5;
  copy_environment = "orig_environment";
  delete_WantIOProxy = true;
  Copy_Another = "B";
  Q2 = target.x + 1;
  eval_set_A = Q2 * 2;
  eval_set_b = MaxIdleJobs + target.RequestCpus;
  eval_set_C = GridResource;
  JobFailureTest = target.ExitCode != 0;
]
@jre
JOB_ROUTER_ROUTE_NAMES = Atlas
"""

CE_V23_DEFAULTS_ROUTE = """\
JOB_ROUTER_ROUTE_Atlas @=jrt
# autoconversion of route 'Atlas' from old route syntax
NAME Atlas
REQUIREMENTS regexp("^usatlas",Owner)

GridResource = "batch slurm"
JobFailureTest = MY.ExitCode != 0
MaxIdleJobs = 5
Q2 = target.x + 1

# copy_* rules
COPY Another B
COPY environment orig_environment

# delete_* rules
DELETE WantIOProxy

# set_* rules
SET default_maxMemory 1000
SET default_maxWallTime 60
SET default_xcount 8
SET Periodic_Hold (NumJobStarts >= 1 && JobStatus == 1) || NumJobStarts > 1

# temporarily SET attrs because eval_set_ rules refer to them
SET Q2 $(Q2)

# eval_set_* rules
EVALSET A 2 * Q2
EVALSET b 5 + MY.RequestCpus
EVALSET C "batch slurm"

# remove temporary attrs
DELETE Q2
@jrt
"""


def load(tmp_path: Path, text: str, name: str = "ce.conf") -> CondorConfig:
    path = tmp_path / name
    path.write_text(text)
    return CondorConfig.load(path, environ={})


def job(**attrs: object) -> classad2.ClassAd:
    ad = classad2.ClassAd()
    ad.update({"ClusterId": 1, "ProcId": 0, "JobUniverse": 5, "JobStatus": 1, "Owner": "pilot", **attrs})
    return ad


# ---- exact conversions ---------------------------------------------------------------------------


def test_seed_example_converts_exactly(tmp_path, monkeypatch):
    """hook-protocol.md §4.2 on the seed slide: TARGET. scope removed, TargetUniverse → UNIVERSE, set_ → SET."""
    monkeypatch.chdir(tmp_path)
    cfg = load(tmp_path, SEED, "seed.conf")
    # the file is read relative to the cwd so the header says seed.conf
    cfg = CondorConfig.load("seed.conf", environ={})
    assert has_old_syntax(cfg)
    result = convert(cfg)
    assert result.text == SEED_CONVERTED
    assert result.routes == ["Local_PBS_cms", "Local_PBS_other"]
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith("seed.conf:2: JOB_ROUTER_ROUTE_NAMES was not set")


def test_ce_v23_first_example_keeps_route_names_order(tmp_path, monkeypatch):
    """htcondor-ce.md §1.7: the Condor_Pool/My_Slurm pair; an existing JOB_ROUTER_ROUTE_NAMES is kept as written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ce.conf").write_text(CE_V23_FIRST)
    result = convert(CondorConfig.load("ce.conf", environ={}))
    assert result.text == CE_V23_FIRST_CONVERTED
    assert result.warnings == []


def test_ce_v23_second_example(tmp_path, monkeypatch):
    """htcondor-ce.md §1.7: Requirements (TARGET.queue == "prod") → REQUIREMENTS (queue == "prod")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ce.conf").write_text(CE_V23_SECOND)
    result = convert(CondorConfig.load("ce.conf", environ={}))
    assert result.text.endswith(CE_V23_SECOND_ROUTES)
    assert "JOB_ROUTER_ROUTE_NAMES = Production_Jobs Condor_Pool\n" in result.text


def test_defaults_merge_and_rule_groups(tmp_path):
    """hook-protocol.md §4.2: defaults ∪ entry (entry wins); copy, delete, set, eval_set each sorted."""
    result = convert(load(tmp_path, CE_V23_DEFAULTS))
    body = result.text.split("\n\n# JOB_ROUTER_ENTRIES [1] at ")[1].split("\n", 1)[1]
    assert body == CE_V23_DEFAULTS_ROUTE
    assert "#   JOB_ROUTER_DEFAULTS (" in result.text


def test_defaults_without_merge_use_only_the_first_ad(tmp_path):
    text = CE_V23_DEFAULTS.replace("MERGE_JOB_ROUTER_DEFAULT_ADS = True", "MERGE_JOB_ROUTER_DEFAULT_ADS = False")
    result = convert(load(tmp_path, text))
    assert "Periodic_Hold" not in result.text
    assert "SET default_maxMemory 1000" in result.text
    assert any("only the first one is used" in w for w in result.warnings)


def test_defaults_without_brackets_are_wrapped(tmp_path):
    """initRouterDefaultsAd: a JOB_ROUTER_DEFAULTS not starting with '[' is wrapped in [ ]."""
    result = convert(load(tmp_path, 'JOB_ROUTER_DEFAULTS = set_Foo = 1;\nJOB_ROUTER_ENTRIES = [ name = "R"; ]\n'))
    assert "SET Foo 1" in result.text


def test_route_statements_unit():
    ad = classad2.parseOne(
        '[ name = "x"; TargetUniverse = 9; set_B = 2; SET_a = "s"; Delete_Z = 1; delete_y = 1; '
        'FailureRateThreshold = 0.5; Plain = "text"; Other = 3 + 4; SharedX509UserProxy = target.p ]',
        classad2.ParserType.New,
    )
    assert route_statements("x", ad) == [
        "# autoconversion of route 'x' from old route syntax",
        "NAME x",
        "UNIVERSE 9",
        "",
        "FailureRateThreshold = 0.5",
        "Other = 3 + 4",
        "Plain = text",  # literal strings lose their quotes (ExprTreeIsLiteralString)
        "SharedX509UserProxy = MY.p",
        "",
        "# delete_* rules",
        "DELETE y",
        "DELETE Z",
        "",
        "# set_* rules",
        'SET a "s"',
        "SET B 2",
    ]


def test_only_the_target_scope_is_removed_from_requirements(tmp_path):
    text = (
        'JOB_ROUTER_ENTRIES = [ name = "R"; Requirements = target.x509UserProxyVOName =?= "target.cms" '
        '&& TARGET.Owner == "x" && mytarget.y == 1 && regexp("target.z", target.w); ]\n'
    )
    result = convert(load(tmp_path, text))
    assert (
        'REQUIREMENTS x509UserProxyVOName =?= "target.cms" && Owner == "x" && mytarget.y == 1 && '
        'regexp("target.z",w)\n'
    ) in result.text


# ---- names, duplicates, precedence ------------------------------------------------------------------


def test_name_defaults_to_grid_resource_made_knob_safe(tmp_path):
    result = convert(load(tmp_path, 'JOB_ROUTER_ENTRIES = [ GridResource = "batch pbs"; ] [ set_x = 1; ]\n'))
    assert result.routes == ["batch_pbs", "entries_2"]
    assert "JOB_ROUTER_ROUTE_batch_pbs @=jrt\n" in result.text
    assert "# original route name: 'batch pbs'\n" in result.text
    assert any("'batch pbs' is not a valid knob suffix" in w for w in result.warnings)


def test_duplicate_names_later_wins_unless_override_is_false(tmp_path):
    later = convert(load(tmp_path, 'JOB_ROUTER_ENTRIES = [ name = "R"; set_v = 1; ] [ name = "R"; set_v = 2; ]\n'))
    assert later.routes == ["R"] and "SET v 2" in later.text and "SET v 1" not in later.text
    assert any("two route entries are named 'R'" in w for w in later.warnings)
    kept = convert(load(tmp_path, 'JOB_ROUTER_ENTRIES = [ name = "R"; set_v = 1; ] '
                                  '[ name = "R"; set_v = 2; OverrideRoutingEntry = false; ]\n'))
    assert "SET v 1" in kept.text and "SET v 2" not in kept.text


def test_new_syntax_route_of_the_same_name_wins(tmp_path):
    text = ('JOB_ROUTER_ENTRIES = [ name = "R"; set_v = 1; ] [ name = "S"; ]\n'
            "JOB_ROUTER_ROUTE_R @=jrt\nUNIVERSE 5\n@jrt\nJOB_ROUTER_ROUTE_NAMES = R S\n")
    cfg = load(tmp_path, text)
    result = convert(cfg)
    assert result.routes == ["S"]
    assert "JOB_ROUTER_ROUTE_R @=" not in result.text
    new = converted_config(cfg)
    assert new.raw("JOB_ROUTER_ROUTE_R") == "UNIVERSE 5"


def test_unlisted_route_warns_that_it_stays_disabled(tmp_path):
    text = 'JOB_ROUTER_ENTRIES = [ name = "R"; ] [ name = "S"; ]\nJOB_ROUTER_ROUTE_NAMES = R\n'
    result = convert(load(tmp_path, text))
    assert "JOB_ROUTER_ROUTE_NAMES = R\n" in result.text
    assert any("route 'S' is not in JOB_ROUTER_ROUTE_NAMES" in w for w in result.warnings)


def test_entries_file_and_cmd(tmp_path):
    routes = tmp_path / "routes.ads"
    routes.write_text('\n[ name = "FromFile"; GridResource = "batch slurm"; ]\n')
    marker = tmp_path / "ran"
    cfg = load(tmp_path, f"JOB_ROUTER_ENTRIES_FILE = {routes}\nJOB_ROUTER_ENTRIES_CMD = /bin/touch {marker}\n")
    result = convert(cfg)
    assert result.routes == ["FromFile"]
    assert f"# JOB_ROUTER_ENTRIES_FILE [1] at {routes}:2\n" in result.text
    assert not marker.exists()
    assert any("JOB_ROUTER_ENTRIES_CMD" in w and "was not run" in w for w in result.warnings)


def test_classad_route_knob_is_converted(tmp_path):
    cfg = load(tmp_path, 'JOB_ROUTER_ROUTE_Old = [ GridResource = "batch pbs"; Requirements = true; ]\n'
                         "JOB_ROUTER_ROUTE_NAMES = Old\n")
    assert has_old_syntax(cfg)
    result = convert(cfg)
    assert result.routes == ["Old"]
    assert "JOB_ROUTER_ROUTE_Old @=jrt\n" in result.text and "REQUIREMENTS true\n" in result.text
    new = converted_config(cfg)
    assert new.raw("JOB_ROUTER_ROUTE_Old").startswith("NAME Old\nREQUIREMENTS true")


def test_entries_are_read_expanded(tmp_path):
    """JobRouter.cpp reads JOB_ROUTER_ENTRIES with param(), so $(X) is expanded before parsing."""
    result = convert(load(tmp_path, 'Q = cms\nJOB_ROUTER_ENTRIES = [ name = "R"; set_queue = "$(Q)"; ]\n'))
    assert 'SET queue "cms"' in result.text


# ---- detection and errors -------------------------------------------------------------------------


def test_has_old_syntax_is_false_for_new_syntax_and_defaults_alone(tmp_path):
    assert not has_old_syntax(load(tmp_path, "JOB_ROUTER_ROUTE_A @=jrt\nUNIVERSE 5\n@jrt\n"))
    assert not has_old_syntax(load(tmp_path, "JOB_ROUTER_DEFAULTS = [ set_A = 1; ]\n"))
    cfg = load(tmp_path, "A = 1\n")
    assert converted_config(cfg) is cfg


def test_broken_route_ad_is_an_error_with_file_and_line(tmp_path):
    text = 'A = 1\nJOB_ROUTER_ENTRIES @=jre\n[ name = "ok"; ]\n# note\n[ name = ; ]\n@jre\n'
    with pytest.raises(ConversionError) as err:
        convert(load(tmp_path, text))
    assert str(err.value).startswith(f"{tmp_path}/ce.conf:5: JOB_ROUTER_ENTRIES: cannot parse route ad")


def test_flattened_slide_text_gets_a_continuation_hint(tmp_path):
    """The seed as extracted puts every '\\' mid-line; HTCondor would not parse that either."""
    one_line = " ".join(line.strip() for line in SEED.splitlines())
    with pytest.raises(ConversionError) as err:
        convert(load(tmp_path, one_line + "\n"))
    assert str(err.value).startswith(f"{tmp_path}/ce.conf:1: JOB_ROUTER_ENTRIES: expected '['")
    assert "line continuation must end its line" in str(err.value)


def test_unclosed_route_ad_is_an_error(tmp_path):
    with pytest.raises(ConversionError, match="has no closing"):
        convert(load(tmp_path, 'JOB_ROUTER_ENTRIES = [ name = "x";\n'))


# ---- converted_config and routing ----------------------------------------------------------------------


def test_converted_config_replaces_old_knobs_and_leaves_the_original(tmp_path):
    cfg = load(tmp_path, CE_V23_DEFAULTS)
    new = converted_config(cfg)
    for knob in ("JOB_ROUTER_ENTRIES", "JOB_ROUTER_DEFAULTS", "MERGE_JOB_ROUTER_DEFAULT_ADS"):
        assert new.raw(knob) is None and cfg.raw(knob) is not None
    assert new.get("JOB_ROUTER_ROUTE_NAMES") == "Atlas"
    assert new.raw("JOB_ROUTER_ROUTE_Atlas").startswith("NAME Atlas\nREQUIREMENTS regexp")
    assert new.raw("JOB_ROUTER_ROUTE_Atlas").endswith("DELETE Q2")
    assert cfg.raw("JOB_ROUTER_ROUTE_Atlas") is None


def test_seed_routes_identically_before_and_after_conversion(tmp_path):
    """hook-protocol.md §4.2/§4.4: old Requirements matched with the job as TARGET choose the same route as the
    converted REQUIREMENTS evaluated on the job alone (routing.py, first match wins)."""
    from ce_k8s.condor import routing

    cfg = load(tmp_path, SEED)
    old_ads = [classad2.parseOne(t, classad2.ParserType.New) for t in (
        '[ name = "Local_PBS_cms"; Requirements = target.x509UserProxyVOName =?= "cms" ]',
        '[ name = "Local_PBS_other"; Requirements = target.x509UserProxyVOName =!= "cms" ]',
    )]
    router = routing.RouterConfig.from_config(converted_config(cfg))
    assert router.errors == []
    for attrs in ({"x509UserProxyVOName": "cms"}, {"x509UserProxyVOName": "atlas"}, {}):
        pilot = job(**attrs)
        before = next(ad.eval("name") for ad in old_ads if pilot.matches(ad))  # route Requirements, job as TARGET
        chosen = router.choose_route(pilot)
        assert chosen is not None and chosen.name == before, attrs
        routed = router.route_job(pilot, chosen)
        assert routed.ad.eval("remote_queue") == ("cms" if attrs.get("x509UserProxyVOName") == "cms" else "other")
        assert routed.ad.eval("GridResource") == "batch pbs"


# ---- the CLI ---------------------------------------------------------------------------------------


def test_cli_prints_the_conversion(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "seed.conf").write_text(SEED)
    assert cli_main(["routes", "convert", "--config", "seed.conf"]) == 0
    out, err = capsys.readouterr()
    assert out == SEED_CONVERTED
    assert "warning: seed.conf:2: JOB_ROUTER_ROUTE_NAMES was not set" in err


def test_cli_nothing_to_convert(tmp_path, capsys):
    (tmp_path / "new.conf").write_text("JOB_ROUTER_ROUTE_A @=jrt\nUNIVERSE 5\n@jrt\n")
    assert cli_main(["routes", "convert", "--config", str(tmp_path / "new.conf")]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("nothing to convert")


def test_cli_errors_exit_1_with_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.conf"
    bad.write_text("JOB_ROUTER_ENTRIES @=jre\n[ name = ; ]\n@jre\n")
    assert cli_main(["routes", "convert", "--config", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"{bad}:2: JOB_ROUTER_ENTRIES: cannot parse route ad")
    broken = tmp_path / "broken.conf"
    broken.write_text("ROUTE @=jrt\nSET A 1\n")
    assert cli_main(["routes", "convert", "--config", str(broken)]) == 1
    assert capsys.readouterr().err.startswith(f"{broken}:1: end of file while looking for '@jrt'")


def _doc_block(doc: str, marker: str) -> str:
    """The fenced block following ``<!-- marker -->`` in docs/upgrading.md."""
    after = doc.split(f"<!-- {marker} -->\n", 1)[1]
    assert after.startswith("```")
    return after.split("\n", 1)[1].split("```\n", 1)[0]


def test_upgrading_doc_commands_run_as_shown(tmp_path):
    """docs/upgrading.md: the command shown, run on the file shown, writes exactly the output shown
    (with the installed ``ce-k8s`` executable), and that output loads as a configuration."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "upgrading.md").read_text()
    (tmp_path / "old-routes.conf").write_text(_doc_block(doc, "file: old-routes.conf"))
    commands = [line[2:] for line in _doc_block(doc, "commands").splitlines() if line.startswith("$ ")]
    assert commands == ["ce-k8s routes convert --config old-routes.conf > 60-converted-routes.conf"]
    for command in commands:
        argv, _, target = command.partition(" > ")
        words = argv.split()
        exe = Path(sys.executable).with_name(words[0])
        proc = subprocess.run([str(exe), *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        (tmp_path / target).write_text(proc.stdout)
    written = (tmp_path / "60-converted-routes.conf").read_text()
    assert written == _doc_block(doc, "output: 60-converted-routes.conf")
    assert written == SEED_CONVERTED.replace("seed.conf", "old-routes.conf")
    reread = CondorConfig.load(tmp_path / "60-converted-routes.conf", environ={})
    assert reread.get("JOB_ROUTER_ROUTE_NAMES") == "Local_PBS_cms Local_PBS_other"
    assert reread.raw("JOB_ROUTER_ROUTE_Local_PBS_other") == (
        'NAME Local_PBS_other\nUNIVERSE 9\nREQUIREMENTS x509UserProxyVOName =!= "cms"\n'
        'GridResource = "batch pbs"\nSET remote_queue "other"'
    )


def test_errors_point_at_the_physical_line_inside_a_continued_value(tmp_path):
    """A broken ad in a '\\'-continued JOB_ROUTER_ENTRIES is reported at its own line, not the knob's."""
    broken = SEED.replace('set_remote_queue = "other"; \\', 'set_remote_queue = ; \\')
    with pytest.raises(ConversionError) as err:
        convert(load(tmp_path, "A = 1\n" + broken))
    assert str(err.value).startswith(f"{tmp_path}/ce.conf:10: JOB_ROUTER_ENTRIES: cannot parse route ad")
