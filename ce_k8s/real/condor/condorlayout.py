"""The names and paths of one real-HTCondor bed: its state directory, its root, its schedds.

What a test, a demo or the bed itself needs to find something of the bed: the spool and socket
in the state directory, the daemons' logs in the root, each schedd's Name in the collector, the
CONDOR_CONFIG a command runs with. The CE's own configuration (ce_k8s.real.condor.stockce)
names some of these differently and overrides them here.
"""

from __future__ import annotations

import os
from pathlib import Path

HOOK_DIR = "/usr/libexec/ce-k8s"     # the launchers, inside the root (0755: the router refuses
                                     # a hook in a world-writable directory)
COLLECTOR_PORT = 19618
CE_SCHEDD = "ce"
FACTORY_SCHEDD = "factory"
#: The batch pool's schedd (`RealCondor(batch=True)`; docs/real-condor.md, "The batch pool").
BATCH_SCHEDD = "batch"
#: The account the batch pool's token maps to (`RealCondor.batch_token`): its jobs run as this uid.
BATCH_ACCOUNT = "htcuser"
#: The batch startd's static slots, whatever the machine has (2 cores here): enough for a few jobs at once.
BATCH_SLOTS = 4
BATCH_SLOT_MEMORY = 1024           # MB per slot; MEMORY = BATCH_SLOTS * this


class RealCondorError(RuntimeError):
    """The environment cannot be built or started; the message says what to do."""


class CondorLayout:
    """Where the parts of one bed are: `state_dir` (spool, socket, kubeconfig, logs of ours) and
    `root` (the chroot with HTCondor's own files)."""

    def __init__(self, state_dir: Path | str, root: Path | str, batch: bool = False) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.root = Path(root).absolute()
        self.state_file = self.state_dir / "state.json"
        self.batch = batch

    # -------------------------------------------------------------------------- the state directory
    @property
    def spool(self) -> Path:
        return self.state_dir / "spool"

    @property
    def socket(self) -> Path:
        return self.state_dir / "run" / "agent.sock"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def blah_log(self) -> Path:
        return self.state_dir / "blah-calls.log"

    @property
    def batch_spool(self) -> Path:
        return self.state_dir / f"{BATCH_SCHEDD}-spool"

    # -------------------------------------------------------------------------- names in the pool
    @property
    def ce_name(self) -> str:
        """The CE schedd's Name in the collector (HTCondor appends `@<host>` to SCHEDD_NAME)."""
        return f"{CE_SCHEDD}@{os.uname().nodename}"

    @property
    def factory_name(self) -> str:
        return f"{FACTORY_SCHEDD}@{os.uname().nodename}"

    @property
    def grid_resource(self) -> str:
        """What the factory's grid jobs name: `condor <CE schedd> <CE collector>`."""
        return f"condor {self.ce_name} 127.0.0.1:{COLLECTOR_PORT}"

    @property
    def batch_name(self) -> str:
        """The batch schedd's Name in the collector (`batch@<host>`), what a client locates."""
        return f"{BATCH_SCHEDD}@{os.uname().nodename}"

    @property
    def collector_address(self) -> str:
        """The pool's collector as a client outside the root names it (`htcondor2.Collector(...)`)."""
        return f"127.0.0.1:{COLLECTOR_PORT}"

    # -------------------------------------------------------------------------- the root
    def condor_config_for(self, args: list[str]) -> str:
        """The CONDOR_CONFIG a command in the root runs with (one configuration here; the CE's own
        configuration mode, ce_k8s.real.condor.stockce, has two hosts' worth)."""
        return "/etc/condor/condor_config"

    def log_path(self, name: str) -> Path:
        """A daemon log of the root (`SchedLog`, `JobRouterLog`, `GridmanagerLog.<owner>`, ...)."""
        return self.root / "var/log/condor" / name

    def _read_log(self, name: str) -> str:
        try:
            return self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""

    def _root_uid(self, name: str) -> int:
        """The uid of `name` in the root's /etc/passwd (the root's accounts are not the host's)."""
        for line in (self.root / "etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == name:
                return int(fields[2])
        raise RealCondorError(f"no account {name!r} in {self.root}/etc/passwd")
