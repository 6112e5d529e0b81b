"""ce_k8s.real.bedcli: the one up/down/status dispatcher of `ce-k8s testbed real-condor` and
`real-kube`, on a fake bed (no real bed starts here): what it prints, where, and its exit codes."""

from __future__ import annotations

import json

import pytest

from ce_k8s.real.bedcli import run_bed


class BedError(Exception):
    pass


class FakeBed:
    def __init__(self, up: bool = True, fail: str | None = None) -> None:
        self.is_up = up
        self.fail = fail
        self.calls: list[str] = []

    def up(self) -> None:
        self.calls.append("up")
        if self.fail == "up":
            raise BedError("etcd did not answer")

    def down(self, progress=None) -> None:
        self.calls.append("down")
        if progress is not None:
            progress("stopping")

    def status(self) -> dict:
        return {"up": self.is_up, "api_url": "https://127.0.0.1:6443"}


def dispatch(action: str, bed: FakeBed, **kw) -> int:
    return run_bed("real-fake", action, lambda: bed, up=lambda env: env.up(), errors=(BedError,), **kw)


def test_up_and_down_act_on_the_bed_and_progress_goes_to_stderr(capsys):
    bed = FakeBed()
    assert dispatch("up", bed) == 0 and dispatch("down", bed) == 0
    assert bed.calls == ["up", "down"]
    out, err = capsys.readouterr()
    assert out == "" and err == "ce-k8s testbed: stopping\n"


@pytest.mark.parametrize("as_json", [False, True])
def test_status_prints_the_beds_status_and_exits_3_when_down(capsys, as_json):
    assert dispatch("status", FakeBed(up=True), as_json=as_json) == 0
    out = capsys.readouterr().out
    if as_json:
        assert json.loads(out) == {"up": True, "api_url": "https://127.0.0.1:6443"}
    else:
        assert out == "api_url: https://127.0.0.1:6443\nup: True\n"
    assert dispatch("status", FakeBed(up=False), as_json=as_json) == 3


def test_a_bed_error_is_one_line_naming_the_command_and_exit_2(capsys):
    assert dispatch("up", FakeBed(fail="up")) == 2
    assert capsys.readouterr().err == "ce-k8s testbed real-fake up: etcd did not answer\n"

    def unreachable():
        raise BedError("state directory is not a bed")
    assert run_bed("real-fake", "status", unreachable, up=lambda env: None, errors=(BedError,)) == 2
    assert "real-fake status: state directory is not a bed" in capsys.readouterr().err


def test_an_error_that_is_not_the_beds_is_not_swallowed():
    bed = FakeBed()
    bed.status = lambda: 1 / 0
    with pytest.raises(ZeroDivisionError):
        dispatch("status", bed)


def test_other_actions_need_no_bed():
    ran: list[str] = []

    def no_bed():
        raise AssertionError("build must not make a bed")
    assert run_bed("real-fake", "build", no_bed, up=lambda env: None, errors=(BedError,),
                   others={"build": lambda: ran.append("build")}) == 0
    assert ran == ["build"]
