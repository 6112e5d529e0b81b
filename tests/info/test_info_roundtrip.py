"""A catalog entry and the route it describes agree (issue 6, htcondor-ce.md §3.2, §3.4).

OSG_autoconf turns a pilot entry into a factory entry: `+xcount = CPUs`, `+maxMemory = Memory`,
`+maxWallTime = MaxWallTime`, `Request_GPUs = GPUs`, `+WantWholeNode = WholeNode`,
`batch_queue = Queue` (`get_pilot`/`get_entry_dictionary`). The pilots that factory entry sends must
be taken by the entry's route and get exactly the advertised shape -- otherwise the catalog lies.
The pilots are built from the routing engineer's examples/pilot-*.ad (identity kept: the CMS entry
is exercised with the CMS-token pilot) and routed with the real routing engine and pod builder.
"""

from __future__ import annotations

import classad2
import pytest

from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.routing import RouterConfig
from ce_k8s.condor.wire import evaluate_ad, parse_job_ads
from ce_k8s.info.capacity import PodShape
from ce_k8s.pods.builder import build_manifests
from ce_k8s.settings import Settings

from .conftest import REPO, TEST_CONFIG, catalog, parse, run_info


def _example(name: str) -> classad2.ClassAd:
    return parse_job_ads((REPO / "examples" / name).read_text())[0]


def factory_pilot(entry: dict) -> classad2.ClassAd:
    """The pilot a factory entry generated from ``entry`` by OSG_autoconf would submit."""
    vos = entry.get("AllowedVOs") or []
    job = _example("pilot-cms-token.ad" if vos == ["cms"] else "pilot-1core.ad")
    for attr in ("xcount", "maxMemory", "maxWallTime", "RequestGPUs", "WantWholeNode", "queue"):
        if attr in job:
            del job[attr]
    if "CPUs" in entry:
        job["xcount"] = entry["CPUs"]
    if "Memory" in entry:
        job["maxMemory"] = entry["Memory"]
    job["maxWallTime"] = entry["MaxWallTime"]
    if "GPUs" in entry:
        job["RequestGPUs"] = entry["GPUs"]
    if entry.get("WholeNode"):
        job["WantWholeNode"] = True
    if "Queue" in entry:
        job["queue"] = entry["Queue"]
    return job


@pytest.mark.parametrize("config", [TEST_CONFIG, None], ids=["test-routes", "shipped-routes"])
def test_factory_pilot_from_each_entry_gets_that_entry(capsys, config):
    args = ["--cluster-snapshot", "tests/info/snapshots/mixed.json"]
    if config:
        args = ["--config", config, *args]
    ad = parse(run_info(capsys, *args)[0])
    cfg = CondorConfig.load(config)
    router = RouterConfig.from_config(cfg)
    settings = Settings.from_config(cfg)
    entries = catalog(ad)
    assert entries
    for name, entry in entries.items():
        pilot = factory_pilot(entry)
        assert router.is_candidate(pilot), name
        route = router.choose_route(pilot)
        assert route is not None and route.name == name, (name, route and route.name)
        routed = router.route_job(pilot, route)
        values = evaluate_ad(routed.ad)
        values.setdefault("K8sSourceGlobalJobId", "x#1.0#0")
        shape = PodShape.from_pod(build_manifests(values, settings).pod)
        gpus = sum(v for k, v in shape.requests.items() if k.endswith("/gpu"))
        assert gpus == entry.get("GPUs", 0), name
        assert shape.active_deadline // 60 == entry["MaxWallTime"], name
        if entry["WholeNode"]:
            assert shape.requests["cpu"] // 1000 == entry["EstimatedCPUs"], name
        else:
            assert (shape.requests["cpu"] // 1000, shape.requests["memory"] // 2**20) == (
                entry["CPUs"], entry["Memory"]), name
