"""Output return that survives pod deletion, agent restarts and an unreachable agent (issue 5 finding 2).

On the in-memory fakes (fakes.py): the log saves wait in the I/O pool until `run_effects`, so a
test says when a read is in flight (a poll or a cleanup made from inside the read).

References: docs/hook-protocol.md §2.3 (completion = `JobStatus = 4` + `JobFinishedHookDone` from
the update hook), hook-protocol.md §2.4 (finalize: exit ≠ 0 re-runs the pilot, exit 0 finishes it), §2.5 (cleanup
follows finalize); htcondor-ce.md §6.4 (the factory stages out `Out`/`Err`).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from ce_k8s import protocol
from ce_k8s.agent.options import AgentOptions
from ce_k8s.agent.output import OutputDirError, OutputStore
from ce_k8s.agent.outputfetch import OutputFetches
from ce_k8s.condor import wire
from ce_k8s.pods.names import pod_name

from .conftest import GJID, make_spool, routed_ad, text_of, update
from .fakes import fake_agent, run_effects

NAME = pod_name(GJID, 0)
T0, T1 = "2025-10-09T08:55:00Z", "2025-10-09T09:05:00Z"


def new(settings, **kwargs):
    """The agent on the in-memory fakes (fakes.py), its API server one that refuses `stream=` on
    pods/log (Kubernetes >= 1.32 with PodLogsQuerySplitStreams off, the emulator's default): the
    log is read combined, stderr in stdout."""
    agent = fake_agent(settings, **kwargs)
    agent.api.log_streams = "forbid"
    return agent


@pytest.fixture
def agent(settings):
    return new(settings)



def finish(api, lines=(("stdout", "glidein ok\n"),), code=0, name=NAME):
    """The kubelet's order: the log exists, then the container is reported terminated."""
    api.logs[name] = [(stream, text.encode()) for stream, text in lines]
    api.set_status(name, {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [
        {"name": "pilot", "state": {"terminated": {"exitCode": code, "startedAt": T0, "finishedAt": T1}}}]})


def started(agent, settings, **extra):
    ad = routed_ad(Path(settings.spool), **extra)
    update(agent, ad)
    run_effects(agent)
    assert agent.cache.get(NAME)
    return ad


def completes(agent, ad, polls: int = 3) -> bool:
    """The router's next polls, the agent's effects run between them: whether one reports the
    completion (JobStatus = 4, kept in the ad once the router has it)."""
    for _ in range(polls):
        if update(agent, ad).get("JobStatus") == 4 or ad["JobStatus"] == 4:
            return True
        run_effects(agent)
    return False


def logs(agent, ad, uid=0):
    src = routed_ad(Path(agent.settings.spool), JobUniverse=5)
    halves = wire.finalize_stdin(src, ad).split(b"\n------\n", 1)
    return agent.handle(protocol.VERB_LOGS, halves[1], uid)


def test_completion_is_reported_only_after_the_output_is_saved(agent, settings):
    """hook-protocol.md §2.3/§2.4: once JobStatus = 4 is out, finalize follows; the log must be safe
    before that. The router polls while the log is read (the attempt's usage settled already)."""
    real = agent.logs.read
    during = []

    def slow(pod, limit):
        during.append(update(agent, ad))          # the router's poll while the read is in flight
        return real(pod, limit)
    agent.logs.read = slow
    ad = started(agent, settings)
    finish(agent.api)
    assert agent.cache.get(NAME).phase == "Succeeded"          # the watch line queued the save
    run_effects(agent)                            # the save: settle the usage, read the log, store it
    assert len(during) == 1
    out = during[0]
    assert "JobStatus" not in out and out["K8sPodReason"] == "saving the pod's output"
    assert agent.output.has(NAME)
    out = update(agent, ad)
    assert out["JobStatus"] == 4 and out["JobFinishedHookDone"] == 1760000700


def test_saved_output_is_private_and_survives_pod_deletion_and_restart(settings):
    first = new(settings)
    ad = started(first, settings)
    finish(first.api, lines=(("stdout", "line 1\n"), ("stderr", "warn\n"), ("stdout", "line 2\n")))
    run_effects(first)
    assert first.output.has(NAME)
    directory = first.output.directory
    first.api.watch = lambda kind, pod: None        # the agent stops; its memory goes with it
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    for entry in os.listdir(directory):
        assert stat.S_IMODE(os.stat(os.path.join(directory, entry)).st_mode) == 0o600, entry
    first.api.remove(NAME)
    second = fake_agent(settings, api=first.api)    # a restart: nothing but the directory is kept
    assert second.cache.get(NAME) is None
    status, parts = logs(second, ad)
    assert status == protocol.STATUS_OK
    # The server refused `stream=` (a gate-off Kubernetes >= 1.32): stderr is merged into stdout.
    assert parts[1] == b"line 1\nwarn\nline 2\n" and parts[2] == b""
    assert parts[0] == settings.spool.encode()


def test_output_is_cut_at_the_limit_with_a_note_in_err(settings):
    agent = new(settings, options=AgentOptions(max_output_bytes=10))
    ad = started(agent, settings)
    finish(agent.api, lines=(("stdout", "0123456789abcdef\n"),))
    run_effects(agent)
    assert agent.output.has(NAME)
    status, parts = logs(agent, ad)
    assert status == protocol.STATUS_OK and parts[1] == b"0123456789"
    assert b"CE_K8S_MAX_OUTPUT_BYTES = 10" in parts[2]


def test_pod_gone_before_its_log_was_saved_completes_with_a_note(agent, settings):
    """The pod vanished after finishing (seen by the watch): completion is not blocked for ever."""
    agent.logs.read = lambda pod, limit: (_ for _ in ()).throw(RuntimeError("no API"))   # never saved live
    ad = started(agent, settings)
    finish(agent.api)
    assert agent.cache.get(NAME).phase == "Succeeded"
    update(agent, ad)
    run_effects(agent)                               # the save tries, and fails
    assert not agent.output.has(NAME)
    agent.logs.read = type(agent.logs).read.__get__(agent.logs)
    agent.saver.tries.clear()
    agent.api.remove(NAME)
    assert agent.cache.get(NAME) is None
    assert completes(agent, ad)
    status, parts = logs(agent, ad)
    assert status == protocol.STATUS_OK and parts[1] == b""
    assert b"could not be returned" in parts[2]


def test_saved_output_of_another_owner_is_denied(agent, settings):
    """A pilot account naming B's pod in an ad of its own gets nothing (docs/security.md)."""
    started(agent, settings)
    finish(agent.api)
    run_effects(agent)
    assert agent.output.has(NAME)
    agent.api.remove(NAME)
    assert agent.cache.get(NAME) is None
    thief = routed_ad(Path(settings.spool), owner="intruder")
    status, _ = logs(agent, thief)
    assert status == protocol.STATUS_DENIED


def test_cleanup_removes_the_saved_output(agent, settings):
    ad = started(agent, settings)
    finish(agent.api)
    run_effects(agent)
    assert agent.output.has(NAME)
    agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert not agent.output.has(NAME)
    assert not any(e.startswith(NAME) for e in os.listdir(agent.output.directory))


def drain(agent, names):
    """Run every effect left (the cleanups' queued deletes, and any fetch their watch lines,
    MODIFIED with deletionTimestamp then DELETED, start) to its end: each pod is gone."""
    run_effects(agent)
    for name in names:
        assert agent.cache.get(name) is None and name not in agent.api.pods


def test_each_pilot_log_is_read_once_through_cleanup(agent, settings, tmp_root):
    """docs/agent.md "What the agent does" (Output; Stdout and stderr): a pod's log is read once. The
    server refuses `stream=` (a gate-off server), so the agent's first read is one refused probe
    for all pods, then one read per pod; neither finalize (served from the saved entry,
    hook-protocol.md §2.4) nor the cleanup's deletion (hook-protocol.md §2.5), whose watch events show
    the finished pod again after its entry was removed, reads it again, and nothing is saved for a
    pod after its cleanup."""
    pilots = []
    for cluster in (4711, 4712, 4713):
        make_spool(tmp_root, cluster)
        gjid = f"ce.example.org#{cluster}.0#1760000000"
        ad = routed_ad(Path(settings.spool), cluster=cluster, gjid=gjid)
        update(agent, ad)
        pilots.append((ad, pod_name(gjid, 0)))
    run_effects(agent)
    for _ad, name in pilots:
        assert agent.cache.get(name)
        finish(agent.api, name=name)
    for ad, _name in pilots:
        assert completes(agent, ad)
        status, parts = logs(agent, ad)
        assert status == protocol.STATUS_OK and parts[1] == b"glidein ok\n"
        status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
        assert status == protocol.STATUS_OK
    drain(agent, [name for _ad, name in pilots])
    assert agent.api.calls[("get", "pods/log")] == 1 + len(pilots)
    assert len(agent.output) == 0
    assert not any(e.startswith("ce-") for e in os.listdir(agent.output.directory))


def test_a_fetch_in_flight_at_cleanup_saves_nothing(agent, settings):
    """A log read still in flight when the cleanup runs (hook-protocol.md §2.5) discards its result:
    the saved output stays removed. The cleanup is answered from inside the read, so it comes
    after the read began and before its result is stored."""
    reads, cleanups = [], []

    def held(pod, limit):
        reads.append(pod.name)
        status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
        cleanups.append((status, agent.output.has(NAME)))
        return b"late output\n", b"", False
    agent.logs.read = held
    ad = started(agent, settings)
    finish(agent.api)
    run_effects(agent)
    assert cleanups == [(protocol.STATUS_OK, False)]
    drain(agent, [NAME])
    assert reads == [NAME]
    assert not agent.output.has(NAME)
    assert not any(e.startswith(NAME) for e in os.listdir(agent.output.directory))


def test_a_new_routing_that_names_a_cleaned_up_finished_pod_still_completes(agent, settings):
    """docs/real-condor.md finding R3: a failed status push sends a routed job to cleanup and its
    source job is routed again under the same pod name. The pod finished and was deleted with its
    output, so the new routing's update must not wait for a log that will never be saved: it
    completes, and finalize says why there is no output."""
    ad = started(agent, settings)
    finish(agent.api)
    run_effects(agent)
    assert agent.output.has(NAME)
    status, _ = agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    assert status == protocol.STATUS_OK
    run_effects(agent)
    assert agent.cache.get(NAME) is None
    again = routed_ad(Path(settings.spool), cluster=4711, ClusterId=104712)     # the next routing
    assert completes(agent, again)
    status, parts = logs(agent, again)
    assert status == protocol.STATUS_OK and b"could not be returned" in parts[2]


def test_fetch_book_closes_a_pod_by_uid():
    """outputfetch.py: a cleanup ends the fetch in flight and refuses new ones for that pod, while a
    later pod of the same name (another uid: a re-routed job's) is fetched as usual."""
    book = OutputFetches()
    first = book.begin("p", "uid-1")
    assert first is not None and book.begin("p", "uid-1") is None        # one fetch at a time
    removed = []
    book.close("p", "uid-1", lambda: removed.append("p"))
    assert removed == ["p"]
    with book.committing("p", first) as current:
        assert not current                                               # the late result is dropped
    book.end("p", first)
    assert book.begin("p", "uid-1") is None                              # closed until reopened
    second = book.begin("p", "uid-2")
    assert second is not None
    with book.committing("p", second) as current:
        assert current
    book.end("p", second)
    assert book.begin("p", "uid-2", saved=lambda: True) is None          # saved already: no second read
    book.prune(time.time() + 1, keep={"p"})
    assert book.begin("p", "uid-1") is None                              # the cache still holds it
    book.prune(time.time() + 1)
    assert book.begin("p", "uid-1") is not None
    book.close("p", "uid-1", lambda: None)
    book.reopen("p")                                                     # a new routing names it
    assert book.begin("p", "uid-1") is not None


def test_output_dir_must_be_the_agents_and_private(tmp_root):
    d = tmp_root / "out"
    d.mkdir(mode=0o755)
    OutputStore(str(d), 100)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700          # opened up by someone: closed again
    link = tmp_root / "link"
    link.symlink_to(d)
    with pytest.raises(OutputDirError):
        OutputStore(str(link), 100)
    other = tmp_root / "other"
    other.mkdir()
    os.chown(other, 65534, 65534)
    with pytest.raises(OutputDirError):
        OutputStore(str(other), 100)


def test_store_refuses_names_that_leave_the_directory(tmp_root):
    store = OutputStore(str(tmp_root / "out"), 100)
    for bad in ("../x", "a/b", "", ".."):
        with pytest.raises(ValueError):
            store.save(bad, uid="u", namespace="n", owner="o", global_job_id="g", out=b"", err=b"", split=False)
    assert not store.remove("../out")


def test_prune_drops_old_entries_of_gone_pods_only(tmp_root):
    store = OutputStore(str(tmp_root / "out"), 100)
    for name in ("old-gone", "old-live"):
        store.save(name, uid="u", namespace="n", owner="o", global_job_id="g", out=b"x", err=b"", split=False)
    assert store.prune(time.time() + 1, keep={"old-live"}) == ["old-gone"]
    assert store.has("old-live") and not store.has("old-gone")
    assert OutputStore(str(tmp_root / "out"), 100).has("old-live")     # the index is rebuilt from disk
