"""`ce-k8s demo`: the emulated demo (ce_k8s.demos.demo), or the same run on the real control plane.

    ce-k8s demo [--kube emulated|real] [--kube-state DIR] [--condor emulated|real] [...the demo's options]

With `--kube real` the pilots' pods go to the real kube-apiserver of `ce-k8s testbed real-kube up`
(brought up here, and down again, when it is not up): admission, scheduling, the Eviction API and
garbage collection are the real ones, kwok plays each pod's scenario, and the agent holds only its
ServiceAccount's rights. Everything else is as `ce-k8s demo` (docs/demo.md); the JSON has the same
keys. This module owns the choice, and the real-HTCondor run, so that the emulator room never imports
the real one.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ce_k8s.demos import statedirs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ce_k8s.demos.demo import add_arguments as demo_arguments

    demo_arguments(parser)
    parser.add_argument("--kube", choices=("emulated", "real"), default="emulated",
                        help="Kubernetes: our API emulator and kubelet simulator (default), or the real control "
                             "plane with kwok nodes (`ce-k8s testbed real-kube up`; brought up and down here if "
                             "it is not up)")
    parser.add_argument("--real-node-share", type=float, default=0.1, metavar="F",
                        help="with --kube real --condor real: this share of the pilots (one-CPU pilots, at least "
                             "one) runs its own glidein script in a container on the bed's real node (default 0.1)")
    parser.add_argument("--pilot", choices=("script", "real"), default="script",
                        help="with --kube real --condor real: `real` sends the factory's pilots to the real node as "
                             "the pilot image (an HTCondor startd) that joins the bed's VO pool and runs its users' "
                             "jobs (docs/demo.md, \"Real pilots\"); `script` (default): the demo's glidein scripts")
    parser.add_argument("--user-jobs", type=int, default=6, metavar="N",
                        help="with --pilot real: the VO users' jobs (default 6)")
    parser.add_argument("--job-seconds", type=int, default=20, metavar="S",
                        help="with --pilot real: how long each user job works (default 20)")
    parser.add_argument("--kube-state", metavar="DIR",
                        help="with --kube real: the control plane's state directory "
                             "(default /var/tmp/ce-k8s-real-kube)")


def run(args: argparse.Namespace) -> int:
    from ce_k8s.demos import demo
    if args.kube == "emulated":
        return run_real(args) if args.condor == "real" else demo.run(args)
    if args.api_fault_rate:
        sys.stderr.write("ce-k8s demo: --api-fault-rate needs the emulator; a real API server injects no faults\n")
        return 2
    from ce_k8s.real.kube.kube import STATE_DIR, RealKube, RealKubeError
    from ce_k8s.real.kube.kubebuild import BuildError
    from ce_k8s.real.kube.kubeserver import RealKubeServer

    def progress(msg: str) -> None:
        sys.stderr.write(f"ce-k8s demo: {msg}\n")
        sys.stderr.flush()

    # The run on a real control plane always restarts the agent (SIGKILL) mid-run: nothing may be
    # lost, run twice or left because the agent died (issue 25).
    args.restart_agent = True
    env = RealKube(args.kube_state or STATE_DIR)
    made_here = not env.state_dir.exists()
    ours = False
    rc = 2
    try:
        if not env.status().get("up"):
            env.up(time_scale=args.time_scale, progress=progress, real_nodes=1, owner_pid=os.getpid())
            ours = True
        server = RealKubeServer(env)
        if args.condor == "real":
            server.start_tracking()
            try:
                rc = run_real(args, kube_server=server)
            finally:
                server.stop()
        else:
            rc = demo.run(args, kube_server=server)
        return rc
    except (RealKubeError, BuildError) as exc:
        sys.stderr.write(f"ce-k8s demo --kube real: {exc}\n")
        return 2
    finally:
        if ours:
            env.down(progress=progress)
            statedirs.tidy(env.state_dir, made_here, rc == 0, progress)


def run_real(args: argparse.Namespace, kube_server=None) -> int:
    """The demo over the real HTCondor test bed (ce_k8s.demos.condordemo); same JSON keys as the emulated one."""

    from ce_k8s.demos.condordemo import RealDemo
    from ce_k8s.real.condor.condor import STATE_DIR, RealCondorError
    from ce_k8s.real.condor.stockce import real_condor
    from ce_k8s.sim.pilots import generate

    def progress(msg: str) -> None:
        sys.stderr.write(f"ce-k8s demo: {msg}\n")
        sys.stderr.flush()

    ours = False
    rc = 2
    made_here = not Path(args.state or STATE_DIR).exists()
    try:
        env = real_condor(args.state or STATE_DIR, htcondor=args.htcondor, kube_server=kube_server,
                          ce_config=getattr(args, "ce_config", None))
        if not env.status().get("up"):
            env.up(progress=progress, owner_pid=os.getpid())      # a killed demo leaves no bed up
            ours = True
        if getattr(args, "pilot", "script") == "real":
            summary = _real_pilots(args, env, kube_server, progress)
            if summary is None:
                return 2
            rc = _report(args, summary)
            return rc
        # On a real control plane the run always includes an agent restart (issue 25: the whole
        # path with no emulator, an agent SIGKILLed mid-run); elsewhere when asked.
        share = getattr(args, "real_node_share", 0.0) if kube_server is not None else 0.0
        if share and not kube_server.env.real_node_names():
            progress("the control plane has no real node (`ce-k8s testbed real-kube up --real-nodes 1`): "
                     "every pilot runs on kwok nodes")
            share = 0.0
        demo = RealDemo(env, factory=args.factory, restart_agent=args.restart_agent or kube_server is not None,
                        real_node_share=share)
        pilots = generate(args.pilots, seed=args.seed, evict_fraction=args.evict_fraction, run_s=args.run_seconds)
        demo.submit(pilots)
        where = "from the factory over HTCondor-C" if args.factory else "to the CE"
        progress(f"{len(pilots)} pilots submitted {where}")
        demo.run(timeout=args.timeout, progress=progress)
        summary = demo.summary(demo.drain(timeout=min(120.0, args.timeout)))
        rc = _report(args, summary)
        return rc
    except RealCondorError as exc:
        sys.stderr.write(f"ce-k8s demo --condor real: {exc}\n")
        return 2
    finally:
        if ours:
            env.down(progress=progress)
            statedirs.tidy(env.state_dir, made_here, rc == 0, progress)


def _report(args: argparse.Namespace, summary: dict) -> int:
    """Print the summary; 0 when nothing was lost, run twice or left, and every pilot on the real node
    brought its output back (with --pilot real: every user job completed 0 with its output back)."""
    import json

    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        for key, value in sorted(summary.items()):
            print(f"{key}: {value}")
    ok = (summary["lost"] == 0 and summary["duplicate_pods"] == 0 and summary["pods_left"] == 0
          and summary["secrets_left"] == 0)
    real = summary.get("real_node")
    if isinstance(real, dict) and "user_jobs" in real:
        ok = (ok and real["user_jobs"] > 0 and real["pilots_completed"] == real["pilots"]
              and real["user_jobs_exit_0"] == real["user_outputs_returned"] == real["user_jobs"])
    elif isinstance(real, dict) and real["completed"] != real["stdout_returned"]:
        ok = False          # a pilot that ran on the real node must have brought its output back
    return 0 if ok else 1


def _real_pilots(args: argparse.Namespace, env, kube_server, progress) -> dict | None:
    """`--pilot real`: the VO pool on the real node, its users' jobs, the factory's pilots as the pilot
    image through the CE (ce_k8s.demos.pilotdemo); the summary, or None when it cannot run here."""
    import shutil
    import tempfile
    from pathlib import Path

    from ce_k8s.demos.pilotdemo import PilotDemo
    from ce_k8s.real.node.vopool import VOPoolError, pool_on_node

    if kube_server is None or not kube_server.env.real_node_names():
        sys.stderr.write("ce-k8s demo --pilot real: needs --kube real with a real node "
                         "(`ce-k8s testbed real-kube up --real-nodes 1`)\n")
        return None
    base = Path(tempfile.mkdtemp(prefix="ce-k8s-vo-pool-", dir="/var/tmp"))
    pool = None
    try:
        pool = pool_on_node(kube_server.env, env.core_api(), base, progress=progress)
        demo = PilotDemo(env, pool, user_jobs=args.user_jobs, job_seconds=args.job_seconds,
                         restart_agent=args.restart_agent)
        cluster = demo.submit_users()
        progress(f"{args.user_jobs} user jobs submitted to the VO pool ({pool.address}), cluster {cluster}")
        demo.submit(demo.pilots(args.pilots))
        progress(f"{args.pilots} pilots submitted from the factory over HTCondor-C")
        demo.run(timeout=args.timeout, progress=progress)
        demo.wait_for_users(timeout=60)
        return demo.summary(demo.drain(timeout=min(120.0, args.timeout)))
    except VOPoolError as exc:
        sys.stderr.write(f"ce-k8s demo --pilot real: {exc}\n")
        return None
    finally:
        if pool is not None:
            pool.stop()
        shutil.rmtree(base, ignore_errors=True)
