"""`ce-k8s demo`: pilots through the whole emulated path, with progress and a condor_ce_q-like table.

    ce-k8s demo [--pilots N] [--evict-fraction F] [--api-fault-rate F] [--restart-agent] [--json]
                [--config PATH] [--batch-fraction F] [--renew-fraction F] [--history-dir DIR]

Everything runs on this machine (docs/demo.md): the Kubernetes API emulator with its kubelet
simulator, the real ``ce-k8s agent`` as a subprocess, the router emulator spawning the real hook
launchers, the shipped routes. Progress goes to stderr; the table (or one JSON object with
``--json``) to stdout. Exit code 0 when every pilot completed (or was held), nothing leaked and, in
mixed mode (``--batch-fraction``), ce-k8s touched no pilot of the Slurm-style route.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pilots", type=int, default=40, metavar="N", help="pilots to submit (default 40)")
    parser.add_argument("--evict-fraction", type=float, default=0.0, metavar="F",
                        help="fraction of pilots whose first pod is evicted (default 0)")
    parser.add_argument("--api-fault-rate", type=float, default=0.0, metavar="F",
                        help="fraction of API requests answered 429/500/applied-then-timeout (default 0)")
    parser.add_argument("--batch-fraction", type=float, default=0.0, metavar="F",
                        help="mixed mode: fraction of pilots for a Slurm-style route ce-k8s must leave alone "
                             "(default 0: no such route)")
    parser.add_argument("--renew-fraction", type=float, default=0.1, metavar="F",
                        help="fraction of pilots whose proxy is renewed in the spool while they run; each pod "
                             "must show the new proxy in its mounted Secret (default 0.1)")
    parser.add_argument("--restart-agent", action="store_true",
                        help="SIGKILL the agent at random moments and restart it")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--history-dir", metavar="DIR",
                        help="keep the agent's per-job history files (one per pod attempt, for APEL) in DIR and "
                             "check them against the emulator (docs/accounting.md)")
    parser.add_argument("--config", metavar="PATH",
                        help="CE config file or directory to use instead of the shipped routes and defaults")
    parser.add_argument("--nodes", metavar="SPEC", help="simulated node pools (docs/testbed.md grammar)")
    parser.add_argument("--run-seconds", type=float, default=20.0, metavar="S",
                        help="simulated pilot run time (scaled by --time-scale; default 20)")
    parser.add_argument("--time-scale", type=float, default=0.05, metavar="X",
                        help="real seconds per simulated second in the kubelet (default 0.05)")
    parser.add_argument("--poll", type=float, default=1.0, metavar="S",
                        help="router polling period in real seconds (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S", help="give up after S seconds")
    parser.add_argument("--seed", type=int, default=1, help="random seed (pilot mix, faults, restarts)")
    parser.add_argument("--condor", choices=("emulated", "real"), default="emulated",
                        help="the job router: our emulator (default) or the real HTCondor test bed "
                             "(`ce-k8s testbed real-condor up`; brought up and down here if it is not up)")
    parser.add_argument("--factory", action="store_true",
                        help="with --condor real: submit from the factory schedd over HTCondor-C")
    parser.add_argument("--state", metavar="DIR", help="with --condor real: the test bed's state directory")
    parser.add_argument("--htcondor", choices=("25", "23"), default="25",
                        help="with --condor real: HTCondor 25.14.1 (sid, the default) or 23.9.6 (Debian 13)")
    parser.add_argument("--ce-config", choices=("stock", "bed"), default=None,
                        help="with --condor real: the CE's configuration, HTCondor-CE's stock files with token "
                             "authentication from the factory (the default on HTCondor 25) or the bed's own "
                             "(the default on 23.9); a bed that is up keeps its own (docs/real-condor.md)")


def _progress(stream):
    last = [0.0]

    def show(bed) -> None:
        now = time.monotonic()
        if now - last[0] < 1.0:
            return
        last[0] = now
        states = Counter(o.status for o in bed.outcomes.values())
        queue = Counter()
        for job in bed.outcomes:
            ad = bed.schedd.get(job)
            if ad is not None and states and bed.outcomes[job].status == "queued":
                queue[int(ad.eval("JobStatus"))] += 1
        stream.write(
            f"[{now - bed.started:6.1f}s] idle {queue[1]:4d}  running {queue[2]:4d}  held {queue[5]:3d}  "
            f"completed {states['completed']:4d}/{len(bed.outcomes)}  pods {bed.tracker.pods_created:4d}  "
            f"agent restarts {bed.agent_restarts}\n")
        stream.flush()
    return show


STATUS = {"completed": "C", "held": "H", "removed": "R", "lost": "X", "queued": "?", "batch": "B"}


def _table(bed) -> str:
    rows = [("ID", "OWNER", "ROUTE", "ST", "POD", "NODE", "EXIT")]
    for job, out in bed.outcomes.items():
        rows.append((job, out.pilot.owner, out.route or "-", STATUS[out.status], out.pod or "-", out.node or "-",
                     "-" if out.exit_code is None else str(out.exit_code)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace, kube_server=None) -> int:
    """The demo; `kube_server` is a real control plane's adapter (ce_k8s.demos.cli_demo), else the emulator."""
    import logging

    if args.condor == "real":       # ce_k8s.demos.cli_demo runs the real HTCondor; it never comes here
        sys.stderr.write("ce-k8s demo: --condor real is run by ce_k8s.demos.cli_demo\n")
        return 2
    if args.factory:
        sys.stderr.write("ce-k8s demo: --factory needs --condor real\n")
        return 2

    from ce_k8s.sim.testbed import DEFAULT_NODES, TestBed

    if logging.getLogger().level > logging.DEBUG:
        # Hook stderr and retried cleanups are expected under injected faults; the summary counts
        # them (router_events). `ce-k8s --debug demo` shows every line.
        logging.getLogger("ce_k8s.sim.condor.router").setLevel(logging.CRITICAL)

    if not 0.0 <= args.batch_fraction <= 1.0:
        sys.stderr.write("ce-k8s demo: --batch-fraction must be between 0 and 1\n")
        return 2
    if not 0.0 <= args.renew_fraction <= 1.0:
        sys.stderr.write("ce-k8s demo: --renew-fraction must be between 0 and 1\n")
        return 2
    from ce_k8s.demos.credrefresh import CredentialDrill
    history = None
    extra = ""
    if args.history_dir:
        history = Path(args.history_dir).resolve()
        history.mkdir(parents=True, exist_ok=True)
        # Pods of the demo live about a second: read the kubelets' usage often.
        extra = f"CE_K8S_PER_JOB_HISTORY_DIR = {history}\nCE_K8S_USAGE_INTERVAL = 0.5\n"
    bed = TestBed(config=args.config, nodes=args.nodes or DEFAULT_NODES, fault_rate=args.api_fault_rate,
                  time_scale=args.time_scale, seed=args.seed, batch_route=args.batch_fraction > 0,
                  extra_config=extra, kube_server=kube_server)
    witness = None
    try:
        bed.start()
        if history is not None and kube_server is None:
            from ce_k8s.demos.demo_accounting import AttemptWitness

            witness = AttemptWitness(getattr(bed.server, "kubelet", None))
            bed.server.call(bed.server.store.add_listener, witness)
        pilots = bed.make_pilots(args.pilots, evict_fraction=args.evict_fraction, run_s=args.run_seconds,
                                 batch_fraction=args.batch_fraction)
        drill = CredentialDrill(args.renew_fraction, seed=args.seed)
        drill.choose(pilots, args.poll, args.time_scale)
        bed.submit(pilots)
        sys.stderr.write(f"ce-k8s demo: {len(pilots)} pilots, API at {bed.server.url}, work dir {bed.root}\n")
        show = _progress(sys.stderr)

        def progress(tick_bed) -> None:
            drill.turn(tick_bed)
            show(tick_bed)
        bed.run(timeout=args.timeout, poll_interval=args.poll, restart_agent=args.restart_agent,
                progress=progress)
        bed.drain(timeout=min(60.0, args.timeout))
        summary = bed.summary()
        summary.update(drill.summary())
        if history is not None and witness is None:
            from ce_k8s.demos.demo_accounting import check_invariants

            summary["history"] = check_invariants(history)
        if history is not None and witness is not None:
            from ce_k8s.demos.demo_accounting import check, wait_for_files

            wait_for_files(history, len(witness.ran()))
            summary["history"] = check(history, witness)
        if args.json:
            print(json.dumps(summary, sort_keys=True))
        else:
            print(_table(bed))
            print()
            print(f"{summary['completed']} completed, {summary['held']} held, {summary['removed']} removed, "
                  f"{summary['lost']} lost; "
                  f"{summary['pods_created']} pods created, {summary['duplicate_pods']} duplicates, "
                  f"{summary['pods_left']} pods and {summary['secrets_left']} secrets left; "
                  f"{summary['pilots_per_s']} pilots/s over {summary['wall_s']} s")
            if summary["credentials_renewed"]:
                print(f"{summary['credentials_renewed']} proxies renewed mid-run, {summary['credentials_refreshed']} "
                      f"seen in the pod's mounted Secret (at most {summary['credential_refresh_polls_max']} polls "
                      f"later), {summary['credentials_pod_ended_first']} pods ended first")
            if args.batch_fraction > 0:
                print(f"{summary['batch_routed']} routed to the Slurm-style route and left in the queue, "
                      f"{summary['batch_touched']} of them touched by ce-k8s")
            if "history" in summary:
                h = summary["history"]
                print(f"{h['files']} history files in {h['dir']} for {h['attempts_ran']} attempts that ran: "
                      f"{h['missing']} missing, {h['incomplete']} incomplete, {h['wall_mismatch']} wall mismatches, "
                      f"{h['cpu_over_reported']} CPU above the kubelet's")
        ok = (summary["lost"] == 0 and summary["duplicate_pods"] == 0 and summary["pods_left"] == 0
              and summary["secrets_left"] == 0 and summary["batch_touched"] == 0
              and summary.get("history", {}).get("ok", True) and summary["credentials_all_seen"])
        return 0 if ok else 1
    finally:
        bed.close()
