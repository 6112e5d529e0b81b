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
import os
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


# ------------------------------------------------------------------------------------ two workers
# The README's test command runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`):
#
# * one takes every test that needs the real HTCondor (its Debian root holds one bed at a time:
#   fixed ports, bind mounts into the root) or a real node (a kubelet, containerd and pods that
#   measure CPU and time on two cores; the host sysctls its kubelet rewrites are the machine's
#   ledger's, safe in any order: ce_k8s/real/sysctls.py), in their collection order, so each
#   real bed is built once, in one process, and never two at a time;
# * the other takes everything else: the emulators, and the real-Kubernetes tests that need only
#   the control plane and kwok's nodes (`KWOK_ONLY_MODULES`), on a bed of their own that has no
#   real node (tests/real/conftest.py).
#
# The real tests spend most of their time waiting on real daemons, so the two overlap well on two
# cores, and the emulated tests run on a machine as busy as a site's. The kwok-only modules ride
# with the emulators because the real worker is the long pole (about 30 minutes on its own).
#
# The scheduler is xdist's scope scheduling with these two scopes. xdist's own `loadgroup` reads
# its groups from a suffix it writes into each test id, which pytest 9.2 no longer lets a plugin
# change (`item.nodeid` stays as collected), so it would hand real tests to both workers.
REAL_GROUP, EMULATED_GROUP = "real", "emulated"

#: Real-Kubernetes modules that need neither the real HTCondor nor a real node (nor a fixed port):
#: the agent, the watch, restarts and the HTCJob operator against the real control plane and
#: kwok's nodes. A module joins only when nothing in it reaches the real node.
KWOK_ONLY_MODULES = frozenset({
    "tests/real/test_watch.py", "tests/real/test_restarts.py", "tests/real/test_findings.py",
    "tests/real/test_lifecycle.py", "tests/real/test_emulator_parity.py", "tests/real/test_htcjob_kube.py",
    "tests/real/test_info_vs_scheduler.py", "tests/real/test_ce_manifests.py",
})


def is_real_environment_test(nodeid: str) -> bool:
    """Whether the test `nodeid` (relative to the repository) runs on a real HTCondor or Kubernetes bed."""
    return nodeid.startswith("tests/real/")


def needs_real_node_or_condor(nodeid: str) -> bool:
    """Whether the test `nodeid` is in the group of the one-at-a-time beds (`REAL_GROUP`)."""
    return is_real_environment_test(nodeid) and nodeid.split("::", 1)[0] not in KWOK_ONLY_MODULES


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TwoRooms(LoadScopeScheduling):
        """One scope for the one-at-a-time beds, one for the emulators and the kwok-only beds."""

        def _split_scope(self, nodeid: str) -> str:
            return REAL_GROUP if needs_real_node_or_condor(nodeid) else EMULATED_GROUP

    return TwoRooms(config, log)



#: The test being set up, for the session bed's choice below (set before its fixtures are).
_CURRENT_TEST = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.config.stash[_CURRENT_TEST] = item.nodeid


#: Set by the controller in each worker's input: whether the suite runs split in two rooms. A
#: worker cannot read it from its own options: pytest-xdist sets a worker's `dist` to "no".
_SPLIT_KEY = "ce_k8s_two_rooms"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[_SPLIT_KEY] = node.config.getvalue("dist") == "loadgroup"


def bed_needs_real_node(workerinput: dict | None, current: str, selected: list[str]) -> bool:
    """Whether this process's session bed gets a real node. In a worker of the README's split,
    whether the worker runs the one-at-a-time group (it never runs both; `current`, the first test
    to ask, tells which); in one process or another split, whether any `selected` test is in it.
    The kwok-only worker's bed has none: one real node at a time on the machine (a second one,
    unasked for, once ran beside the first because a worker's own `dist` reads "no")."""
    if workerinput is not None and workerinput.get(_SPLIT_KEY):
        return needs_real_node_or_condor(current)
    return any(needs_real_node_or_condor(nodeid) for nodeid in selected)


@pytest.fixture(scope="session")
def real_node_wanted(request) -> bool:
    """Whether this process's session bed (tests/real/conftest.py) gets a real node (`bed_needs_real_node`)."""
    return bed_needs_real_node(getattr(request.config, "workerinput", None), request.config.stash[_CURRENT_TEST],
                               [item.nodeid for item in request.session.items])


# ------------------------------------------------------------------------- the beds' fixed ports
# A real-HTCondor bed reserves its loopback ports from its own `up` (ce_k8s/real/condor/ports.py);
# a connection or server made earlier in the run keeps its port, and a long-lived one on a bed's
# port (a watch of the session's Kubernetes bed, made at its start) would refuse every bed after it.
# So a run that may bring beds up holds them from its first moment, in the controller before any
# worker starts, and gives them back at its end (or its reaper does, if the run is killed).
_PORT_HOLD = pytest.StashKey[object]()


def may_run_real_tests(args: list[str], cwd: Path) -> bool:
    """Whether the run's arguments name tests/real or a directory holding it (none: `testpaths`)."""
    real = TESTS / "real"
    paths = [Path(cwd, a.split("::", 1)[0]).resolve() for a in args if not a.startswith("-")]
    return not paths or any(p == real or real in p.parents or p in real.parents for p in paths)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if hasattr(config, "workerinput") or os.geteuid() != 0 \
            or not may_run_real_tests(config.args, config.invocation_params.dir):
        return
    from ce_k8s.real.condor.ports import PortHold
    from ce_k8s.real.condor.stockce import StockCE

    hold = PortHold(Path(f"/run/ce-k8s-test-run-ports-{os.getpid()}.json"))
    hold.hold(StockCE.fixed_ports, owner_pid=os.getpid())
    config.stash[_PORT_HOLD] = hold


def pytest_unconfigure(config):
    hold = config.stash.get(_PORT_HOLD, None)
    if hold is not None:
        hold.release()
