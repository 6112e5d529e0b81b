"""Reference routing cases: HTCondor-CE's route documentation and HTCondor's transform regression tests.

Every case in tests/condor/reference/*.cases (format: tests/condor/reference/README.md) is a
configuration and a job ad taken from an upstream page or test, with the values upstream says the
routed job gets, each citing its upstream line. Two tests per case:

1. ``test_oracle_gives_the_cited_values``: HTCondor 25.14.1's own transform code
   (tests/condor/xform_oracle.py) produces the cited values. This proves the oracle.
2. ``test_ce_k8s_route_matches_htcondor``: ``ce-k8s route --json`` gives the same route and the same
   routed ad, attribute by attribute, as HTCondor's code.

What is compared, and why: libcondor_utils holds the transforms (MacroStreamXFormSource,
XFormHash, TransformClassAd) but not the router's own steps around them (hooks, VanillaToGrid,
the attributes FinishSubmitJob stamps, the schedd's submit edits). The oracle side therefore gets
ce-k8s's own versions of those steps, applied to HTCondor's reading of the route
(``xform_oracle.oracle_as_ce_k8s_route``), and the stamps (RoutedFromJobId, RoutedBy, RouteName,
RoutedToJobId) are left out of the comparison. Every other difference is a difference in how
ce-k8s reads the configuration, selects the route or runs the transforms.

A case whose expectations are about the transforms alone (``pipeline: transforms``, e.g.
condor_transform_ads rules that read attributes VanillaToGrid removes) checks the oracle without
the VanillaToGrid step; its comparison with ce-k8s still runs the full pipeline on both sides.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import classad2
import pytest
import xform_oracle
from xform_oracle import OracleResult, OracleUnavailable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REFERENCE = HERE / "reference"
CE_DEFAULTS = ROOT / "config.d" / "01-ce-router-defaults.conf"
_EXPECT = re.compile(r"^(?P<target>\S+)\s+(?P<op>==|=~|absent|present)\s*(?P<value>.*?)\s*;\s*(?P<cite>\S.*)$")


@dataclass
class Expect:
    target: str
    op: str
    value: str
    cite: str


@dataclass
class Case:
    id: str
    source: str                 # "repo@commit:file" of the case file's header
    origin: str                 # file:line of the case in tests/condor/reference
    lines: str = ""
    base: str = "none"
    pipeline: str = "router"
    note: str = ""
    config: str = ""
    job: str = ""
    expects: list[Expect] = field(default_factory=list)

    def cite(self, expect: Expect) -> str:
        repo_commit, _, path = self.source.partition(":")
        where = expect.cite if ":" in expect.cite.split(",")[0] else f"{path}:{expect.cite}"
        return f"{repo_commit} {where} (case {self.origin})"


def _parse_file(path: Path) -> list[Case]:
    text = path.read_text()
    header, *chunks = re.split(r"^=== case: ", text, flags=re.M)
    meta = dict(line.split(": ", 1) for line in header.splitlines() if ": " in line)
    source = f"{meta['repo']}@{meta['commit'][:12]}:{meta['file']}"
    cases = []
    offset = header.count("\n") + 1
    for chunk in chunks:
        first, _, rest = chunk.partition("\n")
        case = Case(first.strip(), source, f"{path.name}:{offset}")
        section = None
        bodies: dict[str, list[str]] = {"config": [], "job": [], "expect": []}
        for line in rest.splitlines():
            if line.startswith("--- "):
                section = line[4:].strip()
                continue
            if section is None:
                key, sep, value = line.partition(": ")
                if sep:
                    setattr(case, key.strip(), value.strip())
                continue
            bodies[section].append(line)
        case.config = "\n".join(bodies["config"]).rstrip() + "\n"
        case.job = "\n".join(bodies["job"]).rstrip() + "\n"
        for line in bodies["expect"]:
            if not line.strip():
                continue
            found = _EXPECT.match(line.strip())
            assert found, f"{path.name}: cannot read expectation {line!r}"
            case.expects.append(Expect(**found.groupdict()))
        assert case.expects, f"{path.name}: case {case.id} expects nothing"
        cases.append(case)
        offset += chunk.count("\n")
    return cases


CASES = [case for path in sorted(REFERENCE.glob("*.cases")) for case in _parse_file(path)]


def _unparse(text: str) -> str:
    return str(classad2.ExprTree(text))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    try:
        xform_oracle.shim_path()
    except OracleUnavailable as exc:
        pytest.fail(f"the transform oracle cannot run: {exc}")
    return tmp_path_factory.mktemp("reference")


def _case_dir(workdir: Path, case: Case) -> tuple[Path, Path]:
    """(configuration directory, job file) for a case; the directory is read as LOCAL_CONFIG_DIR
    by HTCondor and as a directory of config files by ce-k8s, in file-name order."""
    root = workdir / re.sub(r"[^A-Za-z0-9_.-]", "_", case.origin)
    confdir = root / "config.d"
    if not confdir.is_dir():
        confdir.mkdir(parents=True)
        if case.base == "ce-defaults":
            shutil.copy(CE_DEFAULTS, confdir / CE_DEFAULTS.name)
        else:
            assert case.base == "none", f"{case.origin}: unknown base {case.base}"
        (confdir / "99-case.conf").write_text(case.config)
        (root / "job.ad").write_text(case.job)
    return confdir, root / "job.ad"


_ORACLE: dict[tuple[str, bool], OracleResult] = {}


def _oracle(workdir: Path, case: Case, vanilla_to_grid: bool) -> OracleResult:
    key = (case.origin, vanilla_to_grid)
    if key not in _ORACLE:
        confdir, job = _case_dir(workdir, case)
        _ORACLE[key] = xform_oracle.run_oracle(confdir, job.read_text(), vanilla_to_grid=vanilla_to_grid)
    return _ORACLE[key]


def _check(case: Case, expect: Expect, result: OracleResult) -> str | None:
    """Why ``result`` does not have the expected value, or None."""
    if expect.target == "config-error-line":
        return None if result.config_error_line == int(expect.value) else \
            f"HTCondor should refuse the configuration at line {expect.value}: {result.log or result.errors}"
    if result.config_error_line is not None:
        return f"HTCondor refused the configuration: {result.log}"
    if expect.target == "route":
        want = None if expect.value == "none" else expect.value
        return None if result.route == want else f"route {result.route!r}, expected {want!r} ({result.notes})"
    if expect.target in ("universe", "grid_resource"):
        info = result.route_info(result.route or "")
        if info is None:
            return f"no route chose the job ({result.notes} {result.errors})"
        got = info.universe if expect.target == "universe" else info.grid_resource
        return None if str(got) == expect.value else f"{expect.target} {got!r}, expected {expect.value!r}"
    ad = result.ad()
    if ad is None:
        return f"the router did not route the job: {result.errors} {result.notes}"
    present = expect.target in ad
    if expect.op == "absent":
        return None if not present else f"{expect.target} = {ad.lookup(expect.target)} should be absent"
    if not present:
        return f"{expect.target} is missing"
    got = str(ad.lookup(expect.target))
    if expect.op == "present":
        return None
    if expect.op == "=~":
        pattern = expect.value[1:-1] if expect.value.startswith('"') and expect.value.endswith('"') else expect.value
        return None if re.search(pattern, got) else f"{expect.target} = {got} does not match {expect.value}"
    want = _unparse(expect.value)
    return None if got == want else f"{expect.target} = {got}, expected {want}"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.origin.split('.')[0]}-{c.id}" for c in CASES])
def test_oracle_gives_the_cited_values(workdir, case: Case) -> None:
    result = _oracle(workdir, case, vanilla_to_grid=case.pipeline != "transforms")
    failures = [f"{why}\n    cited: {case.cite(e)}" for e in case.expects if (why := _check(case, e, result))]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.origin.split('.')[0]}-{c.id}" for c in CASES])
def test_ce_k8s_route_matches_htcondor(workdir, case: Case) -> None:
    confdir, _job_file = _case_dir(workdir, case)
    diffs = xform_oracle.differences_from_ce_k8s(confdir, case.job, ce_config=confdir, workdir=workdir)
    assert not diffs, f"ce-k8s route differs from HTCondor for case {case.origin}:\n  " + "\n  ".join(diffs)
