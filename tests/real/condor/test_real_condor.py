"""The real HTCondor is the judge: ce-k8s under Debian's condor 25.14.1 and 23.9.6 (ce_k8s.real.condor.condor).

One environment per HTCondor version, with the bed's own CE configuration (`ce-k8s testbed
real-condor up --htcondor 25|23 --ce-config bed`, torn down before the next): what only that
configuration has, and the route agreement. The inertness and route-agreement tests run on both
(`ON_BOTH`), the behaviour docs/real-condor.md compares between the two; the restart tests on 23.9
(`ON_23`). The pilot's path on 25, and a harder restart test, are judged on HTCondor-CE's own
configuration (test_real_ce_config.py). The real
collector, CE schedd, condor_job_router, gridmanager and BLAH (in the worst case: BLAH accepts
the `k8s` LRMS and records every call), a factory schedd submitting over HTCondor-C, and the
ce-k8s agent under condor_master; only Kubernetes is emulated. Needs root, as CI runs; the root
is built on first use from Debian's packages and cached (docs/real-condor.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polling
import pytest

from ce_k8s.demos.condordemo import RealDemo
from ce_k8s.real.condor.condor import DEFAULT_HTCONDOR, VERSIONS, RealCondor, RealCondorError, _processes_in
from ce_k8s.real.processes import alive
from ce_k8s.sim.pilots import make_pilot

pytestmark = pytest.mark.slow

HOLD_CODES_OOM = 34          # HTCondor's HoldReasonCode for a job over its memory (docs/holds.md)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
#: Tests that hold on every HTCondor the bed runs (docs/real-condor.md, "HTCondor 23.9 and 25").
ON_BOTH = pytest.mark.parametrize("env", list(VERSIONS), indirect=True)
#: Tests whose 25 run is on HTCondor-CE's own configuration instead (test_real_ce_config.py).
ON_23 = pytest.mark.parametrize("env", [v for v in VERSIONS if v != DEFAULT_HTCONDOR], indirect=True)


def _wait(predicate, timeout: float = 90.0, poll: float = 0.5, what: str = "", on_timeout=None):
    """The suite's poll-until (tests/polling.py) at a real HTCondor's pace: most polls run a condor
    tool. Kept under this signature for this directory's ~40 waits."""
    return polling.wait_for(predicate, timeout=timeout, interval=poll, what=what, on_timeout=on_timeout)


@pytest.fixture(scope="module", params=[DEFAULT_HTCONDOR])
def env(request):
    """The bed of one HTCondor version (the default unless a test is `ON_BOTH`); pytest groups the
    tests by version, so each version's bed is up once and down before the next comes up."""
    if os.geteuid() != 0:
        pytest.fail("the real-HTCondor tests need root (CI runs as root); see docs/real-condor.md")
    state = Path("/var/tmp") / f"ce-k8s-real-condor-tests-{os.getpid()}-{request.param}"
    bed = RealCondor(state, htcondor=request.param)
    root = bed.root
    other = [p for p in _processes_in(root)]
    if other:
        pytest.fail(f"{len(other)} processes already run in {root} (an environment is up?): "
                    "`ce-k8s testbed real-condor down` first")
    try:
        bed.up(poll=2, progress=lambda m: sys.stderr.write(f"real-condor: {m}\n"), owner_pid=os.getpid())
    except RealCondorError as exc:
        pytest.fail(f"the real HTCondor could not be brought up: {exc}")
    yield bed
    bed.down(progress=lambda m: sys.stderr.write(f"real-condor: {m}\n"))
    assert not _processes_in(root), "down left processes running in the root"
    assert not [m for m in open("/proc/self/mounts").read().split("\n") if f" {root}/" in m]
    shutil.rmtree(state, ignore_errors=True)       # the spools and logs of this run


def _stats(env: RealCondor) -> dict:
    state = json.loads((env.state_dir / "state.json").read_text())
    with urllib.request.urlopen(f"{state['api_url']}/_sim/stats", timeout=30) as resp:
        return json.loads(resp.read())


def _pods(env: RealCondor) -> list:
    return env.core_api().list_pod_for_all_namespaces(label_selector="app.kubernetes.io/managed-by=ce-k8s").items


def _no_pods_left(env: RealCondor) -> bool:
    s = _stats(env)
    return s["pods_left"] == 0 and s["secrets_left"] == 0


def _demo(env: RealCondor, pilots, factory: bool = False, timeout: float = 240) -> RealDemo:
    demo = RealDemo(env, factory=factory)
    demo.submit(pilots)
    demo.run(timeout=timeout)
    return demo


# --------------------------------------------------------------------------------------- the path
# The path on 25 (a pilot from the CE host and from the factory with its exit code and output, an
# OOM hold, condor_rm on the factory, the master restarting the agent) is judged on HTCondor-CE's
# own configuration, the 25 default: tests/real/condor/test_real_ce_config.py. What stays here is what only
# this configuration has (BLAH accepting every LRMS, a batch route, root's condor_restart) and the
# route agreement, on both versions, and condor_rm by the pilot's owner on the CE host.
def test_condor_rm_on_the_ce_deletes_the_running_pod(env):
    pilot = make_pilot(0, "cpu1", run_s=4000)          # 200 s at the bed's time scale: still running
    demo = RealDemo(env)
    demo.submit([pilot])
    job = next(iter(demo.outcomes))
    _wait(lambda: any(p.status.phase == "Running" for p in _pods(env)), what="the pod running")
    env.run(["condor_rm", job], user=pilot.owner)
    _wait(lambda: _no_pods_left(env), timeout=120, what="the pod deleted after condor_rm")


# --------------------------------------------------------------------------------------- restarts
def assert_each_pilot_completed_on_one_pod(env, demo: RealDemo, before: dict) -> None:
    """Every pilot of `demo` completed with its output, and the emulator created exactly one pod
    per pilot since `before` (its pod counters then): nothing lost, nothing run twice."""
    for out in demo.outcomes.values():
        assert out.status == "completed", (out.job, out.status, out.hold_reason)
        assert f"glidein {out.index} ran" in out.stdout
    after = _stats(env)["pods"]
    assert after["pods_created"] - before["pods_created"] == len(demo.outcomes), "a pilot got a second pod"
    assert after["recreated"] == before["recreated"] and after["overlapping"] == before["overlapping"]


def _daemon_pids(env: RealCondor, program: str) -> list[int]:
    """The pids of the CE's `program` (condor_schedd, condor_job_router) that the bed's
    condor_master runs: not the factory's schedd (`-local-name`), nor children forked for a query."""
    def cmd(pid: int) -> list[bytes]:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return [b""]

    def parent(pid: int) -> int:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    return [pid for pid in _processes_in(env.root)
            if cmd(pid)[0].endswith(program.encode()) and b"-local-name" not in cmd(pid)
            and cmd(parent(pid))[0].endswith(b"condor_master")]


@ON_23
def test_restarts_keep_every_pilot_on_its_one_pod(env):
    """With pilots running, root's condor_restart of the schedd, then of the router, then of both
    at once, each while the pilots still run: no pilot is lost, killed or run twice; each keeps the
    pod it had (docs/real-condor.md, finding R3). One run takes all three restarts, the worst case
    of each alone. On 25 the CE's own configuration is judged instead, harder: its schedd and
    router SIGKILLed mid-run (test_real_ce_config.py), where root's condor_restart is refused."""
    before = _stats(env)["pods"]
    pilots = [make_pilot(i, "cpu1", run_s=1400) for i in range(3)]   # ~70 s each: spans the restarts
    demo = RealDemo(env)
    demo.submit(pilots)
    _wait(lambda: sum(1 for p in _pods(env) if p.status.phase == "Running") == 3, what="3 pods running")
    first = {p.metadata.name: p.metadata.uid for p in _pods(env)}
    for daemons in (["condor_schedd"], ["condor_job_router"], ["condor_schedd", "condor_job_router"]):
        old = {d: _daemon_pids(env, d) for d in daemons}
        assert all(len(pids) == 1 for pids in old.values()), old
        for daemon in daemons:
            env.run(["condor_restart", "-daemon", daemon.removeprefix("condor_")])
        for daemon in daemons:
            _wait(lambda d=daemon, was=old[daemon]: (new := _daemon_pids(env, d)) and new != was, timeout=60,
                  what=f"the master to start {daemon} again")
        # A new pid is not yet a schedd that answers: it writes its address file once it listens.
        # Wait for it to answer before the next restart, as an operator's next command would.
        _wait(lambda: env.run(["condor_q", "-totals"], check=False).returncode == 0, timeout=60,
              what="the new schedd to answer condor_q")
        running = {p.metadata.name: p.metadata.uid for p in _pods(env) if p.status.phase == "Running"}
        assert running == first, f"after restarting {daemons}, the pods running were {running}, not {first}"
    demo.run(timeout=240)
    assert_each_pilot_completed_on_one_pod(env, demo, before)
    assert len(first) == 3
    _wait(lambda: _no_pods_left(env), what="pods and Secrets deleted")


# --------------------------------------------------------------------------------------- inertness
@ON_BOTH
def test_no_gridmanager_or_blah_ever_acts_on_a_kubernetes_job(env):
    """Worst case (BLAH accepts `k8s` and records every call): Kubernetes-routed pilots never reach
    a gridmanager or BLAH, while a batch route beside ours still goes to BLAH, untouched by us."""
    batch = make_pilot(90, "cpu1")
    batch.ad["TestBatchRoute"] = True
    demo = RealDemo(env)
    (demo.workdir / "batch.sub").write_text(
        "universe = vanilla\nexecutable = pilot.sh\ntransfer_input_files = idtoken\n"
        "+TestBatchRoute = true\noutput = batch.out\nerror = batch.err\nqueue 1\n")
    demo.submit([make_pilot(i, "cpu1", run_s=20) for i in range(3)])
    out = env.run(["condor_submit", "-terse", "-spool", "batch.sub"], user="slurmuser",
                  cwd=str(demo.workdir)).stdout
    batch_job = out.split()[0].rsplit(".", 1)[0]
    demo.run(timeout=180)
    assert all(o.status == "completed" for o in demo.outcomes.values())
    calls = _wait(lambda: [ln for ln in env.blah_log.read_text().splitlines() if "slurm_submit" in ln],
                  what="the batch job submitted to BLAH")
    assert calls
    text = env.blah_log.read_text()
    assert "k8s_" not in text, text
    k8s_owners = {p.owner for p in (o.pilot for o in demo.outcomes.values())}
    for owner in k8s_owners:
        assert not env.log_path(f"GridmanagerLog.{owner}").exists(), f"a gridmanager ran for {owner}"
    routed = env.query(f"RoutedFromJobId == \"{batch_job}.0\"", ("GridResource", "K8sPodName", "Managed"))
    routed += env.history(f"RoutedFromJobId == \"{batch_job}.0\"", ("GridResource", "K8sPodName", "Managed"))
    assert routed and routed[0]["GridResource"] == "batch slurm"
    assert "K8sPodName" not in routed[0]
    env.run(["condor_rm", batch_job], user="slurmuser", check=False)


# --------------------------------------------------------------------------------------- the agent
def assert_master_restarts_the_agent(env: RealCondor) -> None:
    """SIGKILL the agent condor_master runs: the master starts a new one, which answers on its socket."""
    from ce_k8s import protocol

    agent_pids = env.agent_pids
    first = _wait(agent_pids, what="the agent under condor_master")
    os.kill(first[0], signal.SIGKILL)
    _wait(lambda: not alive(first[0]), what="the agent gone")
    second = _wait(lambda: [p for p in agent_pids() if p not in first], timeout=60, what="a new agent")
    assert second

    def pings() -> bool:
        try:
            reply = protocol.call(str(env.socket), protocol.VERB_PING, b"", time.monotonic() + 2)
            reply.read_all()
            reply.close()
        except (OSError, protocol.ProtocolError):
            return False
        return reply.status == protocol.STATUS_OK

    _wait(pings, what="the restarted agent answering")
    assert "Started process" in env.log_path("MasterLog").read_text()


# --------------------------------------------------------------------------------------- dry run
@ON_BOTH
@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.ad")))
def test_ce_k8s_route_agrees_with_condor_job_router_info(env, example):
    """`ce-k8s route` on the root's configuration routes every example pilot as the real
    condor_job_router_info -route-jobs does: the same route and the same routed ad, except the
    attributes our translate hook sets (which the tool does not run)."""
    import classad2

    from ce_k8s.condor.routing import submit_edits
    from ce_k8s.condor.wire import to_json_dict

    work = env.state_dir / "submit" / "route-info"
    work.mkdir(exist_ok=True)
    work.chmod(0o1777)        # the tool may write its -route-jobs file as the condor account
    ad_file = work / example
    ad_file.write_text("".join(ln for ln in (EXAMPLES / example).read_text().splitlines(keepends=True)
                               if not ln.startswith("#")))
    real_file = work / (example + ".routed")
    real_file.unlink(missing_ok=True)
    tool = env.run(["condor_job_router_info", "-jobads", str(ad_file), "-route-jobs", str(real_file)])
    assert "could not open" not in tool.stdout + tool.stderr, tool.stdout + tool.stderr
    ours = json.loads(env.run([f"{os.path.realpath(sys.prefix)}/bin/ce-k8s", "route", "--config",
                               "/etc/condor/condor_config", "--jobads", str(ad_file), "--json"],
                              check=False).stdout)[0]
    real_text = real_file.read_text() if real_file.exists() else ""
    if not real_text.strip():
        _assert_nothing_submitted(ours)
        return
    real_ad = classad2.parseOne(real_text, classad2.ParserType.Old)
    # what submit_job() then does on the way into the schedd (submit_job.cpp: secure attributes
    # dropped, LeaveJobInQueue = JobStatus == 4), after the tool printed the ad; `ce-k8s route`
    # shows the ad as submitted
    submit_edits(real_ad)
    assert ours["route"] == real_ad.eval("RouteName") if "RouteName" in real_ad else ours["route"]
    real = {k.lower(): v for k, v in to_json_dict(real_ad).items()}     # the form `route --json` prints
    mine = {k.lower(): v for k, v in ours["routed_ad"].items()}
    translate_sets = {"managed", "managedmanager", "k8sattempt", "k8spodname", "k8ssourceglobaljobid"}
    assert sorted(set(real) - set(mine) - translate_sets) == []
    assert sorted(set(mine) - set(real) - translate_sets) == []
    differ = {k: (real[k], mine[k]) for k in set(real) & set(mine) - translate_sets if real[k] != mine[k]}
    assert differ == {}
    assert mine["managed"] == "ScheddDone"



def _assert_nothing_submitted(ours: dict) -> None:
    """The real condor_job_router_info wrote no routed ad: `ce-k8s route --json` must show none either,
    and when it names a route, say that the router gives the job up and why (docs/routes.md,
    "`ce-k8s route`: which route, and what comes out")."""
    assert ours["routed_ad"] is None, f"the real router routes nothing, ce-k8s route shows a routed ad ({ours})"
    if ours["route"] is not None:
        assert ours["submitted"] is False and ours["errors"], ours
        assert any(f"routed by {ours['route']}" in e or f"route {ours['route']}:" in e for e in ours["errors"]), ours


# ------------------------------------------------------------------ dry run on a stock HTCondor-CE
def _real_router_version(env: RealCondor) -> str:
    """The running root's HTCondor (`condor_version`); `ce-k8s route --htcondor-version` models it."""
    out = env.run(["condor_version"]).stdout
    return out.split()[1]


@pytest.fixture(scope="module")
def stock_ces(env, stock_ce_layout):
    """Two copies of the stock HTCondor-CE layout (tests/fixtures/stock_ce) under the bed's state
    directory, which the root sees at the same path, so both tools read the same files and run the
    same `condor_ce_router_defaults` (the root's python3 for the real router, the host's for ours):

    * ``batch``: every batch package installed, as shipped (the Slurm route is the enabled one);
    * ``k8s``: the same plus `ce-k8s install` (our knobs and routes, after every batch file).

    On 23.9 one line is changed, and it does not touch routing: HTCondor-CE 25's
    01-common-auth-defaults.conf says `use security:recommended`, a metaknob HTCondor 23.9 does not
    have (its reader stops: "use security:recommended: does not recognise recommended"; finding R11),
    so that line is commented out in both copies; the knobs it sets are SEC_* only. HTCondor 25
    reads the layout as shipped.
    """
    assert _real_router_version(env) == env.flavour.version
    made = {}
    for name in ("batch", "k8s"):
        ce = stock_ce_layout.copy_stock_ce(env.state_dir / "stock-ce" / name)
        auth = ce.defaults_dir / "01-common-auth-defaults.conf"
        text = auth.read_text()
        assert "use security:recommended" in text
        if env.flavour.htcondor == "23":
            auth.write_text(text.replace("use security:recommended", "# use security:recommended"))
        if name == "k8s":
            hooks = ce.root / "hooks"
            hooks.mkdir()
            proc = subprocess.run([f"{os.path.realpath(sys.prefix)}/bin/ce-k8s", "install", "--config-dir",
                                   str(ce.config_dir), "--hooks-dir", str(hooks)],
                                  capture_output=True, text=True, check=False)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        made[name] = ce
    return made


def _real_routed(env: RealCondor, config: Path, ad_file: Path):
    """The real router's routed ad for one job (condor_job_router_info), or None when it gives none."""
    import classad2

    out = ad_file.with_suffix(".real")
    out.unlink(missing_ok=True)
    proc = env.run(["/usr/bin/env", f"CONDOR_CONFIG={config}", "condor_job_router_info", "-jobads",
                    str(ad_file), "-route-jobs", str(out)], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # no file because the tool could not write it is not "no routed ad": after a route that does not
    # load, the tool writes as the condor account (seen on both versions), so the directory must let it
    assert "could not open" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    text = out.read_text() if out.exists() else ""
    return classad2.parseOne(text, classad2.ParserType.Old) if text.strip() else None


@ON_BOTH
@pytest.mark.parametrize("layout", ["batch", "k8s"])
@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.ad")))
def test_ce_k8s_route_agrees_with_the_real_router_on_a_stock_ce(env, stock_ces, layout, example):
    """On HTCondor-CE's own configuration, with the CE's condor_ce_router_defaults run by both,
    `ce-k8s route --htcondor-version <the root's version>` gives every example pilot the route and the routed ad
    attribute by attribute (Environment included) that the real condor_job_router_info gives;
    a Kubernetes route's ad differs only by what our translate hook sets (the tool runs no hook)."""
    from ce_k8s.condor.routing import submit_edits
    from ce_k8s.condor.wire import to_json_dict

    ce = stock_ces[layout]
    work = ce.root / "jobs"
    work.mkdir(exist_ok=True)
    work.chmod(0o1777)        # the tool may write its -route-jobs file as the condor account
    ad_file = work / example
    ad_file.write_text("".join(ln for ln in (EXAMPLES / example).read_text().splitlines(keepends=True)
                               if not ln.startswith("#")))
    real_ad = _real_routed(env, ce.condor_config, ad_file)
    proc = subprocess.run([f"{os.path.realpath(sys.prefix)}/bin/ce-k8s", "route", "--config", str(ce.condor_config),
                           "--htcondor-version", env.flavour.version, "--jobads", str(ad_file), "--json"],
                          capture_output=True, text=True, check=False)
    ours = json.loads(proc.stdout)[0]
    assert proc.returncode == 0, proc.stderr
    assert ours["errors"] == []
    if real_ad is None:
        _assert_nothing_submitted(ours)
        return
    submit_edits(real_ad)        # what submit_job() does after the tool printed the ad (see above)
    assert ours["route"] == real_ad.eval("RouteName")
    real = {k.lower(): v for k, v in to_json_dict(real_ad).items()}
    mine = {k.lower(): v for k, v in ours["routed_ad"].items()}
    # the tool's claim_job stub writes Managed/ManagedManager into the source ad it then copies
    # (job_router_info.cpp); the daemon claims the source job in the schedd instead
    ours_only = {"managed", "managedmanager"}
    if ours["pod"] is None:      # another backend's route: translate passes the ad through untouched
        assert "managed" not in mine
    else:
        assert mine["managed"] == "ScheddDone"
        ours_only |= {"k8sattempt", "k8spodname", "k8ssourceglobaljobid"}
    assert sorted(set(real) - set(mine) - ours_only) == []
    assert sorted(set(mine) - set(real) - ours_only) == []
    differ = {k: (real[k], mine[k]) for k in set(real) & set(mine) - ours_only if real[k] != mine[k]}
    assert differ == {}
    assert "CONDORCE_COLLECTOR_HOST=" in mine["environment"]       # the command's Env transform ran


# ------------------------------------------------------------------ route fidelity: transform semantics
def _transform_cases() -> dict[str, tuple[str, str]]:
    """tests/fixtures/transform_cases.py, loaded by path (tests/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "fixtures" / "transform_cases.py"
    spec = importlib.util.spec_from_file_location("ce_k8s_tests_transform_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


TRANSFORM_CASES = _transform_cases()


@ON_BOTH
@pytest.mark.parametrize("case", sorted(TRANSFORM_CASES))
def test_ce_k8s_route_agrees_with_the_real_router_on_transform_semantics(env, case):
    """The configurations on which `ce-k8s route` once disagreed with the real router (docs/real-condor.md,
    "Route fidelity"): when a macro defined in a route body is expanded, a post-route transform that fails
    for the job, `+=`. `ce-k8s route --htcondor-version <the root's>` and the real condor_job_router_info
    give the same route and routed ad, or both submit nothing (then the JSON has no routed ad and names
    the failing route and transform)."""
    from ce_k8s.condor.routing import submit_edits
    from ce_k8s.condor.wire import to_json_dict

    config, extra = TRANSFORM_CASES[case]
    work = env.state_dir / "transform-cases" / case
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o1777)        # the tool may write its -route-jobs file as the condor account
    (work / "condor_config").write_text(config)
    ad_file = work / "job.ad"
    ad_file.write_text("".join(ln for ln in (EXAMPLES / "pilot-cpu8.ad").read_text().splitlines(keepends=True)
                               if not ln.startswith("#")) + extra)
    config_file = work / "condor_config"
    tool = env.run(["/usr/bin/env", f"CONDOR_CONFIG={config_file}", "condor_job_router_info", "-jobads",
                    str(ad_file), "-route-jobs", str(work / "probe.out")], check=False)
    proc = subprocess.run([f"{os.path.realpath(sys.prefix)}/bin/ce-k8s", "route", "--config", str(config_file),
                           "--htcondor-version", env.flavour.version, "--jobads", str(ad_file), "--json"],
                          capture_output=True, text=True, check=False)
    ours = json.loads(proc.stdout)[0]
    if tool.returncode != 0:
        # the real router died (EXCEPT: `ERROR "..." at line N in file config.cpp`): nothing is routed,
        # and ce-k8s route must say that this HTCondor dies here
        assert "ERROR" in tool.stdout + tool.stderr, tool
        _assert_nothing_submitted(ours)
        assert any("EXCEPTs" in e for e in ours["errors"]), ours["errors"]
        return
    real_ad = _real_routed(env, config_file, ad_file)
    if real_ad is None:
        _assert_nothing_submitted(ours)
        assert proc.returncode == 1 or ours["route"] is None, proc.stderr
        return
    submit_edits(real_ad)
    assert ours["route"] == real_ad.eval("RouteName")
    real = {k.lower(): v for k, v in to_json_dict(real_ad).items()}
    mine = {k.lower(): v for k, v in ours["routed_ad"].items()}
    assert "timed" in real, "the case no longer exercises what it was written for"
    ours_only = {"managed", "managedmanager", "k8sattempt", "k8spodname", "k8ssourceglobaljobid"}
    assert sorted((set(real) ^ set(mine)) - ours_only) == []
    assert {k: (real[k], mine[k]) for k in set(real) & set(mine) - ours_only if real[k] != mine[k]} == {}
