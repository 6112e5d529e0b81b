"""Adversarial isolation between pilot accounts, with real processes under two throw-away uids.

The agent's socket is open to every pilot account (mode 0666) because the router runs each hook
as the job's owner (docs/hook-protocol.md §2.1, §8); authorisation is per request from the
kernel-verified SO_PEERCRED uid (ce_k8s/agent/server.py). tests/agent checks the honest rule
("an owner may act, another uid may not"). These tests play account A as an attacker holding a
shell: it replays B's routed ad, forges ads that name B's pod, B's job id or B's spool files,
and speaks the raw protocol. Issue 9: "a hook running as account A cannot read, create, update
or delete anything of account B's jobs". Every attack is followed by checks that B's pod, B's
Secret and B's credentials are untouched and that nothing of B's reached A.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import time
from pathlib import Path

import classad2
import pytest
from kubernetes import config as kconfig
from polling import wait_for

from ce_k8s.agent.agent import Agent
from ce_k8s.agent.sourceprobe import GONE, FixedProbe
from ce_k8s.condor import wire
from ce_k8s.pods.names import pod_name, secret_name
from ce_k8s.settings import Settings
from ce_k8s.sim.kube.apiserver import ApiServer

from .conftest import SYSTEM_PYTHON, hook_env, run_measured

NS = "default"
GJID_A = "ce.example.org#100.0#1760000000"
GJID_B = "ce.example.org#200.0#1760000000"
MARK_B = "B-PROXY-SECRET-7f3a91"


def spool_dir(spool: Path, cluster: int) -> Path:
    """The Condor-C spool directory of job <cluster>.0 (ce_k8s.pods.sandbox.job_spool_dir)."""
    return spool / str(cluster % 10000) / "0" / f"cluster{cluster}.proc0.subproc0"


def make_job_spool(spool: Path, cluster: int, account, proxy: str) -> Path:
    """The job's spool directory as the schedd leaves it: owned by the job owner, 0700."""
    d = spool_dir(spool, cluster)
    d.mkdir(parents=True, exist_ok=True)
    for parent in (d.parent, d.parent.parent):
        os.chmod(parent, 0o755)
    (d / "glidein_startup.sh").write_text("#!/bin/sh\necho pilot\n")
    (d / "x509up").write_text(proxy)
    for path in (d, d / "glidein_startup.sh", d / "x509up"):
        os.chown(path, account.uid, account.gid)
    os.chmod(d / "x509up", 0o600)
    os.chmod(d, 0o700)
    return d


def routed_ad(spool: Path, cluster: int, owner: str, gjid: str, attempt: int = 0, **extra) -> classad2.ClassAd:
    """A routed job as the router leaves it after translate + transforms (hook-protocol.md §2.2)."""
    iwd = spool_dir(spool, cluster)
    values = {
        "ClusterId": cluster + 100000, "ProcId": 0, "JobUniverse": 9, "JobStatus": 1, "Owner": owner,
        "Cmd": "glidein_startup.sh", "Iwd": str(iwd), "x509userproxy": str(iwd / "x509up"),
        "Out": "_condor_stdout", "Err": "_condor_stderr", "RequestCpus": 1, "RequestMemory": 2000,
        "RoutedFromJobId": f"{cluster}.0", "RouteName": "K8s", "RoutedBy": "htcondor-ce",
        "Managed": "ScheddDone", "ManagedManager": "ce-k8s", "K8sAttempt": attempt,
        "K8sPodName": pod_name(gjid, attempt), "K8sSourceGlobalJobId": gjid, "K8sImage": "pilot:1",
        "K8sNamespace": NS, "GridResource": "batch k8s",
    }
    values.update(extra)
    ad = classad2.ClassAd()
    for k, v in values.items():
        if v is not None:
            ad[k] = v
    return ad


class World:
    """API emulator + agent (root, like the real daemon) + two accounts' spools and hooks."""

    def __init__(self, server, agent: Agent, spool: Path, socket: str, launchers: Path, a, b) -> None:
        self.server, self.agent, self.spool, self.socket, self.launchers = server, agent, spool, socket, launchers
        self.a, self.b = a, b

    def hook(self, name: str, stdin: bytes, account) -> object:
        return run_measured([str(self.launchers / f"ce-k8s-{name}")], [stdin], env=hook_env(self.socket),
                            user=account.name, timeout=30)

    def raw(self, account, verb: str, payload: bytes) -> tuple[str, list[bytes]]:
        """Speak the raw protocol as `account` (what an attacker with a shell does)."""
        code = (
            "import sys, time\n"
            f"sys.path.insert(0, {str(self.launchers / 'lib')!r})\n"      # the staged hook modules
            "from ce_k8s import protocol\n"
            "payload = sys.stdin.buffer.read()\n"
            f"r = protocol.call({self.socket!r}, {verb!r}, payload, time.monotonic() + 10)\n"
            "parts = r.read_all()\n"
            "sys.stdout.buffer.write(r.status.encode() + b'\\n' + repr(parts).encode())\n"
        )
        res = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", code], input=payload, capture_output=True,
                             timeout=30, user=account.name, check=False)
        assert res.returncode == 0, res.stderr
        status, _, parts = res.stdout.partition(b"\n")
        return status.decode(), ast.literal_eval(parts.decode())

    def pod(self, name: str):
        return self.server.store.peek("pods", NS, name)

    def secrets_containing(self, marker: str) -> list[str]:
        import base64

        found = []
        for obj in self.server.store.peek_list("secrets"):
            for value in (obj.get("data") or {}).values():
                if marker.encode() in base64.b64decode(value):
                    found.append(obj["metadata"]["name"])
        return found


@pytest.fixture
def world(accounts, launchers, tmp_root):
    a, b = accounts
    spool = tmp_root / "spool"
    spool.mkdir()
    make_job_spool(spool, 100, a, "A-PROXY")
    make_job_spool(spool, 200, b, MARK_B)
    sock = str(tmp_root / "run" / "agent.sock")
    settings = Settings(ce_name="test-ce", namespace=NS, spool=str(spool), socket=sock, qps=1000.0, burst=1000,
                        create_concurrency=2, gc_grace=3600, image_pull_timeout=0)
    with ApiServer.running(kubelet=False, history_size=50, bookmark_interval=0.2) as server:
        api = kconfig.new_client_from_config(config_file=server.kubeconfig_path)
        agent = Agent(settings, api, request_timeout=3.0, watch_timeout=5, source_probe=FixedProbe(GONE))
        agent.start()
        try:
            w = World(server, agent, spool, sock, launchers, a, b)
            # B's honest pilot: B's own update hook creates B's pod and Secret.
            ad_b = routed_ad(spool, 200, b.name, GJID_B)
            res = w.hook("update", wire.sprint_ad(ad_b).encode(), b)
            assert res.returncode == 0, res.stderr
            wait_for(lambda: w.pod(pod_name(GJID_B, 0)) and w.server.store.peek("secrets", NS,
                                                                               secret_name(pod_name(GJID_B, 0))))
            w.ad_b = ad_b
            w.pod_b = w.pod(pod_name(GJID_B, 0))
            yield w
        finally:
            agent.stop()
    shutil.rmtree(tmp_root, ignore_errors=True)


def assert_b_untouched(w: World) -> None:
    name = pod_name(GJID_B, 0)
    pod = w.pod(name)
    assert pod is not None and pod["metadata"]["uid"] == w.pod_b["metadata"]["uid"], "B's pod was replaced or deleted"
    assert not pod["metadata"].get("deletionTimestamp")
    assert w.server.store.peek("secrets", NS, secret_name(name)) is not None
    assert w.secrets_containing(MARK_B) == [secret_name(name)], "B's proxy is in another Secret"
    assert (spool_dir(w.spool, 200) / "x509up").read_text() == MARK_B


def test_a_replaying_bs_ad_is_denied_for_every_verb(world):
    """A sends B's routed ad verbatim (Owner = B): update, cleanup and logs are all `denied`; the
    update hook exits 1 with no output (hook-protocol.md §2.3), cleanup exits 1 (retried, nothing deleted, §2.5)."""
    text = wire.sprint_ad(world.ad_b).encode()
    res = world.hook("update", text, world.a)
    assert (res.returncode, res.stdout) == (1, b"")
    res = world.hook("cleanup", text, world.a)
    assert res.returncode == 1
    for verb in ("update", "cleanup", "logs"):
        status, parts = world.raw(world.a, verb, text)
        assert status == "denied", (verb, status, parts)
        assert MARK_B.encode() not in b"".join(parts)
    assert_b_untouched(world)


def test_a_naming_bs_pod_under_its_own_owner_gets_nothing(world):
    """A forges Owner = A but K8sPodName / K8sSourceGlobalJobId of B's job: the agent sees the pod
    belongs to another owner; update reports a hold on A's own job only, cleanup deletes nothing,
    logs are denied."""
    forged = routed_ad(world.spool, 100, world.a.name, GJID_B)       # B's pod name and job id
    text = wire.sprint_ad(forged).encode()
    status, parts = world.raw(world.a, "update", text)
    assert status == "ok"
    assert b"JobStatus = 5" in parts[0] and b"another job or owner" in parts[0]
    status, parts = world.raw(world.a, "cleanup", text)
    assert status in ("notfound", "ok") and parts == [b"0 pod(s) deleted"]
    status, parts = world.raw(world.a, "logs", text)
    assert status == "denied"
    # cleanup of an own job whose K8sAttempt makes the agent also sweep earlier attempts of B's job id
    sweep = routed_ad(world.spool, 100, world.a.name, GJID_B, attempt=3, K8sPodName=pod_name(GJID_A, 3))
    status, parts = world.raw(world.a, "cleanup", wire.sprint_ad(sweep).encode())
    assert parts == [b"0 pod(s) deleted"]
    time.sleep(0.3)
    assert_b_untouched(world)


def test_a_cannot_pull_bs_proxy_into_its_own_pod(world):
    """A forges an ad that is A's by Owner and pod name but points at B's job in the spool
    (RoutedFromJobId, x509userproxy). The agent reads sandbox files as root, so without an
    ownership check it would copy B's proxy into a Secret mounted in A's pod (docs/design.md Decision 6).
    It must hold A's job instead, and no Secret other than B's may ever hold B's proxy."""
    b_dir = spool_dir(world.spool, 200)
    forged = routed_ad(world.spool, 100, world.a.name, GJID_A, RoutedFromJobId="200.0", Iwd=str(b_dir),
                       x509userproxy=str(b_dir / "x509up"), Cmd=str(b_dir / "glidein_startup.sh"))
    text = wire.sprint_ad(forged).encode()
    status, _ = world.raw(world.a, "update", text)
    assert status == "ok"
    name_a = pod_name(GJID_A, 0)

    def settled():
        rec = world.agent.jobs.get(name_a)
        return rec is not None and rec.creation.info.state not in ("none", "pending") and rec.creation.info.state

    wait_for(settled)
    assert world.secrets_containing(MARK_B) == [secret_name(pod_name(GJID_B, 0))]
    status, parts = world.raw(world.a, "update", text)
    assert status == "ok" and b"JobStatus = 5" in parts[0], parts
    assert MARK_B.encode() not in parts[0]
    assert_b_untouched(world)


def test_a_cannot_write_into_bs_spool_through_finalize(world):
    """Finalize runs as the job owner and writes Out/Err itself (hook-protocol.md §2.4): A's job naming a file in
    B's spool directory is stopped by the kernel (B's directory is 0700), not by trust."""
    ad_a = routed_ad(world.spool, 100, world.a.name, GJID_A)
    res = world.hook("update", wire.sprint_ad(ad_a).encode(), world.a)
    assert res.returncode == 0, res.stderr
    wait_for(lambda: world.pod(pod_name(GJID_A, 0)))
    b_out = spool_dir(world.spool, 200) / "_condor_stdout"
    src = routed_ad(world.spool, 100, world.a.name, GJID_A, JobUniverse=5, ClusterId=100,
                    Out=str(b_out), Err=str(spool_dir(world.spool, 200) / "x509up"))
    res = world.hook("finalize", wire.finalize_stdin(src, ad_a), world.a)
    assert res.returncode == 0                           # hook-protocol.md §2.4: never re-run the pilot for this
    assert not b_out.exists()
    assert (spool_dir(world.spool, 200) / "x509up").read_text() == MARK_B
    assert_b_untouched(world)


def test_hostile_ad_that_crashed_classad2_does_not_kill_the_agent(world):
    """An ad with a 200,000-term expression used to segfault the C++ ClassAd library inside the
    agent (found by tests/hardening/test_fuzz_parsers.py): every account would lose its agent.
    Now the create fails with a hold on A's job and the agent keeps serving B."""
    forged = routed_ad(world.spool, 100, world.a.name, GJID_A)
    text = wire.sprint_ad(forged) + "Evil = " + "+".join(["1"] * 200_000) + "\n"
    status, _ = world.raw(world.a, "update", text.encode())
    assert status == "ok"
    wait_for(lambda: (world.agent.jobs.get(pod_name(GJID_A, 0)) or None) and
             world.agent.jobs[pod_name(GJID_A, 0)].creation.info.state == "hold")
    res = world.hook("update", wire.sprint_ad(world.ad_b).encode(), world.b)
    assert res.returncode == 0, res.stderr
    assert_b_untouched(world)


def test_a_second_owner_line_the_scanner_skips_is_refused(world):
    """The agent authorises on a fast line scan (`Name = value` with spaces, ce_k8s/agent/adtext.py)
    but builds the pod from a full ClassAd parse, which also reads `Owner="B"`. An ad carrying both
    must not become a pod labelled as B's (or reading B's files): the create is held."""
    b_dir = spool_dir(world.spool, 200)
    forged = routed_ad(world.spool, 100, world.a.name, GJID_A)
    text = wire.sprint_ad(forged) + f'Owner="{world.b.name}"\nx509userproxy="{b_dir / "x509up"}"\n'
    status, _ = world.raw(world.a, "update", text.encode())
    assert status == "ok"
    name_a = pod_name(GJID_A, 0)
    wait_for(lambda: world.agent.jobs.get(name_a) and world.agent.jobs[name_a].creation.info.state == "hold")
    assert world.pod(name_a) is None
    assert_b_untouched(world)
