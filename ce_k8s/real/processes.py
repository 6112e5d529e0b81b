"""The real beds' processes: whether one still runs, how one is stopped, which run in a chroot.

Both real beds start daemons in sessions of their own and must stop them without leaving any
behind on a shared machine; the real-Kubernetes bed (ce_k8s.real.kube), its real nodes
(ce_k8s.real.node) and the real-HTCondor bed (ce_k8s.real.condor) use these, so a node stops
its kubelet exactly as the bed stops its API server. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from pathlib import Path


def alive(pid: int | None) -> bool:
    """Whether `pid` runs: a zombie (exited, not yet reaped) is not running, and a process of
    another user we may not signal still is."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return fh.read().split(") ")[-1][:1] != "Z"
    return True


def terminate(pid: int, timeout: float = 10.0) -> None:
    """Stop the process group `pid` leads: SIGTERM (with SIGCONT, so a stopped one sees it), up to
    `timeout` seconds for it to go, then SIGKILL; reaped when it is our child."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        os.killpg(pid, signal.SIGCONT)      # a stopped process (a lost node's kwok) must see it
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def processes_in(root: Path) -> list[int]:
    """Pids whose root directory is `root` (what a chroot started and what they started)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/root") == str(root):
                pids.append(int(entry))
    return pids


def wait_for_owner_exit(pid: int, state_file: Path, check_every: float = 2.0) -> bool:
    """Block until `pid` exits (True) or the bed's `state_file` is gone (False: taken down
    already). A bed's reaper waits here: on a pidfd of the owner (no polling, no pid reuse)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while state_file.exists():
            if poller.poll(check_every * 1000):
                return True
        return False
    finally:
        os.close(fd)
