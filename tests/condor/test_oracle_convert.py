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


def _route_both(tmp_path: Path, label: str, theirs: list[dict], ours_text: str, job: str) -> None:
    """Apply HTCondor's and ce-k8s's conversions with HTCondor 25.14.1's code; assert they agree.

    A CE sets a source constraint, so converted routes without Requirements are valid; of two
    routes of one name the router keeps the last (JobRouter::ParseRoute)."""
    source = "JOB_ROUTER_SOURCE_JOB_CONSTRAINT = target.JobUniverse =?= 5\n"
    last = {r["name"].lower(): r for r in theirs}
    names = list(dict.fromkeys(r["name"] for r in theirs))
    htc_dir, ck_dir = tmp_path / "htcondor", tmp_path / "ce-k8s"
    htc_dir.mkdir()
    ck_dir.mkdir()
    (htc_dir / "routes.conf").write_text(
        source + "".join(f"JOB_ROUTER_ROUTE_{r['name']} @=jrt\n{r['statements']}@jrt\n" for r in last.values())
        + "JOB_ROUTER_ROUTE_NAMES = " + " ".join(names) + "\n")
    (ck_dir / "routes.conf").write_text(source + ours_text)
    a = xform_oracle.run_oracle(htc_dir, job, vanilla_to_grid=True)
    b = xform_oracle.run_oracle(ck_dir, job, vanilla_to_grid=True)
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
    assert a.candidate and a.route is not None, a.notes
    assert not problems, (f"{label}: ce-k8s routes convert differs from HTCondor's conversion:\n  "
                          + "\n  ".join(problems) + "\nHTCondor:\n" + "\n".join(r["statements"] for r in theirs)
                          + "\nce-k8s:\n" + ours_text)


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
    _route_both(tmp_path, lines, theirs, ours.text, JOB)


# Corners of the old syntax the documentation does not show (our own configurations; HTCondor's
# conversion is the expected value).
OWN: dict[str, str] = {
    "defaults-merge-and-override": (
        'JOB_ROUTER_DEFAULTS @=jrd\n[ MaxIdleJobs = 5; set_Foo = "from-defaults"; eval_set_Bar = RequestCpus * 2;\n'
        '  delete_Environment = true; copy_Owner = "OrigOwner"; ]\n@jrd\n'
        'JOB_ROUTER_ENTRIES @=jre\n[ name = "A"; GridResource = "batch pbs"; set_Foo = "from-entry";\n'
        '  Requirements = target.queue == "prod"; ]\n'
        '[ name = "B"; GridResource = "batch slurm"; MaxIdleJobs = 7; eval_set_Baz = strcat(target.Owner, "-x"); ]\n'
        '@jre\n'),
    "target-and-my-references": (
        'JOB_ROUTER_ENTRIES @=jre\n[ name = "T"; TargetUniverse = 5; Requirements = TARGET.RequestCpus >= 1 && '
        'MY.MaxIdleJobs > 0;\n  set_Req = TARGET.RequestMemory > 1000; eval_set_E = target.RequestCpus + 1;\n'
        '  set_Requirements = (TARGET.OpSys == "LINUX"); MaxIdleJobs = 3; ]\n@jre\n'),
    "ce-style-defaults": (
        'JOB_ROUTER_ENTRIES @=jre\n[ name = "Local_Slurm"; GridResource = "batch slurm"; TargetUniverse = 9;\n'
        '  set_default_queue = "osg"; set_default_maxMemory = 3000; set_default_xcount = 4;\n'
        '  set_default_maxWallTime = 120;\n'
        '  eval_set_RequestGPUs = ifThenElse(isUndefined(RequestGPUs), 0, RequestGPUs);\n'
        '  set_remote_queue = "osg"; Requirements = target.x509UserProxyFirstFQAN =!= undefined; ]\n@jre\n'),
    "input-rsl-and-globus": (
        'JOB_ROUTER_ENTRIES @=jre\n[ name = "G"; GridResource = "batch pbs"; GlobusRSL = "(queue=long)";\n'
        '  InputRSL = [ a = 1 ]; set_A = 1; ]\n@jre\n'),
    "same-name-twice": (
        'JOB_ROUTER_ENTRIES @=jre\n[ name = "Dup"; GridResource = "batch pbs"; set_A = 1; ]\n'
        '[ name = "Dup"; GridResource = "batch slurm"; set_A = 2; ]\n@jre\n'),
    "sandbox-and-failure-tests": (
        'JOB_ROUTER_ENTRIES @=jre\n[ name = "S"; GridResource = "condor ce.example.org ce.example.org:9619";\n'
        '  JobShouldBeSandboxed = true; JobFailureTest = target.ExitCode =!= 0; FailureRateThreshold = 0.1;\n'
        '  EditJobInPlace = false; UseSharedX509UserProxy = false; set_A = "x"; ]\n@jre\n'),
}


@pytest.mark.parametrize("name", sorted(OWN))
def test_own_old_routes_convert_like_htcondor(tmp_path: Path, name: str) -> None:
    text = OWN[name]
    theirs = xform_oracle.convert_old_routes(config=text)
    assert theirs and all(r["rval"] > 0 for r in theirs), theirs
    ours = convert(CondorConfig.from_text(text, f"<{name}>"))
    _route_both(tmp_path, name, theirs, ours.text, JOB + 'x509UserProxyFirstFQAN = "/osg/Role=NULL"\nOpSys = "LINUX"\n')
