"""Take a real-Kubernetes bed down when the process that owns it dies (test tool only).

A bed's processes run in sessions of their own, so they outlive a test run that is killed
(SIGKILL, a CI time-out, an OOM kill): its real nodes would keep their containers, cgroups and
changed sysctls. `RealKube.up(owner_pid=...)` starts this reaper beside the bed; it waits on a
pidfd of the owner (no polling, no pid reuse) and, when the owner is gone, runs the bed's own
`down` (ce_k8s.real.kube.kube), which undoes the nodes and restores the sysctls. A bed taken down by
its owner first leaves nothing for the reaper to do: it sees `down` remove the state file and exits.

    python -m ce_k8s.real.kube.reaper --state DIR --pid PID
"""

from __future__ import annotations

import argparse
import os
import select
import sys
from pathlib import Path


def wait_for_exit(pid: int, state_file: Path, check_every: float = 2.0) -> bool:
    """Block until `pid` exits (True) or the bed's state file is gone (False: taken down already)."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ce_k8s.real.kube.reaper")
    parser.add_argument("--state", required=True)
    parser.add_argument("--pid", type=int, required=True)
    args = parser.parse_args(argv)
    from ce_k8s.real.kube.kube import RealKube

    env = RealKube(args.state)
    if not wait_for_exit(args.pid, env.state_file):
        return 0
    print(f"reaper: owner {args.pid} is gone; taking the bed in {args.state} down", flush=True)
    env.down(progress=lambda m: print(f"reaper: {m}", flush=True), reaper=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
