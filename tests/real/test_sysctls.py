"""The machine's sysctl ledger (ce_k8s.real.sysctls) on a /proc/sys of files.

The real `/proc/sys` is judged by tests/real/test_node_cleanup.py (a bed's up and down, its reaper)
and by the session's beds; here every order in which beds come and go, which a real run meets
only by chance (two pytest workers' beds overlapped once without nesting: b54264b).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ce_k8s.real.sysctls import SysctlLedger, read_sysctls, write_sysctls

NAMES = ("vm.overcommit_memory", "kernel.panic")
HOST = {"vm.overcommit_memory": "0", "kernel.panic": "1"}
KUBELET = {"vm.overcommit_memory": "1", "kernel.panic": "10"}


@pytest.fixture
def proc(tmp_path) -> Path:
    root = tmp_path / "proc-sys"
    for name, value in HOST.items():
        path = root / Path(*name.split("."))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return root


@pytest.fixture
def beds(tmp_path) -> list[str]:
    """Three beds' state files (a holder whose state file is gone is stale)."""
    out = []
    for name in ("a", "b", "c"):
        state = tmp_path / name / "state.json"
        state.parent.mkdir()
        state.write_text("{}")
        out.append(str(state))
    return out


def ledger(tmp_path: Path, proc: Path) -> SysctlLedger:
    return SysctlLedger(tmp_path / "ledger.json", proc=proc, names=NAMES)


def kubelet_starts(proc: Path) -> None:
    write_sysctls(KUBELET, proc)


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")], ids=["first-up-first-down", "nested"])
def test_the_last_bed_down_restores_the_host_s_values_in_either_order(tmp_path, proc, beds, order):
    book = ledger(tmp_path, proc)
    by_name = dict(zip("abc", beds, strict=False))
    assert book.hold(by_name["a"]) == HOST
    kubelet_starts(proc)
    # the second bed reads the kubelet's values now, but is given the host's own
    assert book.hold(by_name["b"]) == HOST
    kubelet_starts(proc)
    first, last = order
    assert book.release(by_name[first], own=KUBELET) == [by_name[last]]
    assert read_sysctls(NAMES, proc) == KUBELET, "a kubelet still runs: its values stay"
    assert book.release(by_name[last], own=KUBELET) == []
    assert read_sysctls(NAMES, proc) == HOST
    assert not (tmp_path / "ledger.json").exists()


def test_a_bed_removed_without_down_no_longer_holds(tmp_path, proc, beds):
    book = ledger(tmp_path, proc)
    book.hold(beds[0])
    book.hold(beds[1])
    kubelet_starts(proc)
    Path(beds[0]).unlink()                       # its state directory removed, no down
    assert book.release(beds[1], own=KUBELET) == []
    assert read_sysctls(NAMES, proc) == HOST


def test_a_bed_after_one_removed_without_down_gets_the_values_from_before_it(tmp_path, proc, beds):
    """The stale bed's kubelet changed the values and nobody gave them back: the next bed is given
    (and at its down writes back) the ones saved before that kubelet, not the kubelet's."""
    book = ledger(tmp_path, proc)
    book.hold(beds[0])
    kubelet_starts(proc)
    Path(beds[0]).unlink()
    assert book.hold(beds[1]) == HOST
    assert book.release(beds[1], own=KUBELET) == []
    assert read_sysctls(NAMES, proc) == HOST


def test_a_hold_after_every_release_saves_afresh(tmp_path, proc, beds):
    """The host's values may change between beds (a site sets kernel.panic): the next first hold
    saves what is there then, not what an earlier bed saved."""
    book = ledger(tmp_path, proc)
    book.hold(beds[0])
    book.release(beds[0], own={})
    write_sysctls({"kernel.panic": "30"}, proc)
    assert book.hold(beds[1])["kernel.panic"] == "30"


def test_a_release_without_a_ledger_writes_the_bed_s_own_values(tmp_path, proc, beds):
    """After a reboot (the ledger on /run is gone) or from a bed of an earlier version: nobody else
    is known, so the bed's own saved values go back; a bed that never held writes nothing."""
    book = ledger(tmp_path, proc)
    kubelet_starts(proc)
    assert book.release(beds[0], own={}) == []
    assert read_sysctls(NAMES, proc) == KUBELET
    assert book.release(beds[0], own=HOST) == []
    assert read_sysctls(NAMES, proc) == HOST


def test_a_torn_ledger_is_an_error_that_names_it_and_is_kept(tmp_path, proc, beds):
    (tmp_path / "ledger.json").write_text('{"saved": {"kernel.pa')
    with pytest.raises(RuntimeError, match=r"ledger\.json: not a sysctl ledger"):
        ledger(tmp_path, proc).hold(beds[0])
    assert (tmp_path / "ledger.json").read_text() == '{"saved": {"kernel.pa'


def test_holds_from_many_processes_at_once_lose_none(tmp_path, proc, beds):
    """Beds in different processes take turns on the lock: twelve holders at once, all recorded."""
    states = []
    for i in range(12):
        state = tmp_path / f"bed{i}" / "state.json"
        state.parent.mkdir()
        state.write_text("{}")
        states.append(str(state))
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from ce_k8s.real.sysctls import SysctlLedger
        SysctlLedger({str(tmp_path / "ledger.json")!r}, proc=Path({str(proc)!r}), names={NAMES!r}).hold(sys.argv[1])
        """)
    procs = [subprocess.Popen([sys.executable, "-c", script, s]) for s in states]
    assert [p.wait() for p in procs] == [0] * 12
    book = json.loads((tmp_path / "ledger.json").read_text())
    assert sorted(book["holders"]) == sorted(states) and book["saved"] == HOST
    assert not list(tmp_path.glob("ledger.json.*")), "no lock or temporary file is left beside the ledger"


def test_a_bed_started_before_the_ledger_is_released_as_one_it_does_not_know(tmp_path, beds):
    """A bed whose state has its own values but names no ledger (started by a version before it)
    is released on the machine's ledger at `down`: while another bed holds it, nothing is written
    and that bed keeps it; with nobody else, the bed's own values go back (here the host's current
    ones, so the real /proc/sys is written with what it holds)."""
    from ce_k8s.real.kube.kube import RealKube
    from ce_k8s.real.kube.kubelayout import State

    machine = tmp_path / "ledger.json"
    old_bed = RealKube(tmp_path / "old-bed", sysctl_ledger=machine)
    state = State(version="v0", bin=str(tmp_path), server="", etcd="", sysctls=read_sysctls())
    said: list[str] = []
    SysctlLedger(machine, proc=tmp_path, names=()).hold(beds[0])
    assert old_bed.nodes.stop_real(state, said.append) == []
    assert "1 other bed(s) still run one" in said[-1] and SysctlLedger(machine).holders() == [beds[0]]
    SysctlLedger(machine, proc=tmp_path, names=()).release(beds[0], own={})
    assert old_bed.nodes.stop_real(state, said.append) == []
    assert said[-1].endswith("host sysctls restored") and not machine.exists()
