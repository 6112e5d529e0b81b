"""The shipped configuration routes every example pilot as HTCondor's own transform code does.

For each job ad in examples/ (the .ad files and every ad of pilots.json), ``ce-k8s route --json``
with the embedded default configuration (config.d/ then routes/, as
``ce_k8s.condor.config.default_config_paths`` lists them) must choose the route HTCondor 25.14.1's
code chooses and produce the same routed ad attribute by attribute. The steps around the
transforms that libcondor_utils does not contain (translate hook, VanillaToGrid, submit edits)
are ce-k8s's own on both sides and the router's stamps are not compared; see
tests/condor/test_reference_routes.py and tests/condor/ORACLE.md.

Whether the router looks at a pilot at all (its umbrella constraint) is compared too: the oracle
builds that constraint as JobRouter::GetCandidateJobs does and evaluates it with libclassad.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import xform_oracle
from xform_oracle import OracleUnavailable

from ce_k8s.condor import wire
from ce_k8s.condor.config import default_config_paths

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _example_ads() -> list[tuple[str, str]]:
    """(id, long-form text) of every job ad shipped in examples/."""
    found = []
    for path in sorted(EXAMPLES.iterdir()):
        if path.suffix not in (".ad", ".json"):
            continue
        ads = wire.parse_job_ads(path.read_text(), str(path))
        for index, ad in enumerate(ads):
            found.append((f"{path.name}#{index}" if len(ads) > 1 else path.name, wire.sprint_ad(ad)))
    return found


EXAMPLE_ADS = _example_ads()


@pytest.fixture(scope="module")
def shipped_dirs() -> list[Path]:
    try:
        xform_oracle.shim_path()
    except OracleUnavailable as exc:
        pytest.fail(f"the transform oracle cannot run: {exc}")
    return [d for d in default_config_paths() if d.is_dir()]


def test_examples_are_there() -> None:
    assert len(EXAMPLE_ADS) >= 6, EXAMPLE_ADS


@pytest.mark.parametrize(("name", "text"), EXAMPLE_ADS, ids=[name for name, _ in EXAMPLE_ADS])
def test_shipped_routes_match_htcondor(shipped_dirs, tmp_path, name: str, text: str) -> None:
    diffs = xform_oracle.differences_from_ce_k8s(shipped_dirs, text, ce_config=None, workdir=tmp_path)
    assert not diffs, f"{name}: ce-k8s route differs from HTCondor:\n  " + "\n  ".join(diffs)
    oracle = xform_oracle.run_oracle(shipped_dirs, text)
    assert oracle.routing_enabled, f"HTCondor's code disables routing with the shipped config: {oracle.notes}"
    assert oracle.errors == [], f"{name}: HTCondor logs errors routing the shipped example: {oracle.errors}"


def test_most_examples_are_compared(shipped_dirs, tmp_path) -> None:
    """The comparison above is not vacuous: most examples are candidates HTCondor routes."""
    routed = 0
    for _name, text in EXAMPLE_ADS:
        oracle = xform_oracle.run_oracle(shipped_dirs, text)
        routed += oracle.route is not None
    assert routed >= len(EXAMPLE_ADS) - 2, routed


def test_shipped_routes_parse_as_htcondor_reads_them(shipped_dirs) -> None:
    """Every shipped route is valid for HTCondor's ParseNext, with the universe and GridResource
    ce-k8s reads."""
    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.condor.routing import RouterConfig

    oracle = xform_oracle.run_oracle(shipped_dirs, EXAMPLE_ADS[0][1])
    router = RouterConfig.from_config(CondorConfig.load())
    theirs = {r.name: r for r in oracle.routes}
    assert [r.name for r in router.routes] == oracle.route_order
    for route in router.routes:
        info = theirs[route.name]
        assert info.valid, f"HTCondor rejects shipped route {route.name}: {info.error}"
        assert (route.target_universe, route.grid_resource or None) == (info.universe, info.grid_resource or None)
