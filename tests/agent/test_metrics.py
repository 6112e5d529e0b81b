"""Prometheus metrics of the agent, scraped over HTTP as Prometheus does (issue 8 item 4).

What an admin must be able to read: pods by phase and route, create/delete latency, API errors by
verb and code, hook requests by verb and result, cache age, restarts (process start time).
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

from ce_k8s import protocol
from ce_k8s.agent.options import DEFAULT_METRICS_ADDRESS, AgentOptions, OptionsError, parse_address
from ce_k8s.condor.config import CondorConfig
from ce_k8s.pods.names import pod_name

from .conftest import GJID, agent_process, apply_output, new_agent, routed_ad, text_of, wait

NAME = pod_name(GJID, 0)
ROOT = Path(__file__).resolve().parents[2]


def scrape(agent) -> str:
    host, port = agent.prom.address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def value(text: str, name: str, **labels: str) -> float:
    """The sample `name{labels}` (labels in any order; all given must match)."""
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    raise AssertionError(f"no sample {name}{labels}")


@pytest.fixture
def served(server, settings):
    agent = new_agent(server, settings, options=AgentOptions(metrics_address="127.0.0.1:0"))
    yield agent
    agent.stop()


def test_scrape_shows_pods_latency_hooks_errors_and_cache_age(served, server, settings):
    agent = served
    server.faults.inject("500", verb="create", resource="pods")
    ad = routed_ad(Path(settings.spool), RouteName="K8s_CPU")
    apply_output(ad, agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)[1][0])
    wait(lambda: agent.jobs[NAME].creation.info.state == "retry")
    agent.jobs[NAME].creation.next_try = 0
    agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)
    pod = wait(lambda: agent.cache.get(NAME))
    agent.handle(protocol.VERB_UPDATE, text_of(routed_ad(Path(settings.spool), owner="x")), 4242)   # denied
    text = scrape(agent)
    assert pod.route and value(text, "ce_k8s_pods", phase="Pending", route=pod.route) == 1.0
    assert value(text, "ce_k8s_pods", phase="Running") == 0.0
    assert value(text, "ce_k8s_pod_create_seconds_count") == 1.0
    assert value(text, "ce_k8s_api_errors_total", verb="create", resource="pods", code="500") == 1.0
    assert value(text, "ce_k8s_hook_requests_total", verb="update", result="ok") >= 2.0
    assert value(text, "ce_k8s_hook_requests_total", verb="update", result="denied") == 1.0
    assert 0.0 <= value(text, "ce_k8s_cache_age_seconds") < 5.0
    assert abs(value(text, "process_start_time_seconds") - time.time()) < 600
    assert value(text, "ce_k8s_agent_start_time_seconds") <= time.time()


def test_pods_by_route_and_delete_latency(served, server, settings):
    agent = served
    ad = routed_ad(Path(settings.spool))
    agent.handle(protocol.VERB_UPDATE, text_of(ad), 0)
    pod = wait(lambda: agent.cache.get(NAME))
    text = scrape(agent)
    assert value(text, "ce_k8s_pods", phase="Pending", route=pod.route) == 1.0
    agent.handle(protocol.VERB_CLEANUP, text_of(ad), 0)
    wait(lambda: agent.cache.get(NAME) is None)
    text = scrape(agent)
    assert value(text, "ce_k8s_pod_delete_seconds_count") == 1.0
    assert value(text, "ce_k8s_pods_deleted_total", why="cleanup") == 1.0
    assert value(text, "ce_k8s_hook_requests_total", verb="cleanup", result="ok") == 1.0


def test_busy_port_leaves_the_agent_serving_hooks(server, settings):
    """A metrics endpoint that cannot bind must not take the hooks down."""
    import socket

    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    try:
        address = f"127.0.0.1:{blocker.getsockname()[1]}"
        agent = new_agent(server, settings, options=AgentOptions(metrics_address=address))
        try:
            assert agent.prom.address is None
            status, _ = agent.handle(protocol.VERB_PING, b"", 0)
            reply = protocol.call(settings.socket, protocol.VERB_PING, b"", time.monotonic() + 5)
            assert status == reply.status == protocol.STATUS_OK
            reply.close()
        finally:
            agent.stop()
    finally:
        blocker.close()


def test_knobs_default_and_errors_name_file_and_line(tmp_root):
    assert AgentOptions.from_config(CondorConfig.from_text("")).metrics_address == DEFAULT_METRICS_ADDRESS
    assert AgentOptions.from_config(CondorConfig.from_text("CE_K8S_METRICS_ADDRESS =\n")).metrics_address == ""
    opts = AgentOptions.from_config(CondorConfig.from_text("CE_K8S_MAX_OUTPUT_BYTES = 1000\n"))
    assert opts.max_output_bytes == 1000
    with pytest.raises(OptionsError, match=r"^x\.conf:2: CE_K8S_METRICS_ADDRESS"):
        AgentOptions.from_config(CondorConfig.from_text("\nCE_K8S_METRICS_ADDRESS = nowhere\n", "x.conf"))
    with pytest.raises(OptionsError, match="CE_K8S_MAX_OUTPUT_BYTES"):
        AgentOptions.from_config(CondorConfig.from_text("CE_K8S_MAX_OUTPUT_BYTES = lots\n"))
    assert parse_address("[::1]:9620") == ("::1", 9620) and parse_address(":9620") == ("0.0.0.0", 9620)


def test_agent_subprocess_serves_metrics_from_the_knob(server, tmp_root):
    """`ce-k8s agent` reads CE_K8S_METRICS_ADDRESS from the CE configuration and serves it."""
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    conf = tmp_root / "config"
    conf.mkdir()
    (conf / "99-metrics.conf").write_text(f"CE_K8S_METRICS_ADDRESS = 127.0.0.1:{port}\n"
                                          f"CE_K8S_OUTPUT_DIR = {tmp_root / 'out'}\n")
    with agent_process(server, tmp_root, conf):

        def scraped():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    return resp.read().decode()
            except OSError:
                return None
        text = wait(scraped, timeout=10)
        assert "ce_k8s_cache_age_seconds" in text and "process_start_time_seconds" in text
        assert (tmp_root / "out").is_dir()
