"""The real-HTCondor bed's choice of HTCondor: one pinned version per `--htcondor`, one root each.

These run without building anything: `_run` is replaced by a stand-in for debootstrap and apt, so
what is checked is the bed's own logic (docs/real-condor.md, "What `up --ce-config bed` builds"): the suite and
cache path per version, and that a suite that no longer carries the pinned version is an error
naming the suite and the version found, before anything is installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ce_k8s.real.condor import condor as realcondor
from ce_k8s.real.condor.condor import VERSIONS, RealCondorError, build_root, default_root, flavour


def test_each_version_has_its_own_suite_and_cache():
    """25 comes from sid and 23.9 from trixie, each root in a path of its own (a path holds one)."""
    assert flavour("25").suite == "sid" and flavour("25").version.startswith("25.")
    assert flavour("23").suite == "trixie" and flavour("23").version.startswith("23.9.")
    assert flavour("25.14.1") is flavour("25")
    assert len({default_root(k) for k in VERSIONS}) == len(VERSIONS)
    with pytest.raises(RealCondorError, match="choose one of"):
        flavour("24")


@pytest.mark.parametrize("debian,upstream", [("25.14.1+dfsg-1", "25.14.1"), ("23.9.6+dfsg-2.1+b10", "23.9.6"),
                                             ("1:25.14.1~rc1-1", "25.14.1")])
def test_debian_versions_are_compared_by_their_upstream_part(debian, upstream):
    assert realcondor._upstream(debian) == upstream


class _FakeApt:
    """debootstrap, apt-get and condor_version as the bed calls them, answering `candidate`."""

    def __init__(self, candidate: str, condor_version: str) -> None:
        self.candidate = candidate
        self.condor_version = condor_version
        self.calls: list[list[str]] = []

    def __call__(self, cmd, **_kw):
        self.calls.append(list(cmd))
        out = ""
        if cmd[0] == "debootstrap":
            (Path(cmd[-1]) / "etc").mkdir(parents=True, exist_ok=True)
            (Path(cmd[-1]) / "proc").mkdir(parents=True, exist_ok=True)
        elif "policy" in cmd:
            out = f"condor:\n  Installed: (none)\n  Candidate: {self.candidate}\n"
        elif cmd[-1] == "condor_version":
            out = f"$CondorVersion: {self.condor_version} 2026-01-01 PackageID: x $\n"
        return subprocess.CompletedProcess(cmd, 0, out, "")


@pytest.fixture
def fake_apt(monkeypatch):
    if os.geteuid() != 0:
        pytest.fail("build_root needs root (CI runs as root)")

    def make(candidate: str, condor_version: str) -> _FakeApt:
        fake = _FakeApt(candidate, condor_version)
        monkeypatch.setattr(realcondor, "_run", fake)
        monkeypatch.setattr(realcondor.shutil, "which", lambda _name: "/usr/sbin/debootstrap")
        return fake

    return make


def test_a_suite_that_moved_on_is_an_error_naming_suite_and_version(fake_apt, tmp_path):
    fake = fake_apt("26.0.1+dfsg-1", "26.0.1")
    with pytest.raises(RealCondorError) as err:
        build_root(tmp_path / "root", progress=lambda _m: None, htcondor="25")
    assert "sid" in str(err.value) and "26.0.1+dfsg-1" in str(err.value) and "25.14.1" in str(err.value)
    assert not any("install" in c and "apt-get" in c for c in fake.calls), "nothing is installed"
    assert not (tmp_path / "root").exists()


def test_the_pinned_version_is_installed_by_its_exact_debian_version(fake_apt, tmp_path):
    """apt installs `condor=<candidate>` (not whatever is newest when it runs), with /proc mounted
    for sid's maintainer scripts, and the marker records what was built."""
    fake = fake_apt("23.9.6+dfsg-2.1+b10", "23.9.6")
    root = build_root(tmp_path / "root", progress=lambda _m: None, htcondor="23")
    install = next(c for c in fake.calls if "install" in c and "apt-get" in c)
    assert "condor=23.9.6+dfsg-2.1+b10" in install
    assert any(c[:3] == ["mount", "-t", "proc"] for c in fake.calls)
    marker = json.loads((root / realcondor.MARKER).read_text())
    assert marker["suite"] == "trixie" and marker["version"] == "23.9.6"


def test_a_root_of_another_version_is_refused(fake_apt, tmp_path):
    fake_apt("23.9.6+dfsg-2.1+b10", "23.9.6")
    root = build_root(tmp_path / "root", progress=lambda _m: None, htcondor="23")
    with pytest.raises(RealCondorError, match=re.escape("holds HTCondor 23.9.6 from trixie, not 25.14.1 from sid")):
        build_root(root, progress=lambda _m: None, htcondor="25")


def test_down_without_a_state_file_leaves_another_beds_root_alone(monkeypatch, tmp_path):
    """`down` for a state directory that has nothing up must not kill what runs in the root nor
    unmount anything there: that belongs to a bed of another state directory."""
    if os.geteuid() != 0:
        pytest.fail("down needs root (CI runs as root)")
    bed = realcondor.RealCondor(tmp_path / "state", tmp_path / "root", htcondor="23")

    def forbidden(*_a, **_k):
        raise AssertionError("down acted on a root it did not bring up")

    monkeypatch.setattr(realcondor, "_processes_in", lambda _root: [4242])
    monkeypatch.setattr(realcondor, "_unmount_below", forbidden)
    monkeypatch.setattr(realcondor.os, "kill", forbidden)
    messages: list[str] = []
    report = bed.down(progress=messages.append)
    assert report["killed"] == 0 and report["other_bed_processes"] == 1
    assert "left alone" in messages[0]
