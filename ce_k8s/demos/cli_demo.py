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
import sys


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
    ours = False
    try:
        if not env.status().get("up"):
            env.up(time_scale=args.time_scale, progress=progress, real_nodes=1)
            ours = True
        server = RealKubeServer(env)
        if args.condor == "real":
            server.start_tracking()
            try:
                return run_real(args, kube_server=server)
            finally:
                server.stop()
        return demo.run(args, kube_server=server)
    except (RealKubeError, BuildError) as exc:
        sys.stderr.write(f"ce-k8s demo --kube real: {exc}\n")
        return 2
    finally:
        if ours:
            env.down(progress=progress)


def run_real(args: argparse.Namespace, kube_server=None) -> int:
    """The demo over the real HTCondor test bed (ce_k8s.demos.condordemo); same JSON keys as the emulated one."""
    import json

    from ce_k8s.demos.condordemo import RealDemo
    from ce_k8s.real.condor.condor import STATE_DIR, RealCondorError
    from ce_k8s.real.condor.stockce import real_condor
    from ce_k8s.sim.pilots import generate

    def progress(msg: str) -> None:
        sys.stderr.write(f"ce-k8s demo: {msg}\n")
        sys.stderr.flush()

    ours = False
    try:
        env = real_condor(args.state or STATE_DIR, htcondor=args.htcondor, kube_server=kube_server,
                          ce_config=getattr(args, "ce_config", None))
        if not env.status().get("up"):
            env.up(progress=progress)
            ours = True
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
    except RealCondorError as exc:
        sys.stderr.write(f"ce-k8s demo --condor real: {exc}\n")
        return 2
    finally:
        if ours:
            env.down(progress=progress)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        for key, value in sorted(summary.items()):
            print(f"{key}: {value}")
    ok = (summary["lost"] == 0 and summary["duplicate_pods"] == 0 and summary["pods_left"] == 0
          and summary["secrets_left"] == 0)
    real = summary.get("real_node")
    if isinstance(real, dict) and real["completed"] != real["stdout_returned"]:
        ok = False          # a pilot that ran on the real node must have brought its output back
    return 0 if ok else 1
