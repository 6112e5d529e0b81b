"""A real-HTCondor bed whose owner dies is taken down by its reaper (ce_k8s.real.reaper).

The bed's daemons run in sessions of their own; a test run killed with its bed up (SIGKILL, or the
SIGTERM a CI time-out sends pytest, which runs no fixture's teardown) left condor_master's
children, the agent and the root's bind mounts behind, and the next run found the root busy.
This was seen on this machine: a suite stopped with SIGTERM left the batch pool's bed up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import polling
import pytest

from ce_k8s.real.condor import ports
from ce_k8s.real.condor.condor import COLLECTOR_PORT, RealCondor, RealCondorError, _processes_in
from ce_k8s.real.processes import alive

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def test_a_bed_waits_for_a_connection_on_its_port_and_its_owner_takes_it_down_with_its_reaper():
    """A connection that took the collector's port before the bed came up (the CI run at defdfa4:
    an ephemeral port of some other connection) is waited for, not taken for another bed; then the
    usual end: a second bed is refused, its state untouched; the owner's own `down` gives the
    reservation back, and the reaper, with nothing left to do, is gone with it."""
    if os.geteuid() != 0:
        pytest.fail("the real-HTCondor tests need root (CI runs as root); see docs/real-condor.md")
    state = Path("/var/tmp") / f"ce-k8s-real-condor-owned-{os.getpid()}"
    bed = RealCondor(state)
    host_ports = ports.reserved()
    listener = socket.create_server(("127.0.0.1", 0))
    early = socket.socket()
    # as the kernel may give the port to any connection (no SO_REUSEADDR, as a client has): once the
    # TIME_WAITs of an earlier bed's collector are over, which a bed's own bind does not wait for
    polling.wait_for(lambda: _bound(early, COLLECTOR_PORT), timeout=120, interval=1,
                     what=f"the TIME_WAITs on 127.0.0.1:{COLLECTOR_PORT} of an earlier bed to end")
    early.connect(listener.getsockname())
    said: list[str] = []
    waiting = threading.Event()

    def progress(msg: str) -> None:
        said.append(msg)
        if f"127.0.0.1:{COLLECTOR_PORT} is taken by 1 connection(s)" in msg:
            waiting.set()

    up = threading.Thread(target=lambda: bed.up(poll=2, progress=progress, owner_pid=os.getpid()))
    try:
        up.start()
        assert waiting.wait(300), said
        assert str(COLLECTOR_PORT) in ports.reserved().split(",")     # reserved before it waits
        early.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        early.close()                                               # an RST: no TIME_WAIT left
        up.join(300)
        status = bed.status()
        assert status.get("up"), said
        assert str(COLLECTOR_PORT) in status["reserved_ports"].split(",")    # what `status` shows
        reaper = int(json.loads(bed.state_file.read_text())["reaper_pid"])
        assert alive(reaper)
        second = RealCondor(Path(f"{state}-second"))
        with pytest.raises(RealCondorError, match=r"listened on by pid \d+ \(condor_collecto.*another real-HTCondor"):
            second.up(poll=2, progress=lambda m: None)       # refused before it touches anything
        assert not second.state_dir.exists()
        bed.down(progress=lambda m: None)
        assert not alive(reaper) and not _processes_in(bed.root)
        assert ports.reserved() == host_ports and str(bed.state_file) not in ports.holders()
    finally:
        early.close()
        listener.close()
        up.join(300)
        bed.down(progress=lambda m: None)
        shutil.rmtree(state, ignore_errors=True)


def test_a_bed_whose_owner_is_killed_is_taken_down_by_its_reaper():
    if os.geteuid() != 0:
        pytest.fail("the real-HTCondor tests need root (CI runs as root); see docs/real-condor.md")
    state = Path("/var/tmp") / f"ce-k8s-real-condor-reaped-{os.getpid()}"
    bed = RealCondor(state)
    host_ports = ports.reserved()
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, time
        from ce_k8s.real.condor.condor import RealCondor
        RealCondor({str(state)!r}).up(poll=2, progress=lambda m: None, owner_pid=os.getpid())
        print("up", flush=True)
        time.sleep(3600)
        """)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert owner.stdout.readline().strip() == "up"
        up = bed.status()
        assert up.get("up"), up
        reaper = int(json.loads(bed.state_file.read_text())["reaper_pid"])
        assert alive(reaper)
        assert _processes_in(bed.root), "the bed runs daemons in its root"
        assert [m for m in open("/proc/self/mounts").read().split("\n") if f" {bed.root}/" in m]
        assert str(COLLECTOR_PORT) in ports.reserved().split(",")
        owner.send_signal(signal.SIGKILL)       # the test run dies without a word
        owner.wait()
        polling.wait_for(lambda: not bed.state_file.exists() and not alive(reaper), timeout=120, interval=0.5,
                         what="the reaper to take the bed down",
                         on_timeout=lambda: (state / "reaper.log").read_text(errors="replace")[-2000:])
        assert not _processes_in(bed.root), "the reaper's down left processes in the root"
        assert not [m for m in open("/proc/self/mounts").read().split("\n") if f" {bed.root}/" in m]
        assert "taking the bed in" in (state / "reaper.log").read_text()
        assert ports.reserved() == host_ports                     # the machine's value (or the run's hold) back
        assert str(bed.state_file) not in ports.holders()
    finally:
        owner.kill()
        owner.wait()
        bed.down(progress=lambda m: None)
        shutil.rmtree(state, ignore_errors=True)
