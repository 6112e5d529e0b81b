"""Host sysctls a bed changes, given back when the last bed that changed them goes down.

Two beds change machine-wide settings: a real node's kubelet rewrites `vm.overcommit_memory`,
`vm.panic_on_oom`, `kernel.panic`, `kernel.panic_on_oops` and the root key quotas when it starts
(pkg/kubelet/cm/container_manager_linux.go setupKernelTunables, the default "Modify" behaviour), and
a real-HTCondor bed reserves its fixed ports (`net.ipv4.ip_local_reserved_ports`,
ce_k8s.real.condor.ports). A bed that saved the values before its own change and wrote them back at
its own `down` was right only while beds nested: two beds whose lives overlap without nesting (the
CI run at 31852a5 gave both pytest workers one) leave the second one's "before" (the first one's
values) on the host for good.

So the machine keeps one ledger per set of settings (:data:`LEDGER` for the kubelet's): the values
found before the first bed changed them, and the beds that hold them (each by its state file). The
first `hold` saves the values; each `release` drops its bed; the release that leaves nobody writes
the values back and removes the ledger. A holder whose state file is gone (a bed removed without
`down`) no longer counts. The ledger lives on `/run`, a tmpfs: a reboot clears it, as it clears
what the beds wrote. Beds in different processes take turns by an exclusive `flock` on the ledger's
directory (`/run` itself), so no lock file is left behind: with no bed up, the machine has nothing
of ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

KUBELET_SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
                   "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes")
LEDGER = Path("/run/ce-k8s-kubelet-sysctls.json")
PROC_SYS = Path("/proc/sys")


def read_sysctls(names: tuple[str, ...] = KUBELET_SYSCTLS, proc: Path = PROC_SYS) -> dict[str, str]:
    return {n: (proc / Path(*n.split("."))).read_text().strip() for n in names}


def write_sysctls(values: dict[str, str], proc: Path = PROC_SYS) -> None:
    for name, value in values.items():
        (proc / Path(*name.split("."))).write_text(value + "\n")


class SysctlLedger:
    """The machine's one record of the host's own values of `names` and of the beds that changed them."""

    def __init__(self, path: Path | str = LEDGER, proc: Path = PROC_SYS,
                 names: tuple[str, ...] = KUBELET_SYSCTLS) -> None:
        self.path = Path(path)
        self.proc = proc
        self.names = names

    @contextlib.contextmanager
    def _book(self) -> Iterator[dict]:
        """The ledger's content under an exclusive lock; written back (or removed, when nobody holds
        it) on leaving. A torn or unreadable ledger is an error, never a silent fresh start: its
        values may be the only record of the host's own."""
        lock = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                book = json.loads(self.path.read_text()) if self.path.exists() else {"saved": {}, "holders": []}
            except ValueError as exc:
                raise RuntimeError(f"{self.path}: not a sysctl ledger ({exc}); it names the host's own "
                                   "values before any bed changed them: restore them by hand, then remove "
                                   "it") from exc
            yield book
            if book["holders"]:
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_text(json.dumps(book, indent=1) + "\n")
                os.replace(tmp, self.path)
            else:
                self.path.unlink(missing_ok=True)
        finally:
            os.close(lock)          # the lock goes with the descriptor

    def hold(self, holder: str, change: Callable[[], None] | None = None) -> dict[str, str]:
        """`holder` (a bed's state file) is about to change the settings. Returns the host's own values:
        read now when there is no ledger, else the ones its first holder saved (also when every
        holder left is stale: that bed changed them and nobody gave them back). `change`, when the
        bed makes the change itself (a read, then a write), runs under the lock once the bed is
        recorded, so two beds' changes never interleave (a kubelet makes its own, later)."""
        with self._book() as book:
            self._drop_stale(book, keep=holder)
            if not book["saved"]:
                book["saved"] = read_sysctls(self.names, self.proc)
            if holder not in book["holders"]:
                book["holders"].append(holder)
            if change is not None:
                change()
            return dict(book["saved"])

    def release(self, holder: str, own: dict[str, str]) -> list[str]:
        """`holder` no longer needs the settings (its kubelets stopped, its daemons down). When no
        other bed holds the values, write them back (the ledger's, or `own`, the values this bed
        saved, when the ledger is gone: after a reboot, or a bed of a version before it) and return
        []; else return the beds still holding them."""
        with self._book() as book:
            self._drop_stale(book, keep=holder)
            known = holder in book["holders"]
            book["holders"] = [h for h in book["holders"] if h != holder]
            if book["holders"]:
                return list(book["holders"])
            values = book["saved"] if known else own
            write_sysctls(values, self.proc)
            return []

    def holders(self) -> list[str]:
        with self._book() as book:
            return list(book["holders"])

    @staticmethod
    def _drop_stale(book: dict, keep: str) -> None:
        book["holders"] = [h for h in book["holders"] if h == keep or Path(h).exists()]
