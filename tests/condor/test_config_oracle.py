"""Differential test: our reader against HTCondor's own param system (htcondor2 25.14.1).

``htcondor2.param`` reads CONDOR_CONFIG and LOCAL_CONFIG_DIR, handles
``@=`` blocks and ``$(X)`` appends, but only returns *expanded* values. Expanded values are exactly
what ``CondorConfig.get`` returns, so the wheel is an oracle for the whole syntax. It runs in a
subprocess because htcondor2 reads CONDOR_CONFIG once per process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ce_k8s.condor.config import CondorConfig

KNOBS = [
    "A", "B", "C", "D", "E", "F", "G", "H", "H2", "ROUTE", "INC", "IFA", "IFB", "IFC", "IFD", "IFE",
    "DIR1", "DIR2", "ORDER", "X.Y", "JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES", "JOB_ROUTER_NAME", "EMPTY",
    "SELF_UNDEF", "Z1", "Z2", "Z3", "Z4", "Y", "nm_K", "LATE", "CASE", "OLDROUTES", "CONT_COMMENT",
]

MAIN = """\
# top comment
A = 1
B = two
C = $(A) $(B) $(NOPE) [$(NOPE:dflt)] $ENV(ORACLE_HOME) $ENV(ORACLE_UNSET) $ENV(ORACLE_UNSET:edef) $$(A) $(MY.Owner)
D = first
D = $(D) second
E = $(E) only
F = value # not a comment
  G = indented
H = line1 \\
    line2 \\
# comment in continuation \\
    line3
H2 = trailing \\

CONT_COMMENT = a \\
# xy
ROUTE @=jrt
  # comment inside
  SET Foo "bar-$(MY.Owner)"

    SET Baz $(A)
  H = x \\
   y
@jrt
include : {inc}
include ifexist : {missing}
if defined A
  IFA = yes
else
  IFA = no
endif
if defined NOTDEF
  IFB = yes
elif version >= 8.0.0
  IFB = ver
else
  IFB = no
endif
if false
  IFC = 1
elif true
  IFC = 2
endif
if $(A)
 IFD = 1
endif
if ! version > 99.1
 IFE = old-enough
endif
LOCAL_CONFIG_DIR = {confd}
X.Y = dotted
JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES) Mine
JOB_ROUTER_NAME = $(JOB_ROUTER_NAME)-x
EMPTY =
SELF_UNDEF = $(SELF_UNDEF)
Z1 = $(UNDEF:$(A1))
A1 = deflt
Z2 = $(UNDEF:a b,c$d:e)
Z3 = $(UNDEF:x=y)
Z4 = $(has space)
Y = a$(DOLLAR)(Z)b $(dollar)
N = nm
$(N)_K = named
LATE = $(LATER)
LATER = set-after
case = lower
CASE = $(case) upper
OLDROUTES @=jre
[ GridResource = "batch pbs"; name = "Local_PBS_cms"; set_remote_queue = "cms"; ]
@jre
"""


def _tree(tmp_path: Path) -> Path:
    confd = tmp_path / "config.d"
    confd.mkdir()
    (tmp_path / "inc.conf").write_text("INC = included\n")
    (confd / "10-a.conf").write_text("DIR1 = a\nORDER = $(ORDER) a\n")
    (confd / "20-b.conf").write_text("DIR1 = b\nORDER = $(ORDER) b\n")
    (confd / "30-c.conf~").write_text("DIR1 = tilde\n")
    (confd / ".40-hidden").write_text("DIR1 = hidden\n")
    (confd / "50.py").write_text("DIR1 = py\n")
    (confd / "60noext").write_text("DIR2 = noext\nORDER = $(ORDER) n\n")
    main = tmp_path / "condor_config"
    main.write_text(MAIN.format(inc=tmp_path / "inc.conf", missing=tmp_path / "missing.conf", confd=confd))
    return main


def _oracle(config: Path, env: dict[str, str]) -> dict[str, object]:
    script = (
        "import json, htcondor2\n"
        f"names = {KNOBS!r}\n"
        "out = {}\n"
        "for n in names:\n"
        "    try:\n"
        "        out[n] = str(htcondor2.param[n])\n"
        "    except KeyError:\n"
        "        out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    return json.loads(proc.stdout)


def test_reader_agrees_with_htcondor2_param(tmp_path):
    """Every knob of a config using the whole syntax expands exactly as HTCondor 25's param does."""
    main = _tree(tmp_path)
    env = {"CONDOR_CONFIG": str(main), "ORACLE_HOME": "/home/oracle", "PATH": "/usr/bin:/bin"}
    expected = _oracle(main, env)
    ours = CondorConfig.load(main, environ={"ORACLE_HOME": "/home/oracle"})
    got = {n: ours.get(n) for n in KNOBS}
    assert got == expected
    # and a few of the values, so a broken oracle cannot make this pass vacuously
    assert got["ROUTE"] == 'SET Foo "bar-"\nSET Baz 1\nH = x y'
    assert got["ORDER"] == " a b n"
    assert got["C"] == "1 two  [dflt] /home/oracle UNDEFINED edef $$(A) "


def test_htcondor_reader_values_keep_our_line_maps(tmp_path):
    """load(run_commands=True): values from HTCondor's reader, file:line and @= line maps from ours."""
    main = _tree(tmp_path)
    env = {"CONDOR_CONFIG": str(main), "ORACLE_HOME": "/home/oracle", "PATH": "/usr/bin:/bin"}
    expected = _oracle(main, env)
    both = CondorConfig.load(main, environ={"ORACLE_HOME": "/home/oracle", "PATH": "/usr/bin:/bin"},
                             run_commands=True)
    assert both.read_by_htcondor
    assert {n: both.get(n) for n in KNOBS} == expected
    ours = CondorConfig.load(main, environ={"ORACLE_HOME": "/home/oracle"})
    assert both.raw_lines("ROUTE") == ours.raw_lines("ROUTE") and len(both.raw_lines("ROUTE")) == 3
    assert both.origin("ORDER") == ours.origin("ORDER")
    assert both.line_of("H", len("line1 line2 ")) == ours.line_of("H", len("line1 line2 "))
