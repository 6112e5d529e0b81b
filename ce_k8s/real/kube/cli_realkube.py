"""`ce-k8s testbed real-kube build|up|down|status`: the real Kubernetes control plane (ce_k8s.real.kube.kube).

    ce-k8s testbed real-kube build  [--kubernetes 1.37|1.36]
    ce-k8s testbed real-kube up     [--kubernetes 1.37|1.36] [--nodes SPEC] [--state DIR]
    ce-k8s testbed real-kube down   [--state DIR]
    ce-k8s testbed real-kube status [--json] [--state DIR]

`build` (also done by `up` on first use) builds kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl, etcd and kwok from the Go module proxy into /var/cache/ce-k8s/kube
(cold: tens of minutes on 2 cores; warm: a stat). `up` starts them on loopback with kwok nodes
shaped like the demo's, applies containers/k8s/base and writes the agent's kubeconfig (its
ServiceAccount's token) to <state>/kubeconfig. docs/real-kubernetes.md.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ce_k8s.real.kube.kube import DEFAULT_NODES, STATE_DIR
    from ce_k8s.real.kube.kubebuild import DEFAULT_MINOR, RELEASES

    parser.add_argument("action", choices=("build", "up", "down", "status"))
    parser.add_argument("--kubernetes", choices=tuple(RELEASES), default=DEFAULT_MINOR,
                        help="which release: " + ", ".join(f"{k} = {v}" for k, v in RELEASES.items())
                        + f" (default {DEFAULT_MINOR})")
    parser.add_argument("--state", default=str(STATE_DIR), metavar="DIR", help=f"state directory (default {STATE_DIR})")
    parser.add_argument("--nodes", default=DEFAULT_NODES, metavar="SPEC",
                        help="kwok node pools (the grammar of docs/testbed.md)")
    parser.add_argument("--time-scale", type=float, default=0.05, metavar="X",
                        help="real seconds per simulated second when kwok plays a pod's scenario (default 0.05)")
    parser.add_argument("--real-nodes", type=int, default=1, choices=(0, 1, 2), metavar="N",
                        help="real nodes (a kubelet on containerd and runc, tainted ce-k8s.test/real-node) "
                             "beside the kwok nodes (default 1)")
    parser.add_argument("--json", action="store_true", help="status as one JSON object")


def run(args: argparse.Namespace) -> int:
    from ce_k8s.real.bedcli import progress, run_bed
    from ce_k8s.real.kube.kube import RealKube, RealKubeError
    from ce_k8s.real.kube.kubebuild import BuildError, build
    from ce_k8s.real.node.node import RealNodeError
    from ce_k8s.real.node.noderuntime import NodeBuildError

    return run_bed(
        "real-kube", args.action, lambda: RealKube(args.state, minor=args.kubernetes),
        up=lambda env: env.up(nodes=args.nodes, time_scale=args.time_scale, progress=progress,
                              real_nodes=args.real_nodes),
        errors=(RealKubeError, BuildError, RealNodeError, NodeBuildError), as_json=args.json,
        others={"build": lambda: print(build(args.kubernetes, progress=progress).bin)})
