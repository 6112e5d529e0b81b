"""`protocol.ask`: the one agent call of every client (the hooks, `ce-k8s status`, `doctor`, `info`).

Against a real Unix-socket server in the test: a whole reply is read and the connection closed; a
status other than `ok` is an answer, not an exception; no agent (no socket file, or a socket
nobody listens on) and a silent agent raise what `protocol.call` raises, unchanged, within the
caller's timeout. Each client then words that as it always has: the update hook exits 1, "no sync
this cycle" (docs/hook-protocol.md §2.3), cleanup exits 1 to be retried (docs/hook-protocol.md
§2.5), finalize exits 0 (docs/hook-protocol.md §2.4), every one within its deadline
(docs/hook-protocol.md §8); `status`, `doctor` and `info` name the socket (docs/operations.md,
docs/information-provider.md). The expected lines below are the clients' own format strings, so a
client that drifts from them fails here.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time

import pytest

from ce_k8s import protocol
from ce_k8s.condor import wire
from ce_k8s.info.snapshot import SourceUnavailable, ping_agent
from ce_k8s.ops import doctor, status

from .conftest import run_hook, source_ad

IO_TIMEOUT = 10.0           # a bound for the test server's own reads, never reached when all is well
SHORT = 0.5                 # the clients' timeout where the test makes them wait for a silent agent
ROUTED_AD = source_ad(K8sPodName="ce-4711-0-a0-0123456789", K8sAttempt=0, GridResource="batch k8s", JobUniverse=9)
ROUTED = wire.sprint_ad(ROUTED_AD).encode()


def raised_by_ask(path: str, timeout: float) -> BaseException:
    """What `protocol.ask` raises for `path` (it must raise: no agent answers there)."""
    with pytest.raises((OSError, protocol.ProtocolError)) as info:
        protocol.ask(path, protocol.VERB_PING, b"", timeout)
    return info.value


@pytest.fixture
def replies(monkeypatch) -> list[protocol.Reply]:
    """Every `protocol.Reply` that `protocol.call` hands to `ask`, to see what became of its socket."""
    seen: list[protocol.Reply] = []
    real_call = protocol.call

    def spy(*args, **kwargs):
        seen.append(real_call(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(protocol, "call", spy)
    return seen


def test_ask_reads_every_part_and_closes_the_connection(stub_agent, replies):
    """The whole reply, binary parts unchanged, and the socket closed once it is read (the stub
    agent is a real Unix-socket server: tests/hooks/conftest.py `StubAgent`)."""
    stub_agent.reply = (protocol.STATUS_OK, [b"/var/lib/condor-ce/spool", b"out\x00\xff" * 5000, b""])
    answer = protocol.ask(stub_agent.path, protocol.VERB_LOGS, ROUTED, IO_TIMEOUT)
    assert answer.status == protocol.STATUS_OK
    assert answer.parts == [b"/var/lib/condor-ce/spool", b"out\x00\xff" * 5000, b""]
    assert [(verb, payload) for verb, payload, _uid in stub_agent.requests] == [("logs", ROUTED)]
    (reply,) = replies
    assert reply._sock.fileno() == -1                      # closed


def test_a_refusal_is_an_answer_with_its_message(stub_agent, replies):
    """`busy`, `denied`, `error`...: the client decides what they mean; `message()` is the one-line
    part as text, not stripped, and "" when the agent sent no part."""
    stub_agent.reply = (protocol.STATUS_BUSY, [b"still listing pods \xe2\x80\x94 wait\n"])
    answer = protocol.ask(stub_agent.path, protocol.VERB_PING, b"", IO_TIMEOUT)
    assert (answer.status, answer.message()) == (protocol.STATUS_BUSY, "still listing pods \u2014 wait\n")
    stub_agent.reply = (protocol.STATUS_ERROR, [])
    answer = protocol.ask(stub_agent.path, protocol.VERB_PING, b"", IO_TIMEOUT)
    assert (answer.status, answer.parts, answer.message()) == (protocol.STATUS_ERROR, [], "")
    assert [r._sock.fileno() for r in replies] == [-1, -1]


def test_a_reply_cut_short_raises_and_closes_the_connection(tmp_path, replies):
    """An agent that dies mid-reply: ProtocolError, and the socket closed all the same."""
    path = str(tmp_path / "dying.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer_half() -> None:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(IO_TIMEOUT)
            while conn.recv(65536):
                pass
            conn.sendall(protocol.encode_reply(protocol.STATUS_OK, b"x" * 100)[:-50])

    thread = threading.Thread(target=answer_half, daemon=True)
    thread.start()
    try:
        with pytest.raises(protocol.ProtocolError, match="closed the connection early"):
            protocol.ask(path, protocol.VERB_UPDATE, ROUTED, IO_TIMEOUT)
    finally:
        thread.join(IO_TIMEOUT)
        server.close()
    (reply,) = replies
    assert reply._sock.fileno() == -1


def test_an_unknown_verb_is_refused_before_connecting(stub_agent):
    """`info`'s proposed `snapshot` verb is not in VERBS: a ProtocolError, and the agent never asked."""
    with pytest.raises(protocol.ProtocolError, match="unknown verb"):
        protocol.ask(stub_agent.path, "snapshot", b"", IO_TIMEOUT)
    assert stub_agent.requests == []


def _no_socket(tmp_path) -> str:
    return str(tmp_path / "absent.sock")


def _nobody_listening(tmp_path) -> str:
    """A socket file left by an agent that died: connecting is refused."""
    path = str(tmp_path / "dead.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    dead.close()
    return path


def client_lines(hook_dir, tmp_path, path: str, timeout: float) -> dict[str, tuple[object, str]]:
    """What each client of the agent makes of `path`: (exit code or level, its line). Finalize is
    given no spool (no hooks.conf, no CE_K8S_SPOOL), so its only output is the line."""
    env = {"CE_K8S_SOCKET": path, "CE_K8S_HOOK_TIMEOUT": f"{timeout:g}",
           "CE_K8S_HOOKS_CONF": str(tmp_path / "no-hooks.conf")}
    out: dict[str, tuple[object, str]] = {}
    for name, stdin in (("update", ROUTED), ("cleanup", ROUTED),
                        ("finalize", wire.finalize_stdin(source_ad(Iwd=str(tmp_path)), ROUTED_AD))):
        res = run_hook(hook_dir, name, stdin, env)
        assert res.stdout == b"", name
        out[name] = (res.returncode, res.stderr.decode())
    with pytest.raises(status.StatusError) as stat_err:
        status.rows_from_agent(path, timeout=timeout)
    out["status"] = (None, str(stat_err.value))
    with pytest.raises(SourceUnavailable) as info_err:
        ping_agent(path, timeout=timeout)
    out["info"] = (None, str(info_err.value))
    ctx = doctor.Context(args=argparse.Namespace(socket=path), timeout=timeout)
    doctor.check_agent(ctx)
    (result,) = ctx.results
    out["doctor"] = (result.level, result.message)
    return out


@pytest.mark.parametrize("where", [_no_socket, _nobody_listening], ids=["no-socket", "refused"])
def test_agent_not_running_each_client_says_so_in_its_own_words(hook_dir, tmp_path, where):
    path = where(tmp_path)
    exc = raised_by_ask(path, IO_TIMEOUT)
    assert isinstance(exc, FileNotFoundError if where is _no_socket else ConnectionRefusedError)
    lines = client_lines(hook_dir, tmp_path, path, 1.0)
    assert lines["update"] == (1, f"ce-k8s: agent at {path} unreachable: {exc}; no sync this cycle\n")
    assert lines["cleanup"] == (1, f"ce-k8s: agent at {path} unreachable: {exc}; cleanup will be retried\n")
    code, text = lines["finalize"]        # retried with back-off until the deadline, then given up
    assert code == 0 and text.startswith(f"ce-k8s: job 4711.0: agent at {path} unreachable ({exc}); gave up after ")
    assert lines["status"] == (None, f"agent {path}: {status.short(exc)}")
    assert lines["info"] == (None, f"agent {path}: {status.short(exc)}")
    if where is _no_socket:       # doctor looks at the socket file before it asks
        assert lines["doctor"] == (doctor.FAIL, f"{path}: No such file or directory: the agent is not running, "
                                                "so every update hook fails")
    else:
        assert lines["doctor"] == (doctor.FAIL, f"{path}: no answer to ping: {status.short(exc)}")


def test_a_silent_agent_times_out_within_each_clients_timeout(hook_dir, tmp_path):
    """A socket that accepts connections (the kernel's backlog) and never answers: the call gives
    up at its deadline, not at the hook's alarm or never (docs/hook-protocol.md §8)."""
    path = str(tmp_path / "silent.sock")
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(path)
    silent.listen(16)
    try:
        started = time.monotonic()
        exc = raised_by_ask(path, SHORT)
        took = time.monotonic() - started
        assert "timed out" in str(exc) and SHORT * 0.9 <= took < SHORT + 2.0, (exc, took)
        lines = client_lines(hook_dir, tmp_path, path, 1.0)
    finally:
        silent.close()
    assert lines["update"] == (1, f"ce-k8s: agent at {path} unreachable: {exc}; no sync this cycle\n")
    assert lines["cleanup"] == (1, f"ce-k8s: agent at {path} unreachable: {exc}; cleanup will be retried\n")
    code, text = lines["finalize"]
    assert code == 0 and text.startswith(f"ce-k8s: job 4711.0: agent at {path} unreachable ({exc}); gave up after ")
    assert lines["status"] == (None, f"agent {path}: {status.short(exc)}")
    assert lines["info"] == (None, f"agent {path}: {status.short(exc)}")
    assert lines["doctor"] == (doctor.FAIL, f"{path}: no answer to ping: {status.short(exc)}")
