"""pods/log `stream=Stdout|Stderr|All` (KEP-3288, `PodLogOptions.stream`), in the three ways a
cluster answers it, and what the agent's `Logs.read` makes of each:

* `split`: Kubernetes >= 1.32 with the PodLogsQuerySplitStreams feature gate on. Validation as
  kube-apiserver's ValidatePodLogOptions: a value other than All/Stdout/Stderr and `tailLines`
  with a specific stream are 422 Invalid; no `stream` means All.
* `forbid`: >= 1.32 with the gate off (its default up to current releases): any `stream` is 422
  "stream: Forbidden: may not be specified" (kubernetes/kubernetes#133005, GKE 1.32.4).
* `ignore`: <= 1.31, where PodLogOptions has no `stream`: the parameter is dropped and the
  combined log comes back. The emulator's default (docs/testbed.md says why).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client import ApiException
from polling import wait_for

from ce_k8s.agent.agent import Agent
from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.settings import Settings
from ce_k8s.sim import serve
from ce_k8s.sim.kube.apiserver import ApiServer

SCENARIO = 'run=1s exit=0 out="starting" err="warn: no proxy" out="payload ran" err="error: exit 1"'
OUT = b"starting\npayload ran\n"
ERR = b"warn: no proxy\nerror: exit 1\n"
ALL = b"starting\nwarn: no proxy\npayload ran\nerror: exit 1\n"   # write order, as in the CRI log file


@pytest.fixture(params=["split", "forbid", "ignore"])
def mode(request):
    return request.param


@pytest.fixture
def srv(mode):
    with ApiServer.running(nodes="cpu:1x4c16g", time_scale=0.01, seed=5, log_streams=mode) as s:
        yield s


def finished_pod(srv, pod_body, name="p1", scenario=SCENARIO):
    core = client.CoreV1Api(config.new_client_from_config(config_file=srv.kubeconfig_path))
    core.create_namespaced_pod("default", pod_body(name, scenario=scenario))
    srv.wait_for(lambda: (srv.store.get("pods", "default", name) or {}).get("status", {}).get("phase")
                 == "Succeeded")
    return core


def raw_log(srv, name="p1", **query) -> tuple[int, bytes]:
    """GET .../pods/<name>/log with exactly these query parameters: (HTTP status, body)."""
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    url = f"{srv.url}/api/v1/namespaces/default/pods/{name}/log" + (f"?{qs}" if qs else "")
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def status_of(body: bytes) -> dict:
    doc = json.loads(body)
    assert doc["kind"] == "Status" and doc["status"] == "Failure"
    return doc


@pytest.fixture
def agent(srv, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    settings = Settings(ce_name="ce", namespace="default", spool=str(spool), socket=str(tmp_path / "agent.sock"),
                        qps=1000.0, burst=1000, create_concurrency=1, gc_grace=3600, image_pull_timeout=0)
    a = Agent(settings, config.new_client_from_config(config_file=srv.kubeconfig_path), request_timeout=5.0)
    yield a
    a.stop()


def read_logs(agent, srv, name="p1", limit=1 << 20):
    return agent.logs.read(PodInfo.from_dict(srv.store.get("pods", "default", name)), limit)


# ---- the agent's Logs.read, real client against the emulator -------------------------------------

@pytest.mark.parametrize("mode", ["split"])
def test_split_on_agent_gets_stdout_and_stderr_apart(srv, agent, pod_body):
    finished_pod(srv, pod_body)
    assert read_logs(agent, srv) == (OUT, ERR, True)
    assert read_logs(agent, srv, limit=5) == (OUT[:5], ERR[:5], True)   # limitBytes per stream


@pytest.mark.parametrize("mode", ["split"])
def test_split_on_pilot_without_stderr_is_still_split(srv, agent, pod_body):
    """An empty stderr is an answer too: the server split, the pilot wrote nothing there."""
    finished_pod(srv, pod_body, scenario='run=1s exit=0 out="only out"')
    assert read_logs(agent, srv) == (b"only out\n", b"", True)


@pytest.mark.parametrize("mode", ["ignore"])
def test_pre_132_server_agent_gets_combined_log_as_stdout(srv, agent, pod_body):
    finished_pod(srv, pod_body)
    assert read_logs(agent, srv) == (ALL, b"", False)


@pytest.mark.parametrize("mode", ["forbid"])
def test_gate_off_server_agent_gets_combined_log_as_stdout(srv, agent, pod_body):
    finished_pod(srv, pod_body)
    assert read_logs(agent, srv) == (ALL, b"", False)


# ---- the API, as each kind of server answers it ------------------------------------------------------

def test_without_stream_every_server_returns_the_combined_log_in_write_order(srv, pod_body):
    core = finished_pod(srv, pod_body)
    assert core.read_namespaced_pod_log("p1", "default").encode() == ALL
    assert raw_log(srv, tailLines=2) == (200, b"payload ran\nerror: exit 1\n")


def test_stream_values(srv, mode, pod_body):
    finished_pod(srv, pod_body)
    got = {s: raw_log(srv, stream=s) for s in ("Stdout", "Stderr", "All")}
    if mode == "split":
        assert got == {"Stdout": (200, OUT), "Stderr": (200, ERR), "All": (200, ALL)}
    elif mode == "ignore":
        assert got == {"Stdout": (200, ALL), "Stderr": (200, ALL), "All": (200, ALL)}
    else:
        for s, (code, body) in got.items():
            assert code == 422, s
            assert status_of(body) == {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": 'PodLogOptions "p1" is invalid: stream: Forbidden: may not be specified',
                "reason": "Invalid", "code": 422,
                "details": {"name": "p1", "kind": "PodLogOptions", "causes": [
                    {"reason": "FieldValueForbidden", "message": "Forbidden: may not be specified",
                     "field": "stream"}]}}


def test_invalid_stream_value(srv, mode, pod_body):
    core = finished_pod(srv, pod_body)
    code, body = raw_log(srv, stream="stdout")          # the values are case-sensitive
    if mode == "ignore":
        assert (code, body) == (200, ALL)
        return
    assert code == 422
    doc = status_of(body)
    assert doc["reason"] == "Invalid" and doc["details"]["kind"] == "PodLogOptions"
    if mode == "split":
        assert doc["message"] == ('PodLogOptions "p1" is invalid: stream: Unsupported value: "stdout": '
                                  'supported values: "All", "Stderr", "Stdout"')
        assert doc["details"]["causes"] == [{"reason": "FieldValueNotSupported", "field": "stream",
                                             "message": 'Unsupported value: "stdout": supported values: '
                                                        '"All", "Stderr", "Stdout"'}]
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("p1", "default", stream="Everything")
    assert exc.value.status == 422


@pytest.mark.parametrize("mode", ["split"])
def test_tail_lines_only_with_stream_all(srv, pod_body):
    """API docs: 'when TailLines is specified, Stream can only be set to nil or "All"'."""
    finished_pod(srv, pod_body)
    assert raw_log(srv, stream="All", tailLines=1) == (200, b"error: exit 1\n")
    for s in ("Stdout", "Stderr"):
        code, body = raw_log(srv, stream=s, tailLines=1)
        doc = status_of(body)
        assert code == 422 and doc["message"] == (
            'PodLogOptions "p1" is invalid: []: Forbidden: `tailLines` and specific `stream` are mutually '
            "exclusive for now")
        assert doc["details"]["causes"][0]["field"] == "[]"
    code, body = raw_log(srv, stream="Bad", tailLines=1)     # every failing rule, in one answer
    assert code == 422 and status_of(body)["message"].startswith(
        'PodLogOptions "p1" is invalid: [stream: Unsupported value: "Bad": ')
    assert len(status_of(body)["details"]["causes"]) == 2


@pytest.mark.parametrize("mode", ["split"])
def test_stream_with_limit_bytes_timestamps_and_follow(srv, pod_body):
    core = finished_pod(srv, pod_body)
    assert raw_log(srv, stream="Stderr", limitBytes=6) == (200, b"warn: ")
    stamped = raw_log(srv, stream="Stderr", timestamps="true")[1].decode().splitlines()
    assert [line.split(" ", 1)[1] for line in stamped] == ["warn: no proxy", "error: exit 1"]
    assert stamped[0][:4].isdigit() and stamped[0].split(" ", 1)[0].endswith("Z")
    assert core.read_namespaced_pod_log("p1", "default", stream="Stdout", follow=True) == OUT.decode()


@pytest.mark.parametrize("mode", ["split"])
def test_follow_streams_only_the_selected_stream_up_to_limit_bytes(srv, pod_body):
    core = client.CoreV1Api(config.new_client_from_config(config_file=srv.kubeconfig_path))
    core.create_namespaced_pod("default", pod_body(
        "p2", scenario='run=2s exit=0 out="a" err="b" out="c"'))
    srv.wait_for(lambda: srv.store.get("pods", "default", "p2")["status"].get("phase") == "Running")
    assert core.read_namespaced_pod_log("p2", "default", stream="Stdout", follow=True) == "a\nc\n"
    assert core.read_namespaced_pod_log("p2", "default", stream="All", follow=True, limit_bytes=3) == "a\nb"


@pytest.mark.parametrize("mode", ["split", "ignore"])
def test_option_validation_precedes_the_pod_lookup(srv):
    """LogREST validates PodLogOptions before it reads the pod: a bad option on a missing pod is
    422, a good one 404."""
    code, body = raw_log(srv, "nope", limitBytes=0, sinceSeconds=0, tailLines=-1)
    assert code == 422 and status_of(body)["message"] == (
        'PodLogOptions "nope" is invalid: [tailLines: Invalid value: -1: must be greater than or equal to 0, '
        "limitBytes: Invalid value: 0: must be greater than 0, sinceSeconds: Invalid value: 0: must be greater "
        "than 0]")
    assert raw_log(srv, "nope", stream="Stdout")[0] == 404


# ---- the option: constructor, run-time switch, serve flags ----------------------------------------

def test_default_is_forbid_as_on_a_default_1_32_cluster_and_bad_modes_are_refused():
    assert ApiServer().log_streams == "forbid"
    with pytest.raises(ValueError, match="log_streams must be one of split, forbid, ignore"):
        ApiServer(log_streams="on")
    srv = ApiServer()
    srv.log_streams = "split"
    assert srv.log_streams == "split"
    with pytest.raises(ValueError):
        srv.log_streams = "yes"


def test_serve_flags():
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    base = ["--kubeconfig-out", "k"]
    assert parser.parse_args(base).log_streams == "forbid"
    assert parser.parse_args([*base, "--split-logs"]).log_streams == "split"
    assert parser.parse_args([*base, "--log-streams", "ignore"]).log_streams == "ignore"
    for bad in (["--log-streams", "on"], ["--split-logs", "--log-streams", "ignore"]):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args([*base, *bad])
        assert exc.value.code == 2


def test_serve_split_logs_end_to_end(tmp_path: Path, pod_body):
    kcfg = tmp_path / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "ce_k8s.cli", "sim", "serve", "--kubeconfig-out", str(kcfg),
                             "--time-scale", "0.01", "--nodes", "cpu:1x2c4g", "--split-logs"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("ready ")
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(kcfg)))
        core.create_namespaced_pod("default", pod_body("p1", scenario=SCENARIO))

        def succeeded() -> bool:
            if core.read_namespaced_pod("p1", "default").status.phase == "Succeeded":
                return True
            assert proc.poll() is None, f"the emulator exited: {proc.stderr.read()}"
            return False
        wait_for(succeeded, timeout=10, interval=0.05, what="pod p1 Succeeded")
        assert core.read_namespaced_pod_log("p1", "default", stream="Stderr").encode() == ERR
    finally:
        proc.terminate()
        proc.wait(10)
