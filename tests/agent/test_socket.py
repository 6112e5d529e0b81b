"""Hooks as real processes against the real agent over its Unix socket.

SO_PEERCRED (server.py): a hook running as one pilot account acts on that account's jobs only.
The tests run as root and create a throw-away account; its hooks run on the system Python
because the venv's interpreter lives under /root (0700) — the hooks are stdlib-only anyway.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from ce_k8s.agent.launchers import install_hooks, stage_hook_package
from ce_k8s.condor import wire
from ce_k8s.pods.names import pod_name

from .conftest import GJID, apply_output, new_agent, open_tmpdir, routed_ad, wait

NAME = pod_name(GJID, 0)
USER = "cek8stest2"


@pytest.fixture(scope="module")
def pilot():
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
    return pwd.getpwnam(USER)


@pytest.fixture(scope="module")
def launchers():
    d = open_tmpdir()
    install_hooks(str(d), socket_path="/nonexistent.sock", hook_timeout=5.0, python="/usr/bin/python3",
                  package_dir=stage_hook_package(str(d / "lib")))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def hook(launchers: Path, name: str, stdin: bytes, sock: str, user: str | None = None):
    return subprocess.run([str(launchers / f"ce-k8s-{name}")], input=stdin, capture_output=True, timeout=30,
                          env={"CE_K8S_SOCKET": sock}, user=user, check=False)


def test_peercred_owner_may_act_other_uid_may_not(server, settings, launchers, pilot):
    agent = new_agent(server, settings)
    try:
        mine = routed_ad(Path(settings.spool), owner=USER)
        res = hook(launchers, "update", wire.sprint_ad(mine).encode(), settings.socket, user=USER)
        assert res.returncode == 0, res.stderr
        assert apply_output(mine, res.stdout)["K8sPodReason"] == "creating pod"
        wait(lambda: agent.cache.get(NAME))
        theirs = routed_ad(Path(settings.spool), owner="cmspilot", gjid="ce#9.0#1")
        res = hook(launchers, "update", wire.sprint_ad(theirs).encode(), settings.socket, user=USER)
        assert res.returncode == 1 and res.stdout == b""         # hook-protocol.md §2.3: no sync, never a parse error
        res = hook(launchers, "cleanup", wire.sprint_ad(theirs).encode(), settings.socket, user=USER)
        assert res.returncode == 1                                # refused, so retried; nothing deleted
        assert agent.metrics["denied"] == 2
        assert oct(os.stat(settings.socket).st_mode & 0o777) == "0o666"
    finally:
        agent.stop()


def test_finalize_returns_pod_output_then_cleanup_deletes(server, settings, launchers):
    agent = new_agent(server, settings)
    try:
        ad = routed_ad(Path(settings.spool))
        res = hook(launchers, "update", wire.sprint_ad(ad).encode(), settings.socket)
        assert res.returncode == 0
        wait(lambda: agent.cache.get(NAME))

        def finish(pod):
            pod["status"] = {"phase": "Succeeded", "containerStatuses": [{"name": "pilot", "state": {"terminated": {
                "exitCode": 0, "startedAt": "2025-10-09T08:55:00Z", "finishedAt": "2025-10-09T09:05:00Z"}}}]}
        # Scheduled to a node (a pod without one has no kubelet, so no log: 200 and nothing, as on
        # a real server); the kubelet has the log before it reports the container terminated.
        server.call(server.api.bind, "default", NAME, {"target": {"name": "cpu-1"}})
        server.store.logs[("default", NAME, "pilot")] = [("2025-10-09T09:00:00.000000000Z", "stdout", "glidein ok\n")]
        server.call(server.api.write, "pods", "default", NAME, finish)
        wait(lambda: agent.cache.get(NAME).phase == "Succeeded")
        src = routed_ad(Path(settings.spool), JobUniverse=5, ClusterId=4711)
        res = hook(launchers, "finalize", wire.finalize_stdin(src, ad), settings.socket)
        assert res.returncode == 0, res.stderr
        iwd = Path(src["Iwd"])
        assert (iwd / "_condor_stdout").read_bytes() == b"glidein ok\n"
        assert (iwd / "_condor_stderr").exists()
        res = hook(launchers, "cleanup", wire.sprint_ad(ad).encode(), settings.socket)
        assert res.returncode == 0
        wait(lambda: agent.cache.get(NAME) is None)
        res = hook(launchers, "cleanup", wire.sprint_ad(ad).encode(), settings.socket)
        assert res.returncode == 0                                # "not found" is success (hook-protocol.md §2.5)
    finally:
        agent.stop()
