"""A short coverage-guided run of every atheris harness (fuzz/fuzz_parsers.py, issue 9).

Each target must survive a fixed-seed run: a finding (an untyped exception, a crash of the C++
ClassAd library) makes atheris exit non-zero and print the input. Long runs are for humans
(docs/security.md); this keeps every harness working and catches regressions on the way in.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "fuzz" / "fuzz_parsers.py"
TARGETS = ["wire_old", "wire_json", "hook_output", "config", "transform", "args", "translate", "protocol", "k8s"]


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_survives_a_short_run(target, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(HARNESS), target, "-atheris_runs=1500", "-seed=7", f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"Done 1500 (runs )?in ", proc.stderr), proc.stderr[-500:]
