"""`ce-k8s doctor`: a healthy host passes, and each check fails for its own reason with a fix.

The hook path rules are the router's (docs/hook-protocol.md §1.1: exists, executable, not
world-writable, parent not world-writable; a failing hook is silently treated as unconfigured),
and hooks run as the pilot's account (hook-protocol.md §2.1).
"""

from __future__ import annotations

import json
import os

import pytest
from ops_helpers import NAMESPACE, REPO, ce_host, run_cli


def doctor(host, *extra: str) -> tuple[int, dict[str, tuple[str, str]]]:
    """(exit code, {check name: (level, line)}); the last line is the summary."""
    code, out = run_cli("doctor", "--config", str(host.config_dir), "--timeout", "3", *extra)
    lines = out.rstrip("\n").split("\n")
    assert lines[-1].startswith("doctor: ")
    found = {}
    for line in lines[:-1]:
        level, rest = line.split(None, 1)
        name = rest.split(":", 1)[0]
        found[name] = (level, line)
    return code, found


def levels(found) -> dict[str, str]:
    return {name: level for name, (level, _) in found.items()}


def test_healthy_host_passes_every_check(host):
    code, found = doctor(host)
    assert levels(found) == {
        "config": "OK", "routes": "OK", "route-order": "OK", "hook-keyword": "OK", "hook-translate": "OK",
        "hook-update": "OK", "hook-finalize": "OK", "hook-cleanup": "OK", "attrs-to-copy": "OK", "agent": "OK",
        "api": "OK", "rbac": "OK", "spool": "OK"}, found
    assert code == 0
    assert "all 13 permissions" in found["rbac"][1]


def test_json_output_has_one_object_per_check(host):
    code, out = run_cli("doctor", "--config", str(host.config_dir), "--json")
    assert code == 0
    results = json.loads(out)
    assert {r["level"] for r in results} == {"OK"} and len(results) == 13


def test_bad_knob_fails_config_with_file_and_line_and_skips_the_rest(bare_host):
    bare_host.write_local("# site\nCE_K8S_MAX_ATTEMPTS = lots\n")
    code, found = doctor(bare_host)
    assert code == 1
    level, line = found["config"]
    assert level == "FAIL" and "98-test-override.conf:2" in line and "CE_K8S_MAX_ATTEMPTS" in line
    assert {n for n, (lv, _) in found.items() if lv == "SKIP"} == {
        "routes", "route-order", "hook-keyword", "hooks", "attrs-to-copy", "agent", "api", "rbac", "spool"}


def test_route_problem_fails_routes(host):
    host.write_local("JOB_ROUTER_ROUTE_Pilots @=rt\n  REQUIREMENTS TARGET.Owner == \"x\"\n@rt\n",
                     "71-broken-route.conf")
    code, found = doctor(host)
    assert code == 1
    level, line = found["routes"]
    assert level == "FAIL" and "TARGET." in line and "fix: run 'ce-k8s routes check --config" in line
    assert levels(found)["hook-update"] == "OK"   # the other checks still ran


def test_route_file_read_before_a_knob_file_warns_naming_it(host):
    """20-ce-k8s-routing.conf empties JOB_ROUTER_ROUTE_NAMES: a route file read before it (here the
    CMS route copied by hand under its own name) is disabled and the router says nothing."""
    assert "4 route file(s) read after the ce-k8s knob files" in doctor(host)[1]["route-order"][1]
    (host.config_dir / "10-cms-token.conf").write_text((REPO / "routes/10-cms-token.conf").read_text())
    code, found = doctor(host)
    level, line = found["route-order"]
    assert level == "WARN" and code == 0
    assert f"{host.config_dir}/10-cms-token.conf is read before" in line
    assert "70-ce-k8s-route-" in line.split("-- fix:")[1]


def test_no_hook_keyword_fails(host):
    """hook-protocol.md §1.1: without JOB_ROUTER_HOOK_KEYWORD the router calls no hook at all."""
    host.write_local("JOB_ROUTER_HOOK_KEYWORD =\n")
    code, found = doctor(host)
    assert code == 1
    assert found["hook-keyword"][0] == "FAIL" and "JOB_ROUTER_HOOK_KEYWORD = CE_K8S" in found["hook-keyword"][1]
    assert found["hooks"][0] == "SKIP"


@pytest.mark.parametrize("breakage, words", [
    ("world-writable file", "is world-writable"),
    ("world-writable dir", "its directory"),
    ("missing", "No such file or directory"),
    ("not executable", "is not executable; the router ignores it"),
    ("relative path", "is not an absolute path"),
])
def test_hook_path_rules_of_the_router(host, breakage, words):
    """hook-protocol.md §1.1: each rule the router applies silently is reported, with the fix."""
    path = host.hook_dir / "ce-k8s-update"
    if breakage == "world-writable file":
        os.chmod(path, 0o777)
    elif breakage == "world-writable dir":
        os.chmod(host.hook_dir, 0o777)
    elif breakage == "missing":
        path.unlink()
    elif breakage == "not executable":
        os.chmod(path, 0o644)
    else:
        host.write_local("CE_K8S_HOOK_UPDATE_JOB_INFO = libexec/ce-k8s-update\n")
    code, found = doctor(host)
    assert code == 1
    level, line = found["hook-update"]
    assert level == "FAIL" and words in line and "fix: " in line, line
    if breakage == "world-writable dir":
        assert all(found[f"hook-{h}"][0] == "FAIL" for h in ("translate", "finalize", "cleanup"))
    else:
        assert found["hook-translate"][0] == "OK"


def test_hook_not_executable_by_pilot_accounts_warns(host):
    """hook-protocol.md §2.1: hooks run as the source job's owner, so group-only execute bits are a warning."""
    os.chmod(host.hook_dir / "ce-k8s-cleanup", 0o750)
    code, found = doctor(host)
    assert found["hook-cleanup"][0] == "WARN" and "pilot's Unix account" in found["hook-cleanup"][1]
    assert code == 0


def test_finalize_falls_back_to_the_old_job_exit_knob(host):
    """hook-protocol.md §1.1: <KW>_HOOK_JOB_EXIT is read when JOB_FINALIZE is undefined."""
    host.write_local(f"CE_K8S_HOOK_JOB_FINALIZE =\nCE_K8S_HOOK_JOB_EXIT = {host.hook_dir}/ce-k8s-finalize\n")
    code, found = doctor(host)
    expected = f"OK    hook-finalize: CE_K8S_HOOK_JOB_EXIT = {host.hook_dir}/ce-k8s-finalize"
    assert found["hook-finalize"] == ("OK", expected)
    assert code == 0


def test_launchers_talking_to_another_socket_warn(host):
    from ce_k8s.agent.launchers import install_hooks

    install_hooks(str(host.hook_dir), "/run/elsewhere/agent.sock", 5.0)
    code, found = doctor(host)
    assert all(found[f"hook-{h}"][0] == "WARN" and "/run/elsewhere/agent.sock" in found[f"hook-{h}"][1]
               for h in ("translate", "update", "finalize", "cleanup"))
    assert code == 0


def test_launchers_with_another_grid_resource_warn(host):
    """The hooks tell Kubernetes jobs from other backends' with the CE_K8S_GRID_RESOURCE their
    launchers fall back to (docs/routes.md, "CEs with other backends"); when it names other words
    than the CE's knob, they pass Kubernetes pilots through or claim other jobs, so doctor warns as
    for another socket. The words are compared as the hooks compare them."""
    from ce_k8s.agent.launchers import install_hooks

    hook_names = ("translate", "update", "finalize", "cleanup")
    install_hooks(str(host.hook_dir), str(host.socket), 5.0, grid_resource="batch kube")
    code, found = doctor(host)
    for h in hook_names:
        level, line = found[f"hook-{h}"]
        assert level == "WARN", line
        assert "GridResource starts with 'batch kube', but CE_K8S_GRID_RESOURCE is 'batch k8s'" in line
        assert f"fix: ce-k8s agent --install-hooks {host.hook_dir}" in line
    assert code == 0

    install_hooks(str(host.hook_dir), str(host.socket), 5.0, grid_resource="BATCH  K8s")
    code, found = doctor(host)
    assert all(found[f"hook-{h}"][0] == "OK" for h in hook_names), found

    # The CE's knob changed and the launchers were not written again; a launcher from before the
    # knob existed (no DEFAULT_GRID_RESOURCE line) falls back to the shipped "batch k8s".
    host.write_local('CE_K8S_GRID_RESOURCE = "batch kube"\n')
    install_hooks(str(host.hook_dir), str(host.socket), 5.0)
    old = host.hook_dir / "ce-k8s-update"
    old.write_text("".join(line for line in old.read_text().splitlines(keepends=True)
                           if "DEFAULT_GRID_RESOURCE" not in line))
    code, found = doctor(host)
    for h in hook_names:
        level, line = found[f"hook-{h}"]
        assert level == "WARN", line
        assert "GridResource starts with 'batch k8s', but CE_K8S_GRID_RESOURCE is 'batch kube'" in line
    assert code == 0


def test_attrs_to_copy_without_k8sattempt_fails(host):
    host.write_local("CE_K8S_ATTRS_TO_COPY = K8sPodName, K8sPodNamespace, K8sPodPhase, K8sPodReason, K8sNodeName\n")
    code, found = doctor(host)
    assert code == 1
    assert found["attrs-to-copy"][0] == "FAIL" and "K8sAttempt" in found["attrs-to-copy"][1]


def test_attrs_to_copy_without_the_pod_name_warns(host):
    host.write_local("CE_K8S_ATTRS_TO_COPY = K8sAttempt\n")
    code, found = doctor(host)
    assert code == 0
    assert found["attrs-to-copy"][0] == "WARN" and "K8sPodName" in found["attrs-to-copy"][1]


def test_agent_not_running_fails(bare_host):
    code, found = doctor(bare_host)
    assert code == 1
    level, line = found["agent"]
    assert level == "FAIL" and "not running" in line and "fix: start the agent" in line


def test_agent_socket_that_is_a_plain_file_fails(bare_host):
    bare_host.socket.parent.mkdir(parents=True, exist_ok=True)
    bare_host.socket.write_text("")
    code, found = doctor(bare_host)
    assert code == 1
    assert found["agent"][0] == "FAIL" and "is not a socket" in found["agent"][1]


def test_agent_socket_pilots_cannot_reach_warns(host):
    os.chmod(host.socket.parent, 0o700)
    code, found = doctor(host)
    assert code == 0
    assert found["agent"][0] == "WARN" and "pilot accounts cannot connect" in found["agent"][1]


def test_unreachable_api_fails_and_skips_rbac(host, tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text(open(host.kubeconfig).read().replace(host.server.url, "http://127.0.0.1:9"))
    os.chmod(bad, 0o600)
    code, found = doctor(host, "--kubeconfig", str(bad), "--timeout", "1")
    assert code == 1
    assert found["api"][0] == "FAIL" and "127.0.0.1:9" in found["api"][1]
    assert found["rbac"][0] == "SKIP"


def test_world_readable_kubeconfig_warns(host):
    os.chmod(host.kubeconfig, 0o644)
    code, found = doctor(host)
    assert code == 0
    assert found["api"][0] == "WARN" and "chmod 0600" in found["api"][1]


def test_missing_rbac_permission_fails_naming_it():
    """Every verb the agent uses is asked with a SelfSubjectAccessReview (the emulator answers them)."""
    rules = [
        {"verbs": ["create", "get", "delete"], "resources": ["pods", "pods/log"], "apiGroups": [""],
         "namespaces": [NAMESPACE]},
        {"verbs": ["create", "delete"], "resources": ["secrets"], "apiGroups": [""], "namespaces": [NAMESPACE]},
        {"verbs": ["list", "watch"], "resources": ["pods", "nodes", "resourcequotas"], "apiGroups": [""]},
    ]
    with ce_host(rules=rules) as h:
        h.start_agent()
        code, found = doctor(h)
    assert code == 1
    level, line = found["rbac"]
    assert level == "FAIL" and f"patch secrets in {NAMESPACE}" in line and "rbac.yaml" in line
    assert "create pods" not in line


USAGE_LESS_RULES = [
    {"verbs": ["create", "get", "delete"], "resources": ["pods", "pods/log"], "apiGroups": [""],
     "namespaces": [NAMESPACE]},
    {"verbs": ["create", "delete", "patch"], "resources": ["secrets"], "apiGroups": [""], "namespaces": [NAMESPACE]},
    {"verbs": ["list"], "resources": ["events"], "apiGroups": [""], "namespaces": [NAMESPACE]},
    {"verbs": ["list", "watch"], "resources": ["pods", "nodes", "resourcequotas"], "apiGroups": [""]},
]


def test_missing_node_stats_is_a_warning_about_cpu_accounting():
    """With the default CE_K8S_USAGE_SOURCE = kubelet the agent needs get nodes/stats (each kubelet
    asks the API server): without it CPU time is accounted as unknown and nothing else changes, so
    doctor warns and does not fail. nodes/proxy is not asked for: the agent does not use it."""
    with ce_host(rules=USAGE_LESS_RULES) as h:
        h.start_agent()
        code, found = doctor(h)
    level, line = found["rbac"]
    assert level == "WARN" and "get nodes/stats (cluster-wide)" in line and "unknown" in line, line
    assert "nodes/proxy" not in line and "CE_K8S_USAGE_SOURCE = kubelet" in line
    assert code == 0


def test_the_proxy_source_needs_node_proxy_and_none_needs_nothing():
    stats = {"verbs": ["get"], "resources": ["nodes/stats"], "apiGroups": [""]}
    for source, expected in (("proxy", "get nodes/proxy (cluster-wide)"), ("none", None)):
        with ce_host(rules=[*USAGE_LESS_RULES, stats]) as h:
            h.write_local(f"CE_K8S_USAGE_SOURCE = {source}\n", "99-zz-usage.conf")
            h.start_agent()
            code, found = doctor(h)
        level, line = found["rbac"]
        if expected:
            assert level == "WARN" and expected in line and "node proxy" in line, line
        else:
            assert level == "OK", line
        assert code == 0


def test_rbac_is_checked_in_every_namespace_a_route_uses():
    rules = [{"verbs": ["*"], "resources": ["*"], "apiGroups": [""], "namespaces": [NAMESPACE]}]
    with ce_host(rules=rules) as h:
        h.write_local('JOB_ROUTER_TRANSFORM_Zns @=tr\n  SET K8sNamespace "atlas-pilots"\n@tr\n'
                      "JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES) Zns\n",
                      "99-zz-namespace.conf")
        h.start_agent()
        code, found = doctor(h)
    assert code == 1
    assert "create pods in atlas-pilots" in found["rbac"][1]


def test_missing_spool_fails(host):
    host.spool.rmdir()
    code, found = doctor(host)
    assert code == 1
    assert found["spool"][0] == "FAIL" and "does not exist" in found["spool"][1]


def test_bad_timeout_is_a_usage_error(host):
    code, _ = run_cli("doctor", "--config", str(host.config_dir), "--timeout", "0")
    assert code == 2
