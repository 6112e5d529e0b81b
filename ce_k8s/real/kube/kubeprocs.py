"""The real control plane's processes: started in sessions of their own, waited for, restarted, stopped.

Each process's output goes to `<state>/logs/<name>.log` and its pid to the bed's state, so that a
failed start can say what the process printed last and `down` (or the reaper) can stop it later.
"""

from __future__ import annotations

import logging
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ce_k8s.real.kube import kubepki
from ce_k8s.real.kube.kubelayout import KubeLayout, RealKubeError, State
from ce_k8s.real.processes import alive, terminate

log = logging.getLogger(__name__)


def http_get(url: str, ctx: ssl.SSLContext | None = None, token: str | None = None,
             timeout: float = 3) -> tuple[int, bytes]:
    """(status, body) of a GET; (0, b"") when nothing answers (a process still starting)."""
    req = urllib.request.Request(url)  # noqa: S310 - loopback URLs we built
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:  # noqa: S310
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


class KubeProcesses:
    """Starts and stops the processes of the bed in `layout`'s state directory."""

    def __init__(self, layout: KubeLayout) -> None:
        self.layout = layout

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start one process of the bed in a session of its own, its output to <state>/logs/<name>.log."""
        logf = self.layout.log_file(name)
        logf.parent.mkdir(parents=True, exist_ok=True)
        with open(logf, "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env={**os.environ, **(env or {})},
                                    cwd=self.layout.state_dir)
        log.debug("started %s pid %d: %s", name, proc.pid, " ".join(argv))
        return proc.pid

    def wait(self, what: str, check: Callable[[], bool], timeout: float, pid: int | None = None,
             name: str | None = None) -> None:
        """Until `check()`; an error with the log's last lines if `pid` exits first or time runs out."""
        logname = name or what
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if pid is not None and not alive(pid):
                raise RealKubeError(f"{what} exited while starting; last lines of {self.layout.log_file(logname)}:\n"
                                    f"{self.layout.tail(logname)}")
            time.sleep(0.2)
        raise RealKubeError(f"{what} not ready after {timeout:.0f} s; see {self.layout.log_file(logname)}:\n"
                            f"{self.layout.tail(logname)}")

    def wait_etcd(self, state: State, timeout: float) -> None:
        self.wait("etcd", lambda: http_get(f"{state.etcd}/health")[0] == 200, timeout, state.pids["etcd"])

    def wait_apiserver(self, state: State, timeout: float) -> None:
        def ready() -> bool:
            ctx = ssl._create_unverified_context()  # noqa: S323 - before the CA file exists
            return http_get(f"{state.server}/readyz", ctx, token=self.layout.admin_token())[0] == 200
        self.wait("kube-apiserver", ready, timeout, state.pids["kube-apiserver"])
        if not self.layout.ca_file.exists():
            kubepki.extract_ca(self.layout)

    def healthy(self, st: State) -> bool:
        """Every process of the bed runs and the API server says it is ready."""
        if not all(alive(pid) for pid in st.pids.values()):
            return False
        ctx = ssl._create_unverified_context()  # noqa: S323 - a health probe of our own server
        try:
            token = self.layout.admin_token()
        except OSError:
            return False
        return http_get(f"{st.server}/readyz", ctx, token=token)[0] == 200

    def stop(self, name: str) -> None:
        """Stop one process of the bed (SIGTERM, then SIGKILL); nothing when it is not the bed's."""
        st = self.layout.state()
        if st is None or name not in st.pids:
            return
        terminate(st.pids[name])

    def restart(self, name: str, progress: Callable[[str], None],
                while_stopped: Callable[[], None] | None = None) -> None:
        """Stop one component and start it again with the same arguments (read from /proc before
        it stops); `while_stopped` runs in between."""
        st = self.layout.state()
        if st is None or name not in st.pids:
            raise RealKubeError(f"{name} is not running in this bed")
        argv = Path(f"/proc/{st.pids[name]}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        self.stop(name)
        if while_stopped is not None:
            while_stopped()
        st.pids[name] = self.start(name, [a.decode() for a in argv])
        st.save(self.layout.state_file)
        if name == "etcd":
            self.wait_etcd(st, 60)
        elif name == "kube-apiserver":
            self.wait_apiserver(st, 120)
        progress(f"restarted {name} (pid {st.pids[name]})")
