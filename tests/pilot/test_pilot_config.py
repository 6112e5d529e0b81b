"""The pilot's settings, credential and condor_config (ce_k8s.pilot.pilotconfig)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pilot_helpers import jwt, pilot_env, write_token

from ce_k8s.pilot import pilotconfig as pc
from ce_k8s.pilot.sizing import Size

NOW = 1_800_000_000.0


def knobs(text: str) -> dict[str, str]:
    """The config's `NAME = value` lines (the pilot's file has no multi-line values)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f"not a NAME = value line: {line!r}"
            assert name.strip() not in out, f"{name.strip()} set twice"
            out[name.strip()] = value.strip()
    return out


# ------------------------------------------------------------------ settings
def test_settings_defaults(tmp_path):
    env = {"CE_K8S_PILOT_COLLECTOR": "cm.vo:9618", "CE_K8S_PILOT_TOKEN_FILE": "/secret/t"}
    s = pc.settings_from_env(env, now=NOW)
    assert s.collector == "cm.vo:9618" and s.collector_address == ("cm.vo", 9618)
    assert s.token_file == "/secret/t"
    assert s.local_dir == Path("/ce-k8s/scratch/pilot")
    assert (s.idle_seconds, s.grace_seconds, s.join_timeout, s.update_interval) == (600, 25, 60, 60)
    assert s.times == pc.Times(NOW, None, None)
    assert s.network_interface is None
    assert s.name                      # the hostname, made a valid daemon name


def test_settings_from_every_variable(tmp_path):
    s = pc.settings_from_env(pilot_env(tmp_path, CE_K8S_PILOT_IDLE_SECONDS="120", CE_K8S_PILOT_GRACE_SECONDS="10",
                                       CE_K8S_PILOT_JOIN_TIMEOUT="15", CE_K8S_PILOT_UPDATE_INTERVAL="5",
                                       CE_K8S_PILOT_DEADLINE_SECONDS="3600", CE_K8S_PILOT_JOB_MAX_SECONDS="600",
                                       CE_K8S_PILOT_NETWORK_INTERFACE="10.0.0.5", CE_K8S_PILOT_NAME="pilot/x y"),
                             now=NOW)
    assert (s.idle_seconds, s.grace_seconds, s.join_timeout, s.update_interval) == (120, 10, 15, 5)
    assert s.name == "pilot-x-y"
    assert s.network_interface == "10.0.0.5"
    # ToDie = start + deadline - grace - margin (a tenth of the deadline, at most 60 s); ToRetire = ToDie - job max
    assert s.times == pc.Times(NOW, NOW + 3600 - 10 - 60 - 600, NOW + 3600 - 10 - 60)


def test_the_pods_deadline_from_ce_k8s_unless_the_pilot_says_its_own(tmp_path):
    """Every pod ce-k8s builds carries CE_K8S_DEADLINE_SECONDS (its activeDeadlineSeconds): a routed
    pilot retires by it; CE_K8S_PILOT_DEADLINE_SECONDS, when given, is the pilot's own and wins."""
    s = pc.settings_from_env(pilot_env(tmp_path, CE_K8S_DEADLINE_SECONDS="3600", CE_K8S_PILOT_GRACE_SECONDS="10"),
                             now=NOW)
    assert s.times == pc.Times(NOW, NOW + 3600 - 10 - 60, NOW + 3600 - 10 - 60)
    s = pc.settings_from_env(pilot_env(tmp_path, CE_K8S_DEADLINE_SECONDS="3600", CE_K8S_PILOT_DEADLINE_SECONDS="1800",
                                       CE_K8S_PILOT_GRACE_SECONDS="10"), now=NOW)
    assert s.times.die == NOW + 1800 - 10 - 60
    with pytest.raises(pc.ConfigError, match="CE_K8S_DEADLINE_SECONDS=30 leaves no time"):
        pc.settings_from_env({"CE_K8S_PILOT_COLLECTOR": "cm", "CE_K8S_DEADLINE_SECONDS": "30"}, now=NOW)


def test_collector_without_port_uses_the_default():
    s = pc.settings_from_env({"CE_K8S_PILOT_COLLECTOR": "cm.vo"}, now=NOW)
    assert s.collector_address == ("cm.vo", 9618)


@pytest.mark.parametrize(("env", "message"), [
    ({}, "CE_K8S_PILOT_COLLECTOR is not set"),
    ({"CE_K8S_PILOT_COLLECTOR": "a:1, b:2"}, "one host"),
    ({"CE_K8S_PILOT_COLLECTOR": "cm", "CE_K8S_PILOT_LOCAL_DIR": "scratch"}, "not an absolute path"),
    ({"CE_K8S_PILOT_COLLECTOR": "cm", "CE_K8S_PILOT_IDLE_SECONDS": "ten"}, "CE_K8S_PILOT_IDLE_SECONDS"),
    ({"CE_K8S_PILOT_COLLECTOR": "cm", "CE_K8S_PILOT_GRACE_SECONDS": "0"}, "below 1"),
    ({"CE_K8S_PILOT_COLLECTOR": "cm", "CE_K8S_PILOT_DEADLINE_SECONDS": "30"}, "leaves no time"),
    ({"CE_K8S_PILOT_COLLECTOR": "cm", "CE_K8S_PILOT_CA_FILE": "cred/ca.crt"}, "CE_K8S_PILOT_CA_FILE.*absolute"),
])
def test_settings_errors(env, message):
    with pytest.raises(pc.ConfigError, match=message):
        pc.settings_from_env(env, now=NOW)


def test_deadline_margin_is_a_tenth_up_to_a_minute():
    assert pc.deadline_times(0, 200, 25, 0) == pc.Times(0, 200 - 25 - 20, 200 - 25 - 20)
    assert pc.deadline_times(0, 86400, 25, 3600) == pc.Times(0, 86400 - 25 - 60 - 3600, 86400 - 25 - 60)
    with pytest.raises(pc.ConfigError):
        pc.deadline_times(0, 3600, 25, 3600)            # the job max leaves no time to start a job


# ------------------------------------------------------------------ the credential
def test_reads_an_idtoken(tmp_path):
    token = pc.read_token(str(write_token(tmp_path)), now=NOW)
    assert token.kind == "IDTOKENS" and token.identity == "pilot@vo.ce-k8s.test"
    assert token.text == jwt()


def test_a_scitoken_is_told_apart(tmp_path):
    text = jwt({"scope": "compute.read", "wlcg.ver": "1.0", "aud": "https://cm.vo:9618"})
    assert pc.read_token(str(write_token(tmp_path, text)), now=NOW).kind == "SCITOKENS"


@pytest.mark.parametrize(("setup", "message"), [
    (lambda d: "", "CE_K8S_PILOT_TOKEN_FILE is not set"),
    (lambda d: jwt(), "holds a token, not a path"),
    (lambda d: "secret/idtoken", "not an absolute path"),
    (lambda d: str(d / "nothing"), "does not exist"),
    (lambda d: str(d), "unreadable"),                                        # a directory
    (lambda d: str(write_token(d, "")), "is empty"),
    (lambda d: str(write_token(d, "hunter2")), "does not hold a JWT"),
    (lambda d: str(write_token(d, "a.b.c")), "no readable claims"),
    (lambda d: str(write_token(d, jwt({"exp": NOW - 30}))), "expired 30 s ago"),
])
def test_token_errors(tmp_path, setup, message):
    with pytest.raises(pc.TokenError, match=message):
        pc.read_token(setup(tmp_path), now=NOW)


def test_looks_like_token():
    assert pc.looks_like_token(jwt())
    assert not pc.looks_like_token("/var/run/secrets/pilot/idtoken")
    assert not pc.looks_like_token("a.b.c")


# ------------------------------------------------------------------ the condor_config
def config_for(tmp_path, size: Size | None = None, token_text: str | None = None, **env: str) -> tuple[str, dict]:
    s = pc.settings_from_env(pilot_env(tmp_path, **env), now=NOW)
    token = pc.read_token(str(write_token(tmp_path, token_text)), now=NOW)
    size = size or Size(2, 4096, 0, {"cpus": "CE_K8S_PILOT_CPUS", "memory": "CE_K8S_PILOT_MEMORY_MB"})
    text = pc.condor_config(s, size, token, "id123")
    return text, knobs(text)


def test_every_knob_of_the_config(tmp_path):
    text, k = config_for(tmp_path, CE_K8S_PILOT_IDLE_SECONDS="300", CE_K8S_PILOT_UPDATE_INTERVAL="30")
    local = str(tmp_path / "scratch" / "pilot")
    import os
    expected = {
        "RELEASE_DIR": "/usr", "LIBEXEC": "$(RELEASE_DIR)/libexec/condor", "LIB": "$(RELEASE_DIR)/lib/condor",
        "SHARE": "$(RELEASE_DIR)/share/condor",
        "LOCAL_DIR": local, "LOCAL_CONFIG_FILE": "", "LOCAL_CONFIG_DIR": "",
        "LOG": "$(LOCAL_DIR)/log", "SPOOL": "$(LOCAL_DIR)/spool", "EXECUTE": "$(LOCAL_DIR)/execute",
        "LOCK": "$(LOCAL_DIR)/lock", "RUN": "$(LOCAL_DIR)/run",
        "CONDOR_IDS": f"{os.getuid()}.{os.getgid()}", "CONDOR_ADMIN": "", "MAIL": "/bin/true",
        "COLLECTOR_HOST": "vo-cm.vo.svc:9618", "CONDOR_HOST": "$(COLLECTOR_HOST)",
        "DAEMON_LIST": "MASTER, STARTD", "MASTER_NAME": "pilot-abc", "STARTD_NAME": "pilot-abc",
        "USE_SHARED_PORT": "False", "UPDATE_COLLECTOR_WITH_TCP": "True",
        "STARTD.UPDATE_INTERVAL": "30", "MASTER.UPDATE_INTERVAL": "30",
        "SEC_DEFAULT_AUTHENTICATION": "REQUIRED", "SEC_DEFAULT_AUTHENTICATION_METHODS": "IDTOKENS",
        "SEC_CLIENT_AUTHENTICATION_METHODS": "IDTOKENS", "SEC_DEFAULT_ENCRYPTION": "REQUIRED",
        "SEC_DEFAULT_INTEGRITY": "REQUIRED", "SEC_TOKEN_DIRECTORY": "$(LOCAL_DIR)/tokens.d",
        "SEC_TOKEN_SYSTEM_DIRECTORY": "$(LOCAL_DIR)/tokens.d", "SEC_PASSWORD_DIRECTORY": "$(LOCAL_DIR)/passwords.d",
        "NUM_CPUS": "2", "MEMORY": "4096", "MACHINE_RESOURCE_GPUs": "0",
        "NUM_SLOTS": "1", "NUM_SLOTS_TYPE_1": "1", "SLOT_TYPE_1": "cpus=2, memory=4096",
        "SLOT_TYPE_1_PARTITIONABLE": "True", "RUNBENCHMARKS": "False",
        "BASE_CGROUP": "", "MOUNT_UNDER_SCRATCH": "", "USE_PID_NAMESPACES": "False",
        "DISCARD_SESSION_KEYRING_ON_STARTUP": "False", "ENABLE_KERNEL_TUNING": "False",
        "STARTD_NOCLAIM_SHUTDOWN": "300", "MASTER.DAEMON_SHUTDOWN": "STARTD_StartTime =?= 0",
        "START": "True", "MAXJOBRETIREMENTTIME": "0", "MACHINE_MAX_VACATE_TIME": "20",
        "CE_K8S_PILOT_ID": '"id123"', "STARTD_ATTRS": "$(STARTD_ATTRS) CE_K8S_PILOT_ID",
    }
    assert k == expected
    assert jwt() not in text                  # the config names the token's copy, never holds it


def test_deadline_knobs(tmp_path):
    _, k = config_for(tmp_path, CE_K8S_PILOT_DEADLINE_SECONDS="7200", CE_K8S_PILOT_JOB_MAX_SECONDS="1800",
                      CE_K8S_PILOT_GRACE_SECONDS="40")
    die = int(NOW + 7200 - 40 - 60)
    assert k["GLIDEIN_ToDie"] == str(die) and k["GLIDEIN_ToRetire"] == str(die - 1800)
    assert k["START"] == "(time() < $(GLIDEIN_ToRetire))"
    assert k["STARTD.DAEMON_SHUTDOWN"] == "time() > $(GLIDEIN_ToDie)"
    assert k["STARTD_ATTRS"] == "$(STARTD_ATTRS) CE_K8S_PILOT_ID GLIDEIN_ToRetire GLIDEIN_ToDie"
    assert k["MACHINE_MAX_VACATE_TIME"] == "35"


def test_gpu_and_interface_knobs(tmp_path):
    size = Size(8, 65536, 2, {"cpus": "x", "memory": "y"})
    _, k = config_for(tmp_path, size, CE_K8S_PILOT_NETWORK_INTERFACE="10.1.2.3")
    assert k["MACHINE_RESOURCE_GPUs"] == "2" and "ENVIRONMENT_FOR_AssignedGPUs" not in k   # HTCondor's default
    assert k["SLOT_TYPE_1"] == "cpus=8, memory=65536, gpus=2"
    assert (k["NUM_CPUS"], k["MEMORY"]) == ("8", "65536")
    assert k["NETWORK_INTERFACE"] == "10.1.2.3"


def test_gpu_uuids_are_the_startd_s_gpu_ids(tmp_path):
    device = "GPU-00000000-0000-4000-8000-ce8c00000001"
    _, k = config_for(tmp_path, Size(2, 4096, 1, {"cpus": "x", "memory": "y"}, (device,)))
    assert k["MACHINE_RESOURCE_GPUs"] == device and k["SLOT_TYPE_1"] == "cpus=2, memory=4096, gpus=1"


def test_a_scitoken_config_uses_the_scitokens_method(tmp_path):
    _, k = config_for(tmp_path, token_text=jwt({"scope": "condor:/WRITE", "wlcg.ver": "1.0"}))
    assert k["SEC_CLIENT_AUTHENTICATION_METHODS"] == "SCITOKENS"
    assert k["SCITOKENS_FILE"] == str(tmp_path / "scratch" / "pilot" / "tokens.d" / "pilot.token")
    assert "AUTH_SSL_CLIENT_CAFILE" not in k                 # HTCondor's default: the system's CAs


def test_the_vo_s_ca_file_checks_the_collector_s_certificate(tmp_path):
    _, k = config_for(tmp_path, token_text=jwt({"scope": "condor:/WRITE", "wlcg.ver": "1.0"}),
                      CE_K8S_PILOT_CA_FILE="/ce-k8s/cred/ca.crt")
    assert k["AUTH_SSL_CLIENT_CAFILE"] == "/ce-k8s/cred/ca.crt"


def test_the_sizing_sources_are_in_a_comment(tmp_path):
    text, _ = config_for(tmp_path)
    assert re.search(r"^# The pod's size: .*CE_K8S_PILOT_CPUS.*CE_K8S_PILOT_MEMORY_MB", text, re.MULTILINE)
