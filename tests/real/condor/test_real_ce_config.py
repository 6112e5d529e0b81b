"""HTCondor-CE's own configuration on the real HTCondor 25 daemons (`--ce-config stock`, ce_k8s.real.condor.stockce).

Issue 26, items 2-4: the CE is HTCondor-CE's stock files (tests/fixtures/stock_ce, unedited) plus
what `ce-k8s install` writes, on HTCondor-CE's port 9619; the factory is a separate schedd that
submits over HTCondor-C with an IDTOKEN from `condor_token_create`, mapped to the pilot account;
the info provider's schedd cron puts `OSG_ResourceCatalog` in the CE schedd's ad, and the CE
collector has it in the shape GlideinWMS' OSG_autoconf reads. Only Kubernetes is emulated.
Needs root, as CI runs; one real-HTCondor bed per machine, so the fixture waits (bounded) for
another run's bed to go down rather than touching it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ce_k8s.demos.condordemo import RealDemo
from ce_k8s.real.condor.condor import COLLECTOR_PORT, RealCondor, RealCondorError, _processes_in
from ce_k8s.real.condor.ports import listened_on
from ce_k8s.real.condor.stockce import (
    CE_PORT,
    FACTORY_ACCOUNT,
    PILOT_ACCOUNT,
    SCITOKEN_FILE,
    SCITOKEN_SUBJECT,
    UID_DOMAIN,
    StockCE,
    stock_tree,
)
from ce_k8s.sim.pilots import make_pilot

from .test_real_condor import _wait  # the same waiting loop

pytestmark = pytest.mark.slow

WAIT_FOR_OTHER_BED_S = 1200
STOCK = Path(__file__).resolve().parents[2] / "fixtures" / "stock_ce"


def up_when_free(bed: RealCondor, what: str, ports: tuple[int, ...] = (COLLECTOR_PORT,)) -> Iterator[RealCondor]:
    """Bring `bed` up once no other bed listens on `ports` or runs in its root (a bounded wait: another
    run's bed is never ours to bring down), yield it, then take it down and check that nothing is
    left running or mounted in the root. `what` names the bed in its progress lines and errors."""
    root = bed.root
    deadline = time.monotonic() + WAIT_FOR_OTHER_BED_S
    while (any(listened_on(p) for p in ports) or _processes_in(root)) and time.monotonic() < deadline:
        time.sleep(30)       # another run's bed: never ours to bring down
    try:
        bed.up(poll=2, progress=lambda m: sys.stderr.write(f"{what}: {m}\n"), owner_pid=os.getpid())
    except RealCondorError as exc:
        pytest.fail(f"the real HTCondor ({what}) could not be brought up: {exc}")
    yield bed
    bed.down(progress=lambda m: sys.stderr.write(f"{what}: {m}\n"))
    assert not _processes_in(root), "down left processes running in the root"
    assert not [m for m in open("/proc/self/mounts").read().split("\n") if f" {root}/" in m]
    shutil.rmtree(bed.state_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def env():
    """The stock-configuration bed, once for the module; waits for another bed to go down first."""
    if os.geteuid() != 0:
        pytest.fail("the real-HTCondor tests need root (CI runs as root); see docs/real-condor.md")
    state = Path("/var/tmp") / f"ce-k8s-real-ce-tests-{os.getpid()}"
    yield from up_when_free(StockCE(state, stock_dir=STOCK), "real-ce, HTCondor-CE's configuration",
                            (COLLECTOR_PORT, CE_PORT))


def _ce(env: StockCE, *args: str) -> str:
    return env.run(list(args)).stdout


def test_the_ce_runs_htcondor_ce_files_unedited_on_its_port(env):
    """Every stock file in the root is the fixture's byte for byte (`use security:recommended` in
    force); `ce-k8s install`'s files follow; the CE wrappers read /etc/condor-ce; collector and
    schedd answer through shared port 9619."""
    tree = stock_tree(STOCK)
    for path in sorted(p for p in tree.rglob("*") if p.is_file() and p.name != "README.md"
                       and not p.relative_to(tree).parts[:2] == ("etc", "condor")
                       and p.name not in ("02-ce-condor.conf", "02-ce-condor-defaults.conf",
                                          "uid_acct_group.map", "x509_acct_group.map")):
        rel = path.relative_to(tree)
        assert (env.root / rel).read_bytes() == path.read_bytes(), rel
    auth = env.root / "usr/share/condor-ce/config.d/01-common-auth-defaults.conf"
    assert "use security:recommended" in auth.read_text().splitlines()
    val = {k: _ce(env, "condor_ce_config_val", k).strip()
           for k in ("PORT", "SHARED_PORT_PORT", "COLLECTOR_HOST", "SEC_DEFAULT_ENCRYPTION", "DAEMON_LIST",
                     "JOB_ROUTER_ROUTE_NAMES", "SCHEDD_CRON_JOBLIST", "UID_DOMAIN")}
    assert val["PORT"] == val["SHARED_PORT_PORT"] == str(CE_PORT)
    assert val["COLLECTOR_HOST"] == f"{env.full_hostname}:{CE_PORT}"
    assert val["SEC_DEFAULT_ENCRYPTION"].upper() == "REQUIRED"        # security:recommended
    assert val["DAEMON_LIST"].split() == ["MASTER", "COLLECTOR", "SCHEDD", "JOB_ROUTER", "CE_K8S_AGENT"]
    assert val["JOB_ROUTER_ROUTE_NAMES"].split() == ["CMS_Pilots", "GPU_Pilots", "WholeNode_Pilots", "Pilots"]
    assert "CEK8SINFO" in val["SCHEDD_CRON_JOBLIST"].split()
    assert val["UID_DOMAIN"] == UID_DOMAIN
    sources = _ce(env, "condor_ce_config_val", "-config")
    assert "/etc/condor-ce/condor_config" in sources and "70-ce-k8s-route-90-pilots.conf" in sources
    def kinds():
        ads = json.loads(_ce(env, "condor_ce_status", "-any", "-json", "-attributes", "MyType,Name,MyAddress"))
        found = {ad["MyType"]: ad for ad in ads}
        return found if {"Collector", "Scheduler"} <= set(found) else None

    kinds = _wait(kinds, timeout=60, poll=2, what="the CE's collector and schedd ads")
    assert kinds["Scheduler"]["Name"] == env.ce_name
    assert f":{CE_PORT}?" in kinds["Scheduler"]["MyAddress"]        # reached through shared port 9619
    routes = _ce(env, "condor_ce_job_router_info", "-config")
    assert "Route 4" in routes or "Pilots" in routes


def test_factory_submits_with_a_token_and_sees_what_the_ce_sees(env):
    """The factory's grid jobs reach the CE by IDTOKEN only, run as the pilot account, and
    `condor_q` on the factory shows the CE's job ids and states as `condor_ce_q` has them."""
    pilots = [make_pilot(0, "cpu8", run_s=30, exit_code=5), make_pilot(1, "cpu1", run_s=30)]
    demo = RealDemo(env, factory=True)
    demo.submit(pilots)

    def both_views():
        factory = json.loads(env.factory_run(["condor_q", "-allusers", "-json", "-name", env.factory_name,
                                              "-attributes", "ClusterId,ProcId,GridJobId,JobStatus"]).stdout or "[]")
        ce = json.loads(_ce(env, "condor_ce_q", "-allusers", "-json", "-attributes",
                            "ClusterId,ProcId,JobStatus,Owner,AuthTokenSubject,RoutedToJobId") or "[]")
        return (factory, ce) if len(factory) == 2 and all(a.get("GridJobId") for a in factory) \
            and len([a for a in ce if a.get("AuthTokenSubject")]) == 2 else None

    factory, ce = _wait(both_views, timeout=120, what="the factory's jobs on the CE")
    sources = {f"{a['ClusterId']}.{a['ProcId']}": a for a in ce if a.get("AuthTokenSubject")}
    for job in factory:
        remote = job["GridJobId"].split()[-1]                     # "condor <schedd> <pool> <cluster.proc>"
        assert remote in sources, (job["GridJobId"], sorted(sources))
        assert sources[remote]["Owner"] == PILOT_ACCOUNT
        assert sources[remote]["AuthTokenSubject"] == f"{PILOT_ACCOUNT}@{UID_DOMAIN}"
    audit = env.log_path("AuditLog").read_text(errors="replace")
    assert f"AuthMethod=IDTOKENS, AuthId=(null), CondorId={PILOT_ACCOUNT}@{UID_DOMAIN}" in audit
    assert FACTORY_ACCOUNT not in {a.get("Owner") for a in ce}

    def same_states():
        f = json.loads(env.factory_run(["condor_q", "-allusers", "-json", "-name", env.factory_name,
                                        "-attributes", "GridJobId,JobStatus"]).stdout or "[]")
        c = {f"{a['ClusterId']}.{a['ProcId']}": a["JobStatus"] for a in json.loads(
            _ce(env, "condor_ce_q", "-allusers", "-json", "-attributes", "ClusterId,ProcId,JobStatus") or "[]")}
        return all(c.get(a["GridJobId"].split()[-1]) == a["JobStatus"] for a in f if a.get("GridJobId"))

    _wait(same_states, timeout=60, poll=2, what="the factory's states equal to the CE's")
    demo.run(timeout=240)
    for out in demo.outcomes.values():
        assert out.status == "completed", (out.job, out.status, out.hold_reason)
        assert out.exit_code == out.pilot.exit_code
        assert f"glidein {out.index} ran" in out.stdout
        assert out.stderr.strip() == f"glidein {out.index} stderr"     # staged back over HTCondor-C, apart
    # nothing left behind: the factory's jobs leave both queues once staged out
    _wait(lambda: not [a for a in json.loads(_ce(env, "condor_ce_q", "-allusers", "-json", "-attributes",
                                                 "AuthTokenSubject") or "[]") if a.get("AuthTokenSubject")],
          what="the factory's jobs gone from the CE queue")
    _wait(lambda: not env.query("true", schedd=env.factory_name), what="the factory's queue empty")


def _osg_autoconf_entries(schedd_ad: dict) -> dict[str, dict]:
    """What GlideinWMS' OSG_autoconf (`get_information`/`get_pilot`) takes from a CE's schedd ad:
    the pilot entries of OSG_ResourceCatalog, keyed by Name, with the attributes it reads."""
    out = {}
    for entry in schedd_ad.get("OSG_ResourceCatalog") or []:
        if not entry.get("IsPilotEntry"):
            continue
        cpus = entry.get("CPUs", entry.get("EstimatedCPUs"))
        out[entry["Name"]] = {"cpus": cpus, "memory": entry.get("Memory"), "walltime": entry.get("MaxWallTime"),
                              "gpus": entry.get("GPUs"), "whole_node": entry.get("WholeNode"),
                              "vos": entry.get("AllowedVOs"), "queue": entry.get("Queue"),
                              "max_pilots": entry.get("MaxPilots")}
    return out


def test_the_ce_collector_has_the_catalog_osg_autoconf_reads(env):
    """After the schedd cron ran `ce-k8s info`, `condor_ce_status -schedd -l` (the CE collector's
    copy of the schedd ad) carries OSG_ResourceCatalog with a pilot entry per route."""
    def ad():
        ads = json.loads(_ce(env, "condor_ce_status", "-schedd", "-json") or "[]")
        return next((a for a in ads if a.get("OSG_ResourceCatalog")), None)

    schedd = _wait(ad, timeout=90, poll=2, what="OSG_ResourceCatalog in the CE collector")
    assert schedd["Name"] == env.ce_name and schedd["OSG_BatchSystems"] == "Kubernetes"
    entries = _osg_autoconf_entries(schedd)
    assert set(entries) == {"CMS_Pilots", "GPU_Pilots", "WholeNode_Pilots", "Pilots"}, entries
    for name, entry in entries.items():
        assert entry["cpus"] and entry["walltime"] and entry["max_pilots"] is not None, (name, entry)
        assert entry["whole_node"] or entry["memory"], (name, entry)
    assert entries["GPU_Pilots"]["gpus"] and entries["CMS_Pilots"]["vos"] == ["cms"]
    text = _ce(env, "condor_ce_status", "-schedd", "-l")
    assert "OSG_ResourceCatalog = {" in text and "IsPilotEntry = true" in text
    # the schedd keeps an attribute a later run leaves out: an error of a run before the agent was
    # up must be cleared by the next run's K8sInfoError = "" (ce_k8s/info/provider.py)
    _wait(lambda: (ad() or {}).get("K8sInfoError") == "", timeout=60, poll=2, what="K8sInfoError cleared")
    assert ad()["K8sInfoStatus"] == "OK"
    assert _ce(env, "condor_ce_status", "-schedd", "-af", "Status").split() == ["OK"]   # the CE's health


def _ce_daemon_pids(env: StockCE, program: str) -> list[int]:
    """The CE host's `program` processes (the factory host runs its own schedd: told apart by the
    CONDOR_CONFIG its master gave them)."""
    pids = []
    for pid in _processes_in(env.root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(program.encode()) and b"CONDOR_CONFIG=/etc/condor-ce/condor_config" in environ:
            pids.append(pid)
    return pids


def test_the_ces_schedd_and_router_killed_mid_run_lose_and_rerun_no_pilot(env):
    """The restart test of the default bed, on HTCondor-CE's own configuration and the factory's
    token path, made harsher: the CE's schedd and job router are SIGKILLed (the CE's own
    ALLOW_ADMINISTRATOR refuses root's condor_restart here, docs/real-condor.md) and its master
    starts them again. Every pilot completes on the one pod it had; none is run twice."""
    from .test_real_condor import _pods, _stats, assert_each_pilot_completed_on_one_pod

    before = _stats(env)["pods"]
    demo = RealDemo(env, factory=True)
    demo.submit([make_pilot(i, "cpu1", run_s=700) for i in range(3)])     # ~35 s each
    _wait(lambda: sum(1 for p in _pods(env) if p.status.phase == "Running") == 3, timeout=180,
          what="3 pods running")
    first = {p.metadata.name: p.metadata.uid for p in _pods(env)}
    for program in ("condor_schedd", "condor_job_router"):
        victims = _ce_daemon_pids(env, program)
        assert len(victims) == 1, (program, victims)
        os.kill(victims[0], 9)
        _wait(lambda p=program, old=victims[0]: (new := _ce_daemon_pids(env, p)) and new != [old], timeout=120,
              what=f"the CE's master to start {program} again")
    demo.run(timeout=300)
    assert_each_pilot_completed_on_one_pod(env, demo, before)
    assert len(first) == 3

    # Nothing left behind by the restarts: the factory's jobs leave both queues once staged out
    # (a CE job left here was seen to outlive the next two tests once, in a full run).
    def token_jobs() -> list[dict]:
        return [a for a in json.loads(_ce(env, "condor_ce_q", "-allusers", "-json", "-attributes",
                                          "AuthTokenSubject,JobStatus,RoutedToJobId,HoldReason,"
                                          "LeaveJobInQueue,Managed,ClusterId,ProcId") or "[]")
                if a.get("AuthTokenSubject")]
    _wait(lambda: not token_jobs(), timeout=300, what="the factory's jobs gone from the CE queue after the restarts",
          on_timeout=lambda: f"left: {token_jobs()}")
    _wait(lambda: not env.query("true", schedd=env.factory_name), what="the factory's queue empty")


# ------------------------------------------------- the default bed's path tests, on the CE's own files
def test_a_local_condor_ce_submit_runs_and_returns_exit_code_and_output(env):
    """What condor_ce_trace checks (it cannot run here: docs/real-condor.md): a job submitted on the CE
    host with `condor_ce_submit -spool`, FS-authenticated as the pilot account under HTCondor-CE's own
    authorization, is routed, runs as one pod, and its exit code, stdout and stderr come back."""
    from .test_real_condor import _no_pods_left, _stats

    before = _stats(env)["pods"]["pods_created"]
    pilots = [make_pilot(0, "cpu1", run_s=20, exit_code=3), make_pilot(1, "cpu8", run_s=20)]
    demo = RealDemo(env)
    demo.submit(pilots)
    ce = json.loads(_ce(env, "condor_ce_q", "-allusers", "-json", "-attributes", "Owner,AuthTokenSubject") or "[]")
    assert {a["Owner"] for a in ce} <= {PILOT_ACCOUNT} and not any(a.get("AuthTokenSubject") for a in ce)
    demo.run(timeout=240)
    for out in demo.outcomes.values():
        assert out.status == "completed", (out.job, out.status, out.hold_reason)
        assert out.exit_code == out.pilot.exit_code
        assert f"glidein {out.index} ran" in out.stdout
        assert out.stderr.strip() == f"glidein {out.index} stderr"
    assert _stats(env)["pods"]["pods_created"] - before == 2             # one pod per job
    _wait(lambda: _no_pods_left(env), what="pods and Secrets deleted")
    ours = " || ".join(f'RoutedFromJobId == "{job}"' for job in demo.outcomes)
    routed = env.history(f"RoutedBy =?= \"htcondor-ce\" && ({ours})", ("Managed", "K8sPodName"))
    assert len(routed) == 2 and all(ad["Managed"] == "ScheddDone" and ad["K8sPodName"] for ad in routed), routed


def test_a_failed_pod_is_a_hold_the_factory_sees_and_its_condor_rm_cleans_up(env):
    """An OOM-killed factory pilot: the CE job is held with HTCondor's code for it, the factory's
    grid job is held too (HTCondor-C carries the hold), and the factory's condor_rm removes it all."""
    from .test_real_condor import HOLD_CODES_OOM, _no_pods_left

    pilot = make_pilot(0, "cpu1")
    pilot = type(pilot)(pilot.shape, pilot.owner, "oom-after=1s", 0, False, pilot.ad)
    demo = RealDemo(env, factory=True)
    demo.submit([pilot])
    job = next(iter(demo.outcomes))

    def ce_held():
        ads = json.loads(_ce(env, "condor_ce_q", "-allusers", "-json", "-attributes",
                             "JobStatus,HoldReason,HoldReasonCode,AuthTokenSubject,RoutedToJobId") or "[]")
        return next((a for a in ads if a.get("AuthTokenSubject") and a["JobStatus"] == 5
                     and a.get("HoldReasonCode") != 16), None)

    ad = _wait(ce_held, timeout=180, what="the CE job held")
    assert ad["HoldReasonCode"] == HOLD_CODES_OOM and "memory" in ad["HoldReason"].lower(), ad

    def factory_held():
        ads = json.loads(env.factory_run(["condor_q", "-json", "-name", env.factory_name, job, "-attributes",
                                          "JobStatus,HoldReason"]).stdout or "[]")
        return next((a for a in ads if a["JobStatus"] == 5), None)

    held = _wait(factory_held, timeout=120, what="the factory's grid job held")
    assert "memory" in held["HoldReason"].lower(), held
    env.factory_run(["condor_rm", "-name", env.factory_name, job], user="gfactory")
    _wait(lambda: not json.loads(_ce(env, "condor_ce_q", "-allusers", "-json", "-attributes", "AuthTokenSubject")
                                 or "[]"), timeout=120, what="the CE job gone after the factory's condor_rm")
    _wait(lambda: _no_pods_left(env), what="pods and Secrets deleted")


def test_the_factorys_condor_rm_deletes_the_running_pod(env):
    from .test_real_condor import _no_pods_left, _pods

    demo = RealDemo(env, factory=True)
    demo.submit([make_pilot(0, "cpu1", run_s=4000)])          # 200 s at the bed's time scale: still running
    job = next(iter(demo.outcomes))
    _wait(lambda: any(p.status.phase == "Running" for p in _pods(env)), timeout=180, what="the pod running")
    env.factory_run(["condor_rm", "-name", env.factory_name, job], user="gfactory")
    _wait(lambda: _no_pods_left(env), timeout=120, what="the pod deleted after the factory's condor_rm")


def test_the_ces_master_restarts_the_agent_it_runs(env):
    """`ce-k8s install`'s DAEMON_LIST entry: the CE's condor_master starts the agent again after a SIGKILL."""
    from .test_real_condor import assert_master_restarts_the_agent

    assert_master_restarts_the_agent(env)


# --------------------------------------------------------------------------------------- SciTokens
def test_a_factory_pilot_with_a_scitoken_is_mapped_by_the_ces_mapfile(env):
    """As a GlideinWMS factory submits to an OSG CE: the grid job names a SciToken (`scitokens_file`),
    its C-GAHP presents it, the CE's daemons verify it against the issuer's keys over HTTPS and map
    `<issuer>,<subject>` through HTCondor-CE's mapfile to the pilot account; the routed pilot's pod
    carries the token's subject, and the pilot completes with its exit code and output."""
    from .test_real_condor import _no_pods_left, _pods

    demo = RealDemo(env, factory=True, scitokens_file=SCITOKEN_FILE)
    demo.submit([make_pilot(0, "cpu1", run_s=300, exit_code=4)])          # ~15 s at the bed's scale

    def ce_job():
        ads = json.loads(_ce(env, "condor_ce_q", "-allusers", "-json", "-attributes",
                             "Owner,AuthTokenIssuer,AuthTokenSubject,AuthTokenScopes,RoutedToJobId") or "[]")
        return next((a for a in ads if a.get("AuthTokenIssuer")), None)

    ad = _wait(ce_job, timeout=180, what="the factory's job on the CE, authenticated by its SciToken")
    assert ad["AuthTokenIssuer"] == env.issuer.url and ad["AuthTokenSubject"] == SCITOKEN_SUBJECT, ad
    assert ad["Owner"] == PILOT_ACCOUNT and "compute.create" in ad["AuthTokenScopes"].split(","), ad
    audit = env.log_path("AuditLog").read_text(errors="replace")
    assert f"AuthMethod=SCITOKENS, AuthId={env.issuer.url},{SCITOKEN_SUBJECT}" in audit, audit[-2000:]
    pod = _wait(lambda: next(iter(_pods(env)), None), timeout=120, what="the pilot's pod")
    assert pod.metadata.annotations["ce-k8s.htcondor.org/credential-subject"] == SCITOKEN_SUBJECT
    demo.run(timeout=240)
    out = next(iter(demo.outcomes.values()))
    assert out.status == "completed" and out.exit_code == 4, (out.status, out.hold_reason)
    assert "glidein 0 ran" in out.stdout
    _wait(lambda: _no_pods_left(env), what="pods and Secrets deleted")


def _ping_write_with_scitoken(env: StockCE, name: str, token: str | None) -> str:
    """`condor_ping WRITE` to the CE schedd from the factory host, as the factory account, presenting
    only the SciToken in credentials/<name>.scitoken (written from `token` if given): how HTCondor-CE's
    and GlideinWMS's documentation have a site check a token. Its output, errors included."""
    creds = env.root / SCITOKEN_FILE.lstrip("/")
    path = creds.parent / f"{name}.scitoken"
    if token is not None:
        path.write_text(token + "\n")
        os.chown(path, creds.stat().st_uid, creds.stat().st_gid)
        path.chmod(0o600)
    proc = env.factory_run(["env", "_condor_SEC_CLIENT_AUTHENTICATION_METHODS=SCITOKENS",
                            f"_condor_SCITOKENS_FILE=/{path.relative_to(env.root)}", "condor_ping", "-verbose",
                            "-type", "schedd", "-name", env.ce_name, "-pool", f"{env.full_hostname}:{CE_PORT}",
                            "WRITE"], user=FACTORY_ACCOUNT, check=False)
    return proc.stdout + proc.stderr


def test_only_a_token_the_ce_maps_for_its_audience_with_write_scopes_may_submit(env):
    """The CE's checks of a SciToken, each shown alone: the factory's token authenticates by SCITOKENS
    as the pilot account and may WRITE; the same issuer's token for a subject the mapfile does not
    name, or for another CE's audience, authenticates as no one; one without the WLCG scopes that
    make WRITE (compute.create, .modify, .cancel) maps but is denied."""
    ours = _ping_write_with_scitoken(env, "pilot", None)
    assert "Authenticated using:         SCITOKENS" in ours and "Authorized:                  TRUE" in ours, ours
    assert f"Remote Mapping:              {PILOT_ACCOUNT}@{UID_DOMAIN}" in ours, ours
    audience = f"{env.full_hostname}:{CE_PORT}"
    unmapped = _ping_write_with_scitoken(env, "unmapped", env.issuer.mint("someone-else", audience))
    assert "Failed to authenticate using SCITOKENS" in unmapped, unmapped
    other_ce = env.issuer.mint(SCITOKEN_SUBJECT, "other-ce.example.org:9619")
    elsewhere = _ping_write_with_scitoken(env, "elsewhere", other_ce)
    assert "Failed to authenticate using SCITOKENS" in elsewhere, elsewhere
    read_only = env.issuer.mint(SCITOKEN_SUBJECT, audience, scopes="compute.read")
    reader = _ping_write_with_scitoken(env, "reader", read_only)
    assert f'"DENIED" from server for user {PILOT_ACCOUNT}@{UID_DOMAIN} using method SCITOKENS' in reader, reader


# --------------------------------------------------------------------------------------- evictions
def test_an_evicted_pilot_that_started_is_removed_by_the_ce_and_never_started_again(env):
    """HTCondor-CE's ENABLE_JOB_RETRIES = False: once the CE has counted the pilot's start, an eviction
    of its pod makes the CE remove the job ("disabled job retries") and HTCondor-C hold it on the
    factory; ce-k8s makes no second pod meanwhile (K8sRetryAfter), so the pilot is not started again
    only to be killed (before this rule 2 of 4 such pilots got one in the 50-pilot demo)."""
    from .test_real_condor import _no_pods_left, _pods, _stats

    before = _stats(env)["pods"]["pods_created"]
    demo = RealDemo(env, factory=True)
    demo.submit([make_pilot(0, "cpu1", run_s=4000)])          # 200 s at the bed's time scale
    job = next(iter(demo.outcomes))

    def ce_started():
        ads = json.loads(_ce(env, "condor_ce_q", "-allusers", "-json", "-attributes",
                             "ClusterId,ProcId,JobStatus,NumJobStarts,AuthTokenSubject") or "[]")
        return next((a for a in ads if a.get("AuthTokenSubject") and a["JobStatus"] == 2
                     and a.get("NumJobStarts") == 1), None)

    source = _wait(ce_started, timeout=180, what="the CE job running, its start counted")
    pod = next(p for p in _pods(env) if p.status.phase == "Running")
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace}}
    env.core_api().create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body)

    def factory_held():
        ads = json.loads(env.factory_run(["condor_q", "-json", "-name", env.factory_name, job, "-attributes",
                                          "JobStatus,HoldReason"]).stdout or "[]")
        return next((a for a in ads if a["JobStatus"] == 5), None)

    _wait(factory_held, timeout=180, what="the factory's job held after the CE removed it")
    ce_id = f"{source['ClusterId']}.{source['ProcId']}"
    removed = env.history(f'ClusterId == {source["ClusterId"]} && ProcId == {source["ProcId"]}',
                          ("JobStatus", "RemoveReason"))
    assert removed and removed[0]["JobStatus"] == 3 and "disabled job retries" in removed[0]["RemoveReason"], removed
    routed = env.history(f'RoutedFromJobId == "{ce_id}"', ("K8sRetryAfter", "K8sAttempt", "K8sPodReason"))
    assert routed and routed[0].get("K8sRetryAfter", 0) > 0 and not routed[0].get("K8sAttempt"), routed
    assert _stats(env)["pods"]["pods_created"] - before == 1, "the evicted pilot got a second pod"
    env.factory_run(["condor_rm", "-name", env.factory_name, job], user=FACTORY_ACCOUNT)
    _wait(lambda: _no_pods_left(env), what="pods and Secrets deleted")
