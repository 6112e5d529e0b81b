"""Fixtures for the agent tests: the API emulator (or the in-memory fakes, fakes.py), a spool with a
pilot's files, routed ads."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import classad2
import pytest
from kubernetes import config as kconfig
from polling import wait_for

from ce_k8s import protocol
from ce_k8s.agent.agent import Agent
from ce_k8s.agent.sourceprobe import GONE, FixedProbe
from ce_k8s.condor import wire
from ce_k8s.pods.names import pod_name
from ce_k8s.settings import Settings
from ce_k8s.sim.kube.apiserver import ApiServer

GJID = "ce.example.org#4711.0#1760000000"
CE = "test-ce"


def open_tmpdir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="ce-k8s-agent-", dir="/tmp"))
    os.chmod(d, 0o755)
    return d


def make_spool(root: Path, cluster: int = 4711, proc: int = 0) -> Path:
    """The Condor-C spool layout (ce_k8s.pods.sandbox): executable and proxy of one pilot."""
    iwd = root / "spool" / str(cluster % 10000) / str(proc % 10000) / f"cluster{cluster}.proc{proc}.subproc0"
    iwd.mkdir(parents=True, exist_ok=True)
    (iwd / "glidein_startup.sh").write_text("#!/bin/sh\necho pilot\n")
    (iwd / "x509up").write_text("PROXY")
    return iwd


def routed_ad(spool: Path, cluster: int = 4711, attempt: int = 0, gjid: str = GJID, owner: str = "cmspilot",
              **extra) -> classad2.ClassAd:
    """A routed job as the router leaves it: translate output + VanillaToGrid + route SETs."""
    iwd = spool / str(cluster % 10000) / "0" / f"cluster{cluster}.proc0.subproc0"
    ad = classad2.ClassAd()
    values = {
        "ClusterId": cluster + 100000, "ProcId": 0, "JobUniverse": 9, "JobStatus": 1, "Owner": owner,
        "Cmd": "glidein_startup.sh", "Iwd": str(iwd), "x509userproxy": str(iwd / "x509up"),
        "Out": "_condor_stdout", "Err": "_condor_stderr", "RequestCpus": 1, "RequestMemory": 2000,
        "RoutedFromJobId": f"{cluster}.0", "RouteName": "K8s", "RoutedBy": "htcondor-ce",
        "Managed": "ScheddDone", "ManagedManager": "ce-k8s", "K8sAttempt": attempt,
        "K8sPodName": pod_name(gjid, attempt), "K8sSourceGlobalJobId": gjid, "K8sImage": "pilot:1",
        "K8sNamespace": "default", "GridResource": "batch k8s",
    }
    values.update(extra)
    for k, v in values.items():
        if v is None:
            if k in ad:
                del ad[k]
            continue
        ad[k] = v
    return ad


def text_of(ad: classad2.ClassAd) -> bytes:
    return wire.sprint_ad(ad).encode()


def apply_output(ad: classad2.ClassAd, reply: bytes) -> classad2.ClassAd:
    """What the router does with update output (hook-protocol.md §2.3): parse with its rules, update the ad."""
    out = wire.parse_hook_output(reply.decode())
    for k in out.keys():
        ad[k] = out.lookup(k)
    return out


def update(agent, ad: classad2.ClassAd, uid: int = 0) -> classad2.ClassAd:
    """One update hook call through `agent.handle` as `uid`, which must answer ok; the ad as the
    router leaves it after the reply."""
    status, parts = agent.handle(protocol.VERB_UPDATE, text_of(ad), uid)
    assert status == protocol.STATUS_OK, parts
    return apply_output(ad, parts[0])


@pytest.fixture
def tmp_root():
    d = open_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server():
    with ApiServer.running(kubelet=False, history_size=50, bookmark_interval=0.2) as srv:
        yield srv


@pytest.fixture
def settings(tmp_root):
    make_spool(tmp_root)
    return Settings(ce_name=CE, namespace="default", spool=str(tmp_root / "spool"), socket=str(tmp_root / "agent.sock"),
                    qps=1000.0, burst=1000, create_concurrency=4, gc_grace=3600, image_pull_timeout=0,
                    usage_source="proxy")   # the emulator's kubelets answer at the node proxy only


def new_agent(server, settings, **kwargs) -> Agent:
    """An agent on the emulator, started and listed (its socket at settings.socket).

    Its source probe answers "gone" unless a test passes its own `source_probe`: a cleanup then
    deletes a live pod as a removed source job's cleanup does (docs/agent.md "Released pods"); no
    test needs a schedd.
    """
    api = kconfig.new_client_from_config(config_file=server.kubeconfig_path)
    kwargs.setdefault("request_timeout", 3.0)
    kwargs.setdefault("watch_timeout", 5)
    kwargs.setdefault("source_probe", FixedProbe(GONE))
    agent = Agent(settings, api, **kwargs)
    agent.start()
    assert agent.cache.ready.is_set()
    return agent


@pytest.fixture
def agent(server, settings):
    a = new_agent(server, settings)
    yield a
    a.stop()


@pytest.fixture
def memory_agent(settings):
    """The agent on in-memory collaborators (fakes.py): no API server, nothing started; its
    `api` is the cluster, `run_effects(agent)` makes its queued writes, `clock` is its time."""
    from .fakes import fake_agent

    return fake_agent(settings)


#: The suite's poll-until (tests/polling.py), under the name this directory's ~140 waits use; its
#: defaults (30 s, every 20 ms) are this directory's.
wait = wait_for


def replace_settings(settings, **changes):
    return dataclasses.replace(settings, **changes)


@contextlib.contextmanager
def agent_process(server, tmp_root: Path, config: Path):
    """`ce-k8s agent --config CONFIG` as condor_master runs it, serving on tmp_root/run/agent.sock
    once the context is entered; SIGTERM on exit, which must end it with status 0."""
    sock = tmp_root / "run" / "agent.sock"
    proc = subprocess.Popen([sys.executable, "-m", "ce_k8s.cli", "agent", "--config", str(config),
                             "--kubeconfig", server.kubeconfig_path, "--socket", str(sock),
                             "--spool", str(tmp_root / "spool")], stderr=subprocess.PIPE)
    try:
        wait(lambda: sock.exists(), timeout=20)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, proc.stderr.read()
