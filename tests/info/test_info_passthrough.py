"""Only Kubernetes routes get an OSG_ResourceCatalog entry (docs/routes.md "CEs with other
backends"): the rule is the routed pilot's GridResource against CE_K8S_GRID_RESOURCE, the one the
hooks apply, not whether the route happens to set K8s* attributes."""

from __future__ import annotations

from .conftest import catalog, parse, run_info

MIXED = """\
JOB_ROUTER_ROUTE_NAMES = slurmgpu plain $(JOB_ROUTER_ROUTE_NAMES)
# Another backend's route whose jobs get K8s* attributes anyway (a copy-pasted SET, a transform).
JOB_ROUTER_ROUTE_slurmgpu @=jrt
    REQUIREMENTS queue =?= "slurmgpu"
    UNIVERSE grid
    GridResource = "batch slurm"
    SET K8sNodeSelector [ pool = "cpu" ]
@jrt
# A Kubernetes route with no SET K8s* at all: the site defaults make its pods.
JOB_ROUTER_ROUTE_plain @=jrt
    REQUIREMENTS queue =?= "plain"
    UNIVERSE grid
    GridResource = "BATCH K8s"
@jrt
"""


def test_batch_slurm_route_beside_ours_gets_no_entry(capsys, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "90-mixed.conf").write_text(MIXED)
    config = tmp_path / "condor_config"
    config.write_text(f"LOCAL_CONFIG_DIR = config.d, tests/info/config/d, {tmp_path / 'd'}\n")
    out, code = run_info(capsys, "--config", str(config), "--cluster-snapshot", "tests/info/snapshots/mixed.json")
    entries = catalog(parse(out))
    assert set(entries) == {"gpu", "wholenode", "cpu8", "plain"}, out
    assert code == 0
