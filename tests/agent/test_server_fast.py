"""The agent's epoll socket server (`ce_k8s/agent/server.py`): the protocol kept, the CPU cut.

One request per connection, the client half-closes after sending (docs/agent.md, "The socket
protocol"); every update hook is one connection, once per routed job per poll
(docs/hook-protocol.md §0, §8), so the server must answer many short connections cheaply, never
let slow verbs or idle peers delay the updates, and identify every caller by SO_PEERCRED
(docs/agent.md, "Permissions and authorisation"). tests/hardening/test_fuzz_protocol.py covers
hostile frames; these tests cover the paths the epoll loop added: requests that arrive in pieces,
replies larger than the socket buffer, a reader that never reads, the executor hand-off,
concurrency, and the limits the asyncio server had (64 KiB header line, header at end of input).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ce_k8s import protocol
from ce_k8s.agent import adtext
from ce_k8s.agent import server as agent_server

IO_TIMEOUT = 10.0


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A HookServer whose handler echoes, sleeps for `cleanup`, answers `logs` with a big part and
    raises for payload b"boom"; READ_TIMEOUT is short (30 s in production)."""
    monkeypatch.setattr(agent_server, "READ_TIMEOUT", 0.5)
    calls = []
    big = bytes(range(256)) * (8 * 1024 * 4)          # 8 MiB: far more than a socket buffer

    def handler(verb, payload, uid):
        calls.append((verb, payload, uid, threading.current_thread().name))
        if payload == b"boom":
            raise RuntimeError("handler failed")
        if verb == protocol.VERB_CLEANUP:
            time.sleep(1.0)
        if verb == protocol.VERB_LOGS:
            return protocol.STATUS_OK, [b"/spool", big, b"err"]
        return protocol.STATUS_OK, [b"echo " + payload]

    pool = ThreadPoolExecutor(2, thread_name_prefix="pool")
    srv = agent_server.HookServer(str(tmp_path / "agent.sock"), handler, pool)
    srv.start()
    srv.calls = calls
    srv.big = big
    yield srv
    srv.stop()
    pool.shutdown(wait=False)


def call(path, verb, payload=b""):
    reply = protocol.call(path, verb, payload, time.monotonic() + IO_TIMEOUT)
    try:
        return reply.status, reply.read_all()
    finally:
        reply.close()


def raw(path, *pieces, pause=0.0, half_close=True):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(IO_TIMEOUT)
    s.connect(path)
    try:
        for piece in pieces:
            s.sendall(piece)
            time.sleep(pause)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data
    finally:
        s.close()


def test_update_is_answered_inline_with_the_callers_uid(served):
    """update and ping run in the socket thread (they only read memory); the uid is the kernel's."""
    assert call(served.path, protocol.VERB_UPDATE, b"Owner = \"x\"\n") == ("ok", [b"echo Owner = \"x\"\n"])
    verb, _payload, uid, thread = served.calls[-1]
    assert (verb, uid, thread) == ("update", os.getuid(), "ce-k8s-socket")
    assert oct(os.stat(served.path).st_mode & 0o777) == "0o666"


def test_request_in_pieces_is_answered(served):
    """A request that trickles in (header split, payload split) is assembled before dispatch."""
    reply = raw(served.path, b"CEK8S/1 upd", b"ate 6\nab", b"cdef", pause=0.05)
    assert reply == protocol.encode_reply("ok", b"echo abcdef")


def test_header_at_end_of_input_without_newline_is_parsed(served):
    """As the asyncio server did (StreamReader.readline returns the partial line at EOF)."""
    assert raw(served.path, b"CEK8S/1 ping 0") == protocol.encode_reply("ok", b"echo ")


def test_header_line_longer_than_64k_is_dropped_without_reply(served):
    """The 64 KiB header limit of the old server (asyncio's reader limit) holds, newline or not."""
    assert raw(served.path, b"CEK8S/1 " + b"x" * (70 * 1024) + b"\n") == b""
    assert served.calls == []
    assert call(served.path, protocol.VERB_PING)[0] == "ok"


def test_payload_cut_short_is_dropped(served):
    """Fewer payload bytes than declared, then end of input: closed, nothing dispatched."""
    assert raw(served.path, b"CEK8S/1 update 10\nabc") == b""
    assert served.calls == []


def test_extra_bytes_after_the_payload_are_ignored(served):
    assert raw(served.path, b"CEK8S/1 update 3\nabcXYZ") == protocol.encode_reply("ok", b"echo abc")


def test_large_reply_reaches_a_slow_reader_whole(served):
    """A logs reply of 8 MiB goes out in many sends as the reader drains it (EPOLLOUT path)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(IO_TIMEOUT)
    s.connect(served.path)
    try:
        s.sendall(protocol.encode_request(protocol.VERB_LOGS, b"ad"))
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(100_000):
            data += chunk
            time.sleep(0.002)                 # slower than the server writes
    finally:
        s.close()
    head, _, body = data.partition(b"\n")
    status, lengths = protocol.parse_reply_header(head)
    assert status == "ok" and lengths == [6, len(served.big), 3]
    assert body == b"/spool" + served.big + b"err"


def test_reader_that_never_reads_is_dropped_after_the_timeout(served):
    """A peer that asks for a big reply and never reads it holds nothing for ever."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(served.path)
    try:
        s.sendall(protocol.encode_request(protocol.VERB_LOGS, b"ad"))
        s.shutdown(socket.SHUT_WR)
        time.sleep(0.5 + 1.5)                 # READ_TIMEOUT plus sweeps
        assert served._conns == {}
        assert call(served.path, protocol.VERB_PING)[0] == "ok"
    finally:
        s.close()


def test_slow_verbs_run_on_the_executor_and_never_delay_updates(served):
    """cleanup (API calls in the real agent) sleeps 1 s on the pool; updates meanwhile are
    answered at once from the socket thread."""
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("c", call(served.path, protocol.VERB_CLEANUP, b"ad")))
    t.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    for i in range(20):
        assert call(served.path, protocol.VERB_UPDATE, b"%d" % i) == ("ok", [b"echo %d" % i])
    assert time.monotonic() - t0 < 0.8
    t.join(IO_TIMEOUT)
    assert results["c"] == ("ok", [b"echo ad"])
    assert [c[3].startswith("pool") for c in served.calls if c[0] == "cleanup"] == [True]


def test_handler_exception_closes_without_reply_and_server_lives(served):
    """Inline and executor verbs alike: no reply (the hook maps that to its mildest exit), no crash."""
    for verb in (b"update", b"cleanup"):
        assert raw(served.path, b"CEK8S/1 %s 4\nboom" % verb) == b""
    assert call(served.path, protocol.VERB_PING)[0] == "ok"


def test_many_concurrent_clients_each_get_their_own_answer(served):
    """16 clients x 25 requests at once: every reply matches its request."""
    errors = []

    def client(n):
        for i in range(25):
            payload = b"%d-%d" % (n, i)
            got = call(served.path, protocol.VERB_UPDATE, payload)
            if got != ("ok", [b"echo " + payload]):
                errors.append(got)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(served.calls) == 400


def test_stop_removes_the_socket_and_start_refuses_a_non_socket(tmp_path):
    """The path is unlinked on stop; an existing regular file is never replaced (prepare_socket_path)."""
    pool = ThreadPoolExecutor(1)
    srv = agent_server.HookServer(str(tmp_path / "a.sock"), lambda v, p, u: ("ok", [b""]), pool)
    srv.start()
    assert call(srv.path, protocol.VERB_PING) == ("ok", [b""])
    srv.stop()
    assert not os.path.exists(srv.path)
    with pytest.raises(OSError):
        call(srv.path, protocol.VERB_PING)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        agent_server.HookServer(str(tmp_path / "file"), lambda v, p, u: ("ok", []), pool).start()
    assert (tmp_path / "file").read_text() == "x"
    pool.shutdown()


def test_the_socket_appears_at_its_path_only_ready(tmp_path, monkeypatch):
    """A hook that finds the path must be able to open it and be heard: the socket is made 0666
    and listens under a private name, and only then is renamed to its path (a test saw it at 0755
    once, between the bind and the chmod)."""
    pool = ThreadPoolExecutor(1)
    path = tmp_path / "a.sock"
    seen = []
    real_rename = os.rename

    def rename(src, dst):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(src)             # refused unless it listens (the backlog takes it)
            listening = True
        except ConnectionRefusedError:
            listening = False
        finally:
            probe.close()
        seen.append((os.path.exists(dst), oct(os.stat(src).st_mode & 0o777), listening))
        real_rename(src, dst)

    monkeypatch.setattr(agent_server.os, "rename", rename)
    srv = agent_server.HookServer(str(path), lambda v, p, u: ("ok", [b"up"]), pool)
    srv.start()
    try:
        assert seen == [(False, "0o666", True)]
        assert oct(path.stat().st_mode & 0o777) == "0o666"
        assert call(str(path), protocol.VERB_PING) == ("ok", [b"up"])
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a.sock"]     # no staging name left
    finally:
        srv.stop()
        pool.shutdown()


def _old_quote(text: str) -> str:
    """adtext.quote before its printable fast path (the reference)."""
    clean = "".join(c if c.isprintable() else " " for c in text).replace("\\", "/")
    if len(clean) > adtext.MAX_STRING:
        clean = clean[: adtext.MAX_STRING - 3] + "..."
    return '"' + clean.replace('"', '\\"') + '"'


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(['a', '"', "\\", "\n", "\r", "\x00", "\u2028", "é", " ", "\t"]),
               max_size=40) | st.text(max_size=1100))
def test_quote_fast_path_is_the_same_literal(text):
    """The update reply's strings (hook-protocol.md §2.1, §8: one line, `"` escaped, no backslash) come out
    exactly as before the fast path for printable text."""
    assert adtext.quote(text) == _old_quote(text)


def _old_scan(text: str, wanted: frozenset[str]) -> dict[str, str]:
    """adtext.scan before its memo of attribute spellings (the reference)."""
    found: dict[str, str] = {}
    for line in text.split("\n"):
        i = line.find(" = ")
        if i > 0:
            key = line[:i].strip().lower()
            if key in wanted:
                found[key] = line[i + 3:].strip()
    return found


_NAMES = st.sampled_from(["Owner", "owner", " OWNER", "ClusterId\t", "K8sPodName", "Other", "", " ", "x = y",
                          "JobStatus", "jobstatus ", "\u2028Owner", "Own\u00e9r"])
_LINES = st.tuples(_NAMES, st.sampled_from([" = ", "=", " =", " == ", ""]),
                   st.text(alphabet=st.sampled_from(['1', '"', " ", "=", "\t", "\r", "x"]), max_size=8))


@settings(max_examples=400, deadline=None)
@given(st.lists(_LINES, max_size=12), st.booleans())
def test_scan_with_its_memo_reads_what_the_plain_scan_reads(lines, small_set):
    """The update path's attribute scan (issue 17: a memo of raw spellings) finds the same values
    as the line-by-line scan it replaced, for odd spellings, spacing and repeated names, whichever
    wanted set and however often a spelling was seen before."""
    text = "\n".join(name + sep + value for name, sep, value in lines)
    wanted = frozenset({"owner", "jobstatus"}) if small_set else adtext.WANTED
    assert adtext.scan(text, wanted) == _old_scan(text, wanted)
    assert adtext.scan(text, wanted) == _old_scan(text, wanted)       # again, from the memo


def test_scan_memo_is_bounded():
    """Forged ads with endless new attribute names cannot grow the agent's memo without limit."""
    wanted = frozenset({"owner"})
    for i in range(adtext._CANONICAL_MAX + 100):
        assert adtext.scan(f"Attr{i} = 1\nOwner = \"u\"", wanted) == {"owner": '"u"'}
    assert len(adtext._CANONICAL[wanted]) == adtext._CANONICAL_MAX
