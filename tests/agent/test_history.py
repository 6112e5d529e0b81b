"""Per-job history files (ce_k8s.agent.history): HTCondor's long form, one file per attempt, written
atomically and never twice, even after the APEL script consumed the first one (docs/accounting.md)."""

from __future__ import annotations

import os
from pathlib import Path

import classad2
import pytest

from ce_k8s.agent.history import STATE_DIR, HistoryWriter, file_name, render
from ce_k8s.condor.wire import parse_old_ads

GJID = "ce.example.org#ce-4711-0-a0-0123456789#1760000000"
AD = {"GlobalJobId": GJID, "Owner": "cmspilot", "RemoteWallClockTime": 600.0, "RequestCpus": 8,
      "K8sCpuUsageKnown": True, "MachineAttrApelSpecs0": {"HEPscore23": 15.5}, "Nothing": None}


def regular_files(d: Path) -> list[str]:
    """What condor_batch_blah.py takes: every regular file in the directory (subdirectories skipped)."""
    return sorted(p.name for p in d.iterdir() if p.is_file())


def test_the_file_is_one_classad_in_long_form_named_by_global_job_id(tmp_path):
    w = HistoryWriter(str(tmp_path))
    path = w.write("uid-1", AD)
    assert path == str(tmp_path / f"history.{GJID}")
    text = Path(path).read_text()
    assert text.splitlines()[0] == f'GlobalJobId = "{GJID}"'
    (ad,) = parse_old_ads(text)
    assert ad["Owner"] == "cmspilot" and ad["RemoteWallClockTime"] == 600.0 and ad["K8sCpuUsageKnown"] is True
    assert classad2.ExprTree("MachineAttrApelSpecs0.HEPscore23").eval(ad) == 15.5
    assert "Nothing" not in ad                    # a None value is left out, never written as undefined
    assert regular_files(tmp_path) == [f"history.{GJID}"]   # the state lives in a subdirectory
    assert (tmp_path / STATE_DIR).is_dir()


def test_an_attempt_is_written_once_even_after_apel_consumed_the_file(tmp_path):
    w = HistoryWriter(str(tmp_path))
    path = w.write("uid-1", AD)
    assert w.written("uid-1")
    assert w.write("uid-1", AD) is None
    os.unlink(path)                               # condor_batch_blah.py deletes what it has read
    again = HistoryWriter(str(tmp_path))          # an agent restart
    assert again.write("uid-1", AD) is None
    assert regular_files(tmp_path) == []
    assert again.write("uid-2", dict(AD, GlobalJobId=GJID + "x")) is not None


def test_a_crash_between_marker_and_rename_is_finished_not_rewritten(tmp_path):
    w = HistoryWriter(str(tmp_path))
    tmp = tmp_path / STATE_DIR / "tmp" / "uid-1"
    tmp.write_text(render(AD))                     # complete and marked, the rename never happened
    (tmp_path / STATE_DIR / "written" / "uid-1").write_text("x\n")
    assert not w.written("uid-1")
    path = w.write("uid-1", dict(AD, Owner="someone-else"))
    assert parse_old_ads(Path(path).read_text())[0]["Owner"] == "cmspilot"   # the file that was written
    assert not tmp.exists() and w.written("uid-1")


def test_a_crash_before_the_marker_rewrites_from_scratch(tmp_path):
    w = HistoryWriter(str(tmp_path))
    (tmp_path / STATE_DIR / "tmp" / "uid-1").write_text('GlobalJobId = "half')   # torn, unmarked
    path = w.write("uid-1", AD)
    (ad,) = parse_old_ads(Path(path).read_text())
    assert ad["GlobalJobId"] == GJID


def test_unwritable_directory_raises_so_the_agent_retries(tmp_path):
    """A write that fails (here: the temporary directory is not a directory, which binds root too)
    raises, leaves no marker, and succeeds when tried again after the problem is gone."""
    w = HistoryWriter(str(tmp_path))
    tmp_dir = tmp_path / STATE_DIR / "tmp"
    tmp_dir.rmdir()
    tmp_dir.write_text("in the way")
    with pytest.raises(OSError):
        w.write("uid-1", AD)
    assert not w.written("uid-1") and regular_files(tmp_path) == []
    tmp_dir.unlink()
    tmp_dir.mkdir()
    assert w.write("uid-1", AD) is not None


def test_old_markers_are_pruned(tmp_path):
    w = HistoryWriter(str(tmp_path), keep=100)
    w.write("uid-1", AD)
    mark = tmp_path / STATE_DIR / "written" / "uid-1"
    os.utime(mark, (1000, 1000))
    assert w.prune(now=1000 + 50) == 0 and mark.exists()
    assert w.prune(now=1000 + 200) == 1 and not mark.exists()


def test_file_names_keep_to_safe_characters():
    assert file_name("ce.example.org#ce-1-0-a0-ab#17") == "history.ce.example.org#ce-1-0-a0-ab#17"
    assert "/" not in file_name("a/b#../c") and " " not in file_name("a b")


def test_render_writes_values_in_the_old_syntax():
    text = render({"S": 'say "hi"', "I": 3, "R": 1.5, "B": False, "N": {"A": 1}})
    ad = classad2.parseOne(text)
    assert ad["S"] == 'say "hi"' and ad["I"] == 3 and ad["R"] == 1.5 and ad["B"] is False
    assert classad2.ExprTree("N.A").eval(ad) == 1
