"""The agent's Unix socket: one request per connection, caller identified by `SO_PEERCRED`.

Permissions (docs/agent.md): the socket is mode 0666 inside a root- or condor-owned 0755
directory, because hooks run as the pilot accounts (docs/hook-protocol.md §2.1) and every one
of them must be able to connect; *authorisation* is per request, from the kernel-verified uid of
the connecting process, which cannot be forged (unlike anything in the payload).

Why a hand-written `epoll` loop and not asyncio streams: every update hook is one connection
(hook-protocol.md §0, §8), thousands a minute, and asyncio's stream machinery (a task, a StreamReader and a
StreamWriter per connection, `wait_for`, `drain`, the transport's close) cost ~140 µs of CPU per
connection, twice the request handler itself (docs/performance.md, issue 7). This loop does per
connection: `accept`, `getsockopt(SO_PEERCRED)`, usually one `recv` (the hook has sent its
request by the time it is accepted; otherwise the socket waits in epoll), the handler, one
`send`, `close`. Why not one blocking thread per connection from a small pool: a handful of idle
or trickling connections (any pilot account can open them) would hold every thread until
`READ_TIMEOUT` and stall the updates of everybody else; here an idle connection costs one dict
entry and is closed by the sweep when its deadline passes.

Kept from the asyncio server, byte for byte: the header line (at most 64 KiB, as asyncio's
StreamReader limit; at end of input a header without a newline is parsed as it is), `bad` with
the parser's message for a malformed header, a declared length over `protocol.MAX_PAYLOAD`
refused before reading it, `READ_TIMEOUT` for the header and again for the payload, the update
and ping verbs answered inline (they only read memory), the slower verbs (logs, cleanup, list:
API calls, files) run on the executor so they cannot stall the updates. New: a reply the peer
does not read is dropped after `READ_TIMEOUT` without progress (asyncio waited for ever).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from collections import deque

from ce_k8s import protocol

log = logging.getLogger(__name__)

READ_TIMEOUT = 30.0
MAX_HEADER_LINE = 64 * 1024          # asyncio.StreamReader's default limit, which the old server had
_INLINE = frozenset({protocol.VERB_UPDATE, protocol.VERB_PING})
_CRED = struct.Struct("3i")
_RECV = 256 * 1024                   # an update request (~3-4 KB) arrives in one recv
_ACCEPT_BATCH = 64                   # connections taken per wake-up before looking at the others
_MAX_SWEEP = 1.0
_FD_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_EPOLLIN = select.EPOLLIN
_EPOLLOUT = select.EPOLLOUT


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    _pid, uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return uid


def prepare_socket_path(path: str) -> None:
    """Create the parent directory (0755) if needed and remove a stale socket (never another file)."""
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, mode=0o755, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"{path} exists and is not a socket; refusing to replace it")
    os.unlink(path)


class _Conn:
    """One hook connection: what has been read, what is left to send, and its deadline."""

    __slots__ = ("buf", "deadline", "events", "fd", "length", "out", "sock", "uid", "verb", "waiting")

    def __init__(self, sock: socket.socket, uid: int, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.uid = uid
        self.buf = b""
        self.verb: str | None = None        # set once the header is parsed
        self.length = 0
        self.out: memoryview | None = None  # the unsent rest of the reply
        self.deadline = deadline
        self.events = 0                     # what the connection is registered for in epoll (0: not)
        self.waiting = False                # the handler runs on the executor


class HookServer:
    """Serve `handler(verb, payload, uid) -> (status, parts)` on a Unix socket in a background thread."""

    def __init__(self, path: str, handler, executor) -> None:
        self.path = path
        self.handler = handler
        self.executor = executor
        self._listener: socket.socket | None = None
        self._epoll: select.epoll | None = None
        self._wake_r = self._wake_w = -1
        self._conns: dict[int, _Conn] = {}
        self._done: deque[tuple[_Conn, object]] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accept_paused_until = 0.0
        self._wake_lock = threading.Lock()   # an executor callback may race the pipe's closing

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind (0666), listen, and serve in a daemon thread; raises if the socket cannot be made."""
        prepare_socket_path(self.path)
        # Bound and made 0666 under a private name, then renamed into place once it listens: a
        # hook (or a test) that finds the path never meets a socket it may not open, or one that
        # refuses its connection. The name is short: a socket path has 107 bytes at most.
        staging = os.path.join(os.path.dirname(self.path) or ".", f".{os.getpid():x}")
        prepare_socket_path(staging)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(staging)
            os.chmod(staging, 0o666)  # noqa: S103 - every pilot account connects; SO_PEERCRED authorises
            listener.listen(1024)
            os.rename(staging, self.path)
            listener.setblocking(False)
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._epoll = select.epoll()
            self._epoll.register(listener.fileno(), _EPOLLIN)
            self._epoll.register(self._wake_r, _EPOLLIN)
        except BaseException:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(staging)
            if self._epoll is not None:
                self._epoll.close()
                self._epoll = None
            self._close_wake()
            raise
        self._listener = listener
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ce-k8s-socket", daemon=True)
        self._thread.start()
        log.info("serving hooks on %s", self.path)

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._stopping = True
            self._wake()
            self._thread.join(10)
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except OSError:
            pass

    def _close_wake(self) -> None:
        with self._wake_lock:
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_w < 0:
                return                       # stopped: nobody is listening
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:          # a full pipe: a wake-up is pending anyway
                pass

    # -- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        ep = self._epoll
        listen_fd = self._listener.fileno()
        conns = self._conns
        next_sweep = time.monotonic() + self._sweep_interval()
        try:
            while not self._stopping:
                if conns or self._accept_paused_until:
                    timeout = max(next_sweep - time.monotonic(), 0.0)
                else:
                    timeout = -1
                try:
                    events = ep.poll(timeout)
                except InterruptedError:
                    continue
                for fd, _ev in events:
                    conn = None
                    try:
                        if fd == listen_fd:
                            self._accept()
                        elif fd == self._wake_r:
                            self._finish_waiting()
                        else:
                            conn = conns.get(fd)
                            if conn is None:
                                continue
                            if conn.out is not None:
                                self._send(conn)
                            else:
                                self._read(conn)
                    except Exception:
                        # one connection's surprise must not end the service for everybody
                        log.exception("hook connection failed")
                        if conn is not None and conns.get(fd) is conn:
                            self._close(conn)
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + self._sweep_interval()
        except Exception:
            log.exception("hook socket loop failed")
        finally:
            for conn in list(conns.values()):
                conn.sock.close()
            conns.clear()
            ep.close()
            self._listener.close()
            self._close_wake()

    @staticmethod
    def _sweep_interval() -> float:
        return min(_MAX_SWEEP, READ_TIMEOUT / 4)

    def _sweep(self, now: float) -> None:
        """Close every connection whose read (or reply) deadline has passed; resume accepting."""
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._epoll.register(self._listener.fileno(), _EPOLLIN)
        for conn in [c for c in self._conns.values() if not c.waiting and c.deadline <= now]:
            log.debug("hook connection dropped: no request (or no reading of the reply) within %ss",
                      READ_TIMEOUT)
            self._close(conn)

    def _accept(self) -> None:
        listener = self._listener
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _addr = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _FD_EXHAUSTED:
                    # the pending connections stay in the backlog; try again at the next sweep
                    log.warning("cannot accept hook connections: %s", exc)
                    self._epoll.unregister(listener.fileno())
                    self._accept_paused_until = time.monotonic() + 0.1
                    return
                continue                   # ECONNABORTED and the like: that peer is gone
            try:
                uid = peer_uid(sock)
            except OSError as exc:
                log.debug("hook connection dropped: %s", exc)
                sock.close()
                continue
            conn = _Conn(sock, uid, time.monotonic() + READ_TIMEOUT)
            self._conns[conn.fd] = conn
            self._read(conn)               # the request is usually there already: no epoll round

    def _watch(self, conn: _Conn, events: int) -> None:
        if conn.events == events:
            return
        if conn.events:
            if events:
                self._epoll.modify(conn.fd, events)
            else:
                self._epoll.unregister(conn.fd)
        else:
            self._epoll.register(conn.fd, events)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        self._conns.pop(conn.fd, None)
        conn.sock.close()                  # also takes the fd out of the epoll set

    # -- reading and answering ---------------------------------------------------------------------

    def _read(self, conn: _Conn) -> None:
        """Read what is there; parse the header, then the payload; dispatch once complete."""
        while True:
            want = _RECV if conn.verb is None else max(conn.length - len(conn.buf), 1)
            try:
                chunk = conn.sock.recv(min(want, _RECV), socket.MSG_DONTWAIT)
            except BlockingIOError:
                self._watch(conn, _EPOLLIN)
                return
            except OSError as exc:
                log.debug("hook connection dropped: %s", exc)
                self._close(conn)
                return
            eof = not chunk
            conn.buf += chunk
            if conn.verb is None:
                nl = conn.buf.find(b"\n")
                if nl > MAX_HEADER_LINE or (nl < 0 and len(conn.buf) > MAX_HEADER_LINE):
                    log.warning("hook connection dropped: header line longer than %d bytes", MAX_HEADER_LINE)
                    self._close(conn)
                    return
                if nl < 0 and not eof:
                    continue
                # at end of input a header without a newline is parsed as it is (asyncio's readline)
                line = conn.buf if nl < 0 else conn.buf[:nl + 1]
                conn.buf = b"" if nl < 0 else conn.buf[nl + 1:]
                try:
                    conn.verb, conn.length = protocol.parse_request_header(line)
                except protocol.ProtocolError as exc:
                    self._reply(conn, protocol.STATUS_BAD, [str(exc).encode()])
                    return
                conn.deadline = time.monotonic() + READ_TIMEOUT
            if len(conn.buf) >= conn.length:
                payload = conn.buf[:conn.length] if len(conn.buf) > conn.length else conn.buf
                conn.buf = b""
                self._dispatch(conn, payload)
                return
            if eof:
                log.debug("hook connection dropped: %d of %d payload bytes, then end of input",
                          len(conn.buf), conn.length)
                self._close(conn)
                return

    def _dispatch(self, conn: _Conn, payload: bytes) -> None:
        verb = conn.verb
        if verb in _INLINE:
            try:
                status, parts = self.handler(verb, payload, conn.uid)
            except Exception:
                log.exception("hook connection failed")
                self._close(conn)
                return
            self._reply(conn, status, parts)
            return
        conn.waiting = True
        self._watch(conn, 0)               # a half-closed peer would wake the loop for nothing
        future = self.executor.submit(self.handler, verb, payload, conn.uid)
        future.add_done_callback(lambda f, c=conn: self._completed(c, f))

    def _completed(self, conn: _Conn, future) -> None:
        """Executor thread: hand the result to the loop thread (which alone touches sockets)."""
        self._done.append((conn, future))
        self._wake()

    def _finish_waiting(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self._done:
            conn, future = self._done.popleft()
            conn.waiting = False
            if self._conns.get(conn.fd) is not conn:
                continue
            try:
                status, parts = future.result()
            except Exception:
                log.exception("hook connection failed")
                self._close(conn)
                continue
            self._reply(conn, status, parts)

    def _reply(self, conn: _Conn, status: str, parts) -> None:
        try:
            data = protocol.encode_reply(status, *parts)
        except protocol.ProtocolError:
            log.exception("hook connection failed")
            self._close(conn)
            return
        conn.out = memoryview(data)
        conn.deadline = time.monotonic() + READ_TIMEOUT
        self._send(conn)

    def _send(self, conn: _Conn) -> None:
        out = conn.out
        try:
            while out:
                out = out[conn.sock.send(out, socket.MSG_DONTWAIT):]
        except BlockingIOError:
            conn.out = out
            conn.deadline = time.monotonic() + READ_TIMEOUT      # counts from the last progress
            self._watch(conn, _EPOLLOUT)
            return
        except OSError as exc:
            log.debug("hook connection dropped: %s", exc)
        self._close(conn)
