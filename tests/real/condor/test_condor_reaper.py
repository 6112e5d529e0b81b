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
import subprocess
import sys
import textwrap
from pathlib import Path

import polling
import pytest

from ce_k8s.real.condor.condor import RealCondor, _processes_in
from ce_k8s.real.processes import alive

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]


def test_a_bed_whose_owner_is_killed_is_taken_down_by_its_reaper():
    if os.geteuid() != 0:
        pytest.fail("the real-HTCondor tests need root (CI runs as root); see docs/real-condor.md")
    state = Path("/var/tmp") / f"ce-k8s-real-condor-reaped-{os.getpid()}"
    bed = RealCondor(state)
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
        owner.send_signal(signal.SIGKILL)       # the test run dies without a word
        owner.wait()
        polling.wait_for(lambda: not bed.state_file.exists() and not alive(reaper), timeout=120, interval=0.5,
                         what="the reaper to take the bed down",
                         on_timeout=lambda: (state / "reaper.log").read_text(errors="replace")[-2000:])
        assert not _processes_in(bed.root), "the reaper's down left processes in the root"
        assert not [m for m in open("/proc/self/mounts").read().split("\n") if f" {bed.root}/" in m]
        assert "taking the bed in" in (state / "reaper.log").read_text()
    finally:
        owner.kill()
        owner.wait()
        bed.down(progress=lambda m: None)
        shutil.rmtree(state, ignore_errors=True)


def test_a_bed_taken_down_by_its_owner_stops_its_reaper_too():
    """The usual end: the owner's own `down`; the reaper has nothing left to do and is gone with it."""
    if os.geteuid() != 0:
        pytest.fail("the real-HTCondor tests need root (CI runs as root); see docs/real-condor.md")
    state = Path("/var/tmp") / f"ce-k8s-real-condor-owned-{os.getpid()}"
    bed = RealCondor(state)
    try:
        bed.up(poll=2, progress=lambda m: None, owner_pid=os.getpid())
        reaper = int(json.loads(bed.state_file.read_text())["reaper_pid"])
        assert alive(reaper)
        bed.down(progress=lambda m: None)
        assert not alive(reaper) and not _processes_in(bed.root)
    finally:
        bed.down(progress=lambda m: None)
        shutil.rmtree(state, ignore_errors=True)
