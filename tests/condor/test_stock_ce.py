"""A stock HTCondor-CE configuration plus `ce-k8s install` (issue 14, "Real sites").

The CE here is tests/fixtures/stock_ce/ (HTCondor-CE 25.0.1's condor_config, its shipped
*-defaults.conf, its site files and condor_ce_router_defaults; see its README.md), copied per test
by the `stock_ce` fixture. What must hold (docs/routes.md, "Severity: errors, warnings, notes"):

* the fixture is what HTCondor itself reads: the real reader, run on the copy, sees the CE's
  routes and runs condor_ce_router_defaults, whose Env transform our reader gets as well;
* with `ce-k8s install`, `ce-k8s routes check` exits 0 with the shipped routes enabled in order,
  and `ce-k8s route` on every example pilot exits 0 with the route the embedded default gives;
* with the CE's Slurm route enabled, a pilot it takes passes through every hook process (the
  router's exact stdin, agent stopped) untouched;
* the demo's mixed mode on this configuration completes every Kubernetes pilot and leaves every
  batch pilot a routed grid job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ce_k8s.cli import main
from ce_k8s.condor import wire
from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.routing import RouterConfig, submit_edits

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted([*(ROOT / "examples").glob("*.ad"), *(ROOT / "examples").glob("*.json")])
# Router knobs whose final value decides routing; HTCondor's reader and ours must agree on each.
ROUTER_KNOBS = (
    "JOB_ROUTER_ROUTE_NAMES", "JOB_ROUTER_PRE_ROUTE_TRANSFORM_NAMES", "JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES",
    "JOB_ROUTER_SOURCE_JOB_CONSTRAINT", "JOB_ROUTER_NAME", "JOB_ROUTER_DEFAULT_MAX_JOBS_PER_ROUTE",
    "JOB_ROUTER_DEFAULT_MAX_IDLE_JOBS_PER_ROUTE", "ROUTED_JOB_MAX_TIME", "CONDORCE_PILOT_JOB_ENV",
    "JOB_ROUTER_HOOK_KEYWORD",
)
_PARAMS = """import json, sys
import htcondor2
print(json.dumps({name: htcondor2.param.get(name) for name in sys.argv[1:]}))
"""


def htcondor_params(condor_config: Path, names: tuple[str, ...]) -> dict[str, str | None]:
    """Values as HTCondor's own reader gives them (a subprocess: a bad configuration exits it)."""
    env = {**os.environ, "CONDOR_CONFIG": str(condor_config)}
    env.pop("_CONDOR_LOCAL_CONFIG_DIR", None)
    proc = subprocess.run([sys.executable, "-c", _PARAMS, *names], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def installed_ce(stock_ce, tmp_path):
    """The stock CE after `ce-k8s install` (knobs, the shipped routes as 70-ce-k8s-route-*, launchers)."""
    assert main(["install", "--config-dir", str(stock_ce.config_dir), "--hooks-dir", str(tmp_path / "hooks")]) == 0
    return stock_ce


def _json_route(capsys, args: list[str]) -> tuple[int, list[dict]]:
    code = main(["route", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


# -- the fixture is a CE ------------------------------------------------------------------------------

def test_htcondor_reads_the_stock_ce_as_a_ce_and_our_reader_agrees(stock_ce):
    real = htcondor_params(stock_ce.condor_config, (*ROUTER_KNOBS, "JOB_ROUTER_TRANSFORM_Env", "HTCondorCEVersion"))
    # every batch package installed: each 02- file sets the list outright, Slurm's is read last
    assert real["JOB_ROUTER_ROUTE_NAMES"] == "Slurm_Cluster"
    # condor_ce_router_defaults ran (LOCAL_CONFIG_FILE = ...|) and appended its Env transform
    assert real["JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES"].split()[-1] == "Env"
    assert "mergeEnvironment" in real["JOB_ROUTER_TRANSFORM_Env"]
    assert real["HTCondorCEVersion"] == '"25.0.1"'
    ours = CondorConfig.load(str(stock_ce.condor_config), run_commands=True)
    for name in ROUTER_KNOBS:
        assert (ours.get(name) or None) == (real[name] or None), name


def test_router_defaults_stand_in_prints_the_env_transform_for_its_environment(stock_ce):
    def run(**env: str) -> str:
        proc = subprocess.run([str(stock_ce.router_defaults)], env={"PATH": os.environ["PATH"], **env},
                              capture_output=True, text=True, timeout=60, check=True)
        return proc.stdout

    out = run()
    assert out.startswith("JOB_ROUTER_TRANSFORM_Env @=jrt\n")
    assert "JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES) Env\n" in out
    assert '    EVALMACRO default_env ifThenElse($(DISABLE_PILOT_ADS) =?= True, "", ' in out
    assert '    SET osg_environment ""\n' in out
    assert '    EVALMACRO default_env ""\n' in run(DISABLE_GLIDEIN_ADS="True")
    (stock_ce.osg_dir / "osg-job-environment.conf").write_text(
        'OSG_SITE_NAME="My Site"\nexport OSG_SITE_NAME\nOSG_APP=$APPDIR\nexport OSG_APP\nHIDDEN=1\n')
    (stock_ce.osg_dir / "osg-local-job-environment.conf").write_text("OSG_SITE_NAME=Local\nexport OSG_SITE_NAME\n")
    line = next(x for x in run(APPDIR="/cvmfs/app").splitlines() if "SET osg_environment" in x)
    assert line == """    SET osg_environment "OSG_SITE_NAME='Local' OSG_APP='/cvmfs/app'\""""


# -- routes check -------------------------------------------------------------------------------------

def test_stock_ce_alone_passes_routes_check(stock_ce, capsys):
    """Before ce-k8s: the CE's Slurm route is the one enabled, the other five are notes."""
    assert main(["routes", "check", "--strict", "--config", str(stock_ce.condor_config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("OK: 1 route(s) in order: Slurm_Cluster;") and out[-1].endswith(
        "0 errors, 0 warnings, 5 notes")
    assert all(": note: " in line for line in out[:-1]) and len(out) == 6


def test_stock_ce_with_ce_k8s_installed_passes_routes_check_with_the_shipped_routes_in_order(installed_ce, capsys):
    shipped = [route.name for route in RouterConfig.from_config(CondorConfig.load()).routes]
    assert main(["routes", "check", "--strict", "--config", str(installed_ce.condor_config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(f"OK: {len(shipped)} route(s) in order: {' '.join(shipped)};"), out[-1]
    assert out[-1].endswith("0 errors, 0 warnings, 6 notes")
    router = RouterConfig.from_config(CondorConfig.load(str(installed_ce.condor_config), run_commands=True))
    assert [route.name for route in router.routes] == shipped
    assert "Env" in [t.name for t in router.post_transforms]       # the router-defaults command ran


def test_doctor_finds_no_route_problem_on_the_stock_ce(installed_ce, capsys):
    """The notes about the CE's own batch routes are not problems for `ce-k8s doctor` either."""
    installed_ce.write_site("99-local.conf", f"CE_K8S_HOOK_DIR = {installed_ce.root.parent / 'hooks'}\n")
    main(["doctor", "--config", str(installed_ce.condor_config), "--timeout", "3", "--json"])
    found = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name in ("config", "routes", "route-order", "hook-keyword", "hook-update"):
        assert found[name]["level"] == "OK", found[name]
    assert found["routes"]["message"].startswith("4 route(s): CMS_Pilots GPU_Pilots WholeNode_Pilots Pilots")


# -- route ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_routes_on_the_stock_ce_as_with_the_embedded_default(installed_ce, capsys, example):
    code, embedded = _json_route(capsys, ["--jobads", str(example)])
    assert code == 0
    code, stock = _json_route(capsys, ["--config", str(installed_ce.condor_config), "--jobads", str(example)])
    assert code == 0, [job["errors"] for job in stock]
    assert [(job["job"], job["route"]) for job in stock] == [(job["job"], job["route"]) for job in embedded]
    for ours, theirs in zip(stock, embedded, strict=True):
        assert ours["errors"] == []
        assert all(d["severity"] != "error" for d in ours["diagnostics"]), ours["diagnostics"]
        if ours["route"] is None:
            continue
        for name in ("RequestCpus", "RequestMemory", "BatchRuntime", "BatchQueue", "K8sImage"):
            assert ours["routed_ad"].get(name) == theirs["routed_ad"].get(name), name
        # the CE's Env transform (from condor_ce_router_defaults) ran on the stock CE
        assert "CONDORCE_COLLECTOR_HOST=" in ours["routed_ad"].get("Environment", "")
        assert ours["pod"]["spec"]["containers"][0]["resources"] == theirs["pod"]["spec"]["containers"][0]["resources"]


def test_the_ce_whole_node_evalmacro_is_a_warning_on_every_grid_pilot(installed_ce, capsys):
    """01-ce-router-defaults.conf's WholeNode transform reads $(TargetUniverse), which no route here
    defines: HTCondor logs the EVALMACRO error and carries on. A warning: exit 0, 1 with --strict."""
    args = ["--config", str(installed_ce.condor_config), "--jobads", str(ROOT / "examples/pilot-cpu8.ad")]
    code, data = _json_route(capsys, args)
    warnings = [d for d in data[0]["diagnostics"] if d["severity"] == "warning"]
    assert code == 0 and data[0]["route"] == "Pilots" and data[0]["errors"] == []
    assert any("test_want_whole_node" in d["message"] and d["file"].endswith("01-ce-router-defaults.conf")
               for d in warnings), warnings
    assert main(["route", "--strict", *args]) == 1
    capsys.readouterr()


# -- a batch route beside ours: the hooks leave its pilots alone -----------------------------------------

def _run_hook(hooks: Path, name: str, stdin: bytes, socket: Path) -> subprocess.CompletedProcess:
    """As the router runs a hook: argv = [path], the whole stdin then EOF, a minimal environment."""
    return subprocess.run([str(hooks / f"ce-k8s-{name}")], input=stdin, capture_output=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "CE_K8S_SOCKET": str(socket)}, check=False)


def test_a_pilot_the_ce_slurm_route_takes_passes_through_every_hook_untouched(installed_ce, tmp_path, capsys):
    installed_ce.write_site("99-local.conf", "JOB_ROUTER_ROUTE_NAMES = Slurm_Cluster $(JOB_ROUTER_ROUTE_NAMES)\n")
    config = str(installed_ce.condor_config)
    code, data = _json_route(capsys, ["--config", config, "--jobads", str(ROOT / "examples/pilot-cpu8.ad")])
    assert code == 0 and data[0]["route"] == "Slurm_Cluster" and data[0]["kubernetes"] is False

    cfg = CondorConfig.load(config)
    router = RouterConfig.from_config(cfg)
    src = wire.parse_job_ads((ROOT / "examples/pilot-cpu8.ad").read_text())[0]
    iwd = tmp_path / "iwd"
    iwd.mkdir()
    src["Iwd"] = str(iwd)
    route = router.choose_route(src)
    assert route is not None and route.name == "Slurm_Cluster"
    hooks, socket = tmp_path / "hooks", tmp_path / "agent-stopped.sock"
    assert not socket.exists()

    translate = _run_hook(hooks, "translate", wire.translate_stdin(route.route_info_line(), src), socket)
    assert (translate.returncode, translate.stderr) == (0, b"")
    assert translate.stdout == wire.sprint_ad(src).encode()          # the source ad, byte for byte
    routed = router.route_job(src, route, wire.parse_hook_output(translate.stdout.decode()))
    assert not routed.failed
    dest = routed.ad
    submit_edits(dest)
    dest["ClusterId"], dest["ProcId"] = 4242, 0                       # as the schedd numbers the routed job
    assert dest.eval("JobUniverse") == 9 and dest.eval("GridResource") == "batch slurm"
    assert "Managed" not in dest and not [k for k in dest.keys() if k.lower().startswith("k8s")]

    for name, stdin in (("update", wire.sprint_ad(dest).encode()), ("finalize", wire.finalize_stdin(src, dest)),
                        ("cleanup", wire.sprint_ad(dest).encode())):
        res = _run_hook(hooks, name, stdin, socket)
        assert (res.returncode, res.stdout, res.stderr) == (0, b"", b""), (name, res.stderr)
    assert list(iwd.iterdir()) == []                                  # finalize wrote no Out/Err
    assert not socket.exists()


@pytest.mark.slow
def test_demo_mixed_mode_on_the_stock_ce(installed_ce):
    """`ce-k8s demo --batch-fraction` on this configuration: its Slurm-style route first, every
    Kubernetes pilot completes, every batch pilot stays a routed grid job that ce-k8s never touched."""
    from ce_k8s.sim.testbed import TestBed

    with TestBed(config=str(installed_ce.condor_config), batch_route=True, time_scale=0.02,
                 max_running_hooks=16) as bed:
        bed.submit(bed.make_pilots(6, run_s=4, fail_fraction=0.0, batch_fraction=0.5))
        assert bed.run(timeout=120, poll_interval=0.3)
        bed.drain(timeout=30, poll_interval=0.3)
        for _ in range(3):                           # a few more update polls of the batch jobs
            bed.tick(0.3)
        summary = bed.summary()
        assert summary["completed"] == 3 and summary["lost"] == 0 and summary["held"] == 0, summary
        assert summary["batch_routed"] == 3 and summary["batch_touched"] == 0, summary
        assert summary["pods_created"] == 3 and summary["pods_left"] == 0, summary
        batch = [o for o in bed.outcomes.values() if o.batch]
        assert len(batch) == 3 and {o.route for o in batch} == {"Slurm"} and not any(o.pod for o in batch)
        routed = [ad for _key, ad in bed.schedd.items() if ad.get("RouteName") == "Slurm"]
        assert len(routed) == 3
        assert all(ad.eval("JobUniverse") == 9 and ad.eval("GridResource") == "batch slurm" for ad in routed)
