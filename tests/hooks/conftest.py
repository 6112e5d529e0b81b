"""Shared fixtures for the hook tests: real hook processes, exact router stdin, a stub agent.

The hooks run as the router runs them (docs/hook-protocol.md §7 step 2): argv = [path] only,
stdin written completely and closed, stdout/stderr captured. They are started through the
launchers `ce-k8s agent --install-hooks` writes (the deployed form).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import classad2
import pytest

from ce_k8s import protocol
from ce_k8s.agent.launchers import install_hooks, stage_hook_package
from ce_k8s.agent.server import peer_uid

GJID = "ce.example.org#4711.0#1760000000"
SYSTEM_PYTHON = "/usr/bin/python3"


def source_ad(**extra) -> classad2.ClassAd:
    """A GlideinWMS-shaped source job as it sits in the CE queue (htcondor-ce.md §6.3)."""
    ad = classad2.ClassAd()
    values = {
        "ClusterId": 4711, "ProcId": 0, "JobUniverse": 5, "JobStatus": 1, "Owner": "cmspilot",
        "User": "cmspilot@users.htcondor.org", "GlobalJobId": GJID, "QDate": 1760000000,
        "Cmd": "glidein_startup.sh", "Iwd": "/var/lib/condor-ce/spool/4711/0/cluster4711.proc0.subproc0",
        "Out": "_condor_stdout", "Err": "_condor_stderr", "RequestCpus": 8,
        "Arguments": '-v std -name "gfactory instance" -web https://f.example.org/stage',
        "x509userproxy": "/var/lib/condor-ce/spool/4711/0/cluster4711.proc0.subproc0/x509up",
    }
    values.update(extra)
    for k, v in values.items():
        ad[k] = v
    ad["LeaveJobInQueue"] = classad2.ExprTree("JobStatus == 4 && ( time() < TimerRemove )")
    return ad


def open_tmpdir() -> Path:
    """A 0755 temporary directory: pytest's own tmp tree is 0700, closed to the pilot accounts."""
    d = Path(tempfile.mkdtemp(prefix="ce-k8s-test-", dir="/tmp"))
    os.chmod(d, 0o755)
    return d


@pytest.fixture(scope="session")
def hook_dir() -> Path:
    """Launchers on the venv's interpreter (what `ce-k8s agent --install-hooks` writes)."""
    d = open_tmpdir()
    install_hooks(str(d), socket_path=str(d / "no-agent.sock"), hook_timeout=5.0)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def user_hook_dir() -> Path:
    """Launchers on the system Python: the venv's interpreter lives under /root (0700), which the
    throw-away pilot accounts cannot enter. The hooks are stdlib-only, so this also proves it."""
    d = open_tmpdir()
    # another account runs these: a copy of the hook modules it can read, wherever the checkout is
    install_hooks(str(d), socket_path=str(d / "no-agent.sock"), hook_timeout=5.0, python=SYSTEM_PYTHON,
                  package_dir=stage_hook_package(str(d / "lib")))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run_hook(hook_dir: Path, name: str, stdin: bytes, env: dict | None = None, user: str | None = None,
             timeout: float = 30) -> subprocess.CompletedProcess:
    """Run one hook as the router does; `env` adds to a minimal environment."""
    full_env = {"PATH": "/usr/bin:/bin"}
    full_env.update(env or {})
    return subprocess.run([str(hook_dir / f"ce-k8s-{name}")], input=stdin, capture_output=True, env=full_env,
                          timeout=timeout, user=user, check=False)


class StubAgent:
    """A protocol-level stand-in for the agent: records requests, answers from `self.reply`."""

    def __init__(self, path: str, reply: tuple[str, list[bytes]] | None = None) -> None:
        import socket

        self.path = path
        self.requests: list[tuple[str, bytes, int]] = []
        # Set before the socket listens: a hook already retrying connects the moment it does
        # (setting it after construction raced that first request under load).
        self.reply: tuple[str, list[bytes]] = reply or (protocol.STATUS_OK, [b""])
        self.delay = 0.0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o666)
        self.sock.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import time

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while True:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, payload = data.partition(b"\n")
                verb, _ = protocol.parse_request_header(head + b"\n")
                self.requests.append((verb, payload, peer_uid(conn)))
                if self.delay:
                    time.sleep(self.delay)
                status, parts = self.reply
                try:
                    conn.sendall(protocol.encode_reply(status, *parts))
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def shared_tmp() -> Path:
    """Like tmp_path, but reachable by the pilot accounts."""
    d = open_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def stub_agent(shared_tmp):
    agent = StubAgent(str(shared_tmp / "agent.sock"))
    yield agent
    agent.close()


@pytest.fixture(scope="session")
def pilot_user():
    """A throw-away Unix account for the SO_PEERCRED tests (tests run as root)."""
    name = "cek8stest1"
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    return pwd.getpwnam(name)
