"""`ce-k8s info` end to end over hand-made clusters (issue 6).

The output is read exactly as the schedd reads a cron job's stdout (one `Insert()` per line, old
ClassAd syntax; htcondor-ce.md §1.8 and HTCondor's ClassAdCronJob::ProcessOutput), then evaluated
with classad2. Catalog semantics: htcondor-ce.md §3.2 (attribute names and units) and §3.4
(OSG_autoconf reads MaxPilots as the entry glidein limit, GPUs -> Request_GPUs, WholeNode drops
CPUs/Memory).
"""

from __future__ import annotations

import json
import random

import classad2
import pytest

from ce_k8s.info import provider as info
from ce_k8s.info.snapshot import ClusterSnapshot, SourceUnavailable

from .conftest import NOW, TEST_CONFIG, catalog, parse, run_info, snapshot_doc, write_doc


def info_on(capsys, tmp_path, doc) -> classad2.ClassAd:
    out, code = run_info(capsys, "--config", TEST_CONFIG, "--cluster-snapshot", write_doc(tmp_path, doc))
    assert code == 0
    return parse(out)


def test_mixed_cluster_output(capsys):
    """The sample cluster: every value derived from nodes, pods and quotas (see make_snapshots.py)."""
    out, code = run_info(capsys, "--config", TEST_CONFIG, "--cluster-snapshot", "tests/info/snapshots/mixed.json")
    assert code == 0
    ad = parse(out)
    assert ad.eval("Status") == "OK" and ad.eval("IsOK") is True and ad.eval("IsCritical") is False
    assert ad["OSG_BatchSystems"] == "Kubernetes"
    assert ad["grid_resource"] == "condor ce01.example.edu ce01.example.edu:9619"
    assert (ad["K8sCpusTotal"], ad["K8sCpusFree"]) == (226, 156)
    assert (ad["K8sGpusTotal"], ad["K8sGpusFree"]) == (8, 4)
    assert (ad["K8sPilotsRunning"], ad["K8sPilotsPending"]) == (4, 1)
    assert ad["K8sInfoUpdated"] == NOW
    cat = catalog(ad)
    assert sorted(cat) == ["cpu8", "gpu", "wholenode"]  # the slurm route makes no pods: no entry
    cpu8 = cat["cpu8"]
    # 3 placed on cpu-1 (full), + 1 on cpu-2 (11.75 cores free) + 3 on cpu-3 (25.75 free); quota room 7
    assert cpu8 == {
        "AllowedVOs": ["atlas", "cms", "osg"], "CPUs": 8, "EstimatedCPUs": 8, "IsPilotEntry": True,
        "MaxPilots": 7, "MaxWallTime": 2880, "Memory": 16000, "Name": "cpu8", "OS": "rhel9", "Queue": "cpu",
        "RequireSingularity": True, "SendTests": True, "WholeNode": False,
    }
    # gpu: 1 placed; 4 more GPUs free on the pool, but the namespace quota has room for 1 GPU
    assert (cat["gpu"]["GPUs"], cat["gpu"]["CPUs"], cat["gpu"]["Memory"], cat["gpu"]["MaxPilots"]) == (1, 4, 32000, 2)
    assert cat["gpu"]["AllowedVOs"] == ["icecube", "osg"]
    # whole-node: no CPUs/Memory (as osg-configure), EstimatedCPUs from the node shape; no empty node
    whole = cat["wholenode"]
    assert "CPUs" not in whole and "Memory" not in whole and "GPUs" not in whole
    assert (whole["WholeNode"], whole["EstimatedCPUs"], whole["MaxPilots"]) == (True, 31, 0)
    assert "GPUs" not in cpu8  # OSG_autoconf turns a present GPUs into Request_GPUs (htcondor-ce.md §3.4)


def test_output_is_sorted_one_line_per_attribute(capsys):
    """Sorted attributes, sorted entries, one line each (the schedd Insert()s line by line)."""
    out, _ = run_info(capsys, "--config", TEST_CONFIG, "--cluster-snapshot", "tests/info/snapshots/mixed.json")
    names = [line.split(" = ", 1)[0] for line in out.splitlines()]
    assert names == sorted(names, key=str.lower)
    assert all(" = " in line for line in out.splitlines())
    cat_line = next(line for line in out.splitlines() if line.startswith("OSG_ResourceCatalog = "))
    assert cat_line.index('Name = "cpu8"') < cat_line.index('Name = "gpu"') < cat_line.index('Name = "wholenode"')
    assert not out.rstrip("\n").splitlines()[-1].startswith("-")


def test_unchanged_cluster_gives_unchanged_output(capsys, tmp_path):
    """Deterministic: same cluster (in any item order) and same time give byte-identical output."""
    doc = snapshot_doc("mixed")
    first, _ = run_info(capsys, "--config", TEST_CONFIG, "--cluster-snapshot", write_doc(tmp_path, doc, "a.json"))
    random.Random(7).shuffle(doc["items"])
    second, _ = run_info(capsys, "--config", TEST_CONFIG, "--cluster-snapshot", write_doc(tmp_path, doc, "b.json"))
    assert first == second


def test_node_handover_to_slurm(capsys):
    """cpu-1/cpu-2 drained and their kubelets stopped (BeBiDa prolog): only cpu-3 is left."""
    out, _ = run_info(capsys, "--config", TEST_CONFIG, "--cluster-snapshot", "tests/info/snapshots/handover.json")
    ad = parse(out)
    assert ad["K8sNodesSchedulable"] == 4  # gpu-1, gpu-2, control-1, cpu-3
    # the evicted pilots are gone; cpu-3 has 25.75 cores free -> 3 pilots of 8 cores
    assert catalog(ad)["cpu8"]["MaxPilots"] == 3
    assert ad["K8sPilotsRunning"] == 1  # only the GPU pilot is left


def test_other_tenants_take_capacity(capsys, tmp_path):
    """A tenant's new pods on cpu-3 leave room for fewer pilots; their finished pods free it again."""
    doc = snapshot_doc("mixed")
    hog = {"kind": "Pod", "metadata": {"name": "hog", "namespace": "batch"},
           "spec": {"nodeName": "cpu-3", "containers": [{"resources": {"requests": {"cpu": "20"}}}]},
           "status": {"phase": "Running"}}
    doc["items"].append(hog)
    assert catalog(info_on(capsys, tmp_path, doc))["cpu8"]["MaxPilots"] == 3 + 1 + 0
    hog["status"]["phase"] = "Succeeded"
    assert catalog(info_on(capsys, tmp_path, doc))["cpu8"]["MaxPilots"] == 7


def test_untolerated_noexecute_taint_excludes_gpu_nodes(capsys, tmp_path):
    """The GPU route tolerates nvidia.com/gpu:NoSchedule only; a NoExecute taint shuts the pool."""
    doc = snapshot_doc("mixed")
    for item in doc["items"]:
        if item["kind"] == "Node" and item["metadata"]["name"].startswith("gpu-"):
            item["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoExecute"}]
    assert catalog(info_on(capsys, tmp_path, doc))["gpu"]["MaxPilots"] == 1  # only the placed pilot


def test_quota_full_offers_no_new_pilots(capsys, tmp_path):
    """A namespace quota at its limit: MaxPilots is what is already placed."""
    doc = snapshot_doc("mixed")
    quota = next(i for i in doc["items"] if i["kind"] == "ResourceQuota" and i["metadata"]["name"] == "pilots")
    quota["spec"]["hard"]["pods"] = "5"
    quota["status"]["used"]["pods"] = "5"
    cat = catalog(info_on(capsys, tmp_path, doc))
    assert (cat["cpu8"]["MaxPilots"], cat["gpu"]["MaxPilots"]) == (3, 1)


def test_empty_cluster(capsys):
    """No nodes: zeros everywhere, nothing to offer, but the provider itself is healthy."""
    out, code = run_info(capsys, "--config", TEST_CONFIG, "--cluster-snapshot", "tests/info/snapshots/empty.json")
    ad = parse(out)
    assert code == 0 and ad.eval("Status") == "OK"
    assert (ad["K8sCpusTotal"], ad["K8sGpusTotal"], ad["K8sNodesTotal"]) == (0, 0, 0)
    assert all(e["MaxPilots"] == 0 for e in catalog(ad).values())


def _unreachable_kubeconfig(tmp_path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    return str(path)


def _assert_nothing_fresh(ad):
    cat = catalog(ad)
    assert cat and all(e["MaxPilots"] == 0 for e in cat.values())  # shapes kept, nothing offered
    for attr in ("K8sCpusFree", "K8sGpusFree", "K8sPilotsRunning", "K8sInfoUpdated"):
        assert attr not in ad


def test_api_down_is_critical_and_offers_nothing(capsys, tmp_path):
    """--kubeconfig pointing at a dead API server: CRITICAL, MaxPilots 0, no capacity figures."""
    out, code = run_info(capsys, "--config", TEST_CONFIG, "--kubeconfig", _unreachable_kubeconfig(tmp_path))
    ad = parse(out)
    assert code == 0  # the ad itself carries the verdict; the schedd publishes it either way
    assert ad.eval("Status") == "CRITICAL" and ad.eval("IsOK") is False
    assert "Kubernetes API unreachable" in ad["K8sInfoError"]
    _assert_nothing_fresh(ad)


def test_agent_and_api_down(capsys, tmp_path, monkeypatch):
    """Default mode: agent socket absent, then the API (CE_K8S_KUBECONFIG) unreachable -> CRITICAL."""
    monkeypatch.setenv("_CONDOR_CE_K8S_KUBECONFIG", _unreachable_kubeconfig(tmp_path))
    out, _ = run_info(capsys, "--config", TEST_CONFIG)
    ad = parse(out)
    assert ad.eval("Status") == "CRITICAL"
    assert "agent unreachable" in ad["K8sInfoError"] and "API unreachable" in ad["K8sInfoError"]
    _assert_nothing_fresh(ad)


def _fake_api(monkeypatch, snapshot: ClusterSnapshot | Exception):
    def fake(kubeconfig=None, timeout=20.0, page_size=500):
        if isinstance(snapshot, Exception):
            raise snapshot
        return snapshot

    monkeypatch.setattr(info, "snapshot_from_api", fake)


def test_agent_down_api_up_is_warning(capsys, monkeypatch):
    """Agent down but the API answers: capacity is fresh, Status WARNING (no pilot can start)."""
    from ce_k8s.info.snapshot import load_snapshot_file

    snap = load_snapshot_file("tests/info/snapshots/mixed.json")
    snap.source, snap.taken_at = "api https://k8s.example:6443", NOW - 3
    _fake_api(monkeypatch, snap)
    ad = parse(run_info(capsys, "--config", TEST_CONFIG)[0])
    assert ad.eval("Status") == "WARNING" and ad.eval("IsWarning") is True
    assert ad["K8sInfoSource"] == "api" and ad["K8sInfoUpdated"] == NOW - 3
    assert catalog(ad)["cpu8"]["MaxPilots"] == 7


def test_stale_agent_view_is_not_advertised(capsys, monkeypatch):
    """The agent answers with a view older than CE_K8S_INFO_MAX_AGE and the API is down: CRITICAL."""
    from ce_k8s.info.snapshot import load_snapshot_file

    snap = load_snapshot_file("tests/info/snapshots/mixed.json")
    snap.source, snap.taken_at = "agent /run/ce-k8s/agent.sock", NOW - 3600
    monkeypatch.setattr(info, "agent_offers_snapshots", lambda: True)
    monkeypatch.setattr(info, "snapshot_from_agent", lambda sock, timeout: snap)
    _fake_api(monkeypatch, SourceUnavailable("api x", "connection refused"))
    ad = parse(run_info(capsys, "--config", TEST_CONFIG)[0])
    assert ad.eval("Status") == "CRITICAL"
    assert "3600s old" in ad["K8sInfoError"]
    _assert_nothing_fresh(ad)


def test_fresh_agent_view_is_used(capsys, monkeypatch):
    """A fresh agent view is advertised as is (source agent), without touching the API."""
    from ce_k8s.info.snapshot import load_snapshot_file

    snap = load_snapshot_file("tests/info/snapshots/mixed.json")
    snap.source, snap.taken_at = "agent /run/ce-k8s/agent.sock", NOW - 10
    monkeypatch.setattr(info, "agent_offers_snapshots", lambda: True)
    monkeypatch.setattr(info, "snapshot_from_agent", lambda sock, timeout: snap)
    _fake_api(monkeypatch, AssertionError("the API must not be asked"))
    ad = parse(run_info(capsys, "--config", TEST_CONFIG)[0])
    assert ad.eval("Status") == "OK" and ad["K8sInfoSource"] == "agent"


def test_unreadable_config_still_prints_a_critical_ad(capsys, tmp_path):
    """Never print nothing: the schedd would keep advertising the previous ad as if fresh."""
    out, code = run_info(capsys, "--config", str(tmp_path / "nope"), "--cluster-snapshot",
                         "tests/info/snapshots/mixed.json")
    ad = parse(out)
    assert code == 1
    assert ad.eval("Status") == "CRITICAL" and ad["OSG_ResourceCatalog"] == []
    assert "configuration" in ad["K8sInfoError"]


def test_unreadable_snapshot_is_critical(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    ad = parse(run_info(capsys, "--config", TEST_CONFIG, "--cluster-snapshot", str(bad))[0])
    assert ad.eval("Status") == "CRITICAL" and "bad.json:1:2" in ad["K8sInfoError"]


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ("RecentDaemonCoreDutyCycle = 0.97", "CRITICAL"),  # the CE's own health rule still applies
        ("RecentDaemonCoreDutyCycle = 0.92", "WARNING"),
        ("FileTransferFileWriteLoad_1m = 1.5", "WARNING"),
        ("K8sInfoStale = true", "CRITICAL"),  # config.d/60-ce-k8s-info.conf: runs stopped updating
        ("RecentDaemonCoreDutyCycle = 0.10", "OK"),
    ],
)
def test_health_keeps_the_ce_rules(capsys, extra, status):
    """IsOK/Status are expressions: ours folded into 05-ce-health-defaults.conf's formula (htcondor-ce.md §3.1)."""
    out, _ = run_info(capsys, "--config", TEST_CONFIG, "--cluster-snapshot", "tests/info/snapshots/mixed.json")
    ad = parse(out + extra + "\n")
    assert ad.eval("Status") == status


def test_stale_guard_expression_from_config():
    """K8sInfoStale (SCHEDD_ATTRS) is true once K8sInfoUpdated is older than CE_K8S_INFO_STALE_AFTER."""
    from ce_k8s.condor.config import CondorConfig

    cfg = CondorConfig.load(TEST_CONFIG)
    assert "K8sInfoStale" in cfg.get("SCHEDD_ATTRS").split()
    expr = cfg.get("K8sInfoStale")
    fresh = classad2.parseOne(f"K8sInfoUpdated = time() - 60\nK8sInfoStale = {expr}\n", classad2.ParserType.Old)
    stale = classad2.parseOne(f"K8sInfoUpdated = time() - 3600\nK8sInfoStale = {expr}\n", classad2.ParserType.Old)
    assert fresh.eval("K8sInfoStale") is False and stale.eval("K8sInfoStale") is True


def test_cron_configuration():
    """config.d wires the cron job: appended to the list, periodic, no prefix, killed when overdue."""
    from ce_k8s.condor.config import CondorConfig

    cfg = CondorConfig.load(TEST_CONFIG)
    assert "CEK8SINFO" in cfg.get("SCHEDD_CRON_JOBLIST").split()
    assert cfg.get("SCHEDD_CRON_CEK8SINFO_MODE") == "Periodic"
    assert cfg.get("SCHEDD_CRON_CEK8SINFO_ARGS").split()[0] == "info"
    assert (cfg.get("SCHEDD_CRON_CEK8SINFO_PREFIX") or "") == ""
    assert cfg.get_bool("SCHEDD_CRON_CEK8SINFO_KILL", False) is True
    assert int(cfg.get("SCHEDD_CRON_CEK8SINFO_PERIOD")) == 300  # HTCondor's SCHEDD_INTERVAL default


def test_cron_period_follows_the_ce_schedd_interval(tmp_path):
    """The job runs as often as the CE's schedd publishes its ad (its SCHEDD_INTERVAL), not on a copy."""
    from ce_k8s.condor.config import CondorConfig

    cfg = CondorConfig.load(_config_with(tmp_path, "SCHEDD_INTERVAL = 120\n"))
    assert int(cfg.get("SCHEDD_CRON_CEK8SINFO_PERIOD")) == 120


def _config_with(tmp_path, text: str) -> str:
    """The test configuration plus one more file (a site's SCHEDD_NAME, say), read after it."""
    extra = tmp_path / "d"
    extra.mkdir(exist_ok=True)
    (extra / "90-site.conf").write_text(text)
    conf = tmp_path / "condor_config"
    conf.write_text(f"LOCAL_CONFIG_DIR = config.d, tests/info/config/d, {extra}\n")
    return str(conf)


def _relabel(doc: dict, ce_label: str) -> dict:
    for item in doc["items"]:
        labels = item.get("metadata", {}).get("labels") or {}
        if "ce-k8s.htcondor.org/ce" in labels:
            labels["ce-k8s.htcondor.org/ce"] = ce_label
    return doc


def test_pilots_are_ours_by_the_name_the_ce_schedd_advertises(capsys, tmp_path):
    """With no CE_K8S_CE_NAME the CE name is the schedd's Name (SCHEDD_NAME completed with
    @FULL_HOSTNAME): pods labelled with the host name alone belong to another CE on the cluster."""
    from ce_k8s.pods.names import label_value

    config = _config_with(tmp_path, "SCHEDD_NAME = ce-b\n")
    out, code = run_info(capsys, "--config", config, "--cluster-snapshot", "tests/info/snapshots/mixed.json")
    ad = parse(out)
    assert code == 0 and (ad["K8sPilotsRunning"], ad["K8sPilotsPending"]) == (0, 0)
    assert ad["grid_resource"] == "condor ce-b ce01.example.edu:9619"  # the CE's own expression
    doc = _relabel(snapshot_doc("mixed"), label_value("ce-b@ce01.example.edu"))
    out, code = run_info(capsys, "--config", config, "--cluster-snapshot", write_doc(tmp_path, doc))
    ad = parse(out)
    assert code == 0 and (ad["K8sPilotsRunning"], ad["K8sPilotsPending"]) == (4, 1)
