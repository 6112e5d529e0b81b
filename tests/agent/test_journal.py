"""The post journal (ce_k8s/agent/journal.py): what survives an agent restart, and what it forgets.

Reference: docs/reliability.md F1 (a pod created and deleted while no agent watched must not be
created again under the same attempt; docs/design.md Decision 5).
"""

from __future__ import annotations

import os
import stat

import pytest

from ce_k8s.agent.journal import FILE_NAME, PostJournal


def test_a_post_survives_a_new_process_and_a_refusal_or_cleanup_undoes_it(tmp_path):
    j = PostJournal(str(tmp_path))
    j.record_post("ce-1-0-a0-abc")
    j.record_post("ce-1-1-a0-def")
    j.record_post("ce-1-2-a0-ghi")
    j.record_refused("ce-1-1-a0-def")
    j.record_done(["ce-1-2-a0-ghi", "never-posted"])
    again = PostJournal(str(tmp_path))           # what a fresh agent process reads
    assert again.posted("ce-1-0-a0-abc")
    assert not again.posted("ce-1-1-a0-def") and not again.posted("ce-1-2-a0-ghi")
    assert len(again) == 1


def test_the_file_is_private_and_rewritten_to_its_live_lines_at_start(tmp_path):
    j = PostJournal(str(tmp_path))
    for i in range(50):
        j.record_post(f"ce-1-{i}-a0-x")
    j.record_done([f"ce-1-{i}-a0-x" for i in range(49)])
    path = tmp_path / FILE_NAME
    assert len(path.read_text().splitlines()) == 99
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    PostJournal(str(tmp_path))
    assert path.read_text().split()[1:] == ["P", "ce-1-49-a0-x"]


def test_a_torn_or_damaged_line_is_skipped_not_fatal(tmp_path):
    (tmp_path / FILE_NAME).write_bytes(
        b"1.0 P ok-name\n"
        b"2.0 P bad name with spaces\n"
        b"x P not-a-time\n"
        b"3.0 Q unknown-kind\n"
        b"4.0 P ../../etc/passwd\n"
        b"5.0 P torn-na")                         # a SIGKILL in the middle of the write
    j = PostJournal(str(tmp_path), now=10.0)
    # A torn line was written before its POST was sent, so that POST never left: not "posted".
    assert j.posted("ok-name") and not j.posted("torn-na")
    assert not j.posted("../../etc/passwd") and len(j) == 1


def test_old_posts_are_forgotten_after_keep_and_the_file_compacted(tmp_path):
    j = PostJournal(str(tmp_path), keep=100.0)
    for i in range(12_000):
        j.record_post(f"ce-9-{i}-a0-x")
    j.record_done([f"ce-9-{i}-a0-x" for i in range(11_990)])
    path = tmp_path / FILE_NAME
    assert len(path.read_text().splitlines()) == 23_990
    j.prune()                                     # mostly dead lines: rewritten
    assert len(path.read_text().splitlines()) == 10
    j.record_post("ce-9-new-a0-x")                # the new descriptor appends to the new file
    assert path.read_text().splitlines()[-1].endswith(" P ce-9-new-a0-x")
    import time
    j.prune(now=time.time() + 1000)               # past `keep`: every entry goes
    assert len(j) == 0
    assert len(PostJournal(str(tmp_path), keep=100.0, now=time.time() + 1000)) == 0


def test_an_unwritable_directory_degrades_to_memory_only(tmp_path):
    """The journal is a safety net: if the file cannot be written the agent still runs (and logs)."""
    missing = tmp_path / "gone"
    j = PostJournal(str(missing))
    j.record_post("ce-1-0-a0-x")
    assert j.posted("ce-1-0-a0-x")


def test_releases_and_aliases_survive_a_new_process_and_a_rewrite(tmp_path):
    """docs/agent.md "Released pods": a restarted agent still knows what a cleanup released (and
    when: the grace counts from it) and which never-created name stands for an adopted pod."""
    j = PostJournal(str(tmp_path))
    j.record_post("ce-1-0-a0-x")
    j.record_release("ce-1-0-a0-x", "ce#1.0#1")
    j.record_release("ce-2-0-a0-y", "ce#2.0#1")
    j.record_release("ce-3-0-a0-z", "ce#3.0#1")
    j.record_adopt("ce-2-0-a0-y", "ce-2-0-a1-y")          # adopted: no longer released
    j.record_unreleased("ce-3-0-a0-z")                    # claimed by an update, or the GC deleted it
    j.record_adopt("ce-4-0-a0-w", "ce-4-0-a1-w")
    j.record_release("ce-4-0-a0-w", "ce#4.0#1")           # released again after its adoption
    when = j.released_at("ce-1-0-a0-x")
    for again in (PostJournal(str(tmp_path)), PostJournal(str(tmp_path))):   # the second reads the rewrite
        assert again.posted("ce-1-0-a0-x") and again.released_at("ce-1-0-a0-x") == pytest.approx(when, abs=0.001)
        assert again.released_for("ce#1.0#1") == ["ce-1-0-a0-x"]
        assert again.released_at("ce-2-0-a0-y") is None and again.alias_of("ce-2-0-a1-y") == "ce-2-0-a0-y"
        assert again.released_at("ce-3-0-a0-z") is None
        assert again.alias_of("ce-4-0-a1-w") == "ce-4-0-a0-w" and again.released_at("ce-4-0-a0-w") is not None
    again.record_done(["ce-4-0-a0-w", "ce-1-0-a0-x"])     # cleanup ends the job: everything about them goes
    last = PostJournal(str(tmp_path))
    assert last.alias_of("ce-4-0-a1-w") is None and last.released() == {}
    assert not last.posted("ce-1-0-a0-x") and last.alias_of("ce-2-0-a1-y") == "ce-2-0-a0-y"


def test_a_release_line_needs_a_sane_global_job_id(tmp_path):
    (tmp_path / FILE_NAME).write_bytes(
        b"1.0 R ok-name ce#1.0#1\n"
        b"2.0 R no-gjid\n"
        b"3.0 R bad-gjid ce#\xff\n"
        b"4.0 A ok-target not/a/name\n"
        b"5.0 U\n")
    j = PostJournal(str(tmp_path), now=10.0)
    assert list(j.released()) == ["ok-name"] and j.alias_of("not/a/name") is None
