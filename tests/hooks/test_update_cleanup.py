"""Update and cleanup hooks: exit codes and output chosen for the mildest consequence.

jobrouter-protocol.md §2.3: update exit != 0 = "no sync this cycle"; a parse error removes the
routed job, so nothing unsafe may be printed. §2.5: cleanup exit != 0 is retried every poll.
"""

from __future__ import annotations

import time

from ce_k8s import protocol
from ce_k8s.condor import wire

from .conftest import run_hook, source_ad

ROUTED = wire.sprint_ad(source_ad(K8sPodName="ce-4711-0-a0-0123456789", K8sAttempt=0)).encode()


def env_for(agent):
    return {"CE_K8S_SOCKET": agent.path, "CE_K8S_HOOK_TIMEOUT": "3"}


def test_update_forwards_ad_and_prints_agent_lines(hook_dir, stub_agent):
    stub_agent.reply = (protocol.STATUS_OK, [b'JobStatus = 2\nGridJobStatus = "RUNNING"\n'])
    res = run_hook(hook_dir, "update", ROUTED, env_for(stub_agent))
    assert res.returncode == 0, res.stderr
    ad = wire.parse_hook_output(res.stdout.decode())
    assert ad["JobStatus"] == 2 and ad["GridJobStatus"] == "RUNNING"
    verb, payload, uid = stub_agent.requests[-1]
    assert verb == "update" and payload == ROUTED and uid == 0


def test_update_nothing_changed_prints_nothing(hook_dir, stub_agent):
    """§2.3: empty stdout with exit 0 is the normal "nothing new" reply."""
    res = run_hook(hook_dir, "update", ROUTED, env_for(stub_agent))
    assert res.returncode == 0 and res.stdout == b""


def test_update_agent_unreachable_means_no_sync(hook_dir, tmp_path):
    """§2.3: exit != 0 = no sync this cycle; never a parse error (which would remove the job)."""
    res = run_hook(hook_dir, "update", ROUTED, {"CE_K8S_SOCKET": str(tmp_path / "nothing.sock")})
    assert res.returncode == 1 and res.stdout == b""
    assert b"unreachable" in res.stderr


def test_update_agent_refusal_means_no_sync(hook_dir, stub_agent):
    for status in (protocol.STATUS_DENIED, protocol.STATUS_BUSY, protocol.STATUS_ERROR):
        stub_agent.reply = (status, [b"why"])
        res = run_hook(hook_dir, "update", ROUTED, env_for(stub_agent))
        assert res.returncode == 1 and res.stdout == b"", status


def test_update_refuses_unsafe_agent_output(hook_dir, stub_agent):
    """§8: never print ClusterId/Owner/JobUniverse/x509*/AuthToken*, comments or broken lines."""
    for bad in (b"ClusterId = 5\n", b"Owner = \"x\"\n", b"x509UserProxySubject = \"x\"\n",
                b"AuthTokenSubject = \"x\"\n", b"# comment\n", b"[ a = 1 ]\n", b"JobUniverse = 9\n",
                b"A =\n", b"'Q' = 1\n"):
        stub_agent.reply = (protocol.STATUS_OK, [b"JobStatus = 1\n" + bad])
        res = run_hook(hook_dir, "update", ROUTED, env_for(stub_agent))
        assert res.returncode == 1 and res.stdout == b"", bad


def test_update_deadline_exits_with_no_sync(hook_dir, stub_agent):
    """The router has no timeout (§0): the hook bounds its own call and exits 1, not by a signal."""
    stub_agent.delay = 3.0
    start = time.monotonic()
    res = run_hook(hook_dir, "update", ROUTED, {"CE_K8S_SOCKET": stub_agent.path, "CE_K8S_HOOK_TIMEOUT": "0.5"})
    assert time.monotonic() - start < 2.5
    assert res.returncode == 1 and res.stdout == b""


def test_update_oversized_stdin_refused_before_calling_agent(hook_dir, stub_agent):
    res = run_hook(hook_dir, "update", b"A = 1\n" * (800 * 1024), env_for(stub_agent))
    assert res.returncode == 1 and stub_agent.requests == []


def test_settings_file_used_when_environment_is_silent(hook_dir, stub_agent, tmp_path):
    """The hooks' own tiny config: used when the router's environment has no CE_K8S_SOCKET."""
    conf = tmp_path / "hooks.conf"
    conf.write_text(f"# test\nCE_K8S_SOCKET = {stub_agent.path}\nCE_K8S_HOOK_TIMEOUT = 2\n")
    res = run_hook(hook_dir, "update", ROUTED, {"CE_K8S_HOOKS_CONF": str(conf)})
    assert res.returncode == 0 and stub_agent.requests


def test_cleanup_ok_and_notfound_are_success(hook_dir, stub_agent):
    """§2.5, §8: "not found" is success."""
    for status in (protocol.STATUS_OK, protocol.STATUS_NOTFOUND):
        stub_agent.reply = (status, [b""])
        res = run_hook(hook_dir, "cleanup", ROUTED, env_for(stub_agent))
        assert res.returncode == 0, status
    assert stub_agent.requests[-1][0] == "cleanup"


def test_cleanup_failure_is_retried(hook_dir, stub_agent, tmp_path):
    """§2.5: non-zero exit = retried on the next poll; that is what we want until the pod is gone."""
    stub_agent.reply = (protocol.STATUS_ERROR, [b"API down"])
    assert run_hook(hook_dir, "cleanup", ROUTED, env_for(stub_agent)).returncode == 1
    res = run_hook(hook_dir, "cleanup", ROUTED, {"CE_K8S_SOCKET": str(tmp_path / "none.sock")})
    assert res.returncode == 1


def test_cleanup_without_pod_name_needs_no_agent(hook_dir, tmp_path):
    """A routed ad that never got our translate output has no pod: nothing to delete."""
    plain = wire.sprint_ad(source_ad()).encode()
    res = run_hook(hook_dir, "cleanup", plain, {"CE_K8S_SOCKET": str(tmp_path / "none.sock")})
    assert res.returncode == 0
