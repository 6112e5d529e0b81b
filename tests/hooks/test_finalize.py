"""Finalize: pod stdout/stderr into the job's Out/Err in the spool, safely (docs/hook-protocol.md §2.4)."""

from __future__ import annotations

import os

from ce_k8s import protocol
from ce_k8s.condor import wire

from .conftest import run_hook, source_ad


def setup_spool(tmp_path, uid=None):
    spool = tmp_path / "spool"
    iwd = spool / "4711" / "0" / "cluster4711.proc0.subproc0"
    iwd.mkdir(parents=True)
    for p in (tmp_path, spool, spool / "4711", spool / "4711" / "0"):
        os.chmod(p, 0o755)
    if uid is not None:
        os.chown(iwd, uid, uid)
    return spool, iwd


def stdin_for(iwd, grid_resource="batch k8s", **extra):
    src = source_ad(Iwd=str(iwd), **extra)
    dest = source_ad(K8sPodName="ce-4711-0-a0-0123456789", JobUniverse=9, GridResource=grid_resource)
    return wire.finalize_stdin(src, dest)


def test_writes_out_and_err(hook_dir, stub_agent, tmp_path):
    spool, iwd = setup_spool(tmp_path)
    stub_agent.reply = (protocol.STATUS_OK, [str(spool).encode(), b"pilot stdout\n" * 1000, b"pilot stderr\n"])
    res = run_hook(hook_dir, "finalize", stdin_for(iwd), {"CE_K8S_SOCKET": stub_agent.path})
    assert res.returncode == 0 and res.stdout == b"", res.stderr
    assert (iwd / "_condor_stdout").read_bytes() == b"pilot stdout\n" * 1000
    assert (iwd / "_condor_stderr").read_bytes() == b"pilot stderr\n"
    verb, payload, _ = stub_agent.requests[-1]
    assert verb == "logs" and b"K8sPodName" in payload and b"ce-4711-0-a0-0123456789" in payload


def test_refuses_symlink_and_escape_but_exits_zero(hook_dir, stub_agent, tmp_path):
    """A symlink planted in the spool must not redirect the write; exit 0 anyway (no re-run, hook-protocol.md §2.4)."""
    spool, iwd = setup_spool(tmp_path)
    target = tmp_path / "victim"
    target.write_text("precious")
    (iwd / "_condor_stdout").symlink_to(target)
    stub_agent.reply = (protocol.STATUS_OK, [str(spool).encode(), b"evil", b"err"])
    res = run_hook(hook_dir, "finalize", stdin_for(iwd, Err="../../../../victim2"),
                   {"CE_K8S_SOCKET": stub_agent.path})
    assert res.returncode == 0
    assert target.read_text() == "precious"
    assert not (tmp_path / "victim2").exists()
    assert b"not writing" in res.stderr


def test_same_file_for_out_and_err(hook_dir, stub_agent, tmp_path):
    spool, iwd = setup_spool(tmp_path)
    stub_agent.reply = (protocol.STATUS_OK, [str(spool).encode(), b"OUT", b"ERR"])
    res = run_hook(hook_dir, "finalize", stdin_for(iwd, Err="_condor_stdout"), {"CE_K8S_SOCKET": stub_agent.path})
    assert res.returncode == 0
    assert (iwd / "_condor_stdout").read_bytes() == b"OUTERR"


def test_agent_unreachable_or_pod_gone_still_exit_zero(hook_dir, stub_agent, tmp_path):
    """Exit != 0 would re-run the pilot (RerouteJob, hook-protocol.md §2.4): a lost log is the milder failure."""
    _spool, iwd = setup_spool(tmp_path)
    res = run_hook(hook_dir, "finalize", stdin_for(iwd), {"CE_K8S_SOCKET": str(tmp_path / "none.sock")})
    assert res.returncode == 0 and res.stdout == b""
    stub_agent.reply = (protocol.STATUS_NOTFOUND, [b"no pod"])
    res = run_hook(hook_dir, "finalize", stdin_for(iwd), {"CE_K8S_SOCKET": stub_agent.path})
    assert res.returncode == 0 and not (iwd / "_condor_stdout").exists()


def test_runs_as_job_owner(user_hook_dir, stub_agent, shared_tmp, pilot_user):
    """hook-protocol.md §2.1: the hook runs as the job owner, so the files it writes belong to that user."""
    spool, iwd = setup_spool(shared_tmp, uid=pilot_user.pw_uid)
    stub_agent.reply = (protocol.STATUS_OK, [str(spool).encode(), b"o", b"e"])
    res = run_hook(user_hook_dir, "finalize", stdin_for(iwd), {"CE_K8S_SOCKET": stub_agent.path},
                   user=pilot_user.pw_name)
    assert res.returncode == 0, res.stderr
    assert (iwd / "_condor_stdout").stat().st_uid == pilot_user.pw_uid
    assert stub_agent.requests[-1][2] == pilot_user.pw_uid     # SO_PEERCRED sees the owner


def test_agent_restarting_is_retried_within_the_deadline(hook_dir, shared_tmp):
    """The agent is down when finalize starts and back 1.5 s later: the output still arrives
    (docs/hook-protocol.md §2.4: the hook has no second chance, so it retries within its deadline)."""
    import threading

    from .conftest import StubAgent

    spool, iwd = setup_spool(shared_tmp)
    sock = str(shared_tmp / "late.sock")
    agents = []

    def come_back():
        agents.append(StubAgent(sock, reply=(protocol.STATUS_OK, [str(spool).encode(), b"late but complete\n", b""])))
    timer = threading.Timer(1.5, come_back)
    timer.start()
    try:
        res = run_hook(hook_dir, "finalize", stdin_for(iwd), {"CE_K8S_SOCKET": sock, "CE_K8S_HOOK_TIMEOUT": "8"})
    finally:
        timer.join()
        for a in agents:
            a.close()
    assert res.returncode == 0, res.stderr
    out = iwd / "_condor_stdout"
    assert out.exists() and out.read_bytes() == b"late but complete\n", res.stderr


def test_busy_agent_is_retried(hook_dir, stub_agent, tmp_path):
    """`busy` (the agent still lists pods after a restart) is worth another try; hook-protocol.md §2.4 gives none."""
    import threading
    import time

    spool, iwd = setup_spool(tmp_path)
    stub_agent.reply = (protocol.STATUS_BUSY, [b"agent is still listing pods"])

    def switch():
        while not stub_agent.requests:
            time.sleep(0.01)
        stub_agent.reply = (protocol.STATUS_OK, [str(spool).encode(), b"out", b"err"])
    t = threading.Thread(target=switch)
    t.start()
    res = run_hook(hook_dir, "finalize", stdin_for(iwd), {"CE_K8S_SOCKET": stub_agent.path})
    t.join()
    assert res.returncode == 0 and len(stub_agent.requests) >= 2
    assert (iwd / "_condor_stdout").read_bytes() == b"out"


def test_agent_never_reachable_exits_zero_with_empty_out_and_a_note(hook_dir, tmp_path):
    """The milder outcome of hook-protocol.md §2.4 (docs/install.md "Output return"): exit 0, the pilot is not re-run;
    `Out` exists (empty) for stage-out and `Err` says why."""
    import time

    spool, iwd = setup_spool(tmp_path)
    t0 = time.monotonic()
    res = run_hook(hook_dir, "finalize", stdin_for(iwd), {"CE_K8S_SOCKET": str(tmp_path / "none.sock"),
                                                         "CE_K8S_HOOK_TIMEOUT": "2", "CE_K8S_SPOOL": str(spool)})
    elapsed = time.monotonic() - t0
    assert res.returncode == 0 and res.stdout == b""
    assert 1.0 < elapsed < 4.0                       # it did retry, and it stayed within its deadline
    assert (iwd / "_condor_stdout").read_bytes() == b""
    assert b"agent was unreachable" in (iwd / "_condor_stderr").read_bytes()
    assert b"gave up" in res.stderr


def test_another_backends_job_is_left_alone_without_the_agent(hook_dir, tmp_path):
    """docs/routes.md "CEs with other backends": the routed ad's GridResource (after the separator)
    is `batch slurm`, so finalize exits 0 at once: no agent call (the socket does not exist), no
    retries, and above all no empty `Out` or ce-k8s note written over the Slurm job's own files."""
    import time

    spool, iwd = setup_spool(tmp_path)
    stdin = stdin_for(iwd, grid_resource="batch slurm")
    assert b"GridResource" not in stdin.split(b"\n------\n")[0]     # decided from the routed half
    t0 = time.monotonic()
    res = run_hook(hook_dir, "finalize", stdin, {"CE_K8S_SOCKET": str(tmp_path / "none.sock"),
                                                 "CE_K8S_HOOK_TIMEOUT": "3", "CE_K8S_SPOOL": str(spool)})
    assert time.monotonic() - t0 < 2.0
    assert (res.returncode, res.stdout, res.stderr) == (0, b"", b"")
    assert not (iwd / "_condor_stdout").exists() and not (iwd / "_condor_stderr").exists()


def test_finalize_follows_the_grid_resource_knob(hook_dir, stub_agent, tmp_path):
    """With CE_K8S_GRID_RESOURCE = `batch slurm` the Slurm-routed job is the one finalize handles."""
    spool, iwd = setup_spool(tmp_path)
    stub_agent.reply = (protocol.STATUS_OK, [str(spool).encode(), b"o", b"e"])
    env = {"CE_K8S_SOCKET": stub_agent.path, "CE_K8S_GRID_RESOURCE": "batch slurm"}
    res = run_hook(hook_dir, "finalize", stdin_for(iwd), env)
    assert res.returncode == 0 and stub_agent.requests == [] and not (iwd / "_condor_stdout").exists()
    res = run_hook(hook_dir, "finalize", stdin_for(iwd, grid_resource="batch slurm"), env)
    assert res.returncode == 0 and stub_agent.requests[-1][0] == "logs"
    assert (iwd / "_condor_stdout").read_bytes() == b"o"


def test_a_second_finalize_keeps_the_delivered_output(hook_dir, stub_agent, tmp_path):
    """A real HTCondor 23.9 router can run finalize again for a job it already finalized (it adopts
    the finished routed job again as an orphan, JobRouter.cpp AdoptOrphans). By then the agent has
    dropped its saved copy and answers `notfound`; the delivered `Out` and `Err` stay byte for byte,
    and the JobRouterLog gets one line saying why nothing was written."""
    spool, iwd = setup_spool(tmp_path)
    env = {"CE_K8S_SOCKET": stub_agent.path, "CE_K8S_SPOOL": str(spool)}
    stub_agent.reply = (protocol.STATUS_OK, [str(spool).encode(), b"pilot stdout\n" * 100, b"pilot stderr\n"])
    res = run_hook(hook_dir, "finalize", stdin_for(iwd), env)
    assert res.returncode == 0, res.stderr
    out, err = (iwd / "_condor_stdout").read_bytes(), (iwd / "_condor_stderr").read_bytes()
    assert out == b"pilot stdout\n" * 100 and err == b"pilot stderr\n"

    stub_agent.reply = (protocol.STATUS_NOTFOUND, [b"no pod and no saved output"])
    res = run_hook(hook_dir, "finalize", stdin_for(iwd), env)
    assert (res.returncode, res.stdout) == (0, b"")
    assert stub_agent.requests[-1][0] == "logs"
    assert (iwd / "_condor_stdout").read_bytes() == out
    assert (iwd / "_condor_stderr").read_bytes() == err
    kept = [line for line in res.stderr.splitlines() if b"already holds" in line]
    assert len(kept) == 1 and b"leaving Out and Err as they are" in kept[0], res.stderr


def test_notfound_without_output_still_leaves_a_note(hook_dir, stub_agent, tmp_path):
    """The rule above is about `Out` only: with no `Out` (or an empty one) a `notfound` finalize
    still creates an empty `Out` and puts the note into `Err`, whatever `Err` held."""
    spool, iwd = setup_spool(tmp_path)
    env = {"CE_K8S_SOCKET": stub_agent.path, "CE_K8S_SPOOL": str(spool)}
    stub_agent.reply = (protocol.STATUS_NOTFOUND, [b"no pod and no saved output"])
    (iwd / "_condor_stderr").write_bytes(b"something from before\n")
    for _ in range(2):                      # the second run finds the empty Out the first one made
        res = run_hook(hook_dir, "finalize", stdin_for(iwd), env)
        assert (res.returncode, res.stdout) == (0, b"")
        assert (iwd / "_condor_stdout").read_bytes() == b""
        assert (iwd / "_condor_stderr").read_bytes() == (
            b"ce-k8s: the pilot's output could not be returned: neither the pod nor a saved copy of its log exists\n")
        assert b"already holds" not in res.stderr
