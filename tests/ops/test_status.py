"""`ce-k8s status` against a running agent and the API emulator.

What an admin must see per routed pilot (htcondor-ce.md §4.1: route, pod/node name, hold reason
visible) and that the job state shown is what the agent reports (factory view, htcondor-ce.md §6.4).
"""

from __future__ import annotations

import contextlib
import json
import re
import time

from ops_helpers import NAMESPACE, gjid, run_cli

from ce_k8s import protocol
from ce_k8s.agent.server import HookServer
from ce_k8s.ops import status
from ce_k8s.pods.names import pod_name


def _pilots(host, *extra: str) -> dict:
    code, out = run_cli("status", "--config", str(host.config_dir), "--json", *extra)
    assert code == 0, out
    return json.loads(out)


def test_status_lists_running_and_held_pilots_with_what_the_agent_reports(host):
    """htcondor-ce.md §4.1: route, pod, node and hold reason per pilot; §6.4: running vs held."""
    ran = host.submit(100, image="pilot:forever", route="Pilots")
    held = host.submit(7, image="pilot:oom", route="CMS_Pilots", owner="uscms01",
                       until=None)
    held = host.update_until(7, lambda ad: ad.get("JobStatus") == 5, "an OOM-killed pilot held (docs/holds.md)")

    doc = _pilots(host, "--source", "api")
    rows = doc["pilots"]
    assert doc["source"].startswith("api ")
    # sorted by source job id numerically: 7.0 before 100.0
    assert [r["source_job"] for r in rows] == ["7.0", "100.0"]
    held_row, run_row = rows
    assert run_row["pod"] == pod_name(gjid(100), 0) == ran.get("K8sPodName")
    assert run_row["namespace"] == NAMESPACE
    assert run_row["node"] == ran.get("K8sNodeName") and run_row["node"].startswith("cpu-")
    assert (run_row["phase"], run_row["status"], run_row["route"], run_row["owner"]) == (
        "Running", "Running", "Pilots", "cmspilot")
    assert run_row["hold_reason"] == ""
    assert held_row["status"] == "Held" and held_row["owner"] == "uscms01" and held_row["route"] == "CMS_Pilots"
    # the same HoldReason text the agent gave the routed job
    assert held_row["hold_reason"] == held.get("HoldReason")


def test_status_table_is_aligned_and_summarised(host):
    host.submit(12)
    host.submit(3)
    code, out = run_cli("status", "--config", str(host.config_dir))
    assert code == 0
    lines = out.rstrip("\n").split("\n")
    assert lines[0].split() == list(status.HEADERS)
    # every column starts at the same offset on every row
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    for line in lines[1:3]:
        for s in starts[1:]:
            assert line[s - 2:s] == "  " and line[s] != " "
    assert lines[1].split()[1] == "3.0" and lines[2].split()[1] == "12.0"
    assert lines[-1] == "2 pilot pod(s): 2 running"


def test_status_shows_an_evicted_pilot_running_until_its_pod_is_gone(host):
    """The Eviction API sets DisruptionTarget and starts the pod's deletion; while the pod has not
    ended its pilot may still run (its grace period, or a node that cannot be reached), so the job
    stays Running and says why, and the next attempt waits until the pod is gone (finding 5 of
    docs/real-kubernetes.md; docs/holds.md).

    The emulator deletes an evicted pod within milliseconds, so the row is computed from the pod as
    the Eviction API leaves it (condition set, deletion started), taken from the live pod.
    """
    from ce_k8s.settings import Settings

    host.submit(5)
    name = pod_name(gjid(5), 0)
    pod = host.server.store.get("pods", NAMESPACE, name)
    pod["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    pod["status"].setdefault("conditions", []).append(
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
         "message": "Eviction API: evicting"})
    row = status.row_from_pod(pod, Settings(), time.time())
    assert (row.status, row.phase, row.source_job, row.attempt) == ("Running", "Terminating", "5.0", 0)
    assert f"pod {name} terminating (EvictionByEvictionAPI" in row.reason
    assert row.reason.endswith("the next attempt waits until it has ended")
    assert row.hold_reason == ""


def test_status_exits_1_when_the_api_is_unreachable(host, tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text(open(host.kubeconfig).read().replace(host.server.url, "http://127.0.0.1:9"))
    code, out = run_cli("status", "--config", str(host.config_dir), "--kubeconfig", str(bad), "--source", "api")
    assert code == 1 and out == ""


@contextlib.contextmanager
def _stub_agent(sock, handler):
    """The agent's real socket server in front of `handler(verb, payload, uid)`, for the test's span."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    server = HookServer(str(sock), handler, pool)
    server.start()
    try:
        yield
    finally:
        server.stop()
        pool.shutdown()


def test_status_exits_2_on_a_bad_knob(host):
    host.write_local("CE_K8S_MAX_ATTEMPTS = lots\n")
    code, _ = run_cli("status", "--config", str(host.config_dir))
    assert code == 2


def test_status_uses_the_agents_list_when_the_protocol_offers_it(host, monkeypatch, tmp_path):
    """The agent knows the routed job id (only the hooks tell it); its rows are shown as they come."""
    monkeypatch.setattr(protocol, "VERB_LIST", "list", raising=False)
    monkeypatch.setattr(protocol, "VERBS", protocol.VERBS | {"list"})
    row = {"routed_job": "1100.0", "source_job": "100.0", "owner": "cmspilot", "route": "Pilots",
           "namespace": NAMESPACE, "pod": "ce-100-0-a0-x", "node": "cpu-1", "phase": "Running",
           "status": "Running", "attempt": 0, "created": 1, "hold_reason": "", "reason": ""}
    seen = []

    def handler(verb, payload, uid):
        seen.append(verb)
        return "ok", [json.dumps({"pilots": [row]}).encode()]

    sock = tmp_path / "list.sock"
    with _stub_agent(sock, handler):
        doc = _pilots(host, "--socket", str(sock))
    assert seen == ["list"]
    assert doc["source"] == f"agent {sock}"
    [got] = doc["pilots"]
    assert got["routed_job"] == "1100.0" and got["age"] > 0


def test_status_falls_back_to_the_api_when_the_agent_cannot_list(host, tmp_path, capsys):
    """An older agent that does not know the verb answers "bad": status asks the API instead."""
    host.submit(9)
    sock = tmp_path / "old-agent.sock"
    with _stub_agent(sock, lambda verb, payload, uid: ("bad", [b"unknown verb"])):
        doc = _pilots(host, "--socket", str(sock))
    assert doc["source"].startswith("api ")
    assert [r["source_job"] for r in doc["pilots"]] == ["9.0"]
    assert "asking the Kubernetes API instead" in capsys.readouterr().err


def test_format_age_and_job_sort():
    assert [status.format_age(s) for s in (None, 5, 59, 60, 3599, 7200, 86400 * 3)] == [
        "-", "5s", "59s", "1m", "59m", "2h", "3d"]
    ids = ["100.0", "7.1", "7.0", "x", "12.0"]
    assert sorted(ids, key=status.job_sort_key) == ["7.0", "7.1", "12.0", "100.0", "x"]


def test_collect_does_not_block_on_a_silent_agent(host, monkeypatch, tmp_path):
    """A hung agent must not hang `status`: the call has a deadline."""
    import socket as pysocket

    monkeypatch.setattr(protocol, "VERB_LIST", "list", raising=False)
    monkeypatch.setattr(protocol, "VERBS", protocol.VERBS | {"list"})
    path = tmp_path / "mute.sock"
    srv = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    started = time.monotonic()
    try:
        try:
            status.rows_from_agent(str(path), timeout=0.3)
        except status.StatusError as exc:
            assert "timed out" in str(exc)
        else:
            raise AssertionError("a silent agent must raise StatusError")
    finally:
        srv.close()
    assert time.monotonic() - started < 2
