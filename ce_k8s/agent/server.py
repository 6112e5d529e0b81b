"""The agent's Unix socket: one request per connection, caller identified by `SO_PEERCRED`.

Permissions (docs/agent.md): the socket is mode 0666 inside a root- or condor-owned 0755
directory, because hooks run as the pilot accounts (jobrouter-protocol.md §2.1) and every one
of them must be able to connect; *authorisation* is per request, from the kernel-verified uid of
the connecting process, which cannot be forged (unlike anything in the payload).

asyncio in one thread serves thousands of short connections a second; the update path is
answered inline (it only reads memory), slower verbs (logs, cleanup: API calls) go to a thread
pool so they cannot stall the updates.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import struct
import threading

from ce_k8s import protocol

log = logging.getLogger(__name__)

READ_TIMEOUT = 30.0
_INLINE = frozenset({protocol.VERB_UPDATE, protocol.VERB_PING})


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
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


class HookServer:
    """Serve `handler(verb, payload, uid) -> (status, parts)` on a Unix socket in a background thread."""

    def __init__(self, path: str, handler, executor) -> None:
        self.path = path
        self.handler = handler
        self.executor = executor
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ce-k8s-socket", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            prepare_socket_path(self.path)
            self._server = self.loop.run_until_complete(
                asyncio.start_unix_server(self._client, path=self.path, backlog=1024))
            os.chmod(self.path, 0o666)  # noqa: S103 - every pilot account connects; SO_PEERCRED authorises
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        log.info("serving hooks on %s", self.path)
        self._ready.set()
        try:
            self.loop.run_forever()
        finally:
            self._server.close()
            self.loop.run_until_complete(self._server.wait_closed())
            self.loop.close()

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except OSError:
            pass

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid = peer_uid(writer.get_extra_info("socket"))
            header = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
            try:
                verb, length = protocol.parse_request_header(header)
                payload = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT)
            except protocol.ProtocolError as exc:
                writer.write(protocol.encode_reply(protocol.STATUS_BAD, str(exc).encode()))
                await writer.drain()
                return
            if verb in _INLINE:
                status, parts = self.handler(verb, payload, uid)
            else:
                status, parts = await self.loop.run_in_executor(self.executor, self.handler, verb, payload, uid)
            writer.write(protocol.encode_reply(status, *parts))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.debug("hook connection dropped: %s", exc)
        except Exception:
            log.exception("hook connection failed")
        finally:
            try:
                writer.close()
            except Exception:  # noqa: S110 - the peer may be gone already
                pass
