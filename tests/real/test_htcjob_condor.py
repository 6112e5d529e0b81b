"""HTCJob real on both sides: the real kube-apiserver, `ce-k8s htcjob-operator` as a process on its
ServiceAccount's token, and the real HTCondor 25 schedd whose jobs a real startd in the root runs
(ce_k8s.real.htcjobbed; the batch pool of docs/real-condor.md). Exit codes, output, holds and
removals are HTCondor's own. Also the other direction at once: an HTCJob sent to the CE schedd is
routed by the CE's Kubernetes route into a pod on the same control plane.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from ce_k8s.real.condor.condor import RealCondor, RealCondorError, _processes_in
from ce_k8s.real.htcjobbed import HTCJobBed, phase_is

from .conftest import wait_for

pytestmark = pytest.mark.slow

RESULT = "[ \"$1\" = 2 ] && exit 3\nexit 0\n"


def script(body: str) -> dict:
    return {"source": "#!/bin/sh\n" + body}


@pytest.fixture(scope="module")
def bed(real_kube):
    from ce_k8s.real.kube.kubeserver import RealKubeServer

    state = Path("/var/tmp") / f"ce-k8s-htcjob-tests-{os.getpid()}"
    server = RealKubeServer(real_kube)
    condor = RealCondor(state / "condor", kube_server=server, batch=True)
    if _processes_in(condor.root):
        pytest.fail(f"processes already run in {condor.root} (a real-HTCondor bed is up?): one at a time")
    try:
        condor.up(poll=2, progress=lambda m: sys.stderr.write(f"real-condor: {m}\n"), owner_pid=os.getpid())
    except RealCondorError as exc:
        pytest.fail(f"the real HTCondor could not be brought up: {exc}")
    htc = HTCJobBed(real_kube, condor, state / "work")
    try:
        htc.prepare()
        htc.use_namespace(f"htc-it-{os.urandom(3).hex()}")
        htc.start_operator()
        yield htc
    finally:
        try:
            # The namespace goes while the operator runs, so its finalizers are honoured and no
            # resource is left for another bed's operator to find.
            real_kube.kubectl("delete", "namespace", htc.namespace, "--ignore-not-found", "--timeout=100s",
                              check=False, timeout=120)
        finally:
            htc.stop_operator()
            condor.down(progress=lambda m: sys.stderr.write(f"real-condor: {m}\n"))
            server.stop()
            shutil.rmtree(state, ignore_errors=True)
    assert real_kube.kubectl("get", "namespace", htc.namespace, check=False).returncode != 0, \
        "the test namespace was not deleted: an HTCJob's finalizer held it"


def uid_of(bed: HTCJobBed, name: str) -> str:
    return bed.get(name)["metadata"]["uid"]


def test_queue_3_runs_on_the_real_startd_with_exit_codes_and_output(bed):
    bed.apply("mixed", {"queue": 3, "script": script('echo "proc $1 as $(id -un) index $HTCJOB_INDEX"\n'
                                                      'echo "err $1" >&2\necho "r$1" > result.txt\n' + RESULT)})
    bed.apply("fine", {"queue": 2, "command": ["/bin/echo", "it's", "$HOME", "two words"]})
    bed.apply("interpreted", {"queue": 2, "script": {"source": 'echo "sh ran me with $1"\n',
                                                      "interpreter": ["/bin/sh", "-e"]}})
    obj = bed.wait("mixed", phase_is("Failed", "Completed"), 180, "mixed to finish")
    st = obj["status"]
    assert st["phase"] == "Failed" and (st["succeeded"], st["failed"]) == (2, 1)
    assert [(p["proc"], p["exitCode"]) for p in st["procs"]] == [(0, 0), (1, 0), (2, 3)]
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Failed"]["status"] == "True" and cond["OutputDelivered"]["status"] == "True"
    out = bed.output("mixed")
    for proc in range(3):
        assert out[f"{proc}.stdout"] == f"proc {proc} as htcuser index {proc}\n"
        assert out[f"{proc}.stderr"] == f"err {proc}\n" and out[f"{proc}.result.txt"] == f"r{proc}\n"
    jobs = bed.jobs(uid_of(bed, "mixed"))
    assert len({j["ClusterId"] for j in jobs}) == 1 and len(jobs) == 3, "submitted more than once"
    assert {j["Owner"] for j in jobs} == {"htcuser"}
    assert all(j["JobStatus"] == 4 for j in jobs)
    fine = bed.wait("fine", phase_is("Completed", "Failed"), 120, "fine to finish")
    assert fine["status"]["phase"] == "Completed"
    # Arguments reach execve() as written: no shell, no macro expansion.
    assert bed.output("fine")["1.stdout"] == "it's $HOME two words\n"
    interpreted = bed.wait("interpreted", phase_is("Completed", "Failed"), 120, "interpreted to finish")
    assert interpreted["status"]["phase"] == "Completed"
    assert bed.output("interpreted")["1.stdout"] == "sh ran me with 1\n"
    row = bed.row("fine").split()
    assert row[:8] == ["fine", "Completed", "2", "0", "0", "0", "2", "0"]


def test_a_real_hold_shows_its_reason(bed):
    bed.apply("held", {"command": ["/no/such/executable"]})
    st = bed.wait("held", phase_is("Held"), 120, "the hold")["status"]
    assert st["held"] == 1 and st["procs"][0]["holdReasonCode"] > 0
    held = next(c for c in st["conditions"] if c["type"] == "Held")
    assert held["status"] == "True" and "/no/such/executable" in held["message"]


def test_deleting_a_running_htcjob_removes_its_jobs(bed):
    bed.apply("long", {"queue": 2, "script": script("sleep 600\n")})
    bed.wait("long", lambda o: (o.get("status") or {}).get("running") == 2, 120, "both running")
    uid = uid_of(bed, "long")
    bed.kube.kubectl("delete", "htcjob", "long", "-n", bed.namespace, "--wait=false")
    wait_for(lambda: bed.get("long") is None, timeout=90, what="the resource to go")
    jobs = bed.jobs(uid)
    assert sorted(j["ProcId"] for j in jobs) == [0, 1]
    assert all(j["JobStatus"] == 3 and "was deleted" in j["RemoveReason"] for j in jobs), jobs


def test_operator_killed_mid_way_never_submits_twice(bed):
    bed.apply("killed", {"queue": 3, "script": script("sleep 4\necho done $1\n")})
    bed.wait("killed", lambda o: (o.get("status") or {}).get("jobId"), 60, "submitted")
    bed.stop_operator(signal.SIGKILL)
    uid = uid_of(bed, "killed")
    # The jobs finish while no operator runs; the schedd keeps them (spooled) for the output.
    wait_for(lambda: (js := bed.jobs(uid)) and all(j["JobStatus"] == 4 for j in js), timeout=120,
             what="the jobs to complete without the operator")
    before = bed.get("killed")["status"]
    assert before["phase"] in ("Submitted", "Running")
    bed.start_operator()
    st = bed.wait("killed", phase_is("Completed", "Failed"), 120, "caught up")["status"]
    assert st["phase"] == "Completed" and st["succeeded"] == 3
    assert bed.output("killed")["2.stdout"] == "done 2\n"
    jobs = bed.jobs(uid)
    assert len({j["ClusterId"] for j in jobs}) == 1 and len(jobs) == 3


def test_an_operator_killed_at_once_after_the_submit_adopts_its_jobs(bed):
    """Killed right after it submitted: the status may not say so, the schedd does."""
    bed.apply("early", {"queue": 2, "script": script("echo early $1\n")})
    uid = uid_of(bed, "early")
    wait_for(lambda: bed.jobs(uid), timeout=60, poll=0.05, what="the submit")
    bed.stop_operator(signal.SIGKILL)
    bed.start_operator()
    st = bed.wait("early", phase_is("Completed", "Failed"), 120, "completion")["status"]
    assert st["phase"] == "Completed"
    assert len({j["ClusterId"] for j in bed.jobs(uid)}) == 1


def test_the_schedd_restarted_mid_way(bed):
    bed.apply("restarted", {"queue": 2, "script": script("sleep 6\necho survived $1\n")})
    bed.wait("restarted", lambda o: (o.get("status") or {}).get("running") == 2, 120, "running")
    bed.condor.run(["condor_restart", "-daemon", "schedd", "-name", bed.condor.batch_name])
    st = bed.wait("restarted", phase_is("Completed", "Failed"), 180, "completion after the restart")["status"]
    assert st["phase"] == "Completed"
    assert bed.output("restarted")["1.stdout"] == "survived 1\n"
    assert len({j["ClusterId"] for j in bed.jobs(uid_of(bed, "restarted"))}) == 1


def test_a_spec_the_operator_cannot_serve_gets_a_condition_and_nothing_is_submitted(bed):
    bed.apply("no-input", {"command": ["/bin/true"], "input": [{"configMap": "missing"}]})
    st = bed.wait("no-input", lambda o: any(c.get("reason") == "TargetNotReady"
                                            for c in (o.get("status") or {}).get("conditions", [])),
                  60, "the condition")["status"]
    assert "input configMap 'missing' not found" in st["message"]
    bed.apply("bad-submit", {"command": ["/bin/true"], "submit": {"requirements": "(("}})
    st = bed.wait("bad-submit", phase_is("Invalid"), 60, "the refusal")["status"]
    assert "requirements" in st["message"].lower() or "parse" in st["message"].lower(), st["message"]
    for name in ("no-input", "bad-submit"):
        assert bed.jobs(uid_of(bed, name)) == [], f"{name}: something was submitted"


def test_inputs_a_remote_target_by_token_secret_and_output_to_a_claim(bed):
    """What a user names in the namespace: a ConfigMap and a Secret as input files, the schedd by
    collector and a token Secret (the same batch schedd, reached as a remote one), and a claim the
    site mounted into the operator for the output."""
    ns = bed.namespace
    bed.kube.kubectl("create", "configmap", "params", "-n", ns, "--from-literal=params.txt=alpha beta")
    bed.kube.kubectl("create", "secret", "generic", "creds", "-n", ns, "--from-literal=key.txt=s3cr3t")
    bed.kube.kubectl("create", "secret", "generic", "schedd-token", "-n", ns,
                     f"--from-file=token={bed.token_file}")
    (bed.work / "claims" / "results").mkdir(parents=True, exist_ok=True)    # the site's mount
    bed.apply("inputs", {
        "queue": 2, "script": script('cat params.txt; echo; cat key.txt; echo\necho "$1" > index.txt\n'),
        "input": [{"configMap": "params"}, {"secret": "creds", "keys": ["key.txt"]}],
        "target": {"collector": bed.condor.collector_address, "schedd": bed.condor.batch_name,
                   "tokenSecret": {"name": "schedd-token"}},
        "output": {"pvc": {"claimName": "results", "path": "runs/today"}},
        "env": [{"name": "WHO", "value": "user"}]})
    st = bed.wait("inputs", phase_is("Completed", "Failed"), 120, "completion")["status"]
    assert st["phase"] == "Completed", st
    dest = bed.work / "claims" / "results" / "runs" / "today" / "inputs"
    assert st["output"]["path"] == str(dest)
    for proc in (0, 1):
        assert (dest / str(proc) / "stdout").read_text() == "alpha beta\ns3cr3t\n"
        assert (dest / str(proc) / "index.txt").read_text() == f"{proc}\n"
    assert bed.output("inputs") == {}        # no ConfigMap when the output goes to a claim


def test_both_directions_an_htcjob_to_the_ce_becomes_a_pod(bed):
    """An HTCJob sent to the CE schedd: the CE's Kubernetes route makes each job a pod on the same
    cluster, and the result comes back through the CE into the HTCJob."""
    scenario = "\"run=2s exit=0 stdout='proc $(ProcId) ran in a pod'\""
    bed.apply("round-trip", {"queue": 2, "script": script("exit 0\n"), "target": {"schedd": bed.condor.ce_name},
                             "submit": {"+DemoScenario": scenario}})
    st = bed.wait("round-trip", phase_is("Completed", "Failed"), 240, "the round trip")["status"]
    assert st["phase"] == "Completed" and st["schedd"] == bed.condor.ce_name
    jobs = bed.jobs(uid_of(bed, "round-trip"), bed.condor.ce_name)
    sources = [j for j in jobs if not j.get("RoutedFromJobId")]
    copies = [j for j in jobs if j.get("RoutedFromJobId")]
    assert len(sources) == 2 and all(j.get("RoutedToJobId") for j in sources), jobs
    assert sorted(j["RoutedFromJobId"] for j in copies) == sorted(f"{j['ClusterId']}.{j['ProcId']}" for j in sources)
    out = bed.output("round-trip")
    assert "proc 1 ran in a pod" in out["1.stdout"]
