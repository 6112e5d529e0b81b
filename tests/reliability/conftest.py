"""Load `bench/soak.py` (a script, not part of the installed package) for the reliability tests.

Why a loader and not a copy: the CI-sized soak must run *the same code* as the recorded
10,000-pilot run (issue 9, "Load and faults"), only with fewer pilots.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SOAK_PATH = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def _load():
    name = "ce_k8s_bench_soak"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SOAK_PATH)
    assert spec is not None and spec.loader is not None, f"cannot load {SOAK_PATH}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def soak():
    """The `bench/soak.py` module."""
    return _load()
