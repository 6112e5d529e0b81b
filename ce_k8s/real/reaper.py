"""Take a real bed down when the process that owns it dies (test tool only).

A bed's processes run in sessions of their own, so they outlive a test run that is killed
(SIGKILL, the SIGTERM a CI time-out sends pytest, which runs no teardown, an OOM kill): a real
Kubernetes bed's nodes would keep their containers, cgroups and changed sysctls; a real HTCondor
bed would keep its daemons in the root, its ports and its mounts, and the next run would find the
root busy. `RealKube.up(owner_pid=...)` and `RealCondor.up(owner_pid=...)` start this reaper
beside the bed; it waits on a pidfd of the owner (no polling, no pid reuse) and, when the owner is
gone, runs the bed's own `down`, the one `ce-k8s testbed real-kube|real-condor down` runs. A bed
taken down by its owner first leaves nothing to do: the reaper sees `down` remove the state file
and exits.

    python -m ce_k8s.real.reaper --bed kube|condor --state DIR --pid PID
    python -m ce_k8s.real.reaper --bed ports --state FILE --pid PID     (ce_k8s.real.condor.ports.PortHold)
"""

from __future__ import annotations

import argparse
import sys

from ce_k8s.real.processes import wait_for_owner_exit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ce_k8s.real.reaper")
    parser.add_argument("--bed", choices=("kube", "condor", "ports"), required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--pid", type=int, required=True)
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(f"reaper: {msg}", flush=True)

    if args.bed == "ports":
        from ce_k8s.real.condor.ports import PortHold

        hold = PortHold(args.state)
        if wait_for_owner_exit(args.pid, hold.state):
            say(f"owner {args.pid} is gone; releasing the ports it held ({args.state})")
            hold.release()
        return 0
    if args.bed == "kube":
        from ce_k8s.real.kube.kube import RealKube

        kube = RealKube(args.state)
        if wait_for_owner_exit(args.pid, kube.state_file):
            say(f"owner {args.pid} is gone; taking the bed in {args.state} down")
            kube.down(progress=say, reaper=False)
        return 0
    from ce_k8s.real.condor.stockce import real_condor

    condor = real_condor(args.state)        # the bed's kind (the stock CE or the bed's), from its state file
    if wait_for_owner_exit(args.pid, condor.state_file):
        say(f"owner {args.pid} is gone; taking the bed in {args.state} down")
        condor.down(progress=say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
