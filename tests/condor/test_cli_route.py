"""``ce-k8s route`` (issue 2 item 7): text and JSON output, stdin, exit codes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from ce_k8s.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_readme_first_command_shows_route_summary_ad_and_pod(capsys):
    """The README's first command: route taken, docs/htcondor-ce.md §1.5 values, the routed ad and the pod."""
    assert main(["route", "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Job 1234567.3: route Pilots\n")
    for line in ("    RequestCpus = 8", "    RequestMemory = 16000", "    BatchRuntime = 172800",
                 '    BatchQueue = "cpu"', '    RoutedBy = "htcondor-ce"', '    Managed = "ScheddDone"',
                 '    ManagedManager = "ce-k8s"'):
        assert line in out.splitlines(), line
    assert "  pod ce-k8s-pilots/" in out and "priorityClassName: ce-k8s-pilot" in out
    assert "  secret (data redacted):" in out and "<redacted" in out
    # submit_job drops the secure attributes; the renamed copies survive (docs/hook-protocol.md §2.2 step 5).
    assert "    AuthTokenIssuer =" not in out and "    orig_AuthTokenIssuer =" in out


def test_routed_ad_is_sorted_in_sprint_ad_form(capsys):
    main(["route", "--jobads", str(EXAMPLES / "pilot-1core.ad")])
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("  routed ad (as the routed job is submitted):") + 1
    ad_lines = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        ad_lines.append(line[4:])
    names = [line.split(" = ")[0] for line in ad_lines]
    assert names == sorted(names) and "RequestCpus" in names


def test_no_route_explains_each_check_and_exits_0(capsys):
    """No route is the router's own verdict (the job stays idle), not a routing failure: exit 0."""
    assert main(["route", "--jobads", str(EXAMPLES / "pilot-noroute.ad")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Job 1234572.0: no route\n")
    assert "not a candidate for routing" in out and "target.JobStatus == 1 → false" in out
    assert "  route GPU_Pilots: false - REQUIREMENTS (RequestGPUs ?: 0) > 0 → false" in out


def test_json_output_for_several_jobs(capsys):
    assert main(["route", "--json", "--jobads", str(EXAMPLES / "pilots.json")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(d["job"], d["route"]) for d in data] == [("1234567.3", "Pilots"), ("1234569.0", "GPU_Pilots")]
    first = data[0]
    assert first["errors"] == []
    assert first["routed_ad"]["RequestCpus"] == 8
    assert first["routed_ad"]["JobMemory"] == "/Expr(RequestMemory)/"
    assert first["pod"]["kind"] == "Pod" and first["secret"]["kind"] == "Secret"
    assert all(v.startswith("<redacted") for v in first["secret"]["data"].values())


def test_json_no_route_has_null_route_and_exit_0(capsys):
    assert main(["route", "--json", "--jobads", str(EXAMPLES / "pilot-noroute.ad")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["route"] is None and data[0]["routed_ad"] is None
    assert data[0]["errors"] == [] and data[0]["diagnostics"] == []
    assert any(item["check"] == "built-in" for item in data[0]["explain"])


def test_pod_build_error_is_reported_and_exits_1(tmp_path, capsys):
    conf = tmp_path / "c.conf"
    conf.write_text('JOB_ROUTER_SOURCE_JOB_CONSTRAINT = true\nJOB_ROUTER_ROUTE_R @=x\n  GridResource = "batch k8s"\n'
                    '  SET K8sNamespace "Bad_NS"\n  SET K8sImage "img:1"\n@x\nJOB_ROUTER_ROUTE_NAMES = R\n')
    assert main(["route", "--json", "--config", str(conf), "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data[0]["route"] == "R" and data[0]["pod_error"]["code"]
    assert any(e.startswith("pod builder: ") for e in data[0]["errors"])
    assert [(d["severity"], d["message"]) for d in data[0]["diagnostics"]] == [
        ("error", e) for e in data[0]["errors"]]
    pod_diag = data[0]["diagnostics"][0]
    assert pod_diag["file"] == str(conf) and pod_diag["line"] == 2       # the route's definition


def test_stdin_and_bad_input_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO((EXAMPLES / "pilot-gpu.ad").read_text()))
    assert main(["route", "--jobads", "-"]) == 0
    assert capsys.readouterr().out.startswith("Job 1234569.0: route GPU_Pilots")
    monkeypatch.setattr(sys, "stdin", io.StringIO("this is not an ad\n"))
    assert main(["route", "--jobads", "-"]) == 2
    assert "<stdin>:1:" in capsys.readouterr().err
    assert main(["route", "--jobads", "/nonexistent/file.ad"]) == 2
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["route", "--jobads", "-"]) == 2


def test_console_script_runs_as_a_subprocess():
    exe = Path(sys.executable).with_name("ce-k8s")
    proc = subprocess.run([str(exe), "route", "--jobads", str(EXAMPLES / "pilot-cms-token.ad")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Job 1234571.1: route CMS_Pilots")


MIXED = """JOB_ROUTER_SOURCE_JOB_CONSTRAINT = true
JOB_ROUTER_ROUTE_Slurm @=jrt
  REQUIREMENTS xcount == 8
  UNIVERSE grid
  GridResource = "batch slurm"
@jrt
JOB_ROUTER_ROUTE_Pool @=jrt
  REQUIREMENTS (RequestGPUs ?: 0) > 0
  UNIVERSE vanilla
@jrt
JOB_ROUTER_ROUTE_K8s @=jrt
  UNIVERSE grid
  GridResource = "batch k8s"
  SET K8sImage "img:1"
@jrt
JOB_ROUTER_ROUTE_NAMES = Slurm Pool K8s
"""


def test_other_backends_route_shows_the_plain_routed_ad_and_no_pod(tmp_path, capsys):
    """docs/routes.md "CEs with other backends": on a mixed CE, a job taken by the `batch slurm`
    route gets what the router makes of the translate hook's pass-through (its source ad,
    unchanged): no ce-k8s attributes, no pod, no Secret, and a note that says why."""
    conf = tmp_path / "mixed.conf"
    conf.write_text(MIXED)
    assert main(["route", "--config", str(conf), "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Job 1234567.3: route Slurm\n")
    assert ('  note: route Slurm is not a Kubernetes route (its GridResource "batch slurm" does not start with '
            'CE_K8S_GRID_RESOURCE "batch k8s"): the ce-k8s hooks pass this job through unchanged and no pod '
            'is built') in out.splitlines()
    assert '    GridResource = "batch slurm"' in out.splitlines()
    for absent in ("Managed", "K8sPodName", "K8sAttempt", "  pod ", "  secret "):
        assert absent not in out, absent


def test_json_marks_kubernetes_and_other_routes(tmp_path, capsys):
    conf = tmp_path / "mixed.conf"
    conf.write_text(MIXED)
    ads = "\n".join((EXAMPLES / name).read_text() for name in ("pilot-cpu8.ad", "pilot-gpu.ad", "pilot-1core.ad"))
    jobads = tmp_path / "jobs.ad"
    jobads.write_text(ads)
    assert main(["route", "--json", "--config", str(conf), "--jobads", str(jobads)]) == 0
    data = {d["route"]: d for d in json.loads(capsys.readouterr().out)}
    assert set(data) == {"Slurm", "Pool", "K8s"}
    for name in ("Slurm", "Pool"):
        assert data[name]["kubernetes"] is False and data[name]["pod"] is None and data[name]["secret"] is None
        assert data[name]["errors"] == [] and "pod_error" not in data[name]
        assert "Managed" not in data[name]["routed_ad"] and "K8sPodName" not in data[name]["routed_ad"]
    assert "sets no GridResource" in data["Pool"]["notes"][0]
    k8s = data["K8s"]
    assert k8s["kubernetes"] is True and k8s["pod"]["kind"] == "Pod"
    assert k8s["routed_ad"]["Managed"] == "ScheddDone" and "notes" not in k8s


def test_grid_resource_knob_decides_which_routes_get_pods(tmp_path, capsys):
    """CE_K8S_GRID_RESOURCE in the CE configuration: the same rule the hooks apply."""
    conf = tmp_path / "mixed.conf"
    conf.write_text(MIXED + "CE_K8S_GRID_RESOURCE = batch slurm\n")
    assert main(["route", "--json", "--config", str(conf), "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]) == 1
    data = json.loads(capsys.readouterr().out)[0]
    # the Slurm route is now the Kubernetes one; it sets no image, so the pod builder holds the job
    assert data["route"] == "Slurm" and data["kubernetes"] is True and data["pod_error"]["code"]
    assert data["routed_ad"]["ManagedManager"] == "ce-k8s"


def test_grid_resource_set_in_the_route_body_is_reported(tmp_path, capsys):
    """The translate hook sees only the route's GridResource macro (the route line), the other hooks
    the routed ad's GridResource: a SET that makes them disagree is an error (exit 1), in both
    directions, and names the fix."""
    conf = tmp_path / "set.conf"
    conf.write_text('JOB_ROUTER_SOURCE_JOB_CONSTRAINT = true\nJOB_ROUTER_ROUTE_R @=x\n  UNIVERSE grid\n'
                    '  SET GridResource "batch k8s"\n  SET K8sImage "img:1"\n@x\nJOB_ROUTER_ROUTE_NAMES = R\n')
    assert main(["route", "--json", "--config", str(conf), "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]) == 1
    data = json.loads(capsys.readouterr().out)[0]
    assert data["kubernetes"] is False and data["pod"] is None
    assert any('the route\'s GridResource macro is not set' in e and '`GridResource = "batch k8s"`' in e
               for e in data["errors"]), data["errors"]
    conf.write_text(conf.read_text().replace('SET GridResource "batch k8s"',
                                             'GridResource = "batch k8s"\n  SET GridResource "batch slurm"'))
    assert main(["route", "--json", "--config", str(conf), "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]) == 1
    data = json.loads(capsys.readouterr().out)[0]
    assert data["kubernetes"] is True and "pod" not in data
    assert any("update, finalize and cleanup hooks would ignore" in e for e in data["errors"]), data["errors"]


# -- severities (docs/routes.md, "Severity: errors, warnings, notes") ------------------------------

EVALMACRO_CONF = """JOB_ROUTER_SOURCE_JOB_CONSTRAINT = true
CE_K8S_IMAGE = img:1
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = Probe
JOB_ROUTER_TRANSFORM_Probe @=jrt
    EVALMACRO probe $(MY.WantWholeNode:False) && $(NoSuchMacro)==5
    SET Probed true
@jrt
JOB_ROUTER_ROUTE_K8s @=jrt
  UNIVERSE grid
  GridResource = "batch k8s"
@jrt
JOB_ROUTER_ROUTE_NAMES = K8s
"""


def test_evalmacro_that_does_not_evaluate_is_a_warning_and_the_job_is_routed(tmp_path, capsys):
    """HTCondor logs the EVALMACRO failure and goes on with the transform (the CE's own WholeNode
    transform does this for every grid pilot): a warning, exit 0; 1 with --strict."""
    conf = tmp_path / "evalmacro.conf"
    conf.write_text(EVALMACRO_CONF)
    args = ["route", "--config", str(conf), "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)[0]
    assert data["route"] == "K8s" and data["errors"] == [] and data["pod"]["kind"] == "Pod"
    assert data["routed_ad"]["Probed"] is True                     # the rest of the transform ran
    warnings = [d for d in data["diagnostics"] if d["severity"] == "warning"]
    assert len(warnings) == 1 and "EVALMACRO" in warnings[0]["message"]
    assert warnings[0]["file"] == str(conf) and warnings[0]["line"] == 5
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"  warning: {conf}:5: ") and "EVALMACRO" in line for line in out), out
    assert not any(line.startswith("  error:") for line in out)
    assert main([*args, "--strict"]) == 1
    capsys.readouterr()


def test_configuration_error_exits_1_and_is_printed_with_its_severity(tmp_path, capsys):
    """A route the router refuses to load (unknown keyword): every job still gets its verdict from
    the routes that load, and the exit status says the configuration has an error."""
    conf = tmp_path / "broken.conf"
    conf.write_text(EVALMACRO_CONF.replace("NAMES = K8s", "NAMES = K8s Bad") + (
        "JOB_ROUTER_ROUTE_Bad @=jrt\n  SETT X 1\n  GridResource = \"batch k8s\"\n@jrt\n"))
    assert main(["route", "--json", "--config", str(conf), "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)[0]["route"] == "K8s"
    assert any(line.startswith(f"ce-k8s route: {conf}:") and ": error: " in line and "SETT" in line
               for line in captured.err.splitlines()), captured.err


def test_notes_alone_exit_0_even_with_strict(tmp_path, capsys):
    conf = tmp_path / "mixed.conf"
    conf.write_text(MIXED)
    assert main(["route", "--strict", "--json", "--config", str(conf), "--jobads",
                 str(EXAMPLES / "pilot-cpu8.ad")]) == 0
    data = json.loads(capsys.readouterr().out)[0]
    assert [d["severity"] for d in data["diagnostics"]] == ["note"] and data["errors"] == []


def test_fallback_for_a_router_model_without_diagnostics():
    """Only the message that made the router give up is an error; what it logged before, warnings."""
    from ce_k8s.condor.cli_route import routed_diagnostics

    class Old:
        def __init__(self, errors, failed):
            self.errors, self.failed, self.ad = errors, failed, None

    logged = "a.conf:3: WholeNode: EVALMACRO x could not evaluate"
    fatal = "job 1.0: failure in route R: broken"
    assert [d.severity.name for d in routed_diagnostics(Old([logged], False))] == ["WARNING"]
    assert [d.severity.name for d in routed_diagnostics(Old([logged, fatal], True))] == ["WARNING", "ERROR"]
    assert routed_diagnostics(Old([logged], False))[0].file == "a.conf"


def test_a_failing_dollar_function_is_logged_on_25_and_kills_the_router_before_25_13_2(tmp_path, capsys):
    """A `$INT()` of text: HTCondor 25.13.2 and later log it and route the job (`$INT()` expands to
    nothing); older versions EXCEPT in config.cpp and the job router dies (HTCONDOR-3831; seen on the
    real 23.9.6). `--htcondor-version` decides which the JSON shows (docs/real-condor.md, "What differs
    between HTCondor 23.9 and 25")."""
    conf = tmp_path / "dollar.conf"
    conf.write_text(EVALMACRO_CONF.replace("EVALMACRO probe $(MY.WantWholeNode:False) && $(NoSuchMacro)==5",
                                           'SET Counted "$INT(abc)"'))
    args = ["route", "--json", "--config", str(conf), "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]
    assert main([*args, "--htcondor-version", "25.14.1"]) == 0
    new = json.loads(capsys.readouterr().out)[0]
    assert new["submitted"] is True and new["routed_ad"]["Counted"] == "" and new["errors"] == []
    assert any("$INT() macro: abc does not evaluate to an integer" in d["message"] for d in new["diagnostics"])
    assert main([*args, "--htcondor-version", "25.0.13"]) == 1
    old = json.loads(capsys.readouterr().out)[0]
    assert old["routed_ad"] is None and old["submitted"] is False
    assert any("EXCEPTs" in e and "transform Probe" in e and "routed by K8s" in e for e in old["errors"]), old


def test_edit_job_in_place_submits_no_routed_job(tmp_path, capsys):
    """EditJobInPlace: the router pushes the edited ad onto the source job and submits nothing
    (JobRouter.cpp FinishSubmitJob; the real condor_job_router_info writes nothing). The JSON has no
    routed ad and no pod; on a Kubernetes route it is an error (translate's Managed = "ScheddDone"
    would land on the source job, which then never runs), on another backend's route a note."""
    conf = tmp_path / "inplace.conf"
    conf.write_text(EVALMACRO_CONF.replace("  UNIVERSE grid\n",
                                           "  UNIVERSE grid\n  EditJobInPlace = true\n  SET Edited 1\n"))
    args = ["route", "--json", "--config", str(conf), "--jobads", str(EXAMPLES / "pilot-cpu8.ad")]
    assert main(args) == 1
    k8s = json.loads(capsys.readouterr().out)[0]
    assert k8s["routed_ad"] is None and k8s["submitted"] is False and "pod" not in k8s
    assert k8s["edited_in_place"]["Edited"] == 1 and k8s["edited_in_place"]["Managed"] == "ScheddDone"
    assert any("EditJobInPlace" in e and "never runs" in e for e in k8s["errors"])
    conf.write_text(conf.read_text().replace('GridResource = "batch k8s"', 'GridResource = "batch slurm"'))
    assert main(args) == 0
    batch = json.loads(capsys.readouterr().out)[0]
    assert batch["routed_ad"] is None and batch["submitted"] is False and batch["errors"] == []
    assert batch["edited_in_place"]["Edited"] == 1 and "Managed" not in batch["edited_in_place"]
    assert any("EditJobInPlace" in n for n in batch["notes"])
