"""Settings take what the CE already defines (docs/install.md, "Settings the CE already has").

The spool is the CE's SPOOL, the CE name the Name its schedd advertises, the collector given to
pilots its COLLECTOR_HOST and the default wall time its ROUTED_JOB_MAX_TIME; an explicit CE_K8S_*
knob still overrides each, and `Settings.origins` names the knob and file:line a value came from.
"""

from __future__ import annotations

import pathlib

import pytest
from podads import pilot_files, routed_pilot

from ce_k8s.condor.config import CondorConfig
from ce_k8s.pods.builder import build_manifests
from ce_k8s.pods.names import label_value
from ce_k8s.settings import BUILT_IN, CE_SPOOL, Settings, SettingsError, ce_schedd_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = (ROOT / "config.d" / "40-ce-k8s-settings.conf").read_text()

# What a stock HTCondor-CE defines (config/condor_config, 01-ce-router-defaults.conf), as a CE host
# would have it before ce-k8s's knob file is read.
CE_BASE = """\
LOCAL_DIR = /srv/ce
SPOOL = $(LOCAL_DIR)/lib/condor-ce/spool
FULL_HOSTNAME = ce01.example.edu
CONDOR_HOST = $(FULL_HOSTNAME)
PORT = 9619
COLLECTOR_HOST = $(CONDOR_HOST):$(PORT)
ROUTED_JOB_MAX_TIME = 1440
"""


def settings_of(*texts: str) -> Settings:
    """Settings of a CE whose files are `texts` in order (CE base, ce-k8s knob file, site overrides)."""
    cfg = CondorConfig.from_text("".join(texts), "ce.conf")
    return Settings.from_config(cfg)


def test_the_shipped_knob_file_restates_no_ce_value():
    """The knob file refers to the CE's knobs instead of copying their packaged values."""
    values = dict(
        (k.strip(), v.strip()) for k, _, v in
        (ln.partition("=") for ln in SHIPPED.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))
    )
    assert values["CE_K8S_SPOOL"] == "$(SPOOL)"
    assert values["CE_K8S_COLLECTOR_HOST"] == "$(COLLECTOR_HOST)"
    assert values["CE_K8S_DEFAULT_WALLTIME"] == "$(ROUTED_JOB_MAX_TIME)"
    assert values["CE_K8S_CE_NAME"] == ""
    assert "/var/lib/condor-ce" not in "".join(values.values())


def test_ce_values_are_taken_from_the_ce():
    """On a CE, the shipped knob file yields the CE's own SPOOL, host name, collector and wall time."""
    s = settings_of(CE_BASE, SHIPPED)
    assert s.spool == "/srv/ce/lib/condor-ce/spool"
    assert s.ce_name == "ce01.example.edu"
    assert s.collector_host == "ce01.example.edu:9619"
    assert s.default_walltime == 1440


def test_explicit_ce_k8s_knobs_still_override_the_ce():
    s = settings_of(CE_BASE, SHIPPED, "CE_K8S_SPOOL = /data/spool\nCE_K8S_CE_NAME = site-ce\n"
                    "CE_K8S_COLLECTOR_HOST = view.example.edu:9619\nCE_K8S_DEFAULT_WALLTIME = 60\n")
    assert (s.spool, s.ce_name, s.collector_host, s.default_walltime) == (
        "/data/spool", "site-ce", "view.example.edu:9619", 60)


def test_no_ce_knob_gives_the_packaged_htcondor_ce_values():
    """Without a CE (the embedded default configuration), the HTCondor-CE packaged values apply."""
    s = settings_of(SHIPPED, "FULL_HOSTNAME = dev.example.org\n")
    assert s.spool == CE_SPOOL == "/var/lib/condor-ce/spool"
    assert s.default_walltime == 4320
    assert s.collector_host == ""
    assert s.origins["spool"] == BUILT_IN and s.origins["default_walltime"] == BUILT_IN


@pytest.mark.parametrize(("schedd_name", "want"), [
    ("", "ce01.example.edu"),                                # no SCHEDD_NAME: the full host name
    ("ce-k8s-a", "ce-k8s-a@ce01.example.edu"),               # completed with @FULL_HOSTNAME
    ("pool-a@ce01.example.edu", "pool-a@ce01.example.edu"),  # an '@' is kept as it is
    ("CE01.example.edu", "CE01.example.edu"),                # this host's own name is not completed
])
def test_ce_name_is_the_schedd_name(schedd_name, want):
    """HTCondor's build_valid_daemon_name (src/condor_utils/get_daemon_name.cpp) decides the Name."""
    s = settings_of(CE_BASE, SHIPPED, f"SCHEDD_NAME = {schedd_name}\n")
    assert s.ce_name == want
    assert ce_schedd_name(CondorConfig.from_text(CE_BASE + f"SCHEDD_NAME = {schedd_name}\n"))[0] == want


def test_the_ce_name_and_collector_reach_the_pod():
    """The name the CE advertises labels every pod it makes; its COLLECTOR_HOST is the pilot's
    CONDORCE_COLLECTOR_HOST (HTCondor-CE's Env transform, condor_ce_router_defaults)."""
    s = settings_of(CE_BASE.replace("$(LOCAL_DIR)/lib", "/var/lib"), SHIPPED, "SCHEDD_NAME = ce-k8s-a\n")
    pod = build_manifests(routed_pilot(Environment=None), s, pilot_files()).pod
    assert s.ce_name == "ce-k8s-a@ce01.example.edu"
    assert pod["metadata"]["labels"]["ce-k8s.htcondor.org/ce"] == label_value(s.ce_name)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["CONDORCE_COLLECTOR_HOST"] == "ce01.example.edu:9619"


def test_disable_pilot_ads_still_wins_over_the_ce_collector():
    s = settings_of(CE_BASE, SHIPPED, "DISABLE_PILOT_ADS = true\n")
    assert s.collector_host == "" and "DISABLE_PILOT_ADS" in s.origins["collector_host"]


def test_origins_name_the_knob_and_line():
    """Each value says which knob gave it and where; a `$(MACRO)` value also names the CE's knob."""
    s = settings_of(CE_BASE, SHIPPED, "CE_K8S_NAMESPACE = cms-pilots\n")
    base_lines = CE_BASE.count("\n")
    spool_line = base_lines + 1 + SHIPPED.splitlines().index("CE_K8S_SPOOL = $(SPOOL)")
    assert s.origins["spool"] == f"SPOOL (ce.conf:2) through CE_K8S_SPOOL (ce.conf:{spool_line}) = $(SPOOL)"
    assert s.origins["ce_name"] == "FULL_HOSTNAME (ce.conf:3)"
    assert s.origins["namespace"] == f"CE_K8S_NAMESPACE (ce.conf:{base_lines + SHIPPED.count(chr(10)) + 1})"
    assert s.origins["image"] == BUILT_IN  # CE_K8S_IMAGE is empty in the shipped file
    s2 = settings_of(CE_BASE, SHIPPED, "SCHEDD_NAME = ce-a\n")
    assert s2.origins["ce_name"].startswith("SCHEDD_NAME (ce.conf:") and "FULL_HOSTNAME (ce.conf:3)" in s2.origins[
        "ce_name"]


def test_a_bad_ce_spool_names_the_ce_knob():
    """A relative SPOOL is refused with the file and line of SPOOL, not of the ce-k8s knob."""
    with pytest.raises(SettingsError) as info:
        settings_of("SPOOL = spool\n", SHIPPED)
    assert str(info.value).startswith("ce.conf:1: SPOOL: ") and "absolute path" in str(info.value)


def test_equal_configurations_compare_equal_whatever_their_origins():
    a = settings_of(CE_BASE, SHIPPED)
    b = settings_of(CE_BASE, SHIPPED, "CE_K8S_SPOOL = /srv/ce/lib/condor-ce/spool\n")
    assert a == b and hash(a) == hash(b) and a.origins["spool"] != b.origins["spool"]


def test_the_agent_log_is_in_the_ce_log_directory():
    """No CE_K8S_AGENT_LOG: the CE's LOG directory, named as HTCondor names its daemons' logs."""
    s = settings_of(CE_BASE, "LOG = $(LOCAL_DIR)/log/condor-ce\n", SHIPPED)
    assert s.agent_log == "/srv/ce/log/condor-ce/CeK8sAgentLog"
    assert s.origins["agent_log"] == "LOG (ce.conf:8) + /CeK8sAgentLog"
    assert settings_of(CE_BASE, SHIPPED).agent_log == ""  # no LOG (no CE): stderr only
    assert settings_of(CE_BASE, "LOG = /l\n", SHIPPED, "CE_K8S_AGENT_LOG = none\n").agent_log == ""
    assert settings_of(CE_BASE, SHIPPED, "CE_K8S_AGENT_LOG = /var/log/k8s.log\n").agent_log == "/var/log/k8s.log"
    with pytest.raises(SettingsError, match=r"CE_K8S_AGENT_LOG: 'agent\.log' must be an absolute path"):
        settings_of(CE_BASE, SHIPPED, "CE_K8S_AGENT_LOG = agent.log\n")


def test_the_ces_retry_policy_is_read_as_the_schedd_applies_it(stock_ce):
    """HTCondor-CE's own files: ENABLE_JOB_RETRIES false and used by SYSTEM_PERIODIC_REMOVE (through
    REMOVE_CLAUSE_2), so a started pilot's next attempt waits for the CE's removal; how long comes
    from the CE's poll intervals (HTCondor's defaults 10 s and 60 s), CE_K8S_RETRY_WAIT overrides.
    The knob alone (ce-k8s's embedded configuration, which has no SYSTEM_PERIODIC_REMOVE) or a site's
    ENABLE_JOB_RETRIES = True removes nothing, and retries go on at once."""
    stock = Settings.from_config(CondorConfig.load(stock_ce.condor_config))
    assert stock.ce_removes_restarts and stock.retry_wait == 2 * 10 + 60 + 10
    site = stock_ce.write_site("99-local.conf", "JOB_ROUTER_POLLING_PERIOD = 2\nPERIODIC_EXPR_INTERVAL = 5\n")
    assert site.exists() and Settings.from_config(CondorConfig.load(stock_ce.condor_config)).retry_wait == 19
    stock_ce.write_site("99-local.conf", "CE_K8S_RETRY_WAIT = 300\n")
    assert Settings.from_config(CondorConfig.load(stock_ce.condor_config)).retry_wait == 300
    stock_ce.write_site("99-local.conf", "ENABLE_JOB_RETRIES = True\n")
    assert not Settings.from_config(CondorConfig.load(stock_ce.condor_config)).ce_removes_restarts
    embedded = Settings.from_config(CondorConfig.load(ROOT / "config.d"))
    assert not embedded.ce_removes_restarts
    assert not settings_of(CE_BASE, "ENABLE_JOB_RETRIES = False\nSYSTEM_PERIODIC_REMOVE = JobStatus == 5\n") \
        .ce_removes_restarts


def test_the_policy_walk_reads_each_macro_once_and_ends_on_a_cycle():
    """SYSTEM_PERIODIC_REMOVE's macros are followed at any depth, a cycle (A uses B uses A) ends the
    walk instead of recursing, and a knob only named in text (not used as $(...)) does not count."""
    cyclic = ("ENABLE_JOB_RETRIES = False\nA = $(B) || $(ENABLE_JOB_RETRIES_X)\nB = $(A)\n"
              "SYSTEM_PERIODIC_REMOVE = $(A) || ENABLE_JOB_RETRIES\n")
    assert not settings_of(CE_BASE, cyclic).ce_removes_restarts
    deep = "ENABLE_JOB_RETRIES = False\nC1 = $(C2)\nC2 = $(C3)\nC3 = $(C4)\nC4 = $(C5)\nC5 = $(C6)\nC6 = $(C7)\n" \
           "C7 = JobStatus == 1 && $(ENABLE_JOB_RETRIES) =!= True\nSYSTEM_PERIODIC_REMOVE = $(C1) || $(C1)\n"
    assert settings_of(CE_BASE, deep).ce_removes_restarts
