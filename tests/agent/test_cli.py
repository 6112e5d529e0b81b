"""`ce-k8s agent` as a subprocess (how condor_master, systemd and the end-to-end tests run it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ce_k8s import protocol
from ce_k8s.cli import main as cli_main

from .conftest import agent_process, wait

ROOT = Path(__file__).resolve().parents[2]


def test_agent_subprocess_serves_and_stops_on_sigterm(server, tmp_root):
    sock = tmp_root / "run" / "agent.sock"
    with agent_process(server, tmp_root, ROOT / "config.d"):   # SIGTERM at the end must exit 0
        assert oct(sock.stat().st_mode & 0o777) == "0o666"
        assert oct(sock.parent.stat().st_mode & 0o777) == "0o755"
        reply = protocol.call(str(sock), protocol.VERB_PING, b"", time.monotonic() + 5)
        assert reply.status == protocol.STATUS_OK and reply.read_all() == [b"ce-k8s agent"]
        reply.close()
        wait(lambda: server.calls[("list", "pods")] >= 1, timeout=10)
    assert not sock.exists()


def test_install_hooks_writes_fast_launchers(tmp_root, capsys):
    target = tmp_root / "libexec"
    assert cli_main(["agent", "--config", str(ROOT / "config.d"), "--install-hooks", str(target),
                     "--socket", "/run/x/agent.sock"]) == 0
    names = sorted(p.name for p in target.iterdir())
    assert names == ["ce-k8s-cleanup", "ce-k8s-finalize", "ce-k8s-translate", "ce-k8s-update"]
    text = (target / "ce-k8s-update").read_text()
    assert text.startswith(f"#!{sys.executable} -IS\n") and "'/run/x/agent.sock'" in text
    assert os.stat(target / "ce-k8s-update").st_mode & 0o777 == 0o755


def test_staged_hook_package_serves_the_launchers(tmp_root):
    """stage_hook_package: a copy of exactly the hook modules, readable by every account, that the
    launchers can run from (what a private installation gives the pilot accounts)."""
    from ce_k8s.agent.launchers import HOOK_MODULE_FILES, install_hooks, stage_hook_package

    lib = Path(stage_hook_package(str(tmp_root / "lib")))
    files = sorted(str(p.relative_to(lib)) for p in lib.rglob("*") if p.is_file())
    assert files == sorted(HOOK_MODULE_FILES)
    assert all(p.stat().st_mode & 0o777 == (0o755 if p.is_dir() else 0o644) for p in lib.rglob("*"))
    hooks = tmp_root / "hooks"
    install_hooks(str(hooks), socket_path="/nonexistent.sock", hook_timeout=1.0, package_dir=str(lib))
    assert f"sys.path.insert(0, {str(lib)!r})" in (hooks / "ce-k8s-translate").read_text()
    route = b'[ Name = "Slurm"; TargetUniverse = 9; GridResource = "batch slurm" ]'
    ad = b'ClusterId = 1\nProcId = 0\nOwner = "u"\n'
    res = subprocess.run([str(hooks / "ce-k8s-translate")], input=route + b"\n------\n" + ad,
                         capture_output=True, timeout=30, env={})
    assert res.returncode == 0, res.stderr
    assert res.stdout == ad                   # a job of another backend, passed through by the copy


def test_install_hooks_refuses_world_writable_dir(tmp_root):
    """docs/hook-protocol.md §1.1: the router silently ignores hooks in a world-writable directory."""
    from ce_k8s.agent.launchers import install_hooks

    bad = tmp_root / "ww"
    bad.mkdir()
    os.chmod(bad, 0o777)
    with pytest.raises(PermissionError):
        install_hooks(str(bad), socket_path="/s", hook_timeout=1)


def test_hooks_import_only_cheap_modules():
    """docs/design.md Decision 2: the hooks pay every import on every call; stdlib only, and not even json/socket/re."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "import ce_k8s.hooks.update, ce_k8s.hooks.cleanup, ce_k8s.hooks.translate, ce_k8s.pods.names\n"
            "print(' '.join(sorted(sys.modules)))")
    mods = set(subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                              check=True).stdout.split())
    for heavy in ("kubernetes", "classad2", "htcondor2", "yaml", "jsonpatch", "json", "socket", "re", "enum"):
        assert heavy not in mods, heavy
