"""The translate hook: full echo, inert routed job, pod identity (docs/hook-protocol.md §2.2, §8),
and the pass-through for routes of other backends (docs/routes.md, "CEs with other backends")."""

from __future__ import annotations

import classad2

from ce_k8s.condor import wire
from ce_k8s.hooks.translate import TranslateError, translate_ad_text
from ce_k8s.pods.names import pod_name

from .conftest import GJID, run_hook, source_ad

ROUTE = wire.route_info_line("K8s", 9, "batch k8s")


def test_echoes_every_line_and_sets_our_attributes(hook_dir):
    """hook-protocol.md §2.2: stdout replaces the routed ad, so every input line must come back unchanged."""
    src = source_ad()
    stdin = wire.translate_stdin(ROUTE, src)
    res = run_hook(hook_dir, "translate", stdin)
    assert res.returncode == 0, res.stderr
    assert res.stderr == b""          # hook-protocol.md §8: keep stderr empty on success (logged at D_ALWAYS)
    out = res.stdout.decode()
    for line in wire.sprint_ad(src).splitlines():
        assert line in out.splitlines()
    ad = wire.parse_hook_output(out)
    assert ad["JobUniverse"] == 5
    assert ad["Managed"] == "ScheddDone" and ad["ManagedManager"] == "ce-k8s"
    assert ad["K8sAttempt"] == 0
    assert ad["K8sPodName"] == pod_name(GJID, 0)
    assert ad["K8sSourceGlobalJobId"] == GJID


def test_reroute_increments_attempt_and_replaces_old_lines():
    """A rerouted source job carries K8sAttempt (CE_K8S_ATTRS_TO_COPY): the next pod gets a new name."""
    src = source_ad(K8sAttempt=1, K8sPodName=pod_name(GJID, 1), Managed="Schedd")
    text = wire.sprint_ad(src)
    out = translate_ad_text(ROUTE, text)
    ad = wire.parse_hook_output(out)
    assert ad["K8sAttempt"] == 2
    assert ad["K8sPodName"] == pod_name(GJID, 2)
    assert ad["Managed"] == "ScheddDone"
    assert out.count("K8sAttempt =") == 1 and out.count("Managed =") == 1


def test_is_deterministic():
    """docs/design.md Decision 5: translating the same job twice names the same pod."""
    text = wire.sprint_ad(source_ad())
    assert translate_ad_text(ROUTE, text) == translate_ad_text(ROUTE, text)


def test_adds_job_universe_when_missing():
    """hook-protocol.md §2.2: output without JobUniverse makes VanillaToGrid abort the whole router."""
    src = source_ad()
    del src["JobUniverse"]
    ad = wire.parse_hook_output(translate_ad_text(ROUTE, wire.sprint_ad(src)))
    assert ad["JobUniverse"] == 5


def test_raw_newline_attribute_is_dropped_not_echoed_broken():
    """hook-protocol.md §2.2: sPrintAd writes newlines in strings raw; echoing them would fail the router's parser."""
    text = wire.sprint_ad(source_ad()) + 'Zmessage = "line one\nline two"\nZz = 1\n'
    out = translate_ad_text(ROUTE, text)
    ad = wire.parse_hook_output(out)   # must not raise
    assert "Zmessage" not in ad and ad["Zz"] == 1


def test_no_global_job_id_falls_back_to_cluster_proc_qdate():
    src = source_ad()
    del src["GlobalJobId"]
    ad = wire.parse_hook_output(translate_ad_text(ROUTE, wire.sprint_ad(src)))
    assert ad["K8sPodName"] == pod_name("4711.0#1760000000", 0)


def test_bad_input_exits_nonzero(hook_dir):
    """hook-protocol.md §2.2: exit != 0 is a graceful removal (retried later); never print a broken ad."""
    res = run_hook(hook_dir, "translate", b"no separator here\n")
    assert res.returncode == 1 and res.stdout == b""
    res = run_hook(hook_dir, "translate", (ROUTE + "\n------\n").encode())
    assert res.returncode == 1 and res.stdout == b""


def test_oversized_stdin_refused(hook_dir):
    """Bounded stdin: more than 4 MiB is refused before parsing."""
    res = run_hook(hook_dir, "translate", b"A = 1\n" * (800 * 1024))
    assert res.returncode == 1 and res.stdout == b""


def test_empty_ad_raises():
    import pytest

    with pytest.raises(TranslateError):
        translate_ad_text(ROUTE, "\n")


def test_classad2_agrees_on_every_value():
    """The echoed lines parse to the same values classad2 has for the source ad."""
    src = source_ad()
    ad = wire.parse_hook_output(translate_ad_text(ROUTE, wire.sprint_ad(src)))
    for k in src.keys():
        assert str(ad.lookup(k)) == str(src.lookup(k)), k
    assert isinstance(ad, classad2.ClassAd)


def test_routed_job_is_left_to_nobody_but_ce_k8s():
    """`Managed = "ScheddDone"`, whatever the source job said: "External" is the gridmanager's own
    marker (HTCondor v23.9.6 src/condor_gridmanager/gridmanager.cpp doContactSchedd adopts every
    grid job with it; a real 23.9 submitted our routed jobs to BLAH, finding R1 in docs/real-condor.md),
    while "ScheddDone" is excluded by every gridmanager query, by the schedd's count of jobs that
    need a gridmanager (src/condor_schedd.V6/schedd.cpp count_jobs) and by the router's umbrella
    constraint (src/condor_job_router/JobRouter.cpp GetCandidateJobs)."""
    for managed in (None, "Schedd", "External", "ScheddDone"):
        extra = {} if managed is None else {"Managed": managed, "ManagedManager": "htcondor-ce"}
        out = translate_ad_text(ROUTE, wire.sprint_ad(source_ad(**extra)))
        ad = wire.parse_hook_output(out)
        assert (ad["Managed"], ad["ManagedManager"]) == ("ScheddDone", "ce-k8s"), managed
        assert out.count("Managed =") == 1 and out.count("ManagedManager =") == 1


# -- routes of other backends -----------------------------------------------------------------------

ODD_AD = (b'Arguments = "-v  std\t-name \\"x\\""\nClusterId = 4711\nCmd =   "glidein_startup.sh"   \n'
          b'GlobalJobId = "ce.example.org#4711.0#1760000000"\nK8sNamespace = "kube-system"\n'
          b'Managed="Schedd"\nOwner = "cmspilot"\nProcId = 0\n\n  Zz = { 1,"two" }\r\nZzz = "\xc3\xa9t\xc3\xa9"\n')


def test_other_backends_route_gets_the_source_ad_back_byte_for_byte(hook_dir):
    """A `batch slurm` route: stdout is exactly the bytes after the separator (odd spacing, a blank
    line, CRLF, non-ASCII, a job's own K8s* attribute and all), exit 0, nothing on stderr; so the
    router routes exactly what it would have without ce-k8s."""
    for route in (wire.route_info_line("Slurm", 9, "batch slurm"),
                  '[ Name = "PBS"; TargetUniverse = 9; GridResource = "batch pbs" ]',
                  '[ GridResource = "condor ce.example.org ce.example.org:9619"; Name = "Condor_C" ]'):
        for ad in (ODD_AD, wire.sprint_ad(source_ad()).encode()):
            res = run_hook(hook_dir, "translate", route.encode() + b"\n------\n" + ad)
            assert (res.returncode, res.stdout, res.stderr) == (0, ad, b""), route


def test_kubernetes_route_is_translated_whatever_the_attribute_order(hook_dir):
    """The route line is a new-syntax ClassAd (JobRoute::RouteDescription, JobRouter.cpp) whose
    attribute order depends on the HTCondor version (docs/hook-protocol.md §2.2)."""
    for route in ('[ Name = "Pilots"; TargetUniverse = 9; GridResource = "batch k8s" ]',
                  '[ Name = "K8s"; GridResource = "batch k8s"; TargetUniverse = 9 ]',
                  '[GridResource="BATCH K8S";Name="x"]', ROUTE):
        res = run_hook(hook_dir, "translate", route.encode() + b"\n------\n" + ODD_AD)
        assert res.returncode == 0, (route, res.stderr)
        ad = wire.parse_hook_output(res.stdout.decode())
        assert ad["Managed"] == "ScheddDone" and ad["K8sPodName"] == pod_name(GJID, 0), route
        assert "K8sNamespace" not in ad                  # the job's own K8s* setting is dropped


def test_route_without_grid_resource_is_not_ours(hook_dir):
    """A route that defines no GridResource (a vanilla-universe route to an HTCondor pool, hook-protocol.md §3):
    the router prints no GridResource in the route line, and the job passes through."""
    ad = wire.sprint_ad(source_ad()).encode()
    for route in (wire.route_info_line("Condor_Pool", 5, None), '[ Name = "batch k8s"; TargetUniverse = 9 ]',
                  '[ Name = "x; GridResource = \\"batch k8s\\""; TargetUniverse = 9 ]',
                  '[ Name = "x"; GridResource = undefined ]', "[ ]", ""):
        res = run_hook(hook_dir, "translate", route.encode() + b"\n------\n" + ad)
        assert (res.returncode, res.stdout) == (0, ad), route


def test_grid_resource_knob_changes_the_rule(hook_dir, tmp_path):
    """CE_K8S_GRID_RESOURCE (environment, hooks.conf, or baked in by --install-hooks) decides."""
    from ce_k8s.agent.launchers import install_hooks

    ad = wire.sprint_ad(source_ad()).encode()
    k8s = (ROUTE + "\n------\n").encode() + ad
    kube = (wire.route_info_line("Kube", 9, "kubernetes cluster-a") + "\n------\n").encode() + ad
    env = {"CE_K8S_GRID_RESOURCE": "Kubernetes"}
    assert run_hook(hook_dir, "translate", k8s, env).stdout == ad
    assert b'ManagedManager = "ce-k8s"' in run_hook(hook_dir, "translate", kube, env).stdout
    conf = tmp_path / "hooks.conf"
    conf.write_text("CE_K8S_GRID_RESOURCE = kubernetes cluster-a\n")
    env = {"CE_K8S_HOOKS_CONF": str(conf)}
    assert run_hook(hook_dir, "translate", k8s, env).stdout == ad
    assert b'ManagedManager = "ce-k8s"' in run_hook(hook_dir, "translate", kube, env).stdout
    baked = tmp_path / "hooks"
    install_hooks(str(baked), socket_path="/nonexistent.sock", hook_timeout=5.0, grid_resource="kubernetes")
    assert "protocol.DEFAULT_GRID_RESOURCE = 'kubernetes'" in (baked / "ce-k8s-translate").read_text()
    assert run_hook(baked, "translate", k8s).stdout == ad
    assert b'ManagedManager = "ce-k8s"' in run_hook(baked, "translate", kube).stdout
    env = {"CE_K8S_GRID_RESOURCE": "batch k8s"}
    assert b'ManagedManager = "ce-k8s"' in run_hook(baked, "translate", k8s, env).stdout


def test_route_grid_resource_reads_the_new_syntax_line():
    """Names are case-insensitive, strings use new-syntax escapes, `;` inside strings and nested
    values does not end an attribute, and only a top-level string literal counts."""
    from ce_k8s.hooks.translate import is_kubernetes_route, route_grid_resource

    cases = {
        '[ Name = "a"; GridResource = "batch k8s"; TargetUniverse = 9 ]': "batch k8s",
        '[ gridresource = "batch\\tk8s" ]': "batch\tk8s",
        '[ GridResource = "say \\"hi\\"" ]': 'say "hi"',
        '[ Name = "a;b"; L = { "x;y", [ GridResource = "inner" ] }; GridResource = "outer" ]': "outer",
        '[ GridResource = "unterminated ]': None,
        '[ GridResource = "a" "b" ]': None,
        '[ GridResource = strcat("batch", " k8s") ]': None,
        'GridResource = "batch k8s"': None,
    }
    for line, want in cases.items():
        assert route_grid_resource(line) == want, line
    import classad2

    ad = classad2.ClassAd({"Name": 'a"; GridResource = "batch k8s', "TargetUniverse": 9})
    assert route_grid_resource(repr(ad)) is None
    ad["GridResource"] = "Batch K8s\tsite-b"
    assert is_kubernetes_route(repr(ad), "batch k8s") and not is_kubernetes_route(repr(ad), "batch k8s site-a")


def test_install_hooks_bakes_in_the_ce_knob(tmp_path):
    """`ce-k8s agent --install-hooks` reads CE_K8S_GRID_RESOURCE from the CE configuration and bakes
    it into the launchers, as it does the socket path and the hook timeout."""
    from ce_k8s.cli import main

    conf = tmp_path / "ce.conf"
    conf.write_text('CE_K8S_GRID_RESOURCE = "kubernetes site-b"\n')
    target = tmp_path / "libexec"
    assert main(["agent", "--config", str(conf), "--install-hooks", str(target)]) == 0
    for name in ("translate", "update", "finalize", "cleanup"):
        text = (target / f"ce-k8s-{name}").read_text()
        assert "protocol.DEFAULT_GRID_RESOURCE = 'kubernetes site-b'\n" in text, name
    ad = wire.sprint_ad(source_ad()).encode()
    route = wire.route_info_line("K", 9, "Kubernetes site-b")
    assert b'Managed = "ScheddDone"' in run_hook(target, "translate", (route + "\n------\n").encode() + ad).stdout
    assert run_hook(target, "translate", (ROUTE + "\n------\n").encode() + ad).stdout == ad
