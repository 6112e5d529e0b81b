"""A pilot's outcome from its job's ads, in both demos (ce_k8s.sim.outcomes), with no HTCondor running.

The ads have the shape `condor_q -json` / `condor_history -json` give on the real bed
(docs/real-condor.md "The CE's own configuration", the finding "An evicted pilot is not rerun"; the
attributes tests/real/condor/test_real_ce_config.py reads): on HTCondor-CE's own configuration an evicted pilot that
had started is removed by the CE (`JobStatus = 3`, `RemoveReason` of its `SYSTEM_PERIODIC_REMOVE`),
and a factory's grid job of it is held by the gridmanager (`condorjob.cpp`, GM_POLL_ACTIVE). Such a
pilot is removed, with the CE's reason, not lost.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from ce_k8s.demos.condordemo import RealDemo, RealOutcome
from ce_k8s.sim.outcomes import COMPLETED, HELD, LOST, QUEUED, REMOVED, Verdict, ce_job_id, classify
from ce_k8s.sim.pilots import make_pilot

NO_RETRY = "CE job removed by SYSTEM_PERIODIC_REMOVE due to disabled job retries"
GRID_JOB_ID = "condor ce@vm.example.org vm.example.org:9619 12.0"
FACTORY = "factory@vm.example.org"

CE_REMOVED = {"ClusterId": 12, "ProcId": 0, "DemoIndex": 0, "JobStatus": 3, "RemoveReason": NO_RETRY}
FACTORY_HELD = {"ClusterId": 5, "ProcId": 0, "DemoIndex": 0, "JobStatus": 5, "GridJobId": GRID_JOB_ID,
                "HoldReason": "Job disappeared from remote schedd"}
CE_OOM_HELD = {"ClusterId": 12, "ProcId": 0, "JobStatus": 5, "HoldReasonCode": 34, "HoldReasonSubCode": 8750,
               "HoldReason": "ce-k8s: pod ce-12-0-a0-0123456789 was OOM-killed: memory limit 2Gi exceeded"}


def test_a_ce_job_removed_by_the_no_retry_policy_is_removed_with_its_reason():
    assert classify(CE_REMOVED) == Verdict(REMOVED, NO_RETRY)
    assert classify({**CE_REMOVED, "RemoveReason": None}).status == REMOVED   # removed all the same


def test_a_factory_job_held_because_the_ce_removed_its_job_is_removed_with_the_ces_reason():
    verdict = classify(FACTORY_HELD, CE_REMOVED)
    assert verdict.status == REMOVED
    assert verdict.reason.startswith(NO_RETRY) and "Job disappeared from remote schedd" in verdict.reason


def test_a_factory_job_held_for_a_hold_on_the_ce_or_with_no_ce_ad_is_held():
    assert classify(FACTORY_HELD, CE_OOM_HELD) == Verdict(HELD, "Job disappeared from remote schedd")
    assert classify(FACTORY_HELD) == Verdict(HELD, "Job disappeared from remote schedd")
    assert classify(CE_OOM_HELD) == Verdict(HELD, CE_OOM_HELD["HoldReason"])


def test_completion_counts_once_the_router_finalized_the_job():
    """HTCondor-C waits for JobFinishedHookDone too (condorjob.cpp, m_remoteJobFinished)."""
    done = {"ClusterId": 12, "ProcId": 0, "JobStatus": 4, "ExitCode": 0}
    assert classify(done) == Verdict(QUEUED)
    assert classify({**done, "JobFinishedHookDone": 1760000700}) == Verdict(COMPLETED)


def test_no_outcome_yet():
    """Idle, running, the -spool hold for the input sandbox, and no ad at all (the history may lag)."""
    spooling = {"JobStatus": 5, "HoldReasonCode": 16, "HoldReason": "Spooling input data files"}
    for ad in ({"JobStatus": 1}, {"JobStatus": 2}, spooling, None):
        assert classify(ad) == Verdict(QUEUED)


def test_ce_job_id_is_the_last_word_of_an_htcondor_c_grid_job_id():
    assert ce_job_id(FACTORY_HELD) == "12.0"
    for ad in (None, {}, {"GridJobId": "batch k8s 12.0"}, {"GridJobId": "condor ce@vm 12.0"},
               {"GridJobId": "condor ce@vm pool 12.0; rm -rf"}):
        assert ce_job_id(ad) is None


# ---- the real demo's loop, on canned ads instead of the bed --------------------------------------

class CannedBed:
    """The RealCondor calls RealDemo's loop makes, answered from fixed ads: `condor_q`/`condor_history`
    of the factory's schedd (with `-name`) or of the CE; every command is recorded."""

    factory_name = FACTORY

    def __init__(self, state_dir: Path, ads: dict[tuple[str, str], list[dict]]) -> None:
        self.state_dir = state_dir
        self.blah_log = state_dir / "blah-calls.log"
        self.ads = ads
        self.commands: list[list[str]] = []

    def core_api(self) -> SimpleNamespace:
        """The cluster, for the demo's evictions: the evicted pilot's pod is long gone."""
        return SimpleNamespace(list_pod_for_all_namespaces=lambda **_kw: SimpleNamespace(items=[]))

    def run(self, args: list[str], **_kw) -> SimpleNamespace:
        self.commands.append(args)
        schedd = "factory" if "-name" in args else "ce"
        ads = self.ads.get((args[0], schedd))
        return SimpleNamespace(stdout=json.dumps(ads) if ads else "", returncode=0)


def _demo(tmp_path: Path, ads, job: str, factory: bool) -> tuple[RealDemo, CannedBed]:
    bed = CannedBed(tmp_path, ads)
    demo = RealDemo(bed, factory=factory)   # type: ignore[arg-type]
    demo.outcomes[job] = RealOutcome(make_pilot(0, "cpu1", evict=True), 0, job)
    demo.started = 0.0
    return demo, bed


STATS = {"pods": {"pods_created": 1, "recreated": 0, "overlapping": 0}, "pods_left": 0, "secrets_left": 0}


def test_the_real_demo_counts_a_pilot_the_ce_removed_as_removed_and_stops_waiting(tmp_path):
    """`ce-k8s demo --condor real --evict-fraction 0.1` on the stock CE: the run ends at the first look
    (the timeout is never reached), and the JSON counts the pilot as removed with the CE's reason."""
    demo, bed = _demo(tmp_path, {("condor_history", "ce"): [CE_REMOVED]}, "12.0", factory=False)
    demo.run(timeout=30)
    assert [c[0] for c in bed.commands] == ["condor_q", "condor_history"]     # one look, then done
    out = demo.outcomes["12.0"]
    assert (out.status, out.remove_reason) == (REMOVED, NO_RETRY)
    summary = demo.summary(STATS)
    assert (summary["removed"], summary["lost"], summary["held"]) == (1, 0, 0)
    assert summary["remove_reasons"] == {NO_RETRY: 1}


def test_the_real_demo_reads_the_ces_history_for_a_factory_job_the_gridmanager_held(tmp_path):
    ads = {("condor_q", "factory"): [FACTORY_HELD], ("condor_history", "ce"): [CE_REMOVED]}
    demo, bed = _demo(tmp_path, ads, "5.0", factory=True)
    demo.run(timeout=30)
    out = demo.outcomes["5.0"]
    assert out.status == REMOVED and out.remove_reason.startswith(NO_RETRY)
    assert ["condor_rm", "-name", FACTORY, "5.0"] in bed.commands      # the factory removes it, as GlideinWMS
    summary = demo.summary(STATS)
    assert (summary["removed"], summary["factory_removed"], summary["held"], summary["lost"]) == (1, 1, 0, 0)


def test_the_real_demo_calls_lost_only_a_pilot_nothing_accounts_for(tmp_path):
    demo, _bed = _demo(tmp_path, {}, "12.0", factory=False)
    demo.run(timeout=0)
    assert demo.outcomes["12.0"].status == LOST
    assert demo.summary(STATS)["lost"] == 1
