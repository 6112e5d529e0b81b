"""Pilots running through restarts of the real control plane and of the agent.

The whole path of `ce-k8s demo --kube real` (ce_k8s/demos/cli_demo.py): the emulated job router
spawning the real hooks, the agent as its own process on its ServiceAccount's kubeconfig, the
real kube-apiserver, etcd, controller manager and scheduler, kwok playing each pilot's scenario.
Mid-run kube-apiserver is restarted (every watch cut, its watch cache rebuilt: resumes from older
resourceVersions get 410), then etcd (the API server loses its storage for a while), then the
agent is SIGKILLed and started again (it rebuilds from a LIST). The factory's view must not
change: every pilot completes with its own exit code, none is lost, no pod is made twice, and
nothing is left in the cluster once the jobs leave the queue.
"""

from __future__ import annotations

import pytest

from ce_k8s.sim.condor.schedd import eval_int
from ce_k8s.sim.testbed import TestBed

from .conftest import wait_for

PILOTS = 10
MANAGED = "app.kubernetes.io/managed-by=ce-k8s"


def _left(core) -> int:
    return (len(core.list_pod_for_all_namespaces(label_selector=MANAGED).items)
            + len(core.list_secret_for_all_namespaces(label_selector=MANAGED).items))


def _running(bed: TestBed) -> int:
    return sum(1 for job in bed.outcomes if (ad := bed.schedd.get(job)) is not None and eval_int(ad, "JobStatus") == 2)


def _tick_until(bed: TestBed, predicate, what: str, timeout: float = 60.0) -> None:
    def step() -> bool:
        bed.tick(0.5)
        return predicate()
    wait_for(step, timeout=timeout, poll=0, what=what)


@pytest.mark.slow
def test_pilots_complete_through_apiserver_etcd_and_agent_restarts(real_kube, admin_core):
    from ce_k8s.real.kube.kubeserver import RealKubeServer

    # The bed counts ce-k8s's pods cluster-wide: start from none (earlier tests' namespaces gone).
    wait_for(lambda: _left(admin_core) == 0, timeout=120, what="no ce-k8s pods or Secrets left from earlier tests")
    bed = TestBed(kube_server=RealKubeServer(real_kube), seed=25)
    try:
        bed.start()
        # 20-70 s of life each at the bed's time scale: long enough to span all three restarts.
        pilots = bed.make_pilots(PILOTS, run_s=900, fail_fraction=0.3)
        assert any(p.exit_code for p in pilots) and any(not p.exit_code for p in pilots)
        bed.submit(pilots)
        _tick_until(bed, lambda: _running(bed) >= PILOTS // 2, "half the pilots running", timeout=90)
        real_kube.restart("kube-apiserver", progress=lambda m: None)
        _tick_until(bed, lambda: _running(bed) == PILOTS, "every pilot running", timeout=60)
        real_kube.restart("etcd", progress=lambda m: None)
        bed.tick(0.5)
        bed.kill_agent_and_restart()
        assert not any(o.status == "completed" for o in bed.outcomes.values()), "restarts were not mid-run"
        assert bed.run(timeout=120, poll_interval=0.5), "pilots still queued after 120 s"
        bed.drain(timeout=60)
        summary = bed.summary()
    finally:
        bed.close()
    assert (summary["completed"], summary["held"], summary["lost"]) == (PILOTS, 0, 0), summary
    assert {o.job: o.exit_code for o in bed.outcomes.values()} == \
        {o.job: o.pilot.exit_code for o in bed.outcomes.values()}
    assert summary["pods_created"] == PILOTS and summary["duplicate_pods"] == 0, summary
    assert (summary["pods_left"], summary["secrets_left"], summary["routed_jobs_left"]) == (0, 0, 0), summary
    assert summary["agent_restarts"] == 1
