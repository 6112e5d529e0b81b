"""``ce-k8s sim serve`` (issue 4 item 4): foreground server, one "ready <url>" line, a kubeconfig
any client can use, clean stop on SIGTERM/SIGINT, exit 2 on a bad option."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from kubernetes import client, config

from ce_k8s import cli


def start(tmp_path, *extra):
    kcfg = tmp_path / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "ce_k8s.cli", "sim", "serve", "--kubeconfig-out", str(kcfg),
                             "--time-scale", "0.01", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    return proc, kcfg, line


def test_serve_prints_ready_and_serves_until_sigterm(tmp_path):
    proc, kcfg, line = start(tmp_path, "--nodes", "cpu:1x2c4g", "--seed", "3")
    try:
        assert line.startswith("ready http://127.0.0.1:")
        url = line.split()[1]
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(kcfg)))
        assert core.api_client.configuration.host == url
        assert [n.metadata.name for n in core.list_node().items] == ["cpu-1"]
        assert (kcfg.stat().st_mode & 0o777) == 0o600
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert time.monotonic() - t0 < 5
        assert proc.stdout.read() == ""  # exactly one line of output
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_sigint_and_fault_flags(tmp_path):
    proc, kcfg, line = start(tmp_path, "--no-kubelet", "--fault-500", "1.0")
    try:
        assert line.startswith("ready ")
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(kcfg)))
        try:
            core.list_namespaced_pod("default")
            raise AssertionError("expected an injected 500")
        except client.ApiException as e:
            assert e.status == 500
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bad_node_spec_exits_2(tmp_path, capsys):
    rc = cli.main(["sim", "serve", "--kubeconfig-out", str(tmp_path / "k"), "--nodes", "cpu:3xbig"])
    assert rc == 2
    assert "node spec 'cpu:3xbig'" in capsys.readouterr().err
    assert not (tmp_path / "k").exists()
