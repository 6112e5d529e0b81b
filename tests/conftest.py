"""Fixtures shared by every test directory.

``stock_ce`` / ``stock_ce_layout``: a private copy of a stock HTCondor-CE configuration
(tests/fixtures/stock_ce/, described in its README.md), with its absolute paths pointed at the
copy. The helper module is loaded by file path because tests/ is not a package.

tests/ itself is on sys.path, so every test directory imports the shared test helpers at its top
(``from polling import wait_for``, tests/polling.py). pytest's default import mode puts it there
already, for this file; it is added here too so the import does not depend on that mode.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

_HELPER = TESTS / "fixtures" / "stock_ce.py"
_NAME = "ce_k8s_tests_stock_ce"


def _load_helper():
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, _HELPER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module      # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def stock_ce_layout():
    """The helper module: ``copy_stock_ce(dest, batch=...)``, ``BATCH_PACKAGES``, ``BATCH_ROUTES``."""
    return _load_helper()


@pytest.fixture
def stock_ce(tmp_path, stock_ce_layout):
    """A stock CE with every batch package installed, under ``tmp_path / "ce"``."""
    return stock_ce_layout.copy_stock_ce(tmp_path / "ce")
