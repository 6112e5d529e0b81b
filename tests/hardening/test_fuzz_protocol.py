"""The hook ↔ agent socket protocol under hostile peers, on both ends (issue 9 "Fuzzing").

Server side (`ce_k8s.agent.server.HookServer`): every pilot account can connect (the socket is
0666, docs/hook-protocol.md §2.1, §8), so any byte sequence, a huge declared length, a peer that
sends slowly or never finishes, must end in a `bad` reply or a closed connection, and must never
stop the server from answering the next honest hook promptly.

Client side (`ce_k8s.protocol.call` and the update hook as a real process): the hook must exit
within its own deadline whatever the "agent" does (hook-protocol.md §8: "the hook must set its own timeouts on every
network call and must always exit"), and print nothing it is not sure of (hook-protocol.md §2.3: one bad line
removes the routed job).
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ce_k8s import protocol
from ce_k8s.agent import server as agent_server
from ce_k8s.hooks.update import safe_output

from .conftest import hook_env, run_measured

settings.load_profile("hardening")

IO_TIMEOUT = 5.0


# -- header parsers -----------------------------------------------------------------------------

@given(st.one_of(st.binary(max_size=300), st.lists(st.sampled_from(
    [b"CEK8S/1", b" ", b"update", b"ping", b"ok", b"bad", b"0", b"12", b"99999999999999999999", b"-1", b"\n",
     b"\xd9\xa1", b"+5", b" 5", b"1_000", b"\x00"]), max_size=8).map(b"".join)))
def test_header_parsers_result_or_protocolerror(line):
    """Both header parsers: a (verb|status, lengths) within the limits, or ProtocolError."""
    try:
        verb, length = protocol.parse_request_header(line)
        assert verb in protocol.VERBS and 0 <= length <= protocol.MAX_PAYLOAD
    except protocol.ProtocolError as exc:
        assert str(exc)
    try:
        status, lengths = protocol.parse_reply_header(line)
        assert status in protocol.STATUSES and all(0 <= n <= protocol.MAX_REPLY_PART for n in lengths)
    except protocol.ProtocolError as exc:
        assert str(exc)


# -- the server against hostile clients --------------------------------------------------------

@pytest.fixture
def hook_server(tmp_root, monkeypatch):
    """A HookServer with an echo handler and a short read timeout (30 s in production)."""
    monkeypatch.setattr(agent_server, "READ_TIMEOUT", 0.5)
    calls = []

    def handler(verb, payload, uid):
        calls.append((verb, len(payload), uid))
        return protocol.STATUS_OK, [b"echo %d" % len(payload)]

    pool = ThreadPoolExecutor(2)
    srv = agent_server.HookServer(str(tmp_root / "agent.sock"), handler, pool)
    srv.start()
    srv.calls = calls
    yield srv
    srv.stop()
    pool.shutdown(wait=False)


@contextmanager
def raw_client(path: str):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(IO_TIMEOUT)
    s.connect(path)
    try:
        yield s
    finally:
        s.close()


def read_until_close(s: socket.socket, limit: int = 1 << 20) -> bytes:
    data = b""
    while len(data) < limit:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        data += chunk
    return data


def honest_ping(path: str) -> float:
    """Seconds an honest hook waits for a `ping` answer (must stay small under attack)."""
    t0 = time.monotonic()
    reply = protocol.call(path, protocol.VERB_PING, b"", time.monotonic() + IO_TIMEOUT)
    try:
        assert reply.status == protocol.STATUS_OK and reply.read_all() == [b"echo 0"]
    finally:
        reply.close()
    return time.monotonic() - t0


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CEK8S/1 update 99999999999\n",                  # declared length above MAX_PAYLOAD
    b"CEK8S/1 rm -rf / 0\n",                          # unknown verb
    b"CEK8S/1 update -5\n",
    b"CEK8S/2 update 0\n",
    b"\x00" * 100 + b"\n",
    b"CEK8S/1 update 1 2\n",
])
def test_garbage_gets_bad_reply_and_server_lives(hook_server, garbage):
    """A frame that is not CEK8S/1 gets `bad` with a message; nothing reaches the handler."""
    with raw_client(hook_server.path) as s:
        s.sendall(garbage)
        s.shutdown(socket.SHUT_WR)
        reply = read_until_close(s)
    head, _, body = reply.partition(b"\n")
    status, lengths = protocol.parse_reply_header(head)
    assert status == protocol.STATUS_BAD and lengths == [len(body)] and body
    assert hook_server.calls == []
    assert honest_ping(hook_server.path) < 1.0


def test_huge_declared_length_is_refused_without_reading(hook_server):
    """A header announcing 100 MB is answered `bad` at once; the server reads none of it."""
    with raw_client(hook_server.path) as s:
        s.sendall(b"CEK8S/1 update %d\n" % (100 * 1024 * 1024))
        t0 = time.monotonic()
        reply = read_until_close(s)
        assert time.monotonic() - t0 < 1.0
    assert reply.startswith(b"CEK8S/1 bad ") and b"exceeds" in reply


def test_header_without_newline_is_cut_off(hook_server):
    """1 MB with no newline: the server stops reading (StreamReader limit) and closes."""
    with raw_client(hook_server.path) as s:
        try:
            s.sendall(b"A" * (1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            pass
        read_until_close(s)
    assert hook_server.calls == []
    assert honest_ping(hook_server.path) < 1.0


def test_slow_and_stalled_peers_are_dropped_and_never_block_others(hook_server):
    """Peers that connect and say nothing, trickle a header, or never send the promised payload
    are closed after READ_TIMEOUT; meanwhile honest hooks are answered at once."""
    stalled = []
    for opening in (b"", b"CEK8S/1 upd", b"CEK8S/1 update 100\n" + b"x" * 10):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(IO_TIMEOUT)
        s.connect(hook_server.path)
        if opening:
            s.sendall(opening)
        stalled.append(s)
    many = []
    for _ in range(200):                       # a crowd of idle connections
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(hook_server.path)
        many.append(s)
    try:
        assert honest_ping(hook_server.path) < 1.0
        t0 = time.monotonic()
        for s in stalled:
            assert read_until_close(s) == b""      # closed without a reply (payload never came)
        assert time.monotonic() - t0 < 0.5 + 2.0
        assert hook_server.calls == [("ping", 0, hook_server.calls[0][2])]
    finally:
        for s in stalled + many:
            s.close()
    assert honest_ping(hook_server.path) < 1.0


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=200), st.builds(
    lambda verb, n, body: b"CEK8S/1 %s %d\n%s" % (verb, n, body),
    st.sampled_from([b"update", b"ping", b"logs", b"cleanup", b"nope"]),
    st.integers(0, 64), st.binary(max_size=64))))
def test_any_bytes_end_in_a_valid_reply_or_close(hook_server, data):
    """Random frames (half-closed after sending): the reply, if any, is a well-formed CEK8S/1 reply."""
    with raw_client(hook_server.path) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        reply = read_until_close(s)
    if reply:
        head, _, body = reply.partition(b"\n")
        _status, lengths = protocol.parse_reply_header(head)
        assert sum(lengths) == len(body)


# -- the client (hook side) against a hostile agent ------------------------------------------

@contextmanager
def fake_agent(path: str, behaviour):
    """A one-thread Unix server that runs `behaviour(conn)` for every connection."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    srv.settimeout(0.1)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    def serve_one(conn):
        conn.settimeout(IO_TIMEOUT)
        try:
            behaviour(conn, stop)
        except OSError:
            pass
        finally:
            conn.close()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(2)
        srv.close()


def _silent(conn, stop):
    stop.wait(IO_TIMEOUT)


def _garbage(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")


def _long_header(conn, stop):
    conn.sendall(b"CEK8S/1 ok " + b"1" * 10_000)
    stop.wait(IO_TIMEOUT)


def _huge_part(conn, stop):
    conn.sendall(b"CEK8S/1 ok %d\n" % (protocol.MAX_REPLY_PART + 1))


def _short_part(conn, stop):
    conn.sendall(b"CEK8S/1 ok 1000\nJobStatus = 2\n")


def _trickle(conn, stop):
    conn.sendall(b"CEK8S/1 ok 100\n")
    for _ in range(100):
        if stop.wait(0.2):
            return
        conn.sendall(b" ")


def _endless_header(conn, stop):
    while not stop.is_set():
        conn.sendall(b"CEK8S/1 ")
        time.sleep(0.01)


HOSTILE_AGENTS = {"silent": _silent, "garbage": _garbage, "long header": _long_header, "huge part": _huge_part,
                  "short part": _short_part, "trickle": _trickle, "endless header": _endless_header}


@pytest.mark.parametrize("name", sorted(HOSTILE_AGENTS))
def test_client_call_is_bounded_by_its_deadline(tmp_root, name):
    """protocol.call + read_all: ProtocolError/OSError, never a hang past the deadline (hook-protocol.md §8)."""
    path = str(tmp_root / "fake.sock")
    with fake_agent(path, HOSTILE_AGENTS[name]):
        t0 = time.monotonic()
        with pytest.raises((protocol.ProtocolError, OSError)):
            reply = protocol.call(path, protocol.VERB_UPDATE, b"A = 1\n", time.monotonic() + 1.0)
            try:
                reply.read_all()
            finally:
                reply.close()
        assert time.monotonic() - t0 < 1.5


@pytest.mark.parametrize("name", sorted(HOSTILE_AGENTS))
def test_update_hook_process_exits_quietly_whatever_the_agent_does(tmp_root, launchers, name):
    """The update hook as a real process: exit 1 ("no sync this cycle", hook-protocol.md §2.3), empty stdout, and
    within its deadline, for every misbehaving agent. The routed ad is a Kubernetes job's
    (`GridResource = "batch k8s"`): any other job is passed through without asking the agent
    (docs/routes.md, "CEs with other backends"), and this test is about asking it."""
    path = str(tmp_root / "fake.sock")
    routed = b'GridResource = "batch k8s"\nK8sPodName = "p"\nOwner = "x"\n'
    with fake_agent(path, HOSTILE_AGENTS[name]):
        t0 = time.monotonic()
        res = run_measured([str(launchers / "ce-k8s-update")], [routed],
                           env=hook_env(path, timeout=1.0), timeout=10)
        took = time.monotonic() - t0
    assert (res.returncode, res.stdout) == (1, b""), res.stderr
    assert took < 3.0
    assert b"no sync this cycle" in res.stderr


UNSAFE_REPLIES = [
    b'HoldReason = "unterminated\n',                  # the router's parser refuses it → job removed
    b'A = "x" "y"\n',
    b"A = [\n",
    b'A = "ends with backslash\\"\n',
    b"A = 1 2\n",
    b'JobStatus = 2\nOwner = "root"\n',                # schedd-owned attribute (hook-protocol.md §2.3)
    b'x509UserProxySubject = "/CN=x"\n',
    b"JobStatus = 2\r\n",
    b"JobStatus\n",
    b"'quoted' = 1\n",
]


@pytest.mark.parametrize("body", UNSAFE_REPLIES)
def test_update_hook_never_prints_a_line_the_router_would_refuse(body):
    """hook-protocol.md §2.3: one bad output line removes the routed job and re-runs the pilot, so the hook's
    output check refuses anything the router's line parser (wire.parse_hook_output) would not
    take, and any attribute the schedd owns."""
    from ce_k8s.condor import wire

    assert not safe_output(body)
    assert safe_output(b'JobStatus = 2\nHoldReason = "a \\"quoted\\" text"\nK8sNodeName = "n1"\nX = 1.5\n')
    wire.parse_hook_output('JobStatus = 2\nHoldReason = "a \\"quoted\\" text"\nK8sNodeName = "n1"\nX = 1.5\n')


@settings(max_examples=150)
@given(st.lists(st.tuples(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
                          st.one_of(st.text(max_size=20).map(lambda t: '"' + t + '"'),
                                    st.sampled_from(["1", "-2", "1.5", "true", "false", "undefined", "1 2", "[",
                                                     '"a" "b"', "x +", '"\\"'])
                                    )), min_size=1, max_size=4))
def test_safe_output_implies_router_accepts(lines):
    """Whatever the agent sends, if the update hook's check passes, the router's parser accepts
    every line (hook-protocol.md §2.1): the check is never looser than the router."""
    from ce_k8s.condor import wire

    body = "".join(f"{k} = {v}\n" for k, v in lines)
    try:
        raw = body.encode("utf-8")
    except UnicodeEncodeError:
        return
    if safe_output(raw):
        wire.parse_hook_output(body)

