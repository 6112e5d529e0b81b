"""HTCondor-CE's own configuration on the real HTCondor 25 daemons (`--ce-config stock`, ce_k8s.real.stockce).

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
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_real_condor import _wait  # the same waiting loop (pytest puts tests/e2e on sys.path)

from ce_k8s.real.condor import COLLECTOR_PORT, RealCondor, RealCondorError, _processes_in
from ce_k8s.real.condordemo import RealDemo
from ce_k8s.real.stockce import CE_PORT, FACTORY_ACCOUNT, PILOT_ACCOUNT, UID_DOMAIN, StockCE, stock_tree
from ce_k8s.sim.pilots import make_pilot

pytestmark = pytest.mark.slow

WAIT_FOR_OTHER_BED_S = 1200
STOCK = Path(__file__).resolve().parents[1] / "fixtures" / "stock_ce"


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def up_when_free(bed: RealCondor, what: str, ports: tuple[int, ...] = (COLLECTOR_PORT,)) -> Iterator[RealCondor]:
    """Bring `bed` up once no other bed holds `ports` or runs in its root (a bounded wait: another
    run's bed is never ours to bring down), yield it, then take it down and check that nothing is
    left running or mounted in the root. `what` names the bed in its progress lines and errors."""
    root = bed.root
    deadline = time.monotonic() + WAIT_FOR_OTHER_BED_S
    while (any(_port_in_use(p) for p in ports) or _processes_in(root)) and time.monotonic() < deadline:
        time.sleep(30)       # another run's bed: never ours to bring down
    try:
        bed.up(poll=2, progress=lambda m: sys.stderr.write(f"{what}: {m}\n"))
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
    from test_real_condor import _pods, _stats, assert_each_pilot_completed_on_one_pod

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
