"""ce_k8s.demos.statedirs: a demo's own bed directory goes after success and stays after a failure."""

from __future__ import annotations

from ce_k8s.demos import statedirs


def _bed_dir(tmp_path):
    d = tmp_path / "bed"
    (d / "logs").mkdir(parents=True)
    (d / "logs" / "etcd.log").write_text("a log\n")
    return d


def test_a_directory_the_run_made_goes_after_success_without_a_word(tmp_path):
    said = []
    d = _bed_dir(tmp_path)
    statedirs.tidy(d, made_here=True, ok=True, progress=said.append)
    assert not d.exists() and said == []


def test_after_a_failure_it_stays_and_the_run_says_where(tmp_path):
    said = []
    d = _bed_dir(tmp_path)
    statedirs.tidy(d, made_here=True, ok=False, progress=said.append)
    assert (d / "logs" / "etcd.log").read_text() == "a log\n"
    assert said == [f"the run failed: its bed's files and logs are kept in {d}"]


def test_a_directory_that_was_there_before_is_the_operators(tmp_path):
    said = []
    d = _bed_dir(tmp_path)
    for ok in (True, False):
        statedirs.tidy(d, made_here=False, ok=ok, progress=said.append)
    assert (d / "logs" / "etcd.log").exists() and said == []
