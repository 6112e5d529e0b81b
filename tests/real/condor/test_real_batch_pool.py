"""The batch pool of the real-HTCondor bed (`RealCondor(batch=True)`; docs/real-condor.md, "The batch pool").

A third schedd (`batch@<host>`), a negotiator and a startd under the bed's master and collector, on
the real HTCondor 25.14.1 and 23.9.6 (one bed after the other): batch jobs really run (real exit
codes, real output), the CE schedd's jobs never do (the startd's START takes only jobs whose
GlobalJobId the batch schedd wrote), and a client outside the root (this process's `htcondor2`,
not a command in the root) reaches the batch schedd with an IDTOKEN made by `condor_token_create`
in the root. Needs root, as CI runs; one real-HTCondor bed per machine, so the fixture waits
(bounded) for another run's bed to go down rather than touching it.
`CE_K8S_REAL_CONDOR_BATCH_TEST_STATE` names a batch bed that is up already (`ce-k8s testbed
real-condor up --batch --state DIR`) to run against it instead (its version only; the module then
neither brings a bed up nor down).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ce_k8s.real.condor.condor import (
    BATCH_ACCOUNT,
    BATCH_SLOTS,
    VERSIONS,
    RealCondor,
)
from ce_k8s.sim.pilots import make_pilot

from .test_real_ce_config import up_when_free
from .test_real_condor import _demo, _no_pods_left, _wait

pytestmark = pytest.mark.slow

HOLD_SPOOLING = 16          # HoldReasonCode while a spooled job's input is not in yet


#: A batch bed that is up already (`ce-k8s testbed real-condor up --batch --state DIR`), to run against.
REUSE = os.environ.get("CE_K8S_REAL_CONDOR_BATCH_TEST_STATE")


@pytest.fixture(scope="module", params=["reused"] if REUSE else list(VERSIONS))
def env(request):
    """The default bed with the batch pool, once per HTCondor version (25.14.1, then 23.9.6, each down
    before the next is up); waits for another run's bed to go down first."""
    if os.geteuid() != 0:
        pytest.fail("the real-HTCondor tests need root (CI runs as root); see docs/real-condor.md")
    if REUSE:
        bed = RealCondor(REUSE, batch=True)
        if not (bed.status().get("up") and bed.status().get("batch")):
            pytest.fail(f"CE_K8S_REAL_CONDOR_BATCH_TEST_STATE={REUSE}: no batch bed is up there")
        yield bed
        return
    state = Path("/var/tmp") / f"ce-k8s-real-batch-tests-{os.getpid()}-{request.param}"
    yield from up_when_free(RealCondor(state, htcondor=request.param, batch=True), f"real-batch {request.param}")


def _workdir(env: RealCondor, name: str) -> Path:
    """A directory in the state directory (the root sees it at the same path) every account can use."""
    work = env.state_dir / "submit" / name
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o1777)
    return work


def _ad(env: RealCondor, args: list[str]):
    """One ClassAd from a `-long` listing in the root (condor_q -l, condor_status -l)."""
    import classad2

    return classad2.parseOne(env.run(args).stdout, classad2.ParserType.Old)


def _evaluates_true(expr: str, my, target) -> bool:
    """`expr` with MY and TARGET bound as in a match. A fresh ExprTree: classad2 evaluates an expression
    looked up in an ad without the target (a job's Requirements came out as an error)."""
    import classad2

    return classad2.ExprTree(expr).eval(my, target) is True


def _startd_history(env: RealCondor) -> list[str]:
    """The GlobalJobId of every job the startd has run (its own history file, STARTD_HISTORY)."""
    out = env.run(["condor_history", "-file", "/var/log/condor/startd_history", "-af", "GlobalJobId"],
                  check=False).stdout
    return out.split()


# --------------------------------------------------------------------------------------- the START rule
def test_a_ce_job_no_route_takes_is_never_started_while_a_batch_job_completes(env):
    """A vanilla job idle in the CE schedd that no route takes is considered by the negotiator at every
    cycle and refused by the startd's START alone (its own Requirements and the slot's resource limits
    accept it), while a batch job submitted after it runs and completes: a pilot must run once, where
    the router sends it, never on a local slot (docs/real-condor.md, "The batch pool"). Its owner can
    make it look like a batch job neither in the submit file (the schedd writes GlobalJobId) nor by
    `condor_qedit` (GlobalJobId is protected)."""
    work = _workdir(env, "start-rule")
    # Managed = "ScheddDone" is how a source job looks once the router has given it back to the
    # schedd: the router's candidate query skips it (docs/hook-protocol.md §4.4), and to the schedd
    # and the negotiator it is an ordinary idle vanilla job
    (work / "ce.sub").write_text('universe = vanilla\nexecutable = /bin/sleep\narguments = 600\n'
                                 '+Managed = "ScheddDone"\n+GlobalJobId = "batch@forged#1.0#1"\n'
                                 'request_memory = 64\nrequest_disk = 1024\nqueue\n')
    (work / "batch.sub").write_text('universe = vanilla\nexecutable = /bin/sh\narguments = "-c \'id -un; exit 7\'"\n'
                                    'output = batch.out\nrequest_memory = 64\nrequest_disk = 1024\n'
                                    'should_transfer_files = YES\nqueue\n')
    ce_job = env.run(["condor_submit", "-terse", "ce.sub"], user="osg01", cwd=str(work)).stdout.split()[0]
    ce_cluster = ce_job.split(".")[0]
    attrs = ("JobStatus", "NumJobStarts", "LastRejMatchTime", "LastRejMatchReason", "GlobalJobId",
             "RoutedToJobId", "Managed")

    def ce_ad() -> dict:
        return env.query(f"ClusterId == {ce_cluster}", attrs)[0]

    first = _wait(lambda: (ad := ce_ad()).get("LastRejMatchTime") and ad, timeout=60,
                  what="the negotiator considering the CE job")
    assert first["GlobalJobId"].startswith(f"{env.ce_name}#"), first          # the submit file's is overwritten
    edit = env.run(["condor_qedit", ce_job, "GlobalJobId", f'"{env.batch_name}#999.0#1"'], user="osg01",
                   check=False)
    assert edit.returncode != 0, edit.stdout
    assert ce_ad()["GlobalJobId"] == first["GlobalJobId"]

    batch_job = env.run(["condor_submit", "-terse", "-name", env.batch_name, "batch.sub"], user=BATCH_ACCOUNT,
                        cwd=str(work)).stdout.split()[0]
    done = _wait(lambda: env.history(f"ClusterId == {batch_job.split('.')[0]}", ("ExitCode", "CompletionDate",
                                                                                 "GlobalJobId", "Owner"),
                                     schedd=env.batch_name), timeout=60, what="the batch job completed")
    assert done[0]["ExitCode"] == 7 and done[0]["Owner"] == BATCH_ACCOUNT
    assert (work / "batch.out").read_text().strip() == BATCH_ACCOUNT          # run as its owner's uid
    # the negotiator went on refusing the CE job after the batch job had freed its slot
    later = _wait(lambda: (ad := ce_ad())["LastRejMatchTime"] > done[0]["CompletionDate"] and ad, timeout=30,
                  what="a negotiation cycle after the batch job")
    assert later["JobStatus"] == 1 and later["NumJobStarts"] == 0, later
    assert "RoutedToJobId" not in later and later["Managed"] == "ScheddDone", later
    assert later["LastRejMatchReason"].strip() == "no match found"          # 23.9 adds a space

    # only START keeps it off: the job's Requirements accept the slot, and the slot's Requirements
    # (START, and on 25 its resource limits) accept the job once its START is true
    job = _ad(env, ["condor_q", "-l", ce_job])
    batch_ad = _ad(env, ["condor_history", "-l", "-name", env.batch_name, batch_job])
    slot_name = f"slot1@{os.uname().nodename}"
    slot, open_slot = (_ad(env, ["condor_status", "-l", slot_name]) for _ in range(2))
    open_slot["Start"] = True
    slot_requirements = str(slot.lookup("Requirements"))
    assert _evaluates_true(str(job.lookup("Requirements")), job, slot)
    assert _evaluates_true(slot_requirements, open_slot, job)
    assert not _evaluates_true(slot_requirements, slot, job)
    assert _evaluates_true(slot_requirements, slot, batch_ad)
    ran = _startd_history(env)
    assert done[0]["GlobalJobId"] in ran
    assert all(g.startswith(f"{env.batch_name}#") for g in ran), ran
    env.run(["condor_rm", ce_job], user="osg01")


def test_a_routed_pilot_still_runs_once_as_a_pod_with_the_batch_pool_up(env):
    """With a negotiator and free slots in the pool, a pilot is still routed to Kubernetes and
    completes there, and the startd never ran it (its history holds batch jobs only)."""
    demo = _demo(env, [make_pilot(0, "cpu1", run_s=20, exit_code=4)])
    for out in demo.outcomes.values():
        assert out.status == "completed", (out.job, out.status, out.hold_reason)
        assert out.exit_code == 4 and "glidein 0 ran" in out.stdout
    _wait(lambda: _no_pods_left(env), what="pods and Secrets deleted")
    assert all(g.startswith(f"{env.batch_name}#") for g in _startd_history(env))
    assert len(env.run(["condor_status", "-af", "Name"]).stdout.split()) == BATCH_SLOTS


# --------------------------------------------------------------------------------------- a host client
@contextlib.contextmanager
def _token_directory(path: Path) -> Iterator[None]:
    """SEC_TOKEN_DIRECTORY of this process's htcondor2 (a process-wide setting), restored after."""
    import htcondor2

    before = htcondor2.param.get("SEC_TOKEN_DIRECTORY")
    htcondor2.param["SEC_TOKEN_DIRECTORY"] = str(path)
    try:
        yield
    finally:
        if before is None:
            del htcondor2.param["SEC_TOKEN_DIRECTORY"]
        else:
            htcondor2.param["SEC_TOKEN_DIRECTORY"] = before


JOB_SCRIPT = """#!/bin/sh
# a batch job from outside the root: stdout, stderr and a file, each naming its ProcId
echo "stdout of proc $1 as $(id -un) uid $(id -u)"
echo "stderr of proc $1" >&2
echo "result of proc $1" > "result.$1"
[ "$1" = 1 ] && exit 3
exit 0
"""


def test_a_host_client_runs_spooled_jobs_with_a_token(env, tmp_path):
    """The host's htcondor2 locates the batch schedd through the collector with a token, submits a
    `queue 3` job with `spool=True` whose executable is a script uploaded from the host, spools its
    input, waits for it, retrieves stdout, stderr and the output file of each proc, and reads each
    proc's ExitCode; the jobs belong to and run as the token's account; once retrieved they leave
    the queue by themselves and the schedd's history (from the host, and condor_history in the root)
    keeps an attribute set at submit. The Collector's SecurityContext serves the collector only:
    Schedd calls read the token from SEC_TOKEN_DIRECTORY, in a file of mode 0600."""
    import htcondor2

    token = env.batch_token()
    collector = htcondor2.Collector(env.collector_address, htcondor2.SecurityContext(token=token))
    schedd_ad = collector.locate(htcondor2.DaemonType.Schedd, env.batch_name)
    assert schedd_ad["Name"] == env.batch_name
    schedd = htcondor2.Schedd(schedd_ad)
    tokens = tmp_path / "tokens.d"
    tokens.mkdir(mode=0o700)
    with _token_directory(tokens):
        # no token where the Schedd looks: no access at all (authentication is required)
        with pytest.raises(htcondor2.HTCondorException, match="authenticate"):
            schedd.query("true", ["ClusterId"], limit=1)
        (tokens / "batch").write_text(token + "\n")
        (tokens / "batch").chmod(0o644)                # readable by others: HTCondor ignores the file
        with pytest.raises(htcondor2.HTCondorException, match="authenticate"):
            schedd.query("true", ["ClusterId"], limit=1)
        (tokens / "batch").chmod(0o600)
        schedd.query("true", ["ClusterId"], limit=1)
        _run_spooled_jobs(env, schedd, tmp_path)


def _run_spooled_jobs(env: RealCondor, schedd, tmp_path: Path) -> None:
    """The HTCJob operator's path through one `queue 3` job, asserted step by step (see the caller)."""
    import htcondor2

    work = tmp_path / "job"
    work.mkdir()
    script = tmp_path / "job.sh"                       # on the host only: the root has no such path
    script.write_text(JOB_SCRIPT)
    script.chmod(0o755)
    uid = f"htcjob-{os.urandom(4).hex()}"
    submit = htcondor2.Submit(f"""
executable = {script}
arguments = $(ProcId)
initialdir = {work}
output = out.$(ProcId)
error = err.$(ProcId)
should_transfer_files = YES
when_to_transfer_output = ON_EXIT
transfer_output_files = result.$(ProcId)
request_memory = 64
request_disk = 1024
+HTCJobUid = "{uid}"
queue 3
""")
    started = time.monotonic()
    result = schedd.submit(submit, spool=True)
    schedd.spool(result)
    cluster = result.cluster()
    attrs = ["ProcId", "JobStatus", "ExitCode", "Owner", "User", "HoldReason", "HoldReasonCode", "LeaveJobInQueue",
             "StageOutFinish", "CompletionDate", "EnteredCurrentStatus", "HTCJobUid"]

    def all_completed():
        ads = schedd.query(f"ClusterId == {cluster}", attrs)
        held = [a for a in ads if a["JobStatus"] == 5 and a.get("HoldReasonCode") != HOLD_SPOOLING]
        assert not held, [dict(a) for a in held]
        return ads if len(ads) == 3 and all(a["JobStatus"] == 4 for a in ads) else None

    ads = _wait(all_completed, timeout=120, what="the three spooled jobs completed")
    completed_s = time.monotonic() - started
    by_proc = {a["ProcId"]: a for a in ads}
    assert {p: a["ExitCode"] for p, a in by_proc.items()} == {0: 0, 1: 3, 2: 0}
    assert {a["Owner"] for a in ads} == {BATCH_ACCOUNT}
    assert {a["User"] for a in ads} == {f"{BATCH_ACCOUNT}@{env.uid_domain}"}
    # a spooled job stays until its output is fetched: the schedd's LeaveJobInQueue for -spool
    for ad in ads:
        assert "StageOutFinish" in str(ad.lookup("LeaveJobInQueue"))
        assert ad.eval("LeaveJobInQueue") is True
    assert not list(work.iterdir())                    # nothing comes back before retrieve
    schedd.retrieve(f"ClusterId == {cluster}")
    for proc in range(3):
        assert (work / f"out.{proc}").read_text() == \
            f"stdout of proc {proc} as {BATCH_ACCOUNT} uid {env._root_uid(BATCH_ACCOUNT)}\n"
        assert (work / f"err.{proc}").read_text() == f"stderr of proc {proc}\n"
        assert (work / f"result.{proc}").read_text() == f"result of proc {proc}\n"
    retrieved = time.monotonic()
    _wait(lambda: not schedd.query(f"ClusterId == {cluster}", ["ProcId"]), timeout=60,
          what="the retrieved jobs leaving the queue")
    left_s = time.monotonic() - retrieved
    history = schedd.history(f'HTCJobUid == "{uid}"', ["ProcId", "ExitCode", "Owner", "StageOutFinish"])
    assert {h["ProcId"]: h["ExitCode"] for h in history} == {0: 0, 1: 3, 2: 0}
    assert all(h["Owner"] == BATCH_ACCOUNT and h["StageOutFinish"] for h in history)
    in_root = env.history(f'HTCJobUid == "{uid}"', ("ProcId", "HTCJobUid"), schedd=env.batch_name)
    assert sorted(h["ProcId"] for h in in_root) == [0, 1, 2] and {h["HTCJobUid"] for h in in_root} == {uid}
    assert not env.history(f'HTCJobUid == "{uid}"')        # the CE schedd's history has none of them
    sys.stderr.write(f"batch pool: 3 spooled jobs completed {completed_s:.1f} s after submit; "
                     f"out of the queue {left_s:.1f} s after retrieve\n")
