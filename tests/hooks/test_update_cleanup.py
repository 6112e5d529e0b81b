"""Update and cleanup hooks: exit codes and output chosen for the mildest consequence.

docs/hook-protocol.md §2.3: update exit != 0 = "no sync this cycle"; a parse error removes the
routed job, so nothing unsafe may be printed. hook-protocol.md §2.5: cleanup exit != 0 is retried every poll.
"""

from __future__ import annotations

import time

from ce_k8s import protocol
from ce_k8s.condor import wire

from .conftest import run_hook, source_ad

ROUTED = wire.sprint_ad(source_ad(K8sPodName="ce-4711-0-a0-0123456789", K8sAttempt=0, GridResource="batch k8s",
                                  JobUniverse=9)).encode()
# What the router hands our hooks for a job another backend's route took (docs/routes.md, "CEs
# with other backends"): VanillaToGrid set the route's GridResource, our translate added nothing.
SLURM = wire.sprint_ad(source_ad(GridResource="batch slurm", JobUniverse=9)).encode()


def env_for(agent):
    return {"CE_K8S_SOCKET": agent.path, "CE_K8S_HOOK_TIMEOUT": "3"}


def test_update_forwards_ad_and_prints_agent_lines(hook_dir, stub_agent):
    stub_agent.reply = (protocol.STATUS_OK, [b'JobStatus = 2\nGridJobStatus = "RUNNING"\n'])
    res = run_hook(hook_dir, "update", ROUTED, env_for(stub_agent))
    assert res.returncode == 0, res.stderr
    ad = wire.parse_hook_output(res.stdout.decode())
    assert ad["JobStatus"] == 2 and ad["GridJobStatus"] == "RUNNING"
    verb, payload, uid = stub_agent.requests[-1]
    assert verb == "update" and payload == ROUTED and uid == 0


def test_update_nothing_changed_prints_nothing(hook_dir, stub_agent):
    """hook-protocol.md §2.3: empty stdout with exit 0 is the normal "nothing new" reply."""
    res = run_hook(hook_dir, "update", ROUTED, env_for(stub_agent))
    assert res.returncode == 0 and res.stdout == b""


def test_update_agent_unreachable_means_no_sync(hook_dir, tmp_path):
    """hook-protocol.md §2.3: exit != 0 = no sync this cycle; never a parse error (which would remove the job)."""
    res = run_hook(hook_dir, "update", ROUTED, {"CE_K8S_SOCKET": str(tmp_path / "nothing.sock")})
    assert res.returncode == 1 and res.stdout == b""
    assert b"unreachable" in res.stderr


def test_update_agent_refusal_means_no_sync(hook_dir, stub_agent):
    for status in (protocol.STATUS_DENIED, protocol.STATUS_BUSY, protocol.STATUS_ERROR):
        stub_agent.reply = (status, [b"why"])
        res = run_hook(hook_dir, "update", ROUTED, env_for(stub_agent))
        assert res.returncode == 1 and res.stdout == b"", status


def test_update_refuses_unsafe_agent_output(hook_dir, stub_agent):
    """hook-protocol.md §8: never print ClusterId/Owner/JobUniverse/x509*/AuthToken*, comments or broken lines."""
    for bad in (b"ClusterId = 5\n", b"Owner = \"x\"\n", b"x509UserProxySubject = \"x\"\n",
                b"AuthTokenSubject = \"x\"\n", b"# comment\n", b"[ a = 1 ]\n", b"JobUniverse = 9\n",
                b"A =\n", b"'Q' = 1\n"):
        stub_agent.reply = (protocol.STATUS_OK, [b"JobStatus = 1\n" + bad])
        res = run_hook(hook_dir, "update", ROUTED, env_for(stub_agent))
        assert res.returncode == 1 and res.stdout == b"", bad


def test_update_deadline_exits_with_no_sync(hook_dir, stub_agent):
    """The router has no timeout (hook-protocol.md §0): the hook bounds its own call and exits 1, not by a signal."""
    stub_agent.delay = 3.0
    start = time.monotonic()
    res = run_hook(hook_dir, "update", ROUTED, {"CE_K8S_SOCKET": stub_agent.path, "CE_K8S_HOOK_TIMEOUT": "0.5"})
    assert time.monotonic() - start < 2.5
    assert res.returncode == 1 and res.stdout == b""


def test_update_oversized_stdin_refused_before_calling_agent(hook_dir, stub_agent):
    res = run_hook(hook_dir, "update", b"A = 1\n" * (800 * 1024), env_for(stub_agent))
    assert res.returncode == 1 and stub_agent.requests == []


def test_settings_file_used_when_environment_is_silent(hook_dir, stub_agent, tmp_path):
    """The hooks' own tiny config: used when the router's environment has no CE_K8S_SOCKET."""
    conf = tmp_path / "hooks.conf"
    conf.write_text(f"# test\nCE_K8S_SOCKET = {stub_agent.path}\nCE_K8S_HOOK_TIMEOUT = 2\n")
    res = run_hook(hook_dir, "update", ROUTED, {"CE_K8S_HOOKS_CONF": str(conf)})
    assert res.returncode == 0 and stub_agent.requests


def test_cleanup_ok_and_notfound_are_success(hook_dir, stub_agent):
    """hook-protocol.md §2.5, §8: "not found" is success."""
    for status in (protocol.STATUS_OK, protocol.STATUS_NOTFOUND):
        stub_agent.reply = (status, [b""])
        res = run_hook(hook_dir, "cleanup", ROUTED, env_for(stub_agent))
        assert res.returncode == 0, status
    assert stub_agent.requests[-1][0] == "cleanup"


def test_cleanup_failure_is_retried(hook_dir, stub_agent, tmp_path):
    """hook-protocol.md §2.5: non-zero exit = retried on the next poll; that is what we want until the pod is gone."""
    stub_agent.reply = (protocol.STATUS_ERROR, [b"API down"])
    assert run_hook(hook_dir, "cleanup", ROUTED, env_for(stub_agent)).returncode == 1
    res = run_hook(hook_dir, "cleanup", ROUTED, {"CE_K8S_SOCKET": str(tmp_path / "none.sock")})
    assert res.returncode == 1


def test_cleanup_without_pod_name_needs_no_agent(hook_dir, tmp_path):
    """A routed ad that never got our translate output has no pod: nothing to delete."""
    plain = wire.sprint_ad(source_ad(GridResource="batch k8s")).encode()
    res = run_hook(hook_dir, "cleanup", plain, {"CE_K8S_SOCKET": str(tmp_path / "none.sock")})
    assert res.returncode == 0


# -- another backend's jobs (docs/routes.md, "CEs with other backends") ---------------------------

def test_other_backends_job_needs_no_agent_for_update_or_cleanup(hook_dir, tmp_path):
    """A `batch slurm` routed job: update and cleanup exit 0 with empty stdout and stderr although
    the agent's socket does not exist (another backend's job never depends on our agent), even when
    the job brought a K8sPodName of its own (translate passes such ads through unchanged)."""
    env = {"CE_K8S_SOCKET": str(tmp_path / "none.sock")}
    claimed = wire.sprint_ad(source_ad(GridResource="batch slurm", K8sPodName="ce-4711-0-a0-0123456789")).encode()
    for hook in ("update", "cleanup"):
        for ad in (SLURM, claimed):
            res = run_hook(hook_dir, hook, ad, env)
            assert (res.returncode, res.stdout, res.stderr) == (0, b"", b""), (hook, res.stderr)


def test_other_backends_job_never_reaches_a_running_agent(hook_dir, stub_agent):
    stub_agent.reply = (protocol.STATUS_OK, [b"JobStatus = 2\n"])
    for hook in ("update", "cleanup"):
        res = run_hook(hook_dir, hook, SLURM, env_for(stub_agent))
        assert res.returncode == 0 and res.stdout == b"", hook
    assert stub_agent.requests == []


def test_routed_ad_without_grid_resource_is_not_ours(hook_dir, stub_agent):
    """No GridResource at all (a route that defines none, like a vanilla-universe route): not ours."""
    plain = wire.sprint_ad(source_ad(K8sPodName="ce-4711-0-a0-0123456789")).encode()
    for hook in ("update", "cleanup"):
        res = run_hook(hook_dir, hook, plain, env_for(stub_agent))
        assert (res.returncode, res.stdout) == (0, b""), hook
    assert stub_agent.requests == []


def test_grid_resource_words_compare_case_insensitively(hook_dir, stub_agent):
    """The rule compares leading words: extra words after the knob's, other spacing and case match;
    a longer first word (`k8sx`) or a prefix of the knob (`batch`) does not."""
    for value, ours in (("BATCH  K8s", True), ("batch k8s cluster-b", True), ("batch\tk8s", True),
                        ("batch k8sx", False), ("batch", False), ("k8s", False), ("", False)):
        ad = wire.sprint_ad(source_ad(K8sPodName="ce-4711-0-a0-0123456789", GridResource=value)).encode()
        before = len(stub_agent.requests)
        res = run_hook(hook_dir, "update", ad, env_for(stub_agent))
        assert res.returncode == 0, value
        assert len(stub_agent.requests) == before + int(ours), value


def test_knob_changes_the_rule_from_environment_and_hooks_conf(hook_dir, stub_agent, tmp_path):
    """CE_K8S_GRID_RESOURCE reaches the hooks like CE_K8S_SOCKET: environment first, then hooks.conf,
    then the launcher's baked-in default (`batch k8s` for this hook_dir)."""
    env = {**env_for(stub_agent), "CE_K8S_GRID_RESOURCE": "batch slurm"}
    assert run_hook(hook_dir, "update", ROUTED, env).returncode == 0 and stub_agent.requests == []
    assert run_hook(hook_dir, "update", SLURM, env).returncode == 0
    assert [r[1] for r in stub_agent.requests] == [SLURM]
    conf = tmp_path / "hooks.conf"
    conf.write_text('CE_K8S_GRID_RESOURCE = "Batch Slurm"\n')       # quotes dropped, as Settings does
    env = {**env_for(stub_agent), "CE_K8S_HOOKS_CONF": str(conf)}
    slurm_pod = wire.sprint_ad(source_ad(GridResource="batch slurm", K8sPodName="ce-4711-0-a0-0123456789")).encode()
    assert run_hook(hook_dir, "cleanup", slurm_pod, env).returncode == 0
    assert run_hook(hook_dir, "cleanup", ROUTED, env).returncode == 0
    assert [r[0] for r in stub_agent.requests] == ["update", "cleanup"]
    # the environment wins over hooks.conf; blank counts as unset
    env["CE_K8S_GRID_RESOURCE"] = "batch k8s"
    assert run_hook(hook_dir, "update", ROUTED, env).returncode == 0
    env["CE_K8S_GRID_RESOURCE"] = "   "                             # blank = unset: hooks.conf applies
    assert run_hook(hook_dir, "update", SLURM, env).returncode == 0
    assert [r[1] for r in stub_agent.requests][-2:] == [ROUTED, SLURM]


def test_a_job_string_cannot_pose_as_the_routed_grid_resource(hook_dir, stub_agent):
    """sPrintAd writes a string's raw newline as is (docs/hook-protocol.md §2.2), so a Slurm job's
    text can put a line that starts `GridResource = ` into the routed ad. Such a line cannot be a
    plain string literal (its first bare `"` closes the other string), so it never counts: the job
    stays another backend's, and a Kubernetes job cannot hide from cleanup that way either."""
    from ce_k8s.hooks._common import ad_grid_resource

    tricks = ['x\nGridResource = "batch k8s"', 'x\nGridResource = ', 'x\n GridResource = " == "batch k8s']
    for trick in tricks:
        slurm = wire.sprint_ad(source_ad(GridResource="batch slurm", Zzz=trick, Aaa=trick)).encode()
        assert ad_grid_resource(slurm) == "batch slurm", trick
        res = run_hook(hook_dir, "update", slurm, env_for(stub_agent))
        assert res.returncode == 0 and res.stdout == b""
        k8s = wire.sprint_ad(source_ad(GridResource="batch k8s", Zzz=trick.replace("k8s", "slurm"),
                                       K8sPodName="ce-4711-0-a0-0123456789")).encode()
        assert ad_grid_resource(k8s) == "batch k8s", trick
    assert stub_agent.requests == []
    assert run_hook(hook_dir, "cleanup", k8s, env_for(stub_agent)).returncode == 0
    assert [r[0] for r in stub_agent.requests] == ["cleanup"]
    import classad2

    # an expression puts a bare `"` at the start of the forged line; the bare `"` inside disqualifies it
    forged = source_ad(GridResource="batch slurm", Zzz=classad2.ExprTree('"x\\nGridResource = " == "batch k8s"'))
    text = wire.sprint_ad(forged)
    assert '\nGridResource = " == "batch k8s"\n' in text
    assert ad_grid_resource(text.encode()) == "batch slurm"
    expr = wire.sprint_ad(source_ad(GridResource="batch slurm")).replace(
        'GridResource = "batch slurm"', 'GridResource = strcat("batch", " k8s")').encode()
    assert ad_grid_resource(expr) is None            # only a string literal counts; nothing is evaluated
