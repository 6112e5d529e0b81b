"""`ce-k8s testbed real-condor up|down|status`: the real-HTCondor test bed (ce_k8s.real.condor.condor).

    ce-k8s testbed real-condor up [--htcondor 25|23] [--ce-config stock|bed] [--batch] [--poll S]
                                  [--nodes SPEC] [--state DIR] [--root DIR]
    ce-k8s testbed real-condor down [--htcondor 25|23] [--state DIR] [--root DIR]
    ce-k8s testbed real-condor status [--htcondor 25|23] [--json] [--state DIR] [--root DIR]

Needs root. `up` builds and caches the Debian root of the chosen HTCondor on first use (about a
minute): 25.14.1 from sid (the default: HTCondor-CE 25's HTCondor, the one `ce-k8s route` models)
or 23.9.6 from Debian 13; then it starts the Kubernetes emulator and condor_master (collector, CE
schedd, job router, factory schedd, the ce-k8s agent); `down` stops all of it and undoes the
mounts. On 25 the CE runs HTCondor-CE's own configuration (`--ce-config stock`, ce_k8s.real.condor.stockce),
on 23.9 the bed's. `--batch` adds a batch pool (a schedd `batch@<host>`, a negotiator and a startd that runs
only that schedd's jobs) that a client outside the root reaches with an IDTOKEN. docs/real-condor.md.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ce_k8s.real.condor.condor import DEFAULT_HTCONDOR, DEFAULT_NODES, STATE_DIR, VERSIONS, default_root

    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--htcondor", choices=tuple(VERSIONS), default=DEFAULT_HTCONDOR,
                        help="which HTCondor: " + ", ".join(f"{k} = {f.version} from Debian's {f.suite}"
                                                             for k, f in VERSIONS.items())
                        + f" (default {DEFAULT_HTCONDOR})")
    parser.add_argument("--state", default=str(STATE_DIR), metavar="DIR",
                        help=f"state directory, bind-mounted into the root (default {STATE_DIR})")
    parser.add_argument("--root", metavar="DIR",
                        help="the cached Debian root of that HTCondor (default "
                             + ", ".join(f"{default_root(k)} for {k}" for k in VERSIONS) + ")")
    parser.add_argument("--poll", type=int, default=2, metavar="S", help="JOB_ROUTER_POLLING_PERIOD (default 2)")
    parser.add_argument("--nodes", default=DEFAULT_NODES, metavar="SPEC", help="simulated node pools")
    parser.add_argument("--time-scale", type=float, default=0.05, metavar="X",
                        help="real seconds per simulated second in the kubelet (default 0.05)")
    parser.add_argument("--ce-config", choices=("stock", "bed"), default=None,
                        help="stock: HTCondor-CE's own files plus `ce-k8s install`'s, token authentication "
                             "from the factory (the default on HTCondor 25); bed: the test bed's own CE "
                             "configuration, with BLAH's call log (the default on 23.9, whose daemons refuse "
                             "HTCondor-CE 25's files, and with --batch); down and status act on what up ran "
                             "(docs/real-condor.md)")
    parser.add_argument("--batch", action="store_true",
                        help="up: also a batch pool (schedd `batch@<host>`, negotiator, startd running only "
                             "that schedd's jobs), reachable with an IDTOKEN from outside the root; "
                             "default bed only (docs/real-condor.md, \"The batch pool\")")
    parser.add_argument("--json", action="store_true", help="status as one JSON object")


def run(args: argparse.Namespace) -> int:
    from ce_k8s.real.bedcli import progress, run_bed
    from ce_k8s.real.condor.condor import RealCondorError
    from ce_k8s.real.condor.stockce import real_condor

    return run_bed(
        "real-condor", args.action,
        lambda: real_condor(args.state, args.root, htcondor=args.htcondor, ce_config=args.ce_config, batch=args.batch),
        up=lambda env: env.up(poll=args.poll, nodes=args.nodes, time_scale=args.time_scale, progress=progress),
        errors=(RealCondorError,), as_json=args.json)
