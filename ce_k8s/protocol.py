"""The Unix-socket protocol between the hooks and the agent (standard library only).

Why a home-made framing and not JSON or HTTP: the update hook is forked once per job per router
poll (docs/hook-protocol.md §0, §8), so its start-up cost is paid thousands of times a minute.
`import json` costs ~6 ms and `import socket` ~6 ms (it pulls in `enum` and `selectors`); this
module imports only the built-in C modules `posix` and `time`, which are free, and loads the
`_socket` extension (a shared library: ~0.35 ms of CPU to find and `dlopen`) only inside `call()`,
so the translate hook, which reads its settings here but never talks to the agent, does not pay
for it. No `from __future__ import annotations` either: that is a real import of a module (~0.1
ms per process) and Python 3.11 evaluates these annotations without it.

Wire format (one request and one reply per connection; the client half-closes after sending):

    request:  b"CEK8S/1 <verb> <length>\\n" + payload           (payload = raw job-ad text)
    reply:    b"CEK8S/1 <status> <len1> <len2> ...\\n" + part1 + part2 + ...

`status` is one of the STATUS_* names below. Each verb has a fixed number of reply parts (see
`docs/agent.md`). For every status other than `ok` the only part is a one-line message.

Every client of the agent talks to it through `ask` (one request, the whole reply read) or, to
stream a large reply (the finalize hook's pod logs), `call`; no client connects by itself.
"""

import posix
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # only for the annotations; the hooks import `_socket` lazily (see above)
    import _socket

MAGIC = b"CEK8S/1"
MAX_PAYLOAD = 4 * 1024 * 1024          # the router's ads are far smaller; refuse more (hook-protocol.md §8)
MAX_REPLY_PART = 64 * 1024 * 1024      # pod logs are capped by the agent well below this
MAX_HEADER = 256

VERB_UPDATE = "update"      # payload: routed ad; reply: [lines to print]
VERB_LOGS = "logs"          # payload: routed ad; reply: [spool root, stdout bytes, stderr bytes]
VERB_CLEANUP = "cleanup"    # payload: routed ad; reply: [message]
VERB_PING = "ping"          # payload: empty;     reply: [agent version]
VERB_LIST = "list"          # payload: empty;     reply: [JSON {"pilots": [...]}] (`ce-k8s status`)
VERBS = frozenset({VERB_UPDATE, VERB_LOGS, VERB_CLEANUP, VERB_PING, VERB_LIST})

STATUS_OK = "ok"
STATUS_NOTFOUND = "notfound"    # pod unknown; for cleanup this is success
STATUS_DENIED = "denied"        # SO_PEERCRED says the caller may not act on this job
STATUS_BAD = "bad"              # malformed request or ad
STATUS_BUSY = "busy"            # agent not ready yet (e.g. still listing pods)
STATUS_ERROR = "error"          # anything else on the agent side
STATUSES = frozenset({STATUS_OK, STATUS_NOTFOUND, STATUS_DENIED, STATUS_BAD, STATUS_BUSY, STATUS_ERROR})

DEFAULT_SOCKET = "/run/ce-k8s/agent.sock"
DEFAULT_HOOK_TIMEOUT = 20.0
DEFAULT_SPOOL: str | None = None      # baked in by `--install-hooks`; finalize's fallback only
DEFAULT_GRID_RESOURCE = "batch k8s"   # CE_K8S_GRID_RESOURCE: which routed jobs are ours (hooks/_common.py)
HOOKS_CONF = "/etc/ce-k8s/hooks.conf"


class ProtocolError(Exception):
    """The peer sent something that is not this protocol, or the call could not complete."""


def encode_request(verb: str, payload: bytes) -> bytes:
    """Frame one request; the verb is checked so a typo cannot reach the agent."""
    if verb not in VERBS:
        raise ProtocolError(f"unknown verb {verb!r}")
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    return b"%s %s %d\n" % (MAGIC, verb.encode(), len(payload)) + payload


def parse_request_header(line: bytes) -> tuple[str, int]:
    """Split a request header line into (verb, payload length); raises ProtocolError."""
    fields = line.rstrip(b"\n").split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC:
        raise ProtocolError("not a CEK8S/1 request")
    verb = fields[1].decode("ascii", "replace")
    if verb not in VERBS:
        raise ProtocolError(f"unknown verb {verb!r}")
    if not fields[2].isdigit():
        raise ProtocolError("bad length")
    length = int(fields[2])
    if length > MAX_PAYLOAD:
        raise ProtocolError(f"payload of {length} bytes exceeds {MAX_PAYLOAD}")
    return verb, length


def encode_reply(status: str, *parts: bytes) -> bytes:
    """Frame one reply: the header lists each part's length so binary logs pass unchanged."""
    if status not in STATUSES:
        raise ProtocolError(f"unknown status {status!r}")
    header = b" ".join([MAGIC, status.encode()] + [b"%d" % len(p) for p in parts]) + b"\n"
    return header + b"".join(parts)


def parse_reply_header(line: bytes) -> tuple[str, list[int]]:
    """Split a reply header into (status, part lengths); raises ProtocolError."""
    fields = line.rstrip(b"\n").split(b" ")
    if len(fields) < 2 or fields[0] != MAGIC:
        raise ProtocolError("not a CEK8S/1 reply")
    status = fields[1].decode("ascii", "replace")
    if status not in STATUSES:
        raise ProtocolError(f"unknown status {status!r}")
    lengths = []
    for f in fields[2:]:
        if not f.isdigit() or int(f) > MAX_REPLY_PART:
            raise ProtocolError("bad part length")
        lengths.append(int(f))
    return status, lengths


def _env(name: str) -> str | None:
    value = posix.environ.get(name.encode())
    return value.decode("utf-8", "replace") if value else None


_CONF_CACHE: dict[str, dict[str, str]] = {}


def _conf_file() -> dict[str, str]:
    """Read the hooks' own tiny `key = value` file; a missing or unreadable file is no error.

    Read at most once per process (a hook process is one call): the settings functions below may
    each need it, and the update hook, the hottest code in ce-k8s, asks for three values.
    """
    path = _env("CE_K8S_HOOKS_CONF") or HOOKS_CONF
    cached = _CONF_CACHE.get(path)
    if cached is not None:
        return cached
    out: dict[str, str] = {}
    _CONF_CACHE[path] = out
    try:
        fd = posix.open(path, posix.O_RDONLY)
    except OSError:
        return out
    try:
        data = posix.read(fd, 65536)
    finally:
        posix.close(fd)
    for raw in data.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key.strip().upper()] = value.strip()
    return out


def hook_settings() -> tuple[str, float]:
    """(socket path, per-call deadline in seconds) for a hook process.

    Order: the environment the hook inherits from the router (`CE_K8S_SOCKET`,
    `CE_K8S_HOOK_TIMEOUT`), then `/etc/ce-k8s/hooks.conf` (path overridable with
    `CE_K8S_HOOKS_CONF`), then the built-in defaults. The hooks never parse the HTCondor
    configuration: that costs tens of milliseconds per call (docs/design.md "What a forked hook pays to start").
    """
    sock = _env("CE_K8S_SOCKET")
    timeout = _env("CE_K8S_HOOK_TIMEOUT")
    if sock is None or timeout is None:
        conf = _conf_file()
        sock = sock or conf.get("CE_K8S_SOCKET")
        timeout = timeout or conf.get("CE_K8S_HOOK_TIMEOUT")
    try:
        seconds = float(timeout) if timeout else DEFAULT_HOOK_TIMEOUT
    except ValueError:
        seconds = DEFAULT_HOOK_TIMEOUT
    if not seconds > 0:
        seconds = DEFAULT_HOOK_TIMEOUT
    return sock or DEFAULT_SOCKET, seconds


def hook_grid_resource() -> str:
    """`CE_K8S_GRID_RESOURCE` for a hook process: the `GridResource` words that make a routed job
    a Kubernetes job (docs/routes.md, "CEs with other backends"; the rule is
    `ce_k8s.hooks._common.grid_resource_matches`).

    Same order as `hook_settings`: the environment, then hooks.conf, then the launcher's baked-in
    default (`DEFAULT_GRID_RESOURCE`: `batch k8s` unless `--install-hooks` wrote the CE's knob).
    One pair of surrounding double quotes is dropped, as `Settings` does; a value with no word
    counts as unset, since an empty prefix would claim every routed job on the CE.
    """
    return (_words_value(_env("CE_K8S_GRID_RESOURCE")) or _words_value(_conf_file().get("CE_K8S_GRID_RESOURCE"))
            or DEFAULT_GRID_RESOURCE)


def _words_value(value: str | None) -> str | None:
    """`value` stripped and without one pair of surrounding double quotes; None if no word is left."""
    if value is None:
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value if value.strip() else None


def hook_spool() -> str | None:
    """The CE spool for the finalize hook when the agent cannot tell it (`CE_K8S_SPOOL` in the
    environment, then hooks.conf, then the launcher's baked-in default); None if unknown."""
    return _env("CE_K8S_SPOOL") or _conf_file().get("CE_K8S_SPOOL") or DEFAULT_SPOOL


def _recv_exact(sock: "_socket.socket", n: int, deadline: float, sink=None) -> bytes:
    """Read exactly n bytes before the deadline, or raise; `sink(chunk)` streams instead of keeping."""
    chunks = []
    left = n
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProtocolError("agent reply timed out")
        sock.settimeout(remaining)
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ProtocolError("agent closed the connection early")
        left -= len(chunk)
        if sink is None:
            chunks.append(chunk)
        else:
            sink(chunk)
    return b"".join(chunks)


def _recv_line(sock: "_socket.socket", deadline: float) -> bytes:
    buf = b""
    while b"\n" not in buf:
        if len(buf) > MAX_HEADER:
            raise ProtocolError("reply header too long")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProtocolError("agent reply timed out")
        sock.settimeout(remaining)
        chunk = sock.recv(MAX_HEADER)
        if not chunk:
            raise ProtocolError("agent closed the connection without a reply")
        buf += chunk
    return buf


class Reply:
    """One agent reply: status, parts already read, and the socket positioned after the header."""

    def __init__(self, status: str, lengths: list[int], rest: bytes, sock: "_socket.socket", deadline: float):
        self.status = status
        self.lengths = lengths
        self._rest = rest
        self._sock = sock
        self._deadline = deadline

    def read_part(self, index: int, sink=None) -> bytes:
        """Read part `index` (parts must be read in order); with `sink`, stream it instead."""
        n = self.lengths[index]
        have = self._rest[:n]
        self._rest = self._rest[n:]
        if sink is not None:
            if have:
                sink(have)
            _recv_exact(self._sock, n - len(have), self._deadline, sink)
            return b""
        return have + _recv_exact(self._sock, n - len(have), self._deadline)

    def read_all(self) -> list[bytes]:
        return [self.read_part(i) for i in range(len(self.lengths))]

    def message(self) -> str:
        """Part 0 as text ("" if the reply has none): for every status but `ok`, the agent's
        one-line message. Reads the part, so only for a reply whose parts are not wanted otherwise."""
        return self.read_part(0).decode("utf-8", "replace") if self.lengths else ""

    def close(self) -> None:
        self._sock.close()


class Answer:
    """A whole agent reply, read and its connection closed (`ask`): `status` and every part."""

    __slots__ = ("parts", "status")

    def __init__(self, status: str, parts: list[bytes]):
        self.status = status
        self.parts = parts

    def message(self) -> str:
        """Part 0 as text ("" if the reply has none): for every status but `ok`, the agent's
        one-line message (`Reply.message` for a streaming client). Not stripped: each client
        words and trims it as it always has."""
        return self.parts[0].decode("utf-8", "replace") if self.parts else ""


def call(path: str, verb: str, payload: bytes, deadline: float) -> Reply:
    """Send one request and return the reply with its header parsed (parts read lazily).

    `deadline` is a `time.monotonic()` value; every socket operation gets the time left, so
    the whole call is bounded no matter where the agent stalls. Raises OSError or
    ProtocolError; the caller maps that to the mildest exit code of its hook.
    """
    import _socket

    request = encode_request(verb, payload)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.connect(path)
        view = memoryview(request)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProtocolError("agent request timed out")
            sock.settimeout(remaining)
            sent = sock.send(view)
            view = view[sent:]
        sock.shutdown(_socket.SHUT_WR)
        head = _recv_line(sock, deadline)
        line, _, rest = head.partition(b"\n")
        status, lengths = parse_reply_header(line)
        return Reply(status, lengths, rest, sock, deadline)
    except BaseException:
        sock.close()
        raise


def ask(path: str, verb: str, payload: bytes, timeout: float) -> Answer:
    """One whole request to the agent: `call`, every part read, the connection closed, all
    within `timeout` seconds from now. The one agent call of every client that keeps the whole
    reply (the update and cleanup hooks, `ce-k8s status`, `doctor`, `info`, the real-HTCondor
    bed); the finalize hook alone uses `call`, to stream the pod logs into the spool.

    Raises OSError (socket missing, refused, timed out) or ProtocolError (an unknown verb, a
    malformed reply, the deadline passed), the exception `call` and `Reply` raise, unchanged, so
    each client's message (`str(exc)`, or the type's name when that is empty) stays as it was.
    A status other than `ok` is no exception: each client decides what it means.
    """
    reply = call(path, verb, payload, time.monotonic() + timeout)
    try:
        return Answer(reply.status, reply.read_all())
    finally:
        reply.close()
