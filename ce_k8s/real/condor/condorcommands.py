"""Commands in a real-HTCondor bed's root, and what its daemons answer.

Every command runs inside the root with the root's configuration (`run`); the queries read
the schedds as HTCondor's own tools print them (`condor_q -json`, `condor_history -json`), and
`batch_token` asks `condor_token_create` for an IDTOKEN signed with the pool's key.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from functools import cached_property
from pathlib import Path

from ce_k8s.real.condor.condorlayout import BATCH_ACCOUNT, BATCH_SLOTS, CondorLayout, RealCondorError
from ce_k8s.real.processes import processes_in


class CondorCommands(CondorLayout):
    """`run` a command in the root; the schedds' queues and histories; the agent's processes;
    the pool's UID_DOMAIN and tokens; whether every daemon answers."""

    def run(self, args: list[str], *, user: str | None = None, input: str | None = None,
            check: bool = True, timeout: float = 120, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command inside the root (as `user` if given), with the root's HTCondor config."""
        cmd = ["chroot"]
        if user:
            cmd.append(f"--userspec={user}:{user}")
        cmd += [str(self.root)]
        if cwd:
            cmd += ["/bin/sh", "-c", 'cd "$0" && exec "$@"', cwd]
        cmd += args
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CONDOR_CONFIG": self.condor_config_for(args),
               "LANG": "C", "HOME": f"/home/{user}" if user else "/root"}
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout,
                              env=env, check=False)
        if check and proc.returncode != 0:
            raise RealCondorError(f"{' '.join(args)} failed ({proc.returncode}): "
                                  f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        return proc

    def query(self, constraint: str = "true", attrs: tuple[str, ...] = (), schedd: str | None = None) -> list[dict]:
        """`condor_q -json` of every user's jobs on the CE schedd (or `schedd`) as dicts."""
        args = ["condor_q", "-allusers", "-json", "-constraint", constraint]
        if schedd:
            args += ["-name", schedd]
        if attrs:
            args += ["-attributes", ",".join(attrs)]
        out = self.run(args).stdout.strip()
        return json.loads(out) if out else []

    def history(self, constraint: str = "true", attrs: tuple[str, ...] = (), schedd: str | None = None) -> list[dict]:
        """`condor_history -json` of the CE schedd (its history file), or of the schedd named `schedd`
        (asked over the wire: another schedd's history is in its own spool)."""
        args = ["condor_history", "-json", "-constraint", constraint]
        if schedd:
            args += ["-name", schedd]
        if attrs:
            args += ["-attributes", ",".join(attrs)]
        out = self.run(args, check=False).stdout.strip()
        return json.loads(out) if out.startswith("[") else []

    def agent_pids(self) -> list[int]:
        """The ce-k8s agent processes condor_master runs in the root (its wrapper execs `ce-k8s agent`)."""
        pids = []
        for pid in processes_in(self.root):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(c.endswith(b"/ce-k8s") for c in cmd[:2]) and b"agent" in cmd:
                pids.append(pid)
        return pids

    @cached_property
    def uid_domain(self) -> str:
        """The root's UID_DOMAIN (the host's name unless configured): the domain a token's identity
        must carry for the starter to run the job as the account it names."""
        return self.run(["condor_config_val", "UID_DOMAIN"]).stdout.strip()

    def batch_token(self, identity: str | None = None) -> str:
        """An IDTOKEN for the batch pool, made by HTCondor's own `condor_token_create` in the root from
        the signing key `up` wrote; `identity` defaults to `htcuser@<UID_DOMAIN>`.

        A client outside the root presents it (IDTOKENS). The schedd takes the identity as the job's
        `User` and its user part as `Owner`, and the starter runs the job as that account of the
        root. The default's domain is UID_DOMAIN, so `User` reads as a local submitter's would; a
        token for `htcuser@other.example` also ran as `htcuser` (measured), so the domain is not what
        decides the uid. The token carries no authorization limits: the identity's rights are the
        pool's ALLOW_* for it (all of them, in this bed).
        """
        if not self.batch:
            raise RealCondorError("batch_token: this bed has no batch pool; bring it up with "
                                  "RealCondor(..., batch=True) (`ce-k8s testbed real-condor up --batch`)")
        identity = identity or f"{BATCH_ACCOUNT}@{self.uid_domain}"
        token = self.run(["condor_token_create", "-identity", identity, "-key", "POOL"]).stdout.strip()
        if not token:
            raise RealCondorError("condor_token_create printed no token")
        return token

    def wait_ready(self, timeout: float = 90, progress=print) -> None:
        """Until the CE schedd, the factory schedd and the job router answer, and the agent pings; with
        the batch pool, also until the batch schedd answers and every slot is in the collector
        (a test's first batch job would otherwise wait for the startd's first update)."""
        from ce_k8s import protocol

        deadline = time.monotonic() + timeout
        need = {"ce schedd", "factory schedd", "job router", "agent"}
        if self.batch:
            need |= {"batch schedd", "batch slots"}
        while need and time.monotonic() < deadline:
            if "batch schedd" in need and self.run(["condor_q", "-totals", "-name", self.batch_name],
                                                   check=False).returncode == 0:
                need.discard("batch schedd")
            if "batch slots" in need:
                slots = self.run(["condor_status", "-af", "Name"], check=False).stdout.split()
                if len(slots) >= BATCH_SLOTS:
                    need.discard("batch slots")
            if "ce schedd" in need and self.run(["condor_q", "-totals"], check=False).returncode == 0:
                need.discard("ce schedd")
            if "factory schedd" in need and self.run(["condor_q", "-totals", "-name", self.factory_name],
                                                     check=False).returncode == 0:
                need.discard("factory schedd")
            if "job router" in need and "JobRouter: Checking for candidate jobs" in self._read_log("JobRouterLog"):
                need.discard("job router")
            if "agent" in need:
                with contextlib.suppress(OSError, protocol.ProtocolError):
                    if protocol.ask(str(self.socket), protocol.VERB_PING, b"", 2).status == protocol.STATUS_OK:
                        need.discard("agent")
            if need:
                time.sleep(0.5)
        if need:
            raise RealCondorError(f"not ready after {timeout:.0f} s: {', '.join(sorted(need))} "
                                  f"(logs in {self.root}/var/log/condor)")
