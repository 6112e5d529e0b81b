"""The real-HTCondor bed's fixed loopback ports, kept out of the kernel's ephemeral range while it is up.

A bed's daemons listen on fixed ports: the collector on 19618, the stock CE on 9619 (HTCondor-CE's
own), its SciTokens issuer on 19643. Any outgoing TCP connection on the machine may be given one of
them as its local port when the kernel's ephemeral range covers it (these machines have
`net.ipv4.ip_local_port_range` = 1024 65535; Linux's default, 32768 60999, covers none of them).
While that connection is open, and for its TIME_WAIT (60 s) after, the daemon's `bind` fails with
EADDRINUSE, SO_REUSEADDR or not (measured: tests/real/condor/test_ports.py). The CI run at
defdfa4 refused two beds in a row that way ("127.0.0.1:19618 is in use") with no other bed up.

So a bed adds its ports to `net.ipv4.ip_local_reserved_ports` from just before it checks them
until its `down`: the kernel then gives none of them to a `connect` or a `bind` to port 0 (the
kernel's ip-sysctl documentation). The setting is the machine's (its network namespace's), so it
goes through a ledger of its own (ce_k8s.real.sysctls): the last bed down writes the host's own
value back, whatever order beds come and go in. A connection that took a port before the
reservation is waited for, a minute at most (its TIME_WAIT ends by then); a listener on a port is
refused at once, named: another bed's daemon, or a server the kernel gave the port to.

A bed's reservation starts at its `up`, too late for a long-lived connection made before (a watch
of a Kubernetes bed up beside it), so a test run holds the ports from its first moment
(`PortHold`), and the Kubernetes bed's components never take one (ce_k8s.real.kube.kubenodes
`free_port`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ce_k8s.real.condor.condorlayout import RealCondorError
from ce_k8s.real.processes import terminate
from ce_k8s.real.sysctls import PROC_SYS, SysctlLedger, read_sysctls, write_sysctls

RESERVED = "net.ipv4.ip_local_reserved_ports"
PORT_LEDGER = Path("/run/ce-k8s-reserved-ports.json")
#: How long `wait_free` waits for connections that took a port before it was reserved: Linux's
#: TIME_WAIT is a fixed 60 s (TCP_TIMEWAIT_LEN), so only a connection still open outlasts this.
EARLIER_CONNECTIONS_S = 70.0
#: /proc/net/tcp's state codes (include/net/tcp_states.h) for the messages.
TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
              "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN",
              "0B": "CLOSING"}


def with_ports(value: str, ports: Iterable[int]) -> str:
    """`value` (the sysctl's text: ports and ranges, comma-separated) with `ports` added where no
    entry covers them yet; the host's own entries kept as written."""
    entries = [e.strip() for e in value.split(",") if e.strip()]
    covered: list[tuple[int, int]] = []
    for entry in entries:
        low, _, high = entry.partition("-")
        covered.append((int(low), int(high or low)))
    extra = [str(p) for p in sorted(set(ports)) if not any(lo <= p <= hi for lo, hi in covered)]
    return ",".join(entries + extra)


def reserve(holder: str, ports: Iterable[int], ledger: Path = PORT_LEDGER, proc: Path = PROC_SYS) -> str:
    """Reserve `ports` for `holder` (a bed's state file). Returns the host's own value, which the
    bed keeps in its state for a `release` that finds no ledger (after a reboot)."""
    def add() -> None:          # under the ledger's lock: another bed's read-and-write never interleaves
        current = read_sysctls((RESERVED,), proc)[RESERVED]
        write_sysctls({RESERVED: with_ports(current, ports)}, proc)

    return SysctlLedger(ledger, proc, (RESERVED,)).hold(holder, add)[RESERVED]


def release(holder: str, own: str, ledger: Path = PORT_LEDGER, proc: Path = PROC_SYS) -> list[str]:
    """`holder` is down. The last holder writes the host's own value back; returns the others."""
    return SysctlLedger(ledger, proc, (RESERVED,)).release(holder, {RESERVED: own})


def reserved(proc: Path = PROC_SYS) -> str:
    return read_sysctls((RESERVED,), proc)[RESERVED]


def holders(ledger: Path = PORT_LEDGER, proc: Path = PROC_SYS) -> list[str]:
    """Who holds the reservation now: beds' state files, `PortHold`s' files."""
    return SysctlLedger(ledger, proc, (RESERVED,)).holders()


class PortHold:
    """Ports reserved for as long as one process lives, bed or no bed: the test run's
    (tests/conftest.py). A bed reserves its ports only from its own `up`, and the connections and
    servers made before stay: a long-lived one on a bed's port (a watch of the session's Kubernetes
    bed, made at its start) would refuse every bed of the run. Held from the run's first moment, no
    connection or server of the run takes one. The holder in the ledger is the hold's state file
    (`state`); a reaper (`python -m ce_k8s.real.reaper --bed ports`) releases it if its owner dies
    without `release` (a CI time-out's SIGTERM, which runs no teardown)."""

    def __init__(self, state: Path | str, ledger: Path = PORT_LEDGER, proc: Path = PROC_SYS) -> None:
        self.state = Path(state)
        self.ledger = Path(ledger)
        self.proc = proc

    def hold(self, ports: Iterable[int], owner_pid: int) -> None:
        """Reserve `ports` until `release`, or until `owner_pid` dies; a hold that fails to start
        gives back what it took (its reservation, its state file)."""
        # the state file first: a holder whose file is missing is stale to the ledger
        self._save(saved=None, reaper_pid=0)
        try:
            saved = reserve(str(self.state), ports, self.ledger, self.proc)
            self._save(saved=saved, reaper_pid=0)
            reaper = subprocess.Popen([sys.executable, "-m", "ce_k8s.real.reaper", "--bed", "ports",
                                       "--state", str(self.state), "--pid", str(owner_pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            self._save(saved=saved, reaper_pid=reaper.pid)
        except BaseException:
            self.release()
            raise

    def _save(self, saved: str | None, reaper_pid: int) -> None:
        self.state.write_text(json.dumps({"ledger": str(self.ledger), "saved": saved, "reaper_pid": reaper_pid}))

    def release(self) -> list[str]:
        """Give the ports back (the last holder writes the host's value back); returns the other
        holders. Nothing to do when the hold is gone."""
        try:
            data = json.loads(self.state.read_text())
        except (OSError, ValueError):
            return []
        others = release(str(self.state), data["saved"] or "", Path(data["ledger"]), self.proc) \
            if data["saved"] is not None else []
        self.state.unlink(missing_ok=True)
        if data["reaper_pid"] and data["reaper_pid"] != os.getpid():
            terminate(data["reaper_pid"], timeout=5)
        return others


@dataclass(frozen=True)
class PortUse:
    """One socket on the port, as /proc/net/tcp{,6} lists it."""

    state: str
    local: str
    remote: str
    inode: int

    def describe(self, owners: dict[int, Owner]) -> str:
        owner = owners.get(self.inode)
        who = str(owner) if owner else "no process: the kernel keeps it" if self.inode == 0 else "a process"
        return f"{self.state} {self.local} -> {self.remote} ({who})"


def _address(hexed: str) -> str:
    host, port = hexed.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        text = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:   # four host-order 32-bit words
        text = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return f"{text}:{int(port, 16)}"


def uses(port: int, proc_net: Path = Path("/proc/net")) -> list[PortUse]:
    """Every TCP socket of this network namespace whose local port is `port`."""
    found = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc_net / table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    found.append(PortUse(TCP_STATES.get(fields[3], fields[3]), _address(fields[1]),
                                         _address(fields[2]), int(fields[9])))
    return found


@dataclass(frozen=True)
class Owner:
    """A process holding a socket on the port."""

    pid: int
    comm: str
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.comm})"

    @property
    def of_a_bed(self) -> bool:
        """A real-HTCondor bed's daemon (condor_*) or its SciTokens issuer."""
        return self.comm.startswith("condor_") or "ce_k8s.real.condor.issuer" in self.cmdline


def owners(inodes: set[int], proc: Path = Path("/proc")) -> dict[int, Owner]:
    """The processes holding the sockets `inodes`, for the error messages."""
    wanted = {f"socket:[{i}]": i for i in inodes if i}
    found: dict[int, Owner] = {}
    if not wanted:
        return found
    for pid in (p for p in os.listdir(proc) if p.isdigit()):
        with contextlib.suppress(OSError):
            for fd in os.listdir(proc / pid / "fd"):
                inode = wanted.get(os.readlink(proc / pid / "fd" / fd))
                if inode is not None and inode not in found:
                    cmdline = (proc / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found[inode] = Owner(int(pid), (proc / pid / "comm").read_text().strip(), cmdline)
    return found


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _another_bed(port: int, found: list[PortUse]) -> RealCondorError:
    """A listener on the port: another bed's daemon, or a process that took the port for its own
    server before any bed reserved it (a `bind` to port 0); the message names which."""
    names = owners({u.inode for u in found if u.state == "LISTEN"}).values()
    who = ", ".join(sorted({str(o) for o in names})) or "a process this user cannot see"
    if not names or any(o.of_a_bed for o in names):
        return RealCondorError(f"127.0.0.1:{port} is in use (listened on by {who}): another real-HTCondor bed "
                               "(or a collector) is running; one bed per machine at a time, `ce-k8s testbed "
                               "real-condor status --state DIR` finds it")
    return RealCondorError(f"127.0.0.1:{port} is in use (listened on by {who}), which a bed needs: that server "
                           "was given the port before any bed reserved it (the kernel's ephemeral range, "
                           f"net.ipv4.ip_local_port_range, covers it); restart it, or reserve the port for good: "
                           f"sysctl -w {RESERVED}=...,{port}")


def listened_on(port: int, proc_net: Path = Path("/proc/net")) -> bool:
    """Whether a socket listens on `port`: another bed's daemon, not a connection's end."""
    return any(u.state == "LISTEN" for u in uses(port, proc_net))


def refuse_listeners(ports: Iterable[int], proc_net: Path = Path("/proc/net")) -> None:
    """Refuse to start a second bed before touching anything: its daemons would talk to the first
    one's, and its `down` would unmount and kill them (seen when another session brought a bed up
    on a copy of the root). A listener on a bed's port is such a bed."""
    for port in ports:
        found = uses(port, proc_net)
        if any(u.state == "LISTEN" for u in found):
            raise _another_bed(port, found)


def wait_free(port: int, progress: Callable[[str], None] = print, timeout: float = EARLIER_CONNECTIONS_S,
              proc_net: Path = Path("/proc/net")) -> None:
    """Return once a daemon can bind 127.0.0.1:`port`, which the bed has reserved: the connections
    that took it as their local port before are given `timeout` to go (a listener is another bed:
    refused at once). Past it, the error names each connection and its process."""
    deadline = time.monotonic() + timeout
    said = False
    while not _bindable(port):
        found = uses(port, proc_net)
        if any(u.state == "LISTEN" for u in found):
            raise _another_bed(port, found)
        if time.monotonic() >= deadline:
            names = owners({u.inode for u in found})
            held = "; ".join(u.describe(names) for u in found) or "no socket listed in /proc/net/tcp{,6}"
            raise RealCondorError(f"127.0.0.1:{port} is still taken {timeout:.0f} s after the bed reserved it, by "
                                  f"connections made before: {held}. The kernel's ephemeral range "
                                  "(net.ipv4.ip_local_port_range) covers the port; close them, or reserve the "
                                  f"port for good: sysctl -w {RESERVED}=...,{port}")
        if not said:
            progress(f"127.0.0.1:{port} is taken by {len(found)} connection(s) made before the bed reserved it "
                     f"(their local port, from the kernel's ephemeral range): waiting up to {timeout:.0f} s "
                     "for them to close")
            said = True
        time.sleep(0.5)
    if said:
        progress(f"127.0.0.1:{port} is free")
