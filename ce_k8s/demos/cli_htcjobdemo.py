"""`ce-k8s demo htcjob`: an HTCJob with `queue: 3` from submitted to completed, on the real
control plane and the real schedd (docs/htcjob.md, "The demo").

    ce-k8s demo htcjob [--queue N] [--to-ce] [--htcondor 25|23] [--json]

Brings up (or reuses) the real kube-apiserver and the real HTCondor with its batch pool, applies
the HTCJob CRD and the operator's RBAC, runs `ce-k8s htcjob-operator` on its ServiceAccount's
token, creates the HTCJob and prints each change of its `kubectl get htcjobs` row, then each
proc's exit code and output. With `--to-ce` the HTCJob goes to the site's CE schedd instead of the
batch schedd, and the CE's Kubernetes route takes each job into a pod (both directions at once).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", type=int, default=3, help="how many jobs (default 3)")
    parser.add_argument("--to-ce", action="store_true",
                        help="submit to the CE schedd: its Kubernetes route makes each job a pod")
    parser.add_argument("--htcondor", choices=("25", "23"), default="25", help="the real HTCondor (default 25)")
    parser.add_argument("--kube-state", default=None, help="a control plane to reuse (default: bring one up)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for completion")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace) -> int:
    from ce_k8s.demos.htcjobdemo import DemoError, run_demo

    def progress(msg: str) -> None:
        print(f"demo htcjob: {msg}", file=sys.stderr if args.json else sys.stdout, flush=True)

    try:
        result = run_demo(queue=args.queue, to_ce=args.to_ce, htcondor=args.htcondor, kube_state=args.kube_state,
                          timeout=args.timeout, progress=progress)
    except DemoError as exc:
        print(f"ce-k8s demo htcjob: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    return 0 if result["ok"] else 1
