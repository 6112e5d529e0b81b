"""Shared fixtures of the hardening tests: throw-away accounts, hook launchers, bounded processes.

Every subprocess and socket call made by these tests has a timeout: a hostile-input test that can
hang proves nothing (issue 9: "no crash, no hang").
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from ce_k8s.agent.launchers import install_hooks, stage_hook_package

# One profile for every fuzz test here: enough examples to find the classic failures, few enough
# that the whole hardening suite stays well under a minute (team rule).
settings.register_profile(
    "hardening", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)

SYSTEM_PYTHON = "/usr/bin/python3"
USERS = ("cek8sharda", "cek8shardb")


def open_tmpdir(prefix: str = "ce-k8s-hard-") -> Path:
    """A 0755 directory under /tmp (the venv lives under /root, 0700, unreadable to test accounts)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(d, 0o755)
    return d


@pytest.fixture
def tmp_root():
    d = open_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int


@pytest.fixture(scope="session")
def accounts() -> tuple[Account, Account]:
    """Two throw-away pilot accounts, A and B (created with useradd; needs root, as CI runs)."""
    if os.geteuid() != 0:
        reason = "not root: cannot create the two throw-away pilot accounts the isolation tests need"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    out = []
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, timeout=30, capture_output=True)
        pw = pwd.getpwnam(name)
        out.append(Account(name, pw.pw_uid, pw.pw_gid))
    return out[0], out[1]


@pytest.fixture(scope="session")
def launchers():
    """The real hook launchers (ce-k8s agent --install-hooks), on the system Python so that other
    accounts can run them (the venv's interpreter is under /root)."""
    d = open_tmpdir("ce-k8s-hard-hooks-")
    install_hooks(str(d), socket_path="/nonexistent/agent.sock", hook_timeout=5.0, python=SYSTEM_PYTHON,
                  package_dir=stage_hook_package(str(d / "lib")))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@dataclass
class Finished:
    returncode: int
    stdout: bytes
    stderr: bytes
    maxrss_kib: int
    stdin_error: str | None
    elapsed: float


# Runs argv[1:] as its only child and appends its peak RSS to stderr. RUSAGE_CHILDREN of this tiny
# wrapper is the hook's own figure: a child forked straight from pytest would report pytest's RSS
# (fork copies it, and ru_maxrss keeps the pre-exec maximum).
_RSS_WRAPPER = (
    "import os, resource, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.argv[1], sys.argv[1:])\n"
    "_, status = os.waitpid(pid, 0)\n"
    "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "os.write(2, b'\\nCEK8S_MAXRSS=%d\\n' % rss)\n"
    "sys.exit(os.waitstatus_to_exitcode(status) & 0xff)\n"
)
_RSS_MARK = b"\nCEK8S_MAXRSS="


def run_measured(argv: list[str], stdin_chunks, *, env: dict[str, str] | None = None,
                 user: str | None = None, timeout: float = 30.0) -> Finished:
    """Run `argv`, stream `stdin_chunks` into it, and return its exit, output and own peak RSS.

    Writing stops at the first EPIPE: a process that refuses oversized input closes its stdin
    early, which is the behaviour under test. Everything is bounded by `timeout` (the process
    group is killed).
    """
    import time

    wrapped = [SYSTEM_PYTHON, "-I", "-S", "-c", _RSS_WRAPPER, *argv]
    t0 = time.monotonic()
    proc = subprocess.Popen(wrapped, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env if env is not None else {}, user=user, start_new_session=True)
    stdin_error: list[str] = []
    outputs: dict[str, bytes] = {}

    def feed() -> None:
        try:
            for chunk in stdin_chunks:
                proc.stdin.write(chunk)
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError) as exc:
            stdin_error.append(type(exc).__name__)

    def drain(name: str, stream) -> None:
        outputs[name] = stream.read()

    feeder = threading.Thread(target=feed, daemon=True)
    drains = [threading.Thread(target=drain, args=("out", proc.stdout), daemon=True),
              threading.Thread(target=drain, args=("err", proc.stderr), daemon=True)]
    for t in [feeder, *drains]:
        t.start()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(10)
    elapsed = time.monotonic() - t0
    for t in drains:
        t.join(timeout)
    feeder.join(0.5)
    err = outputs.get("err", b"")
    rss = 0
    if _RSS_MARK in err:
        err, _, tail = err.rpartition(_RSS_MARK)
        rss = int(tail.strip() or 0)
    return Finished(proc.returncode, outputs.get("out", b""), err, rss,
                    stdin_error[0] if stdin_error else None, elapsed)


def hook_env(socket_path: str, timeout: float = 3.0) -> dict[str, str]:
    """The environment a hook inherits from the router (hook-protocol.md §2.1), narrowed to what ce-k8s reads."""
    return {"CE_K8S_SOCKET": socket_path, "CE_K8S_HOOK_TIMEOUT": str(timeout), "PATH": "/usr/bin:/bin"}
