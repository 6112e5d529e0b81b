"""The entry point's supervision and exit codes (ce_k8s.pilot.entrypoint), with a fake
condor_master and condor_status (scripts on this interpreter), a listening socket for a collector,
and the real signal path (the fake master signals its parent, the supervisor forwards)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pilot_helpers import jwt, pilot_env

from ce_k8s.pilot import entrypoint as ep
from ce_k8s.pilot import pilotconfig as pc
from ce_k8s.pilot.sizing import Size

REPO = Path(__file__).resolve().parents[2]

FAKE_MASTER = """\
import os, signal, sys, time
from pathlib import Path
local = Path(os.environ["CONDOR_CONFIG"]).parent
mode = os.environ["FAKE_MASTER_MODE"]
record = local / "master-record"
(local / "master-env").write_text("\\n".join(f"{k}={v}" for k, v in os.environ.items()))
def got(signum, _f):
    with open(record, "a") as fh:
        fh.write(signal.Signals(signum).name + "\\n")
    if mode == "ignore-term" and signum == signal.SIGTERM:
        return
    sys.exit(0)
for s in (signal.SIGTERM, signal.SIGQUIT):
    signal.signal(s, got)
if mode == "idle":
    (local / "log" / "StartLog").write_text("11/28/26 09:00:00 No resources have been claimed for 5 seconds\\n")
    sys.exit(99)
if mode == "startd-died":
    sys.exit(99)
if mode == "crash":
    sys.exit(4)
if mode == "auth-fail":
    (local / "log" / "StartLog").write_text(
        "11/28/26 09:00:00 ERROR: AUTHENTICATE:1003:Failed to authenticate with any method\\n")
if mode == "term-parent":
    os.kill(os.getppid(), signal.SIGTERM)
while True:
    signal.pause()
"""

FAKE_STATUS = """\
import os, sys
from pathlib import Path
local = Path(os.environ["CONDOR_CONFIG"]).parent
(local / "status-env").write_text("\\n".join(f"{k}={v}" for k, v in os.environ.items()))
mode = os.environ.get("FAKE_STATUS_MODE", "empty")
if mode == "joined":
    print("slot1@pilot-abc")
elif mode == "denied":
    print("ERROR: AUTHENTICATE:1003:Failed to authenticate with any method", file=sys.stderr)
    sys.exit(1)
"""


def script(path: Path, body: str) -> str:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(autouse=True)
def _sigterm_handler_restored():
    """main() and the tests install SIGTERM handlers in this process: put pytest's back."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    monkeypatch.setattr(ep, "CONDOR_MASTER", script(tmp_path / "condor_master", FAKE_MASTER))
    monkeypatch.setattr(ep, "CONDOR_STATUS", script(tmp_path / "condor_status", FAKE_STATUS))
    monkeypatch.setattr(ep, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(ep, "JOIN_QUERY_EVERY", 0.1)
    monkeypatch.setattr(ep, "QUIT_SECONDS", 0.5)


@pytest.fixture
def collector():
    """A listening TCP socket: a collector that accepts connections."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


def supervisor(tmp_path, collector: str, master: str, status: str = "empty", **env: str) -> ep.Supervisor:
    """A prepared pilot (config and token written) with its fake master's and query's modes."""
    base = pilot_env(tmp_path, CE_K8S_PILOT_COLLECTOR=collector, **env)
    s = pc.settings_from_env(base)
    token = pc.read_token(s.token_file)
    config = ep.prepare(s, Size(2, 4096, 0, {"cpus": "env", "memory": "env"}), token, "id1")
    child = ep.child_environment({**base, "FAKE_MASTER_MODE": master, "FAKE_STATUS_MODE": status,
                                  "PATH": os.environ["PATH"]}, token, config)
    return ep.Supervisor(s, child, "id1")


def record(sup: ep.Supervisor) -> list[str]:
    try:
        return (sup.s.local_dir / "master-record").read_text().split()
    except FileNotFoundError:
        return []


# ------------------------------------------------------------------ the exit codes
def test_the_exit_code_table_is_the_documented_one():
    """docs/pilot.md's table and the module docstring's list the codes of `Exit`, and nothing else."""
    expected = {(int(e), e.name) for e in ep.Exit}
    doc = (REPO / "docs" / "pilot.md").read_text()
    rows = set(re.findall(r"^\| (\d+) \| `(\w+)` \|", doc, re.MULTILINE))
    assert {(int(c), n) for c, n in rows} == expected
    in_docstring = set(re.findall(r"^(\d+)\s+([A-Z]+)\s{2,}", ep.__doc__, re.MULTILINE))
    assert {(int(c), n) for c, n in in_docstring} == expected
    assert ep.Exit.SIGTERM == 128 + signal.SIGTERM      # what Kubernetes shows for a SIGTERM'd container
    assert len({int(e) for e in ep.Exit}) == len(ep.Exit)


def test_idle_shutdown_is_zero(tmp_path, fakes, collector):
    sup = supervisor(tmp_path, collector, "idle")
    assert sup.run() is ep.Exit.IDLE


def test_startd_gone_without_idle_shutdown_is_a_failure(tmp_path, fakes, collector):
    assert supervisor(tmp_path, collector, "startd-died").run() is ep.Exit.FAILED


def test_master_failure(tmp_path, fakes, collector):
    assert supervisor(tmp_path, collector, "crash").run() is ep.Exit.FAILED


def test_joined_then_sigterm_is_forwarded_and_143(tmp_path, fakes, collector, capsys):
    """The real signal path: the pod's SIGTERM reaches the supervisor's handler, which forwards it."""
    sup = supervisor(tmp_path, collector, "term-parent", status="joined")
    previous = signal.signal(signal.SIGTERM, sup.on_sigterm)
    try:
        assert sup.run() is ep.Exit.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert record(sup) == ["SIGTERM"]                 # graceful: the master got SIGTERM, not SIGQUIT
    assert "SIGTERM: shutting the startd down gracefully" in capsys.readouterr().err


def test_a_master_that_ignores_sigterm_gets_sigquit_after_the_grace(tmp_path, fakes, collector):
    sup = supervisor(tmp_path, collector, "ignore-term", status="joined", CE_K8S_PILOT_GRACE_SECONDS="1")
    sup.terminated = True
    started = time.monotonic()
    assert sup.run() is ep.Exit.SIGTERM
    assert record(sup) == ["SIGTERM", "SIGQUIT"]
    assert time.monotonic() - started >= 1


def test_deadline(tmp_path, fakes, collector, capsys):
    sup = supervisor(tmp_path, collector, "wait", status="joined")
    now = time.time()
    sup.s = dataclasses.replace(sup.s, times=pc.Times(now, now + 1, now + 1))
    assert sup.run() is ep.Exit.DEADLINE
    assert record(sup) == ["SIGTERM"]                 # graceful: jobs are vacated
    err = capsys.readouterr().err
    assert "GLIDEIN_ToDie reached" in err
    assert err.count("joined the collector") == 1     # seen once, then no more queries


def test_a_startd_gone_after_todie_is_the_deadline(tmp_path, fakes, collector, capsys):
    """STARTD.DAEMON_SHUTDOWN may stop the startd before the supervisor's own clock says ToDie."""
    sup = supervisor(tmp_path, collector, "startd-died")
    now = time.time()
    sup.s = dataclasses.replace(sup.s, times=pc.Times(now, now + 3000, now + 3600))
    # ToDie passes when the master is gone: the loop never saw it, the end does
    sup.clock = lambda: now + 3601 if sup.master.poll() is not None else now
    assert sup.run() is ep.Exit.DEADLINE
    assert record(sup) == []
    assert "the startd shut itself down before the pod's deadline" in capsys.readouterr().err


# ------------------------------------------------------------------ failing fast
def test_a_refused_token_fails_fast_with_its_reason(tmp_path, fakes, collector, capsys):
    sup = supervisor(tmp_path, collector, "auth-fail", CE_K8S_PILOT_JOIN_TIMEOUT="600")
    started = time.monotonic()
    assert sup.run() is ep.Exit.TOKEN
    assert time.monotonic() - started < 30            # long before the join timeout
    assert record(sup) == ["SIGQUIT"]                  # fast: nothing can run yet
    err = capsys.readouterr().err
    assert "refused the pilot's token: " in err and "AUTHENTICATE:1003" in err


def test_a_query_refused_for_the_token_fails_fast(tmp_path, fakes, collector):
    sup = supervisor(tmp_path, collector, "wait", status="denied", CE_K8S_PILOT_JOIN_TIMEOUT="600")
    assert sup.run() is ep.Exit.TOKEN


def test_an_unreachable_collector(tmp_path, fakes, closed_port, capsys):
    sup = supervisor(tmp_path, closed_port, "wait", CE_K8S_PILOT_JOIN_TIMEOUT="1")
    assert sup.run() is ep.Exit.COLLECTOR
    assert record(sup) == ["SIGQUIT"]
    assert "is unreachable (Connection refused) after 1 s" in capsys.readouterr().err


def test_an_ad_that_never_arrives(tmp_path, fakes, collector, capsys):
    sup = supervisor(tmp_path, collector, "wait", status="empty", CE_K8S_PILOT_JOIN_TIMEOUT="1")
    assert sup.run() is ep.Exit.COLLECTOR
    assert "did not reach the collector" in capsys.readouterr().err


# ------------------------------------------------------------------ the token never in the environment
def test_child_environment_drops_condor_overrides_and_the_token(tmp_path):
    token = pc.Token(jwt(), "IDTOKENS", {})
    env = {"PATH": "/usr/bin", "_CONDOR_START": "True", "_condor_SEC_TOKEN": "x", "CONDOR_CONFIG": "/etc/other",
           "LEAKED": f"Bearer {jwt()}", "KEEP": "1"}
    out = ep.child_environment(env, token, tmp_path / "condor_config")
    assert out == {"PATH": "/usr/bin", "KEEP": "1", "CONDOR_CONFIG": str(tmp_path / "condor_config")}


def test_the_master_and_the_query_never_see_the_token(tmp_path, fakes, collector):
    sup = supervisor(tmp_path, collector, "wait", status="joined")
    sup.env["SMUGGLED"] = jwt()      # would a pod's variable holding the token reach them? child_environment says no
    sup.env = ep.child_environment(sup.env, pc.Token(jwt(), "IDTOKENS", {}), sup.s.local_dir / "condor_config")
    now = time.time()
    sup.s = dataclasses.replace(sup.s, times=pc.Times(now, now + 1, now + 1))
    assert sup.run() is ep.Exit.DEADLINE       # after the query saw the ad
    for name in ("master-env", "status-env"):
        seen = (sup.s.local_dir / name).read_text()
        assert jwt() not in seen and "CONDOR_CONFIG=" in seen
    copy = pc.token_path(sup.s)
    assert copy.read_text().strip() == jwt()
    assert copy.stat().st_mode & 0o777 == 0o600 and copy.parent.stat().st_mode & 0o777 == 0o700
    assert jwt() not in (sup.s.local_dir / "condor_config").read_text()


def test_main_refuses_a_token_in_the_environment(tmp_path, capsys):
    env = pilot_env(tmp_path, CE_K8S_PILOT_TOKEN_FILE=jwt())
    assert ep.main(env) == ep.Exit.TOKEN
    err = capsys.readouterr().err
    assert "never put in the environment" in err and jwt() not in err


# ------------------------------------------------------------------ main's early exits
def test_main_configuration_errors(tmp_path, capsys):
    assert ep.main({"CE_K8S_PILOT_TOKEN_FILE": "/x"}) == ep.Exit.CONFIG
    assert "CE_K8S_PILOT_COLLECTOR is not set" in capsys.readouterr().err
    assert ep.main(pilot_env(tmp_path, CE_K8S_PILOT_CPUS="many")) == ep.Exit.CONFIG


def test_main_token_missing(tmp_path, capsys):
    assert ep.main(pilot_env(tmp_path, CE_K8S_PILOT_TOKEN_FILE=str(tmp_path / "none"))) == ep.Exit.TOKEN
    assert "does not exist (is the Secret mounted?)" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is of root")
def test_main_refuses_to_run_as_root(tmp_path, capsys):
    assert ep.main(pilot_env(tmp_path)) == ep.Exit.CONFIG
    assert "refusing to run as root" in capsys.readouterr().err
    assert not (tmp_path / "scratch" / "pilot").exists()     # nothing written, nothing started


def test_the_launcher_imports_the_entry_point(tmp_path):
    """The image's launcher (pilotimage.LAUNCHER_TEXT) finds the package where the image puts it."""
    from ce_k8s.real.node import pilotimage

    assert "sys.path.insert(0, \"/opt/ce-k8s/lib\")" in pilotimage.LAUNCHER_TEXT
    assert textwrap.dedent(pilotimage.LAUNCHER_TEXT).startswith("#!/usr/bin/python3 -I\n")
    assert "from ce_k8s.pilot.entrypoint import main" in pilotimage.LAUNCHER_TEXT
