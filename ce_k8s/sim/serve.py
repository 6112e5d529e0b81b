"""``ce-k8s sim serve``: the API emulator and the kubelet simulator in the foreground.

For pointing ``kubectl``, the agent or any client at an emulated cluster by hand (and for the
benchmarks, which run the server in its own process so client and server do not share a GIL).
Prints exactly one ``ready <url>`` line on stdout once the kubeconfig is written, then serves until
SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``ce-k8s sim serve``."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--nodes", default=None,
                        help='simulated nodes, e.g. "cpu:3x16c64g,gpu:1x32c256g4gpu:taint=nvidia.com/gpu=present:'
                             'NoSchedule" (default cpu:3x16c64g; see docs/testbed.md)')
    parser.add_argument("--kubeconfig-out", required=True, metavar="FILE", help="write a kubeconfig here")
    parser.add_argument("--namespace", default="default", help="namespace of the kubeconfig context")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="simulated seconds → real seconds factor (0.01: a 60 s pilot takes 0.6 s)")
    parser.add_argument("--no-kubelet", action="store_true", help="serve the API only (pods stay Pending)")
    parser.add_argument("--scenario", default=None, help='default container scenario (default "run=60s exit=0")')
    parser.add_argument("--fault-rate", type=float, default=0.0,
                        help="probability per request of an injected fault, split evenly between 429, 500 and "
                             "write-applied-then-timeout")
    parser.add_argument("--fault-429", type=float, default=None, help="probability of 429 Too Many Requests")
    parser.add_argument("--fault-500", type=float, default=None, help="probability of 500 Internal Error")
    parser.add_argument("--fault-timeout", type=float, default=None,
                        help="probability that a write is applied and then the answer is lost")
    parser.add_argument("--watch-cut", type=float, default=0.0,
                        help="probability per watch event of cutting the stream")
    parser.add_argument("--watch-cut-after", type=float, default=None, help="cut every watch after this many seconds")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    parser.add_argument("--jitter", type=float, default=0.0, help="plus a random 0..JITTER seconds")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault and naming RNGs")
    streams = parser.add_mutually_exclusive_group()
    streams.add_argument("--log-streams", choices=("split", "forbid", "ignore"), default="forbid",
                         help="what pods/log does with stream=Stdout|Stderr: split (Kubernetes >= 1.32 with the "
                              "PodLogsQuerySplitStreams feature gate on), forbid (>= 1.32 with the gate off: 422), "
                              "ignore (<= 1.31: the combined log; the default)")
    streams.add_argument("--split-logs", dest="log_streams", action="store_const", const="split",
                         help="same as --log-streams split")
    parser.add_argument("--stats", action="store_true",
                        help="serve GET /_sim/stats (API calls by verb, ce-k8s pods and Secrets left, pod "
                             "creations per job) for benchmarks that run the emulator in its own process")


def _faults(args: argparse.Namespace) -> object:
    from ce_k8s.sim.kube.faults import Faults

    rates = [r for r in (args.fault_rate, args.fault_429, args.fault_500, args.fault_timeout, args.watch_cut)
             if r is not None]
    if any(not 0.0 <= r <= 1.0 for r in rates):
        raise ValueError("fault rates must be between 0 and 1")
    faults = Faults.from_rate(args.fault_rate, seed=args.seed)
    if args.fault_429 is not None:
        faults.rate_429 = args.fault_429
    if args.fault_500 is not None:
        faults.rate_500 = args.fault_500
    if args.fault_timeout is not None:
        faults.rate_timeout = args.fault_timeout
    faults.cut_rate = args.watch_cut
    faults.cut_after = args.watch_cut_after
    faults.latency = args.latency
    faults.jitter = args.jitter
    return faults


def _enable_stats(srv: object) -> None:
    """Register the test bed's pod tracker and leftover counts behind ``GET /_sim/stats``."""
    from ce_k8s.sim.testbed import PodTracker, managed_count

    tracker = PodTracker()
    srv.store.add_listener(tracker)  # type: ignore[attr-defined]

    def extra() -> dict[str, object]:
        return {"pods_left": managed_count(srv.store, "pods"),  # type: ignore[attr-defined]
                "secrets_left": managed_count(srv.store, "secrets"),  # type: ignore[attr-defined]
                "pods": tracker.as_dict()}

    srv.enable_stats(extra)  # type: ignore[attr-defined]


async def _serve(args: argparse.Namespace) -> int:
    from ce_k8s.sim.kube.apiserver import ApiServer
    from ce_k8s.sim.kube.cluster import parse_nodes

    if args.nodes is not None:
        parse_nodes(args.nodes)  # a bad spec fails here with a clear message
    kubelet_options = {"default_scenario": args.scenario} if args.scenario else {}
    srv = ApiServer(host=args.host, port=args.port, nodes=args.nodes, faults=_faults(args),  # type: ignore[arg-type]
                    time_scale=args.time_scale, kubelet=not args.no_kubelet, seed=args.seed,
                    namespace=args.namespace, kubelet_options=kubelet_options, log_streams=args.log_streams)
    await srv.start()
    if args.stats:
        _enable_stats(srv)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        srv.write_kubeconfig(args.kubeconfig_out)
        print(f"ready {srv.url}", flush=True)
        await stop.wait()
    finally:
        await srv.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; exit code 2 on bad options."""
    from ce_k8s.sim.kube.cluster import NodeSpecError

    try:
        return asyncio.run(_serve(args))
    except (NodeSpecError, ValueError) as e:
        print(f"ce-k8s sim serve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"ce-k8s sim serve: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
