"""`ce-k8s routes convert` against HTCondor's own old-route converter.

HTCondor's libcondor_utils still contains ConvertClassadJobRouterRouteToXForm (xform_utils.cpp),
the function the router used to turn an old-syntax `JOB_ROUTER_ENTRIES` route ad into transform
statements. Every old-syntax example of HTCondor-CE's v5 "Writing Job Routes" page
(tests/condor/reference/htcondor-ce-v5-old-syntax.entries) is converted twice, by HTCondor and
by ``ce_k8s.condor.oldsyntax.convert``, and both conversions are then read and applied by the
same HTCondor 25.14.1 code (tests/condor/xform_oracle.py) to the same pilot: the route names,
how HTCondor reads each route (validity, universe, GridResource, REQUIREMENTS, route macros),
the route chosen and the routed ad must be the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import classad2
import pytest
import xform_oracle
from xform_oracle import OracleUnavailable

from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.oldsyntax import ConversionError, convert

HERE = Path(__file__).resolve().parent
ENTRIES = HERE / "reference" / "htcondor-ce-v5-old-syntax.entries"
JOB = """ClusterId = 7
ProcId = 0
JobUniverse = 5
JobStatus = 1
Owner = "usatlas2"
queue = "prod"
x509UserProxyFirstFQAN = "/cms/Role=pilot/Capability=NULL"
RequestCpus = 1
RequestMemory = 2048
Environment = "A=1"
JOB_COLLECTOR = "collector.example.org"
JOB_VO = "GLOW"
"""


def _blocks() -> list[tuple[str, str]]:
    text = ENTRIES.read_text()
    parts = re.split(r"^=== entries: (lines \d+-\d+)\n", text, flags=re.M)
    return [(parts[i], parts[i + 1].rstrip() + "\n") for i in range(1, len(parts), 2)]


BLOCKS = _blocks()


@pytest.fixture(scope="module", autouse=True)
def oracle_ready() -> None:
    try:
        xform_oracle.shim_path()
    except OracleUnavailable as exc:
        pytest.fail(f"the transform oracle cannot run: {exc}")


def test_examples_are_there() -> None:
    assert len(BLOCKS) >= 15, [lines for lines, _ in BLOCKS]


def _canonical(expr: str | None) -> str | None:
    if expr is None:
        return None
    try:
        return str(classad2.ExprTree(expr))
    except Exception:  # not an expression: compare the text
        return expr.strip()


@pytest.mark.parametrize(("lines", "entries"), BLOCKS, ids=[lines.replace(" ", "-") for lines, _ in BLOCKS])
def test_conversion_routes_like_htcondors(tmp_path: Path, lines: str, entries: str) -> None:
    text = f"JOB_ROUTER_ENTRIES @=jre\n{entries}@jre\n"
    theirs = xform_oracle.convert_old_routes(config=text)
    failed = [r for r in theirs if r["rval"] <= 0]
    config = CondorConfig.from_text(text, f"<{lines}>")
    if failed:
        with pytest.raises(ConversionError):
            convert(config)
        return
    ours = convert(config)
    assert ours.routes == [r["name"] for r in theirs], (ours.routes, [r["name"] for r in theirs])

    htc_dir, ck_dir = tmp_path / "htcondor", tmp_path / "ce-k8s"
    htc_dir.mkdir()
    ck_dir.mkdir()
    (htc_dir / "routes.conf").write_text(
        "".join(f"JOB_ROUTER_ROUTE_{r['name']} @=jrt\n{r['statements']}@jrt\n" for r in theirs)
        + "JOB_ROUTER_ROUTE_NAMES = " + " ".join(r["name"] for r in theirs) + "\n")
    (ck_dir / "routes.conf").write_text(ours.text)
    a = xform_oracle.run_oracle(htc_dir, JOB, vanilla_to_grid=True)
    b = xform_oracle.run_oracle(ck_dir, JOB, vanilla_to_grid=True)
    problems = []
    for route in a.routes:
        other = b.route_info(route.name)
        if other is None:
            problems.append(f"route {route.name}: HTCondor's conversion has it, ce-k8s's does not")
            continue
        mine = (other.valid, other.universe, other.grid_resource, _canonical(other.requirements), other.macros)
        want = (route.valid, route.universe, route.grid_resource, _canonical(route.requirements), route.macros)
        if mine != want:
            problems.append(f"route {route.name}: read from ce-k8s's conversion as {mine}, from HTCondor's as {want}")
    if (a.route, a.candidate) != (b.route, b.candidate):
        problems.append(f"chosen route / candidate: ce-k8s's conversion {(b.route, b.candidate)}, "
                        f"HTCondor's {(a.route, a.candidate)}")
    elif a.ad() is not None:
        problems += xform_oracle.ad_differences(b.ad(), a.ad())
    assert not problems, (f"{lines}: ce-k8s routes convert differs from HTCondor's conversion:\n  "
                          + "\n  ".join(problems) + "\nHTCondor:\n" + "\n".join(r["statements"] for r in theirs)
                          + "\nce-k8s:\n" + ours.text)
