"""Shared set-up for the router emulator tests: fake hooks installed with safe modes, a config."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import classad2

HERE = Path(__file__).parent
HOOK_NAMES = ("translate", "update", "finalize", "cleanup")
T0 = 1760000000


class FakeClock:
    """The router's and schedd's clock; each test poll advances it by the polling period."""

    def __init__(self, now: float = T0) -> None:
        self.now = float(now)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def install_hooks(root: Path) -> Path:
    """Copy fake_hook.py as the four hooks: executable, not world-writable, parent neither (hook-protocol.md §1.1).

    The shebang is rewritten to this interpreter with -S: `#!/usr/bin/env python3` may hit a slow
    shim, and the router passes argv [path] only, so the file itself must be runnable.
    """
    hooks = root / "hooks"
    hooks.mkdir(mode=0o755, exist_ok=True)
    os.chmod(hooks, 0o755)
    body = (HERE / "fake_hook.py").read_text().split("\n", 1)[1]
    for name in HOOK_NAMES:
        path = hooks / name
        path.write_text(f"#!{sys.executable} -S\n{body}")
        os.chmod(path, 0o755)
    return hooks


def set_mode(hooks: Path, hook: str, mode: str, proc: int | None = None) -> None:
    suffix = f".{proc}" if proc is not None else ""
    (hooks / f"{hook}.mode{suffix}").write_text(mode)


def config_text(hooks: Path, max_idle: int = 50, max_jobs: int = 100, extra: str = "",
                hooks_enabled: tuple[str, ...] = HOOK_NAMES) -> str:
    knob = {"translate": "TRANSLATE_JOB", "update": "UPDATE_JOB_INFO", "finalize": "JOB_FINALIZE",
            "cleanup": "JOB_CLEANUP"}
    lines = [
        "JOB_ROUTER_NAME = htcondor-ce",
        "JOB_ROUTER_HOOK_KEYWORD = FAKE",
        "FAKE_ATTRS_TO_COPY = K8sPodPhase",
        "JOB_ROUTER_ROUTE_NAMES = K8s",
        "JOB_ROUTER_ROUTE_K8s @=jrt",
        "  UNIVERSE grid",
        '  GridResource = "batch k8s"',
        "  REQUIREMENTS JobUniverse == 5",
        f"  MaxIdleJobs = {max_idle}",
        f"  MaxJobs = {max_jobs}",
        "  SET RoutedJob True",
        "@jrt",
    ]
    lines += [f"FAKE_HOOK_{knob[h]} = {hooks / h}" for h in hooks_enabled]
    return "\n".join(lines) + "\n" + extra


def pilot(**extra: object) -> dict[str, object]:
    ad: dict[str, object] = {
        "Cmd": "glidein_startup.sh",
        "JobUniverse": 5,
        "Owner": "cmspilot",
        "RequestCpus": 8,
        "x509userproxy": "/var/lib/condor-ce/spool/4711/0/cluster4711.proc0.subproc0/x509up",
        # Condor-C's value (htcondor-ce.md §6.2): a completed pilot waits for its output stage-out.
        "LeaveJobInQueue": classad2.ExprTree("JobStatus == 4"),
    }
    ad.update(extra)
    return ad


def echo_hook(tmp_path: Path) -> tuple[Path, Path]:
    """A hook for the runners' hook-protocol.md §2.1 tests, and the file its escaped grandchild would create.

    It reads all of stdin, writes it reversed to stdout, writes `$ROUTER_ENV` (or "err") to stderr,
    starts a grandchild that creates the marker after 1 s unless the group is killed, and exits 3.
    """
    marker = tmp_path / "grandchild-ran"
    child = tmp_path / "child.py"
    child.write_text(f"import time\ntime.sleep(1)\nopen({str(marker)!r}, 'w').close()\n")
    script = tmp_path / "hook"
    script.write_text(f"#!{sys.executable} -S\n"
                      "import os, subprocess, sys\n"
                      "data = sys.stdin.buffer.read()\n"
                      "sys.stdout.buffer.write(data[::-1]); sys.stderr.write(os.environ.get('ROUTER_ENV', 'err'))\n"
                      f"subprocess.Popen([sys.executable, '-S', {str(child)!r}])\n"
                      "sys.exit(3)\n")
    script.chmod(0o755)
    return script, marker


def make_router(tmp_path: Path, **router_options: object):
    """(router, schedd, hooks dir, clock): the fake hooks installed, a schedd, and a Router built
    with `router_options` (spawn_threads, spawn_process...) on a fake clock."""
    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.sim.condor.router import Router
    from ce_k8s.sim.condor.schedd import Schedd

    clock = FakeClock(T0)
    hooks = install_hooks(tmp_path)
    config = CondorConfig.from_text(config_text(hooks), name=str(tmp_path / "condor_config"))
    schedd = Schedd(name="ce.example.org", clock=clock)
    router = Router(config, schedd, env={"FAKE_HOOK_DIR": str(hooks)}, hook_timeout=20, clock=clock,
                    **router_options)
    return router, schedd, hooks, clock


def step(router, clock, n: int = 1) -> None:
    """`n` polls, each settled (every hook exited and applied), with 10 s of fake time after each."""
    for _ in range(n):
        router.poll()
        assert router.settle(timeout=30)
        clock.advance(10)
