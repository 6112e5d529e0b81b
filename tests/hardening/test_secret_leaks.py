"""Proxy and token contents never leave the Secret (docs/design.md Decision 6, issue 9 "Secrets").

A full embedded demo run (ce_k8s.sim.testbed.TestBed: the API emulator with its kubelet,
the real `ce-k8s agent` process with `--verbose`, the router emulator spawning the real hook
launchers, the shipped routes) with every pilot's proxy and token holding a unique marker. Then
every place an operator or another tenant can read is searched for the marker: the agent's log,
every log record of the in-process components, every hook's stdin/stdout/stderr, every API
object except the Secrets themselves (pods, events, ...), the pod logs, the routed and source job
ads, the demo summary, the agent's Prometheus metrics, and the output of `ce-k8s route` for the
same pilot.
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_for

from ce_k8s.sim.testbed import TestBed

MARKER = "CEK8S-SECRET-MARKER-5b1e0c"
PROXY = f"-----BEGIN CERTIFICATE-----\n{MARKER}-proxy\n-----END CERTIFICATE-----\n"
TOKEN = f"eyJ{MARKER}-token.e30.\n"


class MarkedBed(TestBed):
    """The demo test bed with the agent's log kept in a file and every pilot's credentials marked."""

    __test__ = False

    def start_agent(self) -> None:
        log_path = self.root / "agent.log"
        cmd = [sys.executable, "-m", "ce_k8s.cli", "agent", "--verbose", "--config", str(self.confdir),
               "--kubeconfig", str(self.kubeconfig), "--socket", str(self.socket), "--spool", str(self.spool)]
        self.socket.unlink(missing_ok=True)
        self._log = open(log_path, "ab")  # closed in stop_agent
        self.agent = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

        def started() -> bool:
            if self.socket.exists():
                return True
            assert self.agent.poll() is None, log_path.read_text()
            return False
        wait_for(started, timeout=30, interval=0.05, what="the agent to start (its socket)")

    def stop_agent(self, sig: int = 15) -> None:
        super().stop_agent(sig)
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def submit(self, pilots):
        ids = super().submit(pilots)
        for job in ids:
            ad = self.schedd.get(job)
            iwd = Path(ad.eval("Iwd"))
            (iwd / "x509up").write_text(PROXY)
            (iwd / "idtoken").write_text(TOKEN)
        return ids


def _collect(bed: MarkedBed, records: list[logging.LogRecord]) -> dict[str, str]:
    """Every readable output of the run, by where it came from."""
    from ce_k8s.condor import wire

    out: dict[str, str] = {"agent log": (bed.root / "agent.log").read_text(errors="replace")}
    out["in-process log records"] = "\n".join(r.getMessage() + (str(r.exc_info) if r.exc_info else "")
                                              for r in records)
    for i, call in enumerate(bed.router.calls):
        out[f"hook {call.hook} #{i} io"] = b"\n".join([call.stdin or b"", call.stdout or b"",
                                                       call.stderr or b""]).decode(errors="replace")

    def dump_objects() -> dict[str, str]:
        objs = {}
        for resource in list(bed.server.store._objs):          # every kind the emulator stored
            if resource == "secrets":
                continue
            for obj in bed.server.store.peek_list(resource):
                name = f"{resource}/{obj.get('metadata', {}).get('namespace')}/{obj.get('metadata', {}).get('name')}"
                objs[name] = json.dumps(obj)
        objs["pod logs"] = json.dumps({"/".join(k): v for k, v in bed.server.store.logs.items()})
        return objs

    out.update(bed.server.call(dump_objects))
    for job, ad in bed.schedd.items():
        out[f"job ad {job}"] = wire.sprint_ad(ad)
    out["summary"] = json.dumps(bed.summary())
    out["agent metrics"] = _scrape(bed.metrics_port)
    for o in bed.outcomes.values():
        out[f"staged out {o.job}"] = (o.stdout + o.stderr).decode(errors="replace")
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode(errors="replace")
    assert "ce_k8s_hook_requests_total" in text      # a real scrape, or the search proves nothing
    return text


@pytest.fixture
def records():
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append(record)

    handler = Keep(level=logging.DEBUG)
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield got
    root.removeHandler(handler)
    root.setLevel(old)


def test_demo_run_never_shows_proxy_or_token_contents(records):
    """Full demo path, one evicted pilot and one failing pilot included; the marker appears in no
    output other than the Secrets, which must hold it (or the test would prove nothing)."""
    port = _free_port()
    bed = MarkedBed(seed=3, time_scale=0.02, extra_config=f"CE_K8S_METRICS_ADDRESS = 127.0.0.1:{port}\n")
    bed.metrics_port = port
    try:
        bed.start()
        bed.router.record_io = True
        pilots = bed.make_pilots(6, evict_fraction=0.3, run_s=4, fail_fraction=0.3)
        bed.submit(pilots)

        seen_in_secret: list[str] = []

        def secrets_with_marker():
            for obj in bed.server.store.peek_list("secrets"):
                for value in (obj.get("data") or {}).values():
                    if MARKER.encode() in base64.b64decode(value):
                        seen_in_secret.append(obj["metadata"]["name"])

        orig_tick = bed.tick

        def tick(poll_interval=1.0):
            orig_tick(poll_interval)
            if not seen_in_secret:
                bed.server.call(secrets_with_marker)
        bed.tick = tick
        assert bed.run(timeout=90, poll_interval=0.3)
        bed.drain(timeout=30)
        assert seen_in_secret, "the marker never reached a Secret: the search below would prove nothing"
        outputs = _collect(bed, records)
    finally:
        bed.close()
    assert len(outputs) > 20
    leaks = sorted(where for where, text in outputs.items() if MARKER in text)
    assert leaks == []


def test_route_command_output_redacts_credentials(tmp_path):
    """`ce-k8s route` shows the pod and Secret it would build; the Secret's data is redacted."""
    from ce_k8s.sim.pilots import make_pilot, spool_sandbox

    spool = tmp_path / "spool"
    files = spool_sandbox(spool, "5.0")
    Path(files["x509userproxy"]).write_text(PROXY)
    ad = dict(make_pilot(1, "cpu8").ad)
    ad.update(files, ClusterId=5, ProcId=0, GlobalJobId="ce#5.0#1", QDate=1, JobStatus=1)
    import classad2

    from ce_k8s.condor import wire

    job = classad2.ClassAd()
    for k, v in ad.items():
        job[k] = v
    (tmp_path / "job.ad").write_text(wire.sprint_ad(job))
    cfg = tmp_path / "config"
    cfg.mkdir()
    from ce_k8s.condor.config import default_config_paths

    for n, f in enumerate(sorted(p for d in default_config_paths() for p in d.glob("*.conf"))):
        (cfg / f"{n:03d}-{f.name}").write_text(f.read_text())
    (cfg / "999-spool.conf").write_text(f"CE_K8S_SPOOL = {spool}\n")
    for extra in ([], ["--json"]):
        res = subprocess.run([sys.executable, "-m", "ce_k8s.cli", "route", "--jobads", str(tmp_path / "job.ad"),
                              "--config", str(cfg), *extra],
                             capture_output=True, timeout=60, check=False, env={"PATH": "/usr/bin:/bin"})
        text = (res.stdout + res.stderr).decode(errors="replace")
        assert res.returncode == 0, text[-2000:]
        assert "redacted" in text and "x509up" in text, text[-3000:]
        assert MARKER not in text
