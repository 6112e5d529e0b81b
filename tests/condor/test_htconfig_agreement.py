"""ce-k8s's own reader (what --no-commands uses) against HTCondor's reader, category by category.

Every configuration below is read twice: by ``CondorConfig.load`` alone (no program run) and by
HTCondor's own reader in a child (``ce_k8s.condor.htconfig``, htcondor 25.14.1). Raw values (what
``param_unexpanded`` returns) must agree knob for knob, and where expansion matters the expanded
values must agree with ``htcondor2.param``. Each configuration cites the HTCondor code whose rule
it exercises. The last tests do the same for every configuration file under tests/ and for the
shipped default configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ce_k8s.condor import htconfig
from ce_k8s.condor.config import CondorConfig, default_config_paths

TESTS = Path(__file__).resolve().parents[1]
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def htcondor_raw(root: Path | None, dirs: list[Path] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(knobs a source set, knobs recorded as their default) from HTCondor's reader, lower-case keys."""
    result = htconfig.read(str(root) if root else None, dirs or [], environ=ENV)
    assert result.error is None, result.error
    seen: dict[str, str] = {}
    defaults: dict[str, str] = {}
    for knob in result.knobs:
        if knob.source == htconfig.DETECTED_SOURCE or knob.source == result.synthetic_root:
            continue
        (defaults if knob.source == htconfig.DEFAULT_SOURCE else seen)[knob.name.lower()] = knob.value
    return seen, defaults


def ours_raw(cfg: CondorConfig, defaults: dict[str, str]) -> dict[str, str]:
    """Our knobs, minus those HTCondor records as "set to the default" (it keeps no place for them)."""
    out = {}
    for name in cfg.names():
        value = cfg.raw_items()[name.lower()]
        if defaults.get(name.lower()) == value:
            continue
        out[name.lower()] = value
    return out


def assert_agree(root: Path | None, dirs: list[Path] | None = None) -> CondorConfig:
    ours = CondorConfig.load(root if root else (dirs[0] if dirs and len(dirs) == 1 else None), environ=ENV,
                             detected_specials=True)
    theirs, defaults = htcondor_raw(root, dirs)
    assert ours_raw(ours, defaults) == theirs
    return ours


def htcondor_param(root: Path, names: list[str]) -> dict[str, str | None]:
    """Expanded values from htcondor2.param (subsystem JOB_ROUTER), in a child process."""
    script = (
        "import json, sys, htcondor2\n"
        "htcondor2.set_subsystem('JOB_ROUTER')\n"
        "htcondor2.reload_config()\n"
        "print(json.dumps({n: htcondor2.param.get(n) for n in json.loads(sys.argv[1])}))\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", script, json.dumps(names)], capture_output=True, text=True,
                          env={**ENV, "CONDOR_CONFIG": str(root)}, timeout=60, check=True)
    return json.loads(proc.stdout)


CATEGORIES = {
    # config.cpp Parse_macros, "+=": previous non-empty value, then ' ' (or the separator), then the text
    "plus_equals": (
        "X = a\nX += b\nEMPTY =\nEMPTY += z\nNEW += n\nSEP = a\nSEP +,= b\nSEP +&&= c\nSEP2 = p\nSEP2 +;= q\n"
        "SELF = a\nSELF += $(SELF) x\nLATE = $(X)\nLATE += $(LATER)\nJOB_ROUTER_NAME += mine\n"
        "DAEMON_LIST += COLLECTOR\n",
        ["X", "SEP", "SELF", "LATE", "JOB_ROUTER_NAME", "DAEMON_LIST"],
    ),
    # config.cpp expand_self_macro: only the knob's own name expands at definition, with the
    # previous value, else the param-table default, else the :default; others expand when used
    "self_reference": (
        "X = a\nX = $(X) b $(Y)\nY = later\nZ = $(Z:dflt) more\nDAEMON_LIST = $(DAEMON_LIST) SCHEDD\n"
        "P = base\nJOB_ROUTER.P = $(P) r\nQ = $(Q)\nR = $(R) $(r)\n"
        "JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES) Mine\n",
        ["X", "Z", "DAEMON_LIST", "P", "Q", "R", "JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES"],
    ),
    # config.cpp lookup_macro with the router's subsystem: JOB_ROUTER.X first, also for += and $(X)
    "subsystem_prefix": (
        "JOB_ROUTER.X = jr\nX = plain\nX += a\nY = y0\nJOB_ROUTER.Y = jy\nY = $(Y) b\nZ = $(X)/$(Y)\n",
        ["X", "Y", "Z"],
    ),
    # config.cpp evaluate_macro_func: $INT/$REAL/$STRING (ClassAd evaluation; failure = empty)
    "typed_macros": (
        'A = 2*3\nF = 1.5\nS = "quo" + "ted"\nS2 = strcat("a", "b")\nNS = plain words\n'
        "I1 = $INT(A)\nI2 = $INT(A,%05d)\nI3 = $INT(NS)\nI4 = $INT(12)\nI5 = x$INT(F)y\nI6 = $INT(true)\n"
        "R1 = $REAL(F)\nR2 = $REAL(A)\nR3 = $REAL(A,%.2f)\nR4 = $REAL(NS)\nR5 = $REAL(A,%d)\nR6 = $REAL(F,%.0f)\n"
        "T1 = $STRING(S)\nT2 = $STRING(S2)\nT3 = $STRING(NS)\nT4 = $STRING(A)\nT5 = $STRING(S2,<%s>)\n"
        "T6 = $STRING(literal)\n",
        ["I1", "I2", "I3", "I4", "I5", "I6", "R1", "R2", "R3", "R4", "R5", "R6", "T1", "T2", "T3", "T4", "T5",
         "T6"],
    ),
    # config.cpp read_meta_config / expand_meta_args, with HTCondor's own metaknob table
    # (the same line as HTCondor-CE's 01-common-auth-defaults.conf)
    "metaknobs": (
        "use security : recommended\nuse role : CentralManager\nuse FEATURE : PartitionableSlot(2, 50%)\n"
        "use policy : Hold_If_Memory_Exceeded\n",
        ["SEC_DEFAULT_AUTHENTICATION", "DAEMON_LIST", "SLOT_TYPE_2", "SLOT_TYPE_2_PARTITIONABLE"],
    ),
    # config.cpp Test_config_if_expression / ConfigIfStack (version compares against the wheel here)
    "if_statements": (
        "if version >= 24.0.0\n V24 = yes\nelse\n V24 = no\nendif\n"
        "if version < 25.11\n OLD = yes\nendif\n"
        "if defined use security:recommended\n META = known\nendif\n"
        "if defined use nosuchcategory\n META2 = known\nelse\n META2 = unknown\nendif\n",
        ["V24", "OLD", "META", "META2"],
    ),
}


@pytest.mark.parametrize("category", sorted(CATEGORIES))
def test_category_agrees_with_htcondor(tmp_path, category):
    text, names = CATEGORIES[category]
    root = tmp_path / "condor_config"
    root.write_text(text)
    ours = assert_agree(root)
    expected = htcondor_param(root, names)
    assert {n: ours.get(n) for n in names} == expected
    assert any(v for v in expected.values())  # the oracle said something


def test_plus_equals_values_spelled_out(tmp_path):
    """So a broken oracle cannot make the category test pass: the rule, written down."""
    root = tmp_path / "condor_config"
    root.write_text(CATEGORIES["plus_equals"][0])
    cfg = CondorConfig.load(root)
    assert [cfg.raw(n) for n in ("X", "EMPTY", "NEW", "SEP", "SEP2", "SELF")] == [
        "a b", "z", "n", "a,b && c", "p;q", "a a x"]
    assert cfg.raw("LATE") == "$(X) $(LATER)"
    assert cfg.raw("JOB_ROUTER_NAME") == "jobrouter mine"  # the param-table default comes first
    assert cfg.raw("DAEMON_LIST") == "MASTER COLLECTOR"


def test_typed_macros_spelled_out(tmp_path):
    root = tmp_path / "condor_config"
    root.write_text(CATEGORIES["typed_macros"][0])
    cfg = CondorConfig.load(root)
    got = {n: cfg.get(n) for n in CATEGORIES["typed_macros"][1]}
    assert got == {
        "I1": "6", "I2": "00006", "I3": None, "I4": "12", "I5": "x1y", "I6": "1",
        "R1": "1.5", "R2": "6", "R3": "6.00", "R4": None, "R5": "%d", "R6": "2.0",
        "T1": '"quo" + "ted"', "T2": "ab", "T3": "plain words", "T4": "2*3", "T5": "<ab>", "T6": "literal",
    }


def test_metaknob_knobs_are_placed_at_the_use_line(tmp_path):
    root = tmp_path / "condor_config"
    root.write_text("A = 1\nuse security : recommended\n")
    cfg = CondorConfig.load(root)
    origin = cfg.origin("SEC_DEFAULT_ENCRYPTION")
    assert (origin.file, origin.line, origin.via) == (str(root), 2, "use security : recommended")
    assert cfg.raw("SEC_DEFAULT_ENCRYPTION") == "required"
    assert not cfg.diagnostics  # the old "metaknob is not supported" warning is gone


def test_knobs_htcondor_sets_itself_replace_the_configuration(tmp_path):
    """condor_config.cpp reinsert_specials: FULL_HOSTNAME & co. are re-detected after every file."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "50.conf").write_text("FULL_HOSTNAME = ce01.example.edu\nA = 1\n")
    root = tmp_path / "condor_config"
    root.write_text(f"LOCAL_CONFIG_DIR = {d}\n")
    router_view = CondorConfig.load(root, detected_specials=True)
    assert router_view.get("FULL_HOSTNAME") != "ce01.example.edu"
    assert [(x.file, x.line) for x in router_view.diagnostics] == [(str(d / "50.conf"), 1)]
    assert CondorConfig.load(root).get("FULL_HOSTNAME") == "ce01.example.edu"  # the default stays lenient
    with_reader = CondorConfig.load(root, run_commands=True, environ=ENV)
    assert with_reader.get("FULL_HOSTNAME") == htcondor_param(root, ["FULL_HOSTNAME"])["FULL_HOSTNAME"]
    assert with_reader.get("FULL_HOSTNAME") != "ce01.example.edu"


def test_unknown_metaknob_is_an_error_as_in_htcondor(tmp_path):
    """read_meta_config: "use CATEGORY: does not recognise NAME" stops the reader."""
    from ce_k8s.condor.config import ConfigError

    root = tmp_path / "condor_config"
    root.write_text("use security : nosuchthing\n")
    with pytest.raises(ConfigError, match=r":1: use security: does not recognise nosuchthing"):
        CondorConfig.load(root)
    assert "does not recognise nosuchthing" in (htconfig.read(str(root), environ=ENV).error or "")


def _config_files() -> list[Path]:
    """Every configuration file under tests/ (by name: *.conf and condor_config*; the `.conf` files of a
    `mapfiles.d` are HTCondor's unified map files, another language)."""
    found = sorted({*TESTS.rglob("*.conf"), *TESTS.rglob("condor_config*")})
    return [p for p in found if p.is_file() and "__pycache__" not in p.parts and "mapfiles.d" not in p.parts]


def test_there_are_configuration_files_to_compare():
    files = _config_files()
    assert len(files) >= 25
    assert any(p.name == "01-ce-router-defaults.conf" for p in files)


@pytest.fixture(scope="module")
def stock_copy(tmp_path_factory):
    """The stock CE tree with its absolute paths pointed at a copy (its files name each other so)."""
    from tests.fixtures.stock_ce import TREE, copy_stock_ce

    return TREE, copy_stock_ce(tmp_path_factory.mktemp("stock") / "ce").root


@pytest.mark.parametrize("path", _config_files(), ids=lambda p: str(p.relative_to(TESTS)))
def test_every_configuration_file_under_tests_agrees(path, stock_copy):
    """Each file read as a root configuration. A file that runs a command is compared on every knob
    but those the command's output sets (ce-k8s alone does not run it)."""
    tree, copy = stock_copy
    if path.is_relative_to(tree):
        path = copy / path.relative_to(tree)
    ours = CondorConfig.load(path, environ=ENV, detected_specials=True)
    result = htconfig.read(str(path), environ=ENV)
    assert result.error is None, result.error
    commands = {command for _where, command in ours.commands}
    theirs = {k.name.lower(): k.value for k in result.knobs
              if k.source not in (htconfig.DETECTED_SOURCE, htconfig.DEFAULT_SOURCE) and k.source not in commands}
    defaults = {k.name.lower(): k.value for k in result.knobs if k.source == htconfig.DEFAULT_SOURCE}
    from_commands = {k.name.lower() for k in result.knobs if k.source in commands}
    mine = {k: v for k, v in ours_raw(ours, defaults).items() if k not in from_commands}
    assert mine == {k: v for k, v in theirs.items() if k not in from_commands}


def test_shipped_default_configuration_agrees():
    """The embedded config.d/ and routes/, read as LOCAL_CONFIG_DIR (what `ce-k8s route` reads by default)."""
    dirs = [d for d in default_config_paths() if d.is_dir()]
    ours = CondorConfig.load(None, environ=ENV, detected_specials=True)
    theirs, defaults = htcondor_raw(None, dirs)
    assert ours_raw(ours, defaults) == theirs
    assert any(k.startswith("job_router_route_") for k in theirs)


def _doc_blocks() -> list[tuple[str, str]]:
    """Every ```condor-config block of docs/*.md, as (doc:line, text)."""
    import re

    found = []
    for doc in sorted((TESTS.parent / "docs").glob("*.md")):
        text = doc.read_text()
        for m in re.finditer(r"```condor-config\n(.*?)```", text, re.DOTALL):
            found.append((f"{doc.name}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)))
    return found


def test_there_are_documented_configurations():
    assert len(_doc_blocks()) >= 3


@pytest.mark.parametrize("where,text", _doc_blocks(), ids=[w for w, _ in _doc_blocks()])
def test_every_documented_configuration_agrees(tmp_path, where, text):
    """The configurations docs/ shows admins read the same with both readers."""
    root = tmp_path / "condor_config"
    root.write_text(text)
    assert_agree(root)
