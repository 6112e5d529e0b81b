"""Wall time and the CPU bound (docs/accounting.md "Wall time and the CPU bound").

A kubelet writes the container's `startedAt`/`finishedAt` in whole seconds (RFC 3339 without a
fraction), so a pilot shorter than a second can show both in the same second. Every record of an
attempt that ran must keep two invariants: its wall time is never 0, and its CPU time is never more
than wall time × cores. The rules hold both in the values the history file holds and in the
integers that APEL's script reads from it (`condor_q -format "%lld"`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from ce_k8s import protocol
from ce_k8s.agent.accounting import (
    WALL_CPU,
    WALL_MINIMUM,
    WALL_TIMESTAMPS,
    UsageCollector,
    charge,
    history_ad,
    routed_attrs,
)
from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.demos.demo_accounting import check_invariants
from ce_k8s.ops.accounting import apel_fields
from ce_k8s.pods.names import pod_name

from .conftest import GJID, apply_output, new_agent, replace_settings, routed_ad, text_of, wait

NAME = pod_name(GJID, 0)
T0 = "2025-10-09T08:55:00Z"          # whole seconds, as a real kubelet writes them
T1 = "2025-10-09T08:55:01Z"


def pod(started: str, finished: str | None, cpu: str = "8", phase: str = "Succeeded") -> PodInfo:
    """A pilot pod of 8 requested cores (RequestCpus = 8), finished unless `finished` is None."""
    state = ({"terminated": {"exitCode": 0, "startedAt": started, "finishedAt": finished}} if finished
             else {"running": {"startedAt": started}})
    return PodInfo.from_dict({
        "metadata": {"name": "ce-1-0-a0-x", "namespace": "ns", "uid": "u1", "creationTimestamp": started,
                     "labels": {"ce-k8s.htcondor.org/attempt": "0"},
                     "annotations": {"ce-k8s.htcondor.org/owner": "osg01", "ce-k8s.htcondor.org/routed-from": "12.3"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "pilot", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": phase if finished else "Running",
                   "containerStatuses": [{"name": "pilot", "state": state}]}})


def settled(started: str, finished: str, cpu_s: float | None):
    """The record the collector builds for a pod that ran from `started` to `finished` and whose
    kubelet Summary last showed `cpu_s` seconds of CPU (None: never read)."""
    collector = UsageCollector(client.ApiClient(), None, lambda: [])    # its thread is not running
    collector._nodes_forbidden = True                                   # no node list in a unit test
    running = pod(started, None)
    collector.pod_changed(running)
    if cpu_s is not None:
        collector.fold("n1", {"pods": [{"podRef": {"name": running.name, "uid": "u1"}, "containers": [
            {"name": "pilot", "cpu": {"usageCoreNanoSeconds": int(cpu_s * 1e9)}, "memory": {"rssBytes": 1}}]}]},
            now=1.0)
    done = pod(started, finished)
    return collector.build(done, collector.usage[done.name])


def apel_numbers(record) -> tuple[int, int, int]:
    """(wall, CPU, cores) as APEL's batch record holds them: `%lld` of the history file's values."""
    fields = apel_fields(history_ad(record, "ce"))
    assert fields is not None
    return int(fields["RemoteWallClockTime"]), int(fields["RemoteUserCpu"]), int(fields["RequestCpus"])


def assert_invariants(record) -> None:
    ad = history_ad(record, "ce")
    assert ad["RemoteWallClockTime"] >= 1.0
    assert ad["RemoteUserCpu"] <= ad["RemoteWallClockTime"] * ad["RequestCpus"]
    assert ad["CompletionDate"] - ad["JobStartDate"] == ad["RemoteWallClockTime"]      # dates and wall agree
    assert ad["EnteredCurrentStatus"] == ad["CompletionDate"]
    wall, cpu, cores = apel_numbers(record)
    assert wall >= 1 and cpu <= wall * cores
    attrs = routed_attrs(record)
    assert attrs.get("RemoteUserCpu", 0.0) <= record.wall * attrs["CpusProvisioned"]


@pytest.mark.parametrize("cpu_s", [4.674, 6.0, None])
def test_a_pilot_within_one_second_is_charged_that_second_not_zero(cpu_s):
    """What the demo showed: 8 of 54 files with `RemoteWallClockTime = 0.0` and CPU 3.5-6.0 s (8
    cores, pods shorter than a second). Same-second timestamps: the attempt ran, so one second."""
    record = settled(T0, T0, cpu_s)
    assert record.wall == 1.0 and record.wall_source == WALL_MINIMUM
    assert record.cpu_seconds == cpu_s and record.cpu_reported is None
    assert_invariants(record)
    ad = history_ad(record, "ce")
    assert ad["K8sWallClockSource"] == "minimum" and ad["K8sCpuCapped"] is False and "K8sCpuReported" not in ad


def test_cpu_time_proves_the_second_the_truncated_timestamps_hid():
    """08:55:00.0 to 08:55:01.9 reads as 1 s; 10.091 s of CPU on 8 cores needs 1.26 s: the wall is
    2 s, within what the timestamps allow (less than end - start + 1), and no CPU is capped."""
    record = settled(T0, T1, 10.091)
    assert record.wall == 2.0 and record.wall_source == WALL_CPU
    assert record.cpu_seconds == 10.091 and record.cpu_reported is None
    assert_invariants(record)


def test_cpu_beyond_what_any_wall_time_allows_is_capped_and_the_record_says_so():
    """A pod without a CPU limit may use more than it requested: 20 s of CPU in 1 s on 8 cores. No
    wall time the timestamps allow explains it, so the record holds 8 s and names the kubelet's 20."""
    record = settled(T0, T0, 20.0)
    assert record.wall == 1.0 and record.cpu_seconds == 8.0 and record.cpu_reported == 20.0
    ad = history_ad(record, "ce")
    assert ad["K8sCpuCapped"] is True and ad["K8sCpuReported"] == 20.0 and ad["RemoteUserCpu"] == 8.0
    assert_invariants(record)


def test_a_long_attempt_keeps_its_timestamps():
    record = settled(T0, "2025-10-09T09:05:00Z", 500.0)
    assert record.wall == 600.0 and record.wall_source == WALL_TIMESTAMPS and record.cpu_seconds == 500.0


@given(start=st.integers(0, 2_000_000_000), length=st.integers(0, 10**6),
       cpu=st.one_of(st.none(), st.floats(0, 1e8, allow_nan=False)), cores=st.integers(1, 256))
def test_charge_keeps_both_invariants_and_stays_within_the_timestamps(start, length, cpu, cores):
    wall, source, charged, reported = charge(start, start + length, cpu, cores)
    assert wall >= 1.0                                      # never zero for an attempt that ran
    assert length - 1 < wall <= length + 1                  # what the truncated timestamps allow
    assert wall == float(int(wall))                         # whole seconds: APEL reads %lld
    if cpu is None:
        assert charged is None and reported is None
    else:
        assert charged <= wall * cores                      # never more CPU than wall × cores
        assert (reported is None and charged == cpu) or (reported == cpu and charged == wall * cores < cpu)
    assert source in (WALL_TIMESTAMPS, WALL_MINIMUM, WALL_CPU)


def test_the_demo_check_flags_a_zero_wall_and_cpu_above_wall_times_cores(tmp_path):
    """`check_invariants` (run by `ce-k8s demo --history-dir`) fails on the records this fix removes."""
    from ce_k8s.agent.history import HistoryWriter

    writer = HistoryWriter(str(tmp_path))
    good = settled(T0, T0, 4.674)
    writer.write("good", history_ad(good, "ce"))
    assert check_invariants(tmp_path)["ok"] is True
    bad = history_ad(good, "ce")
    bad.update({"GlobalJobId": "ce#bad#1", "RemoteWallClockTime": 0.0})
    writer.write("bad", bad)
    result = check_invariants(tmp_path)
    assert result["ok"] is False and result["wall_zero"] == 1 and result["cpu_over_wall"] == 1


def test_an_eviction_reported_at_once_has_a_wall_time_of_at_least_a_second(server, settings, tmp_root):
    """The update that moves an evicted job to its next attempt reports the wall time before the
    collector has settled the attempt: same-second timestamps still give one second, not 0."""
    agent = new_agent(server, replace_settings(settings, per_job_history_dir=str(tmp_root / "history")))
    try:
        ad = routed_ad(Path(settings.spool))
        status, parts = agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)
        assert status == protocol.STATUS_OK
        wait(lambda: agent.cache.get(NAME))

        def evict(p):
            p["status"] = {"phase": "Failed", "reason": "Evicted", "message": "node drained",
                           "conditions": [{"type": "DisruptionTarget", "status": "True",
                                           "reason": "EvictionByEvictionAPI", "lastTransitionTime": T0}],
                           "containerStatuses": [{"name": "pilot", "state": {"terminated": {
                               "exitCode": 137, "startedAt": T0, "finishedAt": T0}}}]}
        server.call(server.api.write, "pods", "default", NAME, evict)
        wait(lambda: agent.cache.get(NAME).phase == "Failed")
        status, parts = agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)
        assert status == protocol.STATUS_OK
        out = apply_output(ad, parts[0])
        assert out["K8sAttempt"] == 1
        assert out["LastRemoteWallClockTime"] >= 1.0 and out["RemoteWallClockTime"] >= 1.0
        wait(lambda: agent.usage.record(NAME))                  # settled: the history file's record
        assert agent.usage.record(NAME).wall >= 1.0
        wait(lambda: check_invariants(tmp_root / "history")["files"] == 1)
        assert check_invariants(tmp_root / "history")["ok"] is True
    finally:
        agent.stop()


def test_a_capped_cpu_time_is_logged(settings, tmp_root, caplog):
    """The log says so too: `event=cpu-capped` with the kubelet's figure (docs/accounting.md)."""
    from ce_k8s.agent.agent import Agent

    record = settled(T0, T0, 20.0)
    agent = Agent(replace_settings(settings, per_job_history_dir=str(tmp_root / "history")), client.ApiClient())
    with caplog.at_level(logging.INFO, logger="ce_k8s.agent.jobaccounting"):
        agent.accounting.attempt_settled(record)            # what the collector calls (not started)
    assert check_invariants(tmp_root / "history")["cpu_capped"] == 1
    text = caplog.text
    assert "event=attempt-accounted" in text and "wall_source=minimum" in text
    assert "event=cpu-capped" in text and "reported_s=20.0" in text and "capped_s=8.0" in text
