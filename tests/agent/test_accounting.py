"""Accounting of every pilot attempt (issue 15 items 1-3, docs/accounting.md): usage from the kubelet
Summary API into the routed job's update and into one per-job history file per attempt that
HTCondor-CE's APEL script reads unchanged. Runs the real agent on the emulator with its kubelet
simulator (time at 1/100)."""

from __future__ import annotations

import logging
from pathlib import Path

import classad2
import pytest
from kubernetes import client
from kubernetes import config as kconfig

from ce_k8s.agent.accounting import (
    AttemptRecord,
    history_ad,
    outcome_of,
    parse_specs,
    routed_attrs,
)
from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.condor.wire import parse_old_ads
from ce_k8s.ops.accounting import apel_fields, apel_scaling_expr, format_field
from ce_k8s.pods.names import pod_name
from ce_k8s.sim.kube.apiserver import ApiServer

from .conftest import GJID, new_agent, replace_settings, routed_ad, update, wait

NAME = pod_name(GJID, 0)
NEXT = pod_name(GJID, 1)


@pytest.fixture
def cluster():
    with ApiServer.running(nodes="cpu:2x16c64g", time_scale=0.01, seed=5, bookmark_interval=0.2) as srv:
        yield srv


@pytest.fixture
def hist(tmp_root):
    d = tmp_root / "history"
    d.mkdir()
    return d



def history_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file())


def one_ad(path: Path) -> classad2.ClassAd:
    (ad,) = parse_old_ads(path.read_text())
    return ad


def run_to_completion(agent, ad, timeout=15.0):
    """Update until the routed job is completed (the router's polling, compressed)."""
    out = None

    def done():
        nonlocal out
        out = update(agent, ad)
        return "JobStatus" in out and out["JobStatus"] == 4
    wait(done, timeout=timeout, interval=0.05)
    return out


def meter_cpu_s(srv, name):
    meter = srv.kubelet.usage.meters(("default", name)).get("pilot")
    return None if meter is None else meter.cpu_ns(meter.ended or 0) / 1e9


def test_completion_carries_the_attempts_usage_and_one_history_file(cluster, settings, hist):
    settings = replace_settings(settings, per_job_history_dir=str(hist), usage_interval=0.1)
    agent = new_agent(cluster, settings)
    try:
        ad = routed_ad(Path(settings.spool), x509userproxysubject="/DC=org/CN=pilot", RequestCpus=2,
                       x509UserProxyFirstFQAN="/cms/Role=pilot")
        update(agent, ad)
        wait(lambda: cluster.kubelet.usage.meters(("default", NAME)), timeout=10)
        out = run_to_completion(agent, ad)
        meter = cluster.kubelet.usage.meters(("default", NAME))["pilot"]
        reported = meter.cpu_ns(meter.ended) / 1e9
        # Item 2: the standard attributes, HTCondor's units.
        assert 0 < out["RemoteUserCpu"] <= reported + 1e-3 and out["RemoteSysCpu"] == 0.0
        assert out["K8sCpuUsageKnown"] is True
        assert out["CpusProvisioned"] == 2 and out["MemoryProvisioned"] == 2000
        assert out["ResidentSetSize_RAW"] == 1000 * 1024 == out["ResidentSetSize"]     # KiB: half the 2000 MiB
        assert out["ImageSize_RAW"] >= out["ResidentSetSize_RAW"]
        node = cluster.store.get("pods", "default", NAME)["spec"]["nodeName"]
        assert out["LastRemoteHost"] == node
        assert out["RemoteWallClockTime"] == out["LastRemoteWallClockTime"] == \
            ad["CompletionDate"] - ad["JobCurrentStartDate"]       # the routed ad after the replies
        # Item 3: one history file, every attribute condor_batch_blah.py reads.
        wait(lambda: history_files(hist))
        (path,) = history_files(hist)
        h = one_ad(path)
        assert path.name == f"history.{h['GlobalJobId']}" and NAME in h["GlobalJobId"]
        fields = apel_fields(h)
        assert fields is not None
        assert fields["Owner"] == "cmspilot" and fields["RequestCpus"] == "2"
        assert int(fields["RemoteWallClockTime"]) == int(out["RemoteWallClockTime"])
        assert fields["blah:userDN"] == "/DC=org/CN=pilot" and fields["blah:jobID"] == "4711.0_ce"
        assert h["x509UserProxyFirstFQAN"] == "/cms/Role=pilot"
        assert h["RemoteUserCpu"] == out["RemoteUserCpu"] and h["K8sAttemptOutcome"] == "completed"
    finally:
        agent.stop()
    # An agent restart (the pod still there, finished) never writes a second file.
    agent = new_agent(cluster, settings)
    try:
        wait(lambda: agent.usage.record(NAME) is not None, timeout=10)
        assert len(history_files(hist)) == 1
        path.unlink()                                  # APEL consumed it; a restart must not bring it back
    finally:
        agent.stop()
    agent = new_agent(cluster, settings)
    try:
        wait(lambda: agent.usage.record(NAME) is not None, timeout=10)
        assert history_files(hist) == []
    finally:
        agent.stop()


@pytest.mark.parametrize("earlier_wall", [None, 600.0], ids=["first-run", "after-a-600s-run"])
def test_an_evicted_attempt_is_accounted_and_the_wall_time_accumulates(cluster, settings, hist, earlier_wall):
    """HTCondor's RemoteWallClockTime is cumulative over a job's runs (a real in the ad): the
    evicted attempt's wall time is added to what the routed ad already has."""
    settings = replace_settings(settings, per_job_history_dir=str(hist), usage_interval=0.05)
    agent = new_agent(cluster, settings)
    core = client.CoreV1Api(kconfig.new_client_from_config(config_file=cluster.kubeconfig_path))
    try:
        ad = routed_ad(Path(settings.spool))
        if earlier_wall is not None:
            ad["RemoteWallClockTime"] = earlier_wall
        ad["K8sPodPatch"] = ('[{"op": "add", "path": "/metadata/annotations/sim.ce-k8s.io~1scenario", '
                             '"value": "run=forever"}]')
        update(agent, ad)
        wait(lambda: agent.cache.get(NAME) is not None and agent.cache.get(NAME).phase == "Running", timeout=10)
        assert update(agent, ad)["JobStatus"] == 2
        wait(lambda: agent.usage.usage.get(NAME) and agent.usage.usage[NAME].cpu_ns, timeout=10)
        core.create_namespaced_pod_eviction(NAME, "default", {"metadata": {"name": NAME, "namespace": "default"}})

        def moved():
            out = update(agent, ad)
            return out if "K8sAttempt" in out and out["K8sAttempt"] == 1 else None
        out = wait(moved, timeout=10)
        assert out["JobStatus"] == 1 and out["LastRemoteWallClockTime"] >= 0
        assert out["RemoteWallClockTime"] == pytest.approx((earlier_wall or 0.0) + out["LastRemoteWallClockTime"])
        wait(lambda: history_files(hist), timeout=10)
        (path,) = history_files(hist)
        h = one_ad(path)
        assert h["K8sAttemptOutcome"] == "evicted" and h["K8sPodName"] == NAME and h["K8sAttempt"] == 0
        assert apel_fields(h) is not None
        assert h["K8sCpuUsageKnown"] is True and h["RemoteUserCpu"] > 0
        cpu_seen = max(agent.usage.usage[NAME].cpu_ns or 0, 0) / 1e9
        assert h["RemoteUserCpu"] == pytest.approx(cpu_seen, abs=1e-3)
        assert h["CompletionDate"] - h["JobStartDate"] == h["RemoteWallClockTime"]
    finally:
        agent.stop()


def test_without_the_nodes_proxy_grant_cpu_is_unknown_not_zero(cluster, settings, hist, caplog):
    cluster.kubelet.usage.denied = True
    settings = replace_settings(settings, per_job_history_dir=str(hist), usage_interval=0.05)
    caplog.set_level(logging.INFO, logger="ce_k8s.agent.accounting")
    agent = new_agent(cluster, settings)
    try:
        ad = routed_ad(Path(settings.spool))
        update(agent, ad)
        out = run_to_completion(agent, ad)
        assert "RemoteUserCpu" not in out and out["K8sCpuUsageKnown"] is False
        assert out["CpusProvisioned"] == 1 and "RemoteWallClockTime" in out
        wait(lambda: history_files(hist))
        h = one_ad(history_files(hist)[0])
        assert h["K8sCpuUsageKnown"] is False and h["RemoteUserCpu"] == 0.0   # APEL needs the column
        assert apel_fields(h) is not None
        said = [r for r in caplog.records if "usage-forbidden" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING          # said once
    finally:
        agent.stop()


def test_node_benchmarks_become_the_apel_scaling_attributes(cluster, settings, hist):
    core = client.CoreV1Api(kconfig.new_client_from_config(config_file=cluster.kubeconfig_path))
    for node in ("cpu-1", "cpu-2"):
        core.patch_node(node, {"metadata": {"labels": {"ce-k8s.htcondor.org/apel-scaling": "1.25"},
                                            "annotations": {"ce-k8s.htcondor.org/apel-specs":
                                                            "HEPscore23=20.0, HEPSPEC=16"}}})
    settings = replace_settings(settings, per_job_history_dir=str(hist), usage_interval=0.1)
    agent = new_agent(cluster, settings)
    try:
        ad = routed_ad(Path(settings.spool))
        update(agent, ad)
        run_to_completion(agent, ad)
        wait(lambda: history_files(hist))
        h = one_ad(history_files(hist)[0])
        assert h["MachineAttrApelScaling0"] == 1.25
        # The CE's APEL default chain, and one with specs (client.cfg manual_spec): spec first.
        assert apel_fields(h)[apel_scaling_expr()] == "1.25"
        assert format_field(h, "%f", apel_scaling_expr({"HEPscore23": 10.0})) == "2.000000"
        assert format_field(h, "%f", apel_scaling_expr({"SI2K": 10.0})) == "1.250000"   # no such spec: falls through
    finally:
        agent.stop()


def test_a_history_directory_that_becomes_usable_later_gets_the_files(cluster, settings, tmp_root):
    """The directory cannot be made at start (a file is in the way): the attempts wait in memory and
    the agent's GC writes them once it can."""
    blocked = tmp_root / "history"
    blocked.write_text("not a directory")
    settings = replace_settings(settings, per_job_history_dir=str(blocked), usage_interval=0.1)
    agent = new_agent(cluster, settings)
    try:
        assert agent.accounting.history is None
        ad = routed_ad(Path(settings.spool))
        update(agent, ad)
        run_to_completion(agent, ad)
        assert NAME in agent.accounting._history_retry
        blocked.unlink()
        agent.garbage.collect()
        assert agent.accounting.history is not None and not agent.accounting._history_retry
        (path,) = history_files(blocked)
        assert one_ad(path)["K8sPodName"] == NAME
    finally:
        agent.stop()


# -- pure pieces ---------------------------------------------------------------------------------

def pod_info(**kw) -> PodInfo:
    base = {"metadata": {"name": "ce-1-0-a0-x", "namespace": "ns", "uid": "u1",
                         "creationTimestamp": "2025-10-09T08:50:00Z",
                         "labels": {"ce-k8s.htcondor.org/attempt": "0", "ce-k8s.htcondor.org/route": "R"},
                         "annotations": {"ce-k8s.htcondor.org/owner": "osg01",
                                         "ce-k8s.htcondor.org/routed-from": "12.3"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "pilot", "resources": {"requests": {
                "cpu": "1500m", "memory": "3Gi"}}}]},
            "status": {"phase": "Succeeded", "containerStatuses": [{"name": "pilot", "state": {"terminated": {
                "exitCode": 0, "startedAt": "2025-10-09T08:55:00Z", "finishedAt": "2025-10-09T09:05:00Z"}}}]}}
    base.update(kw)
    return PodInfo.from_dict(base)


def record(cpu: float | None) -> AttemptRecord:
    pod = pod_info()
    return AttemptRecord(pod=pod, start=pod.started_at, end=pod.finished_at, wall=600.0, cpu_seconds=cpu,
                         rss_kib=2048, image_kib=4096, cores=2, memory_mb=3072, outcome=outcome_of(pod),
                         scaling=None, specs={})


def test_requests_round_up_to_whole_cores_and_mebibytes():
    pod = pod_info()
    assert pod.cpu_request == 1.5 and pod.memory_request == 3 * 2**30


def test_routed_attrs_units_and_unknown_cpu():
    known = routed_attrs(record(900.5))
    assert known["RemoteUserCpu"] == 900.5 and known["RemoteSysCpu"] == 0.0
    assert known["ResidentSetSize_RAW"] == 2048 and known["ImageSize_RAW"] == 4096
    assert known["CpusProvisioned"] == 2 and known["MemoryProvisioned"] == 3072
    unknown = routed_attrs(record(None))
    assert "RemoteUserCpu" not in unknown and "RemoteSysCpu" not in unknown
    assert unknown["K8sCpuUsageKnown"] is False


def test_history_ad_ids_are_unique_per_attempt_and_complete_for_apel():
    ad = history_ad(record(100.0), "ce.example.org", {"orig_authtokensubject": '"sub-1"'}, "99.0")
    assert ad["GlobalJobId"] == f"ce.example.org#ce-1-0-a0-x#{pod_info().created}"
    assert ad["RoutedFromJobId"] == "12.3" and ad["ClusterId"] == 12 and ad["ProcId"] == 3
    assert ad["orig_AuthTokenSubject"] == "sub-1" and ad["K8sRoutedJobId"] == "99.0"
    fields = apel_fields(ad)
    assert fields is not None and fields["blah:userDN"] == "sub-1"
    assert fields["RemoteUserCpu"] == "100" and fields["EnteredCurrentStatus"] == str(pod_info().finished_at)


def test_apel_fields_refuse_a_record_with_a_missing_column():
    ad = history_ad(record(100.0), "ce")
    del ad["ImageSize_RAW"]
    assert apel_fields(ad) is None
    assert apel_fields({"Owner": "x"}) is None                 # no GlobalJobId: quarantined


def test_parse_specs_skips_what_is_not_a_number():
    assert parse_specs("HEPscore23=15.2, HEPSPEC=x; SI2K=2793") == {"HEPscore23": 15.2, "SI2K": 2793.0}


def running_pod(name="ce-1-0-a0-x", uid="u1", node="n1") -> PodInfo:
    return PodInfo.from_dict({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "pilot"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "pilot", "state": {"running": {
            "startedAt": "2025-10-09T08:55:00Z"}}}]}})


def summary_doc(name, uid, cpu_ns, rss, ws=None, used=None):
    return {"pods": [{"podRef": {"name": name, "namespace": "ns", "uid": uid}, "containers": [
        {"name": "pilot", "cpu": {"usageCoreNanoSeconds": cpu_ns},
         "memory": {"rssBytes": rss, "workingSetBytes": ws or rss, "usageBytes": used or rss}}]}]}


def test_readings_keep_the_cumulative_cpu_and_the_peak_memory():
    from ce_k8s.agent.accounting import UsageCollector

    collector = UsageCollector(client.ApiClient(), None, lambda: [])
    pod = running_pod()
    collector.pod_changed(pod)
    collector.fold("n1", summary_doc(pod.name, "u1", 5_000_000_000, 300 * 2**20), now=1.0)
    collector.fold("n1", summary_doc(pod.name, "u1", 9_000_000_000, 100 * 2**20), now=2.0)
    collector.fold("n1", summary_doc(pod.name, "u1", 2_000_000_000, 50 * 2**20), now=3.0)   # a reset: ignored
    collector.fold("n1", summary_doc(pod.name, "other-uid", 99_000_000_000, 999 * 2**20), now=4.0)  # another pod
    collector.fold("n2", summary_doc(pod.name, "u1", 99_000_000_000, 999 * 2**20), now=5.0)         # another node
    u = collector.usage[pod.name]
    assert u.cpu_ns == 9_000_000_000 and u.rss_peak == 300 * 2**20 and u.sampled == 3.0


def test_a_completion_never_waits_for_accounting_for_long():
    from ce_k8s.agent.accounting import SETTLE_WAIT, UsageCollector

    collector = UsageCollector(client.ApiClient(), None, lambda: [])   # its thread is not running
    pod = running_pod()
    assert not collector.settled(pod, now=1000.0)
    assert not collector.settled(pod, now=1000.0 + SETTLE_WAIT - 1)
    assert collector.settled(pod, now=1000.0 + SETTLE_WAIT)
