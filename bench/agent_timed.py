"""`ce-k8s agent` with its request handler timed: the agent process the agent benchmark talks to.

    python bench/agent_timed.py --config DIR --kubeconfig FILE --socket PATH --spool DIR

Why a wrapper and not a second, in-process agent: the figure the issue asks for is the agent-side
time per update *in the agent that serves the hooks* (same process, same 20,000-pod cache, same
memory), and a second agent would double the LIST and the memory of the benchmark. The wrapper
replaces `Agent.handle` with a timed call of the original before the agent starts; the timing
costs two `perf_counter()` calls and a list append (well under a microsecond).

On SIGUSR2 the update-request durations recorded so far (seconds, JSON list) are written to
`$CE_K8S_BENCH_TIMINGS` (atomically) and the record is cleared. After every full LIST of the
pods, `$CE_K8S_BENCH_TIMINGS.relists` is rewritten with every LIST so far (`time.monotonic()`
start and end, pods listed): the agent benchmark times the relist after a 410 Gone from it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> int:
    from ce_k8s.agent import agent as agent_module
    from ce_k8s.cli import main as cli_main

    samples: list[float] = []
    original = agent_module.Agent.handle

    def timed_handle(self, verb, payload, uid):
        t0 = time.perf_counter()
        try:
            return original(self, verb, payload, uid)
        finally:
            if verb == "update":
                samples.append(time.perf_counter() - t0)

    def dump(_signum, _frame) -> None:
        path = os.environ["CE_K8S_BENCH_TIMINGS"]
        taken = samples[:]
        del samples[: len(taken)]
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(taken, fh)
        os.replace(path + ".tmp", path)

    from ce_k8s.agent import cache as cache_module

    relists: list[dict[str, float]] = []
    original_relist = cache_module.PodCache.relist

    def timed_relist(self) -> None:
        t0 = time.monotonic()
        original_relist(self)
        relists.append({"start": t0, "end": time.monotonic(), "pods": len(self.pods)})
        path = os.environ["CE_K8S_BENCH_TIMINGS"] + ".relists"
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(relists, fh)
        os.replace(path + ".tmp", path)

    agent_module.Agent.handle = timed_handle
    cache_module.PodCache.relist = timed_relist
    signal.signal(signal.SIGUSR2, dump)
    return cli_main(["agent", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
