"""The pilot image's entry point: a glidein's work, in a pod (docs/pilot.md).

    /usr/local/bin/ce-k8s-pilot        (the image's Cmd; no arguments)

What GlideinWMS's glidein_startup.sh and condor_startup.sh do on a worker node, for a pod: read
the credential from its mounted file, size the startd from what Kubernetes gave the pod
(`ce_k8s.pilot.sizing`), write a startd-only condor_config (`ce_k8s.pilot.pilotconfig`), run
`condor_master -f`, check within `CE_K8S_PILOT_JOIN_TIMEOUT` that the startd's ad reached the
collector (a wrong token fails fast, with its reason on stderr, which the factory reads as the
pod's log), forward SIGTERM for a graceful shutdown (the startd vacates its jobs), stop the master
itself at `GLIDEIN_ToDie`, and exit with a code that says why the pilot ended (`Exit`).

The exit codes (docs/pilot.md has the same table):

====  ==========  =====================================================================
code  name        the pilot ended because
====  ==========  =====================================================================
0     IDLE        the startd shut itself down idle (STARTD_NOCLAIM_SHUTDOWN), after
                  serving jobs or none; the master followed it out
1     FAILED      condor_master failed or died on its own, or the entry point broke
2     CONFIG      the pod's environment cannot describe a pilot (no collector, a bad
                  number, a deadline too short, run as root)
3     TOKEN       the credential is missing, unreadable, malformed or expired, or the
                  collector rejected it (found in the daemons' logs or the query's error)
4     COLLECTOR   the collector could not be reached, or the startd's ad never arrived
                  within CE_K8S_PILOT_JOIN_TIMEOUT
5     DEADLINE    GLIDEIN_ToDie came: the master was stopped gracefully (jobs vacated)
                  before the pod's activeDeadlineSeconds
143   SIGTERM     the pod got SIGTERM (deleted, evicted, drained): forwarded to the master,
                  jobs vacated, then exit; 128 + 15, what Kubernetes shows for a container
                  ended by SIGTERM, and what ce-k8s's agent reads as "killed"
====  ==========  =====================================================================
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from ce_k8s.pilot import pilotconfig, sizing
from ce_k8s.pilot.pilotconfig import ConfigError, PilotSettings, Token, TokenError

CONDOR_MASTER = "/usr/sbin/condor_master"
CONDOR_STATUS = "/usr/bin/condor_status"
#: Between two looks at the master, the logs and the collector while starting.
POLL_SECONDS = 0.5
JOIN_QUERY_EVERY = 2.0
#: After the grace, SIGQUIT (a fast shutdown); this long after it, SIGKILL.
QUIT_SECONDS = 5.0
#: What a daemon or a client logs when the other side refused its credential (HTCondor 25's words).
AUTH_FAILURE = re.compile(
    r"AUTHENTICATE:\d+:|SECMAN:2010|PERMISSION DENIED|Failed to authenticate|"
    r"(?i:token)[^\n]*(?:reject|invalid|not (?:valid|accepted)|verif)")
LOG_NAMES = ("MasterLog", "StartLog")
#: condor_master's exit status after its DAEMON_SHUTDOWN expression stopped it (so that a service
#: manager does not restart it): here, the startd left and `MASTER.DAEMON_SHUTDOWN` followed.
MASTER_DAEMON_SHUTDOWN = 99
#: What the startd logs when STARTD_NOCLAIM_SHUTDOWN stops it.
IDLE_SHUTDOWN = re.compile(r"No resources have been claimed for \d+ seconds")


class Exit(IntEnum):
    """Why the pilot ended (the module docstring's table)."""

    IDLE = 0
    FAILED = 1
    CONFIG = 2
    TOKEN = 3
    COLLECTOR = 4
    DEADLINE = 5
    SIGTERM = 143


def say(message: str) -> None:
    """One line on stderr: the pod's log, which the factory and `kubectl logs` see."""
    print(f"ce-k8s pilot: {message}", file=sys.stderr, flush=True)


def child_environment(env: dict[str, str], token: Token, condor_config: Path) -> dict[str, str]:
    """The master's environment: no `_CONDOR_*` override from the pod (as glidein_startup.sh
    clears them), no variable that holds the token, and CONDOR_CONFIG naming the pilot's file."""
    out = {k: v for k, v in env.items()
           if not k.upper().startswith("_CONDOR_") and k != "CONDOR_CONFIG" and token.text not in v}
    out["CONDOR_CONFIG"] = str(condor_config)
    out.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return out


def prepare(s: PilotSettings, size: sizing.Size, token: Token, pilot_id: str) -> Path:
    """LOCAL_DIR's directories, the token's copy (0600) and the condor_config; returns its path."""
    for sub in ("log", "spool", "execute", "lock", "run"):
        (s.local_dir / sub).mkdir(parents=True, exist_ok=True)
    for private in ("tokens.d", "passwords.d"):
        (s.local_dir / private).mkdir(mode=0o700, parents=True, exist_ok=True)
        (s.local_dir / private).chmod(0o700)
    copy = pilotconfig.token_path(s)
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token.text + "\n")
    config = s.local_dir / "condor_config"
    config.write_text(pilotconfig.condor_config(s, size, token, pilot_id))
    return config


def reachable(address: tuple[str, int], timeout: float = 3.0) -> str | None:
    """None if a TCP connection to the collector opens, else why not."""
    try:
        with socket.create_connection(address, timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def auth_failure(log_dir: Path, extra: str = "") -> str | None:
    """The first line of the daemons' logs (or `extra`, a client's stderr) saying a credential was refused."""
    texts = [extra]
    for name in LOG_NAMES:
        try:
            texts.append((log_dir / name).read_text(errors="replace"))
        except OSError:
            continue
    for text in texts:
        for line in text.splitlines():
            if AUTH_FAILURE.search(line):
                return line.strip()[:400]
    return None


def idle_shutdown(log_dir: Path) -> bool:
    """The startd's log says STARTD_NOCLAIM_SHUTDOWN stopped it."""
    try:
        return bool(IDLE_SHUTDOWN.search((log_dir / "StartLog").read_text(errors="replace")))
    except OSError:
        return False


@dataclass
class Supervisor:
    """The master and the pilot's reasons to stop it; `run` returns the exit code."""

    s: PilotSettings
    env: dict[str, str]
    pilot_id: str
    clock: Callable[[], float] = time.time
    master: subprocess.Popen | None = None
    reason: Exit | None = None
    detail: str = ""
    joined: bool = False
    stop_sent: float | None = None
    quit_sent: float | None = None
    terminated: bool = False
    _next_query: float = 0.0
    _last_unreachable: str | None = field(default=None, repr=False)

    def on_sigterm(self, signum: int, _frame: object) -> None:
        self.terminated = True

    def stop(self, reason: Exit, detail: str, fast: bool = False) -> None:
        """Ask the master to shut down: SIGTERM (graceful: the startd vacates its jobs) or, when
        no job can be running yet (a refused credential), SIGQUIT (fast)."""
        if self.reason is None:
            self.reason, self.detail = reason, detail
            say(detail)
        if self.master is None or self.master.poll() is not None or self.stop_sent is not None:
            return
        self.stop_sent = self.clock()
        self.master.send_signal(signal.SIGQUIT if fast else signal.SIGTERM)
        if fast:
            self.quit_sent = self.stop_sent

    def _escalate(self) -> None:
        if self.stop_sent is None or self.master is None:
            return
        now = self.clock()
        if self.quit_sent is None and now - self.stop_sent > self.s.grace_seconds:
            say(f"the master is still up {self.s.grace_seconds} s after SIGTERM: SIGQUIT")
            self.quit_sent = now
            self.master.send_signal(signal.SIGQUIT)
        elif self.quit_sent is not None and now - self.quit_sent > QUIT_SECONDS:
            say("the master is still up after SIGQUIT: SIGKILL")
            self.master.kill()

    def _query(self) -> tuple[bool, str]:
        """(the startd's ad is in the collector, the query's stderr)."""
        try:
            proc = subprocess.run(
                [CONDOR_STATUS, "-startd", "-constraint", f'CE_K8S_PILOT_ID == "{self.pilot_id}"', "-af", "Name"],
                capture_output=True, text=True, timeout=15, env=self.env, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)
        return proc.returncode == 0 and bool(proc.stdout.strip()), proc.stderr

    def _check_join(self) -> None:
        now = self.clock()
        log_dir = self.s.local_dir / "log"
        if now >= self._next_query:
            self._next_query = now + JOIN_QUERY_EVERY
            self._last_unreachable = reachable(self.s.collector_address)
            if self._last_unreachable is None:
                joined, stderr = self._query()
                if joined:
                    self.joined = True
                    say(f"the startd {self.s.name} joined the collector {self.s.collector}")
                    return
                refused = auth_failure(log_dir, stderr)
                if refused:
                    self.stop(Exit.TOKEN, f"the collector {self.s.collector} refused the pilot's token: {refused}",
                              fast=True)
                    return
        if now - self.s.times.start > self.s.join_timeout:
            refused = auth_failure(log_dir)
            if refused:
                self.stop(Exit.TOKEN, f"the collector {self.s.collector} refused the pilot's token: {refused}",
                          fast=True)
            elif self._last_unreachable is not None:
                self.stop(Exit.COLLECTOR, f"the collector {self.s.collector} is unreachable "
                                          f"({self._last_unreachable}) after {self.s.join_timeout} s", fast=True)
            else:
                self.stop(Exit.COLLECTOR, f"the startd's ad did not reach the collector {self.s.collector} "
                                          f"within {self.s.join_timeout} s (may the token's identity "
                                          "advertise a startd there?)", fast=True)

    def run(self) -> Exit:
        self.master = subprocess.Popen([CONDOR_MASTER, "-f"], env=self.env, stdin=subprocess.DEVNULL)
        say(f"condor_master -f started (pid {self.master.pid})")
        while True:
            try:
                code = self.master.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                break
            if self.terminated:
                self.stop(Exit.SIGTERM, "SIGTERM: shutting the startd down gracefully (running jobs are vacated)")
            elif self.s.times.die is not None and self.clock() >= self.s.times.die:
                self.stop(Exit.DEADLINE, "GLIDEIN_ToDie reached: shutting down before the pod's deadline "
                                         "(running jobs are vacated)")
            elif not self.joined and self.reason is None:
                self._check_join()
            self._escalate()
        if self.reason is not None:
            return self.reason
        if self.s.times.die is not None and self.clock() >= self.s.times.die:
            # the startd's own STARTD.DAEMON_SHUTDOWN came first: the same deadline
            say("GLIDEIN_ToDie reached: the startd shut itself down before the pod's deadline")
            return Exit.DEADLINE
        if code in (0, MASTER_DAEMON_SHUTDOWN):
            if not self.joined:
                refused = auth_failure(self.s.local_dir / "log")
                if refused:
                    say(f"the master ended before the startd joined; the token was refused: {refused}")
                    return Exit.TOKEN
            if idle_shutdown(self.s.local_dir / "log"):
                say("the startd shut down idle; the master followed it")
                return Exit.IDLE
            say(f"the startd ended without an idle shutdown: see {self.s.local_dir / 'log' / 'StartLog'}")
            return Exit.FAILED
        say(f"condor_master exited with {code}: see {self.s.local_dir / 'log' / 'MasterLog'}")
        return Exit.FAILED


def main(env: dict[str, str] | None = None, host: sizing.Host | None = None) -> int:
    """Read, size, configure, run, and say why it ended (the exit code)."""
    env = dict(os.environ) if env is None else env
    # SIGTERM may come before the master runs (a pod deleted at once): nothing to vacate then.
    early: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _f: early.append(signum))
    try:
        s = pilotconfig.settings_from_env(env)
        token = pilotconfig.read_token(s.token_file)
        size = sizing.size(env, host)
    except (ConfigError, sizing.SizingError) as exc:
        say(f"configuration: {exc}")
        return Exit.CONFIG
    except TokenError as exc:
        say(f"token: {exc}")
        return Exit.TOKEN
    if os.geteuid() == 0:
        say("refusing to run as root: the pilot runs as the image's unprivileged user (runAsNonRoot)")
        return Exit.CONFIG
    pilot_id = uuid.uuid4().hex
    try:
        config = prepare(s, size, token, pilot_id)
    except OSError as exc:
        say(f"configuration: cannot write {s.local_dir} ({exc.strerror}): it must be a writable "
            "directory of the pod (an emptyDir)")
        return Exit.CONFIG
    times = "" if s.times.die is None else (
        f", retires in {int(s.times.retire - s.times.start)} s, dies in {int(s.times.die - s.times.start)} s")
    devices = f" ({', '.join(size.gpu_ids)})" if size.gpu_ids else ""
    say(f"{s.name}: {size.cpus} CPUs ({size.sources['cpus']}), {size.memory_mb} MB ({size.sources['memory']}), "
        f"{size.gpus} GPUs{devices}; collector {s.collector}; {token.kind} for {token.identity}; "
        f"idle shutdown {s.idle_seconds} s{times}")
    sup = Supervisor(s, child_environment(env, token, config), pilot_id)
    signal.signal(signal.SIGTERM, sup.on_sigterm)
    if early:
        say("SIGTERM before the master started: nothing to vacate")
        return Exit.SIGTERM
    try:
        code = sup.run()
    except OSError as exc:
        say(f"cannot run {CONDOR_MASTER}: {exc}")
        return Exit.FAILED
    say(f"exit {int(code)} ({code.name})")
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())
