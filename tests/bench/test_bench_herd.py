"""The thundering-herd benchmark runs end to end on a small CE and proves its own bookkeeping.

`bench/bench_herd.py` clones routed pilots into the CE's queue and the cluster, restarts the
router and the agent at once and waits until every routed job is true again (issue 17). Here with
60 jobs: no speed is asserted, only that the clones were re-adopted, the stale ones corrected by
the agent's answers, and nothing created, deleted or lost.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_herd_recovers_with_nothing_lost_or_duplicated():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CE_K8S_")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_herd.py"), "--jobs", "60",
                           "--stale-fraction", "0.5", "--json"], cwd=ROOT, env=env, capture_output=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    figures = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert figures["herd_jobs"] == 60 and 0 < figures["herd_stale_jobs"] < 60
    assert figures["herd_pods_created"] == figures["herd_pods_deleted"] == figures["herd_jobs_lost"] == 0
    assert figures["herd_pods_in_cluster"] == 60 + 5          # the clones and the five templates
    assert 0 < figures["herd_recover_s"]
    assert math.isclose(figures["herd_recover_polls"], figures["herd_recover_s"] / 60, abs_tol=0.01)
    assert "every routed job true after" in proc.stderr.decode()
    assert figures["herd_hooks_run"] >= 60 and figures["herd_cek8s_cpu_s"] > 0
