"""The README's two workers (tests/conftest.py): which bed runs where.

The split is safe only while no kwok-only module reaches what one bed at a time may hold: the real
HTCondor's root and its fixed ports, the VO's issuer port, and the one real node. Those modules
run beside the emulators on a session bed without a real node, while the other worker's beds are
up; a module that reached for any of these would collide there.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _root_conftest():
    """tests/conftest.py by its path: under pytest-xdist the module name `conftest` may be another
    directory's (a worker once resolved it to tests/sim/conftest.py)."""
    spec = importlib.util.spec_from_file_location("ce_k8s_tests_root_conftest", REPO / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SPLIT = _root_conftest()
KWOK_ONLY_MODULES, needs_real_node_or_condor = _SPLIT.KWOK_ONLY_MODULES, _SPLIT.needs_real_node_or_condor
bed_needs_real_node = _SPLIT.bed_needs_real_node
#: What only the one-at-a-time worker may touch, as a kwok-only module would name it.
ONE_AT_A_TIME = re.compile(r"real_node(?!s=0|_wanted|_names\(\))|RealCondor|real_condor|condordemo|pilotdemo|"
                           r"vo_pool|VOPool|TestIssuer|ISSUER_PORT|COLLECTOR_PORT|import_image|real_nodes=[1-9]|"
                           r"--condor|fakegpu")


def test_every_kwok_only_module_exists_and_names_nothing_of_the_one_at_a_time_beds():
    for module in sorted(KWOK_ONLY_MODULES):
        text = (REPO / module).read_text()
        found = sorted(set(ONE_AT_A_TIME.findall(text)))
        assert not found, f"{module} is kwok-only (tests/conftest.py) but names {found}"


def test_a_kwok_only_module_imports_no_test_module_outside_the_set():
    """A helper imported from a real-node module would pull its module-scoped fixtures along."""
    for module in sorted(KWOK_ONLY_MODULES):
        for name in re.findall(r"^from \.(\w+) import", (REPO / module).read_text(), re.M):
            if name != "conftest":
                assert f"tests/real/{name}.py" in KWOK_ONLY_MODULES, f"{module} imports .{name}"


def test_real_node_and_condor_tests_take_the_one_at_a_time_worker():
    assert needs_real_node_or_condor("tests/real/node/test_vo_pool.py::test_a_users_job_runs")
    assert needs_real_node_or_condor("tests/real/condor/test_real_condor.py::test_restarts[23]")
    assert needs_real_node_or_condor("tests/real/test_real_node_demo.py::test_real_pilots")
    assert not needs_real_node_or_condor("tests/real/test_watch.py::test_a_real_410")
    assert not needs_real_node_or_condor("tests/agent/test_status.py::test_anything")


def test_only_the_one_at_a_time_worker_s_bed_gets_a_real_node():
    """The controller tells each worker it runs split (xdist sets a worker's own `dist` to "no":
    reading that once gave both workers' beds a real node, and their overlapping lives left the
    kubelet's sysctls changed on the machine)."""
    selected = ["tests/real/test_watch.py::test_a", "tests/real/node/test_vo_pool.py::test_b"]
    split = {"ce_k8s_two_rooms": True}
    assert bed_needs_real_node(split, "tests/real/test_watch.py::test_a", selected) is False
    assert bed_needs_real_node(split, "tests/real/node/test_vo_pool.py::test_b", selected) is True
    # one process, or a worker of another split: a real node when any selected test needs one
    assert bed_needs_real_node(None, "tests/real/test_watch.py::test_a", selected) is True
    assert bed_needs_real_node({}, "tests/real/test_watch.py::test_a", selected) is True
    assert bed_needs_real_node(None, "tests/real/test_watch.py::test_a", selected[:1]) is False


def test_the_run_holds_the_beds_ports_when_it_may_run_real_tests():
    """tests/conftest.py holds the condor beds' ports for a run that may bring a bed up: its
    arguments name tests/real, a file or test in it, or a directory above it (none: testpaths)."""
    may = _SPLIT.may_run_real_tests
    assert may([], REPO) and may(["tests"], REPO) and may(["-q", "."], REPO)
    assert may(["tests/real/condor/test_ports.py::test_x"], REPO) and may(["real/node"], REPO / "tests")
    assert not may(["tests/agent", "tests/sim/test_kubelet.py::test_y"], REPO)
    assert not may(["test_rooms.py"], REPO / "tests")
