"""The shipped defaults applied to the example pilots give the values htcondor-ce.md §1.5 describes."""

from __future__ import annotations

from pathlib import Path

import classad2
import pytest

from ce_k8s.condor import wire
from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.routing import RouterConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def shipped() -> RouterConfig:
    return RouterConfig.from_config(CondorConfig.load())


def pilot(name: str) -> classad2.ClassAd:
    path = EXAMPLES / f"pilot-{name}.ad"
    return wire.parse_old_ads(path.read_text(), str(path))[0]


def routed(shipped: RouterConfig, name: str, extra: dict[str, object] | None = None):
    job = pilot(name)
    for key, value in (extra or {}).items():
        job[key] = value
    route = shipped.choose_route(job)
    assert route is not None
    result = shipped.route_job(job, route)
    assert not result.failed and result.errors == []
    return route.name, result.ad


def test_shipped_config_loads_cleanly_with_ce_values_section_1_4(shipped):
    """htcondor-ce.md §1.4: the CE's router name, source constraint and limits."""
    assert shipped.errors == [] and shipped.warnings == []
    assert shipped.router_name == "htcondor-ce"
    assert shipped.source_constraint == "target.JobUniverse =?= 5 || target.JobUniverse =?= 1"
    assert [t.name for t in shipped.pre_transforms] == ["Base", "Cleanup", "OrigRequests"]
    assert [t.name for t in shipped.post_transforms] == [
        "WholeNode", "Cpus", "Gpus", "Memory", "Queue", "BatchRuntime", "CERequirements", "OnExitHold"]
    assert [r.name for r in shipped.routes] == ["CMS_Pilots", "GPU_Pilots", "WholeNode_Pilots", "Pilots"]
    pilots = shipped.routes[-1]
    assert (pilots.max_jobs, pilots.max_idle_jobs) == (10000, 2000)
    assert shipped.routes[0].max_idle_jobs == 500


def test_cpu8_pilot_section_1_5(shipped):
    """htcondor-ce.md §1.5: xcount → RequestCpus, maxMemory → RequestMemory, 60*maxWallTime → BatchRuntime,
    queue → BatchQueue; Base/Cleanup/OrigRequests/CERequirements effects."""
    name, ad = routed(shipped, "cpu8")
    assert name == "Pilots"
    assert ad.eval("RequestCpus") == 8
    assert ad.eval("remote_SMPGranularity") == 8 and ad.eval("remote_NodeNumber") == 8
    assert ad.eval("RequestMemory") == 16000 and ad.eval("JobMemory") == 16000
    assert ad.eval("BatchRuntime") == 172800
    assert ad.eval("BatchQueue") == "cpu"
    assert ad.eval("RoutedJob") is True
    assert ad.eval("CondorCE") == 1 and ad.eval("CERequirements") == "CondorCE"
    assert "PeriodicRemove" not in ad
    assert "AuthTokenIssuer" not in ad and ad.eval("orig_AuthTokenIssuer") == "https://scitokens.org/osg-connect"
    assert ad.eval("orig_environment").startswith("IDTOKENS_FILE=")
    assert wire.unparse_old(ad.lookup("JobIsRunning")) == "(JobStatus =!= 1) && (JobStatus =!= 5)"
    assert (ad.eval("RouteName"), ad.eval("RoutedBy"), ad.eval("RoutedFromJobId")) == ("Pilots", "htcondor-ce",
                                                                                         "1234567.3")
    assert "K8sNamespace" not in ad and ad.eval("K8sPriorityClass") == "ce-k8s-pilot"  # CE_K8S_NAMESPACE applies


def test_single_core_pilot_gets_the_ce_defaults_section_1_5(shipped):
    """htcondor-ce.md §1.5: no xcount, RequestCpus 1 → 1; no maxMemory → 2000; no wall time → 60*ROUTED_JOB_MAX_TIME;
    no queue → the route's default_queue."""
    _, ad = routed(shipped, "1core")
    assert ad.eval("RequestCpus") == 1 and ad.eval("remote_SMPGranularity") == 1
    assert ad.eval("RequestMemory") == 2000
    assert ad.eval("BatchRuntime") == 60 * 4320
    assert ad.eval("BatchQueue") == "pilots"


def test_incoming_request_cpus_above_one_is_kept_section_1_5(shipped):
    _, ad = routed(shipped, "1core", {"RequestCpus": 4})
    assert ad.eval("RequestCpus") == 4
    assert ad.eval("remote_SMPGranularity") == 1  # follows xcount only, as the CE does


def test_incoming_batch_runtime_is_kept_section_1_5(shipped):
    _, ad = routed(shipped, "1core", {"BatchRuntime": 3600})
    assert ad.eval("BatchRuntime") == 3600 and ad.eval("orig_BatchRuntime") == 3600


def test_gpu_pilot_takes_the_gpu_route(shipped):
    name, ad = routed(shipped, "gpu")
    assert name == "GPU_Pilots"
    assert ad.eval("RequestCpus") == 4 and ad.eval("RequestMemory") == 24000 and ad.eval("RequestGPUs") == 1
    assert ad.eval("BatchRuntime") == 86400
    assert ad.eval("BatchQueue") == ""
    assert ad.eval("K8sGpuResource") == "nvidia.com/gpu"
    assert wire.evaluate_ad(ad)["K8sTolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert wire.evaluate_ad(ad)["K8sNodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_whole_node_pilot_section_1_5(shipped):
    """htcondor-ce.md §1.5: WholeNode logic is for vanilla routes only; WantWholeNode is copied to WholeNodes."""
    name, ad = routed(shipped, "wholenode")
    assert name == "WholeNode_Pilots"
    assert ad.eval("WholeNodes") is True
    assert "JOB_GLIDEIN_Cpus" not in ad  # grid route: test_want_whole_node is false
    assert ad.eval("K8sWholeNodeCpus") == 64
    assert ad.eval("x509UserProxyVOName") == "atlas"  # dropped only when submitted (submit_edits)


def test_cms_token_pilot_takes_the_vo_route(shipped):
    name, ad = routed(shipped, "cms-token")
    assert name == "CMS_Pilots"
    assert wire.evaluate_ad(ad)["K8sLabels"] == {"vo": "cms"}
    assert ad.eval("BatchRuntime") == 60 * 2880  # the route's default_maxWallTime
    assert wire.evaluate_ad(ad)["K8sAnnotations"] == {
        "ce-k8s.htcondor.org/token-issuer": "https://cms-auth.web.cern.ch/"}


def test_spooling_pilot_is_not_a_candidate_section_6_2(shipped):
    job = pilot("noroute")
    assert shipped.is_candidate(job) is False
    failing = [v.reason for v in shipped.candidate_verdicts(job) if v.result is not True]
    assert any("JobStatus == 1" in reason for reason in failing)


def test_base_replaces_literal_true_requirements_section_1_5(shipped):
    job = pilot("1core")
    job["Requirements"] = True
    route = shipped.choose_route(job)
    ad = shipped.route_job(job, route).ad
    assert wire.unparse_old(ad.lookup("Requirements")) == "(RequestGpus ?: 0) >= (TARGET.Gpus ?: 0)"


def test_on_exit_hold_when_route_sets_min_walltime_section_1_5(shipped):
    job = pilot("1core")
    job["minWalltime"] = 10
    route = shipped.choose_route(job)
    ad = shipped.route_job(job, route).ad
    ad["RemoteWallClockTime"] = 60
    assert ad.eval("OnExitHold") is True and ad.eval("OnExitHoldSubcode") == 42
    assert "(10) min" in ad.eval("OnExitHoldReason")


def test_json_example_routes_like_the_old_form():
    data = (EXAMPLES / "pilots.json").read_text()
    ads = wire.parse_job_ads(data, "pilots.json")
    assert [wire.sprint_ad(a) for a in ads] == [wire.sprint_ad(pilot("cpu8")), wire.sprint_ad(pilot("gpu"))]


@pytest.mark.parametrize("name, own_route", [("wholenode", "WholeNode_Pilots"), ("gpu", "GPU_Pilots")])
def test_special_pilot_waits_when_its_route_is_full_section_4_4(shipped, name, own_route):
    """hook-protocol.md §4.4: a route that is not accepting is skipped and the next match wins; the catch-all must
    not be that match for GPU or whole-node pilots, or they would get a pod of the wrong shape."""
    job = pilot(name)
    assert shipped.choose_route(job).name == own_route
    assert shipped.choose_route(job, accepting=lambda route: route.name != own_route) is None
    assert shipped.choose_route(pilot("cpu8"), accepting=lambda route: route.name != own_route).name == "Pilots"
