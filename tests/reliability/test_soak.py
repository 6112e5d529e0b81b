"""Issue 9, "Load and faults": the soak's detectors, and a CI-sized soak that must keep every invariant.

The invariants (docs/reliability.md): every pilot ends completed or held with a documented code
(docs/holds.md), no pilot is lost, no (job, attempt) gets a second pod (docs/design.md Decision 5, "exactly
one pod per attempt"), no pod or Secret is left behind, and the agent's memory stays bounded.
The detectors are tested first, against the real API emulator, so that the soak's zeros mean
something: each one is shown to count what it claims to count.
"""

from __future__ import annotations

import pytest

from ce_k8s.holds import HOLDS
from ce_k8s.sim.kube.apiserver import ApiServer


def _pod(name: str, gjid: str, attempt: int, managed: bool = True) -> dict:
    labels = {"ce-k8s.htcondor.org/attempt": str(attempt)}
    if managed:
        labels["app.kubernetes.io/managed-by"] = "ce-k8s"
    return {"metadata": {"name": name, "labels": labels,
                         "annotations": {"ce-k8s.htcondor.org/global-job-id": gjid}},
            "spec": {"containers": [{"name": "pilot", "image": "busybox:1"}], "restartPolicy": "Never"}}


def test_ledger_counts_a_second_pod_for_the_same_attempt(soak):
    """docs/design.md Decision 5: one pod per (job, attempt). Two pods of one attempt under different names
    are a duplicate; a pod of the next attempt is not; pods without ce-k8s's label are not ours."""
    ledger = soak.AttemptLedger()
    with ApiServer.running(kubelet=False) as srv:
        srv.call(srv.store.add_listener, ledger)
        srv.call(srv.api.create, "pods", "default", _pod("a0", "ce#1.0#1", 0))
        srv.call(srv.api.create, "pods", "default", _pod("a0-again", "ce#1.0#1", 0))
        srv.call(srv.api.create, "pods", "default", _pod("a1", "ce#1.0#1", 1))
        srv.call(srv.api.create, "pods", "default", _pod("b0", "ce#2.0#1", 0))
        srv.call(srv.api.create, "pods", "default", _pod("other", "ce#2.0#1", 0, managed=False))
        srv.call(srv.api.create, "secrets", "default", {"metadata": {"name": "s"}, "data": {}})
        # Deleting and re-creating under the same name is still a second pod for that attempt.
        srv.call(srv.api.delete, "pods", "default", "b0")
        srv.call(srv.api.create, "pods", "default", _pod("b0", "ce#2.0#1", 0))
    dups = ledger.duplicates()
    assert set(dups) == {"ce#1.0#1#attempt0", "ce#2.0#1#attempt0"}
    assert all(len(uids) == 2 and len(set(uids)) == 2 for uids in dups.values())
    assert ledger.pods_created == 5 and ledger.attempts == 3
    assert ledger.unlabelled_pods == 1 and ledger.secrets_created == 1


def test_memory_report_separates_lives_and_finds_growth(soak):
    """A leak shows as RSS growing with pilots handled within one agent's life (a SIGKILL resets it);
    the longest life is reported with its slope, and the in-flight fit spans the whole run."""
    S = soak.RssSample
    flat = [S(t, 90.0, 50, t * 10, 0) for t in range(10)]
    leaking = [S(10 + t, 90.0 + t * 2.0, 50, 100 + t * 20, 1) for t in range(30)]   # 2 MB per 20 pilots
    report = soak.memory_report(flat + leaking, keep=8)
    assert report["rss_max_mb"] == 148.0
    assert report["longest_life"]["generation"] == 1
    assert report["longest_life"]["mb_per_1000_pilots"] == pytest.approx(100.0)
    assert report["lives"][0]["mb_per_1000_pilots"] == 0.0
    assert len(report["series"]) <= 8
    assert soak.memory_report([]) == {"samples": 0}


@pytest.mark.parametrize("change", [{"pilots": 0}, {"kill_min": 0.0}, {"rate_429": 1.5},
                                    {"rate_429": 0.5, "rate_500": 0.5}, {"max_in_flight": 5, "burst": 10}])
def test_config_refuses_meaningless_settings(soak, change):
    """Bad options are a typed error naming the option, never a run that measures nothing."""
    cfg = soak.SoakConfig(**change)
    with pytest.raises(soak.SoakError, match="--"):
        cfg.validate()


def test_command_line_reports_bad_option_with_exit_2(soak, capsys):
    assert soak.main(["--pilots", "0"]) == 2
    assert "--pilots must be at least 1" in capsys.readouterr().err


def test_report_flags_leaked_pod_and_secret(soak):
    """The leak check counts every pod and Secret created after set-up, whatever its labels: a
    stray pod and Secret left in the API make the run fail."""
    run = soak.Soak(soak.SoakConfig(pilots=1, drain_timeout=1.0, node_loss_every=0))
    try:
        run.start()
        srv = run.bed.server
        srv.call(srv.api.create, "pods", "default", _pod("stray", "x#9.0#1", 0, managed=False))
        srv.call(srv.api.create, "secrets", "default", {"metadata": {"name": "stray"}, "data": {}})
        run.finish()
        report = run.report(all_finished=True, wall_s=1.0)
    finally:
        run.close()
    assert report["pods_left"] == 1 and report["secrets_left"] == 1
    assert report["leaked_examples"] == ["default/stray", "default/stray"]
    assert not report["invariants"]["no_leaked_pod"] and not report["invariants"]["no_leaked_secret"]
    assert not report["invariants"]["every_pilot_completed_or_held"]      # 0 of 1 pilots ran
    assert report["ok"] is False


@pytest.mark.slow
def test_ci_soak_keeps_every_invariant_under_faults(soak):
    """Issue 9 "Load and faults" at CI size, same code as the recorded run (docs/reliability.md):
    429/500/applied-then-lost writes (closed and hung), latency, cut watches, repeated agent
    SIGKILLs, API evictions and node losses. Every pilot completes or is held with a docs/holds.md
    code; none is lost; nothing is left; the agent's RSS stays bounded; no two pods of one attempt
    ever exist at once, and no attempt ever gets a second pod, not even after its first one
    vanished unseen while the agent was down (docs/design.md Decision 5; findings F1-F3 of
    docs/reliability.md, closed by the Events check and the post journal)."""
    cfg = soak.SoakConfig(
        pilots=60, seed=11, burst=20, max_in_flight=60,
        rate_429=0.03, rate_500=0.03, rate_timeout=0.03, hang_share=0.5, hang_seconds=1.0,
        latency=0.001, jitter=0.005, watch_cut_rate=0.02, watch_cut_after=8.0,
        kill_min=2.0, kill_max=4.0, kill_until=1.0, evict_fraction=0.1, evict_run_real_s=3.0,
        # stall_timeout bounds "no pilot finished for this long": a pilot whose pod sits on a lost
        # node now waits, Running or Pending and Terminating, until the node is back (up to ~11 s
        # here) before its next attempt (finding 5 of docs/real-kubernetes.md), then may be evicted
        # once more; 15 s ended a run whose last pilot was on its third attempt (CI, 2026-11-27).
        node_loss_every=5.0, run_s=10.0, time_scale=0.02, poll=0.5, timeout=60.0, stall_timeout=30.0,
        drain_timeout=30.0,
        rss_every=0.5, rss_limit_mb=400.0, progress_every=1e9)
    report = soak.Soak(cfg).run()
    brief = {k: report[k] for k in ("completed", "held", "held_by_code", "lost", "lost_details", "duplicate_classes",
                                    "duplicate_details", "leaked_examples", "agent_kills", "wall_s")}
    for name, ok in report["invariants"].items():
        assert ok, f"invariant {name} failed: {brief}"
    assert report["duplicate_classes"] == {}, brief
    assert report["overlapping_live_pods"] == 0, brief
    # The faults really happened, so the zeros above are not vacuous.
    assert report["agent_kills"] >= 2, brief
    assert any(loss["live_pods"] for loss in report["node_losses"]), report["node_losses"]
    assert report["evicted_through_api"] >= 1, brief
    assert report["attempts"] > cfg.pilots, "evicted or node-lost pilots ran a second attempt"
    assert all(report["faults_injected"].get(kind, 0) > 0 for kind in ("429", "500", "timeout", "cut")), \
        report["faults_injected"]
    assert set(report["held_by_code"]) <= set(HOLDS)
    assert report["agent_rss"]["samples"] >= 10
