"""Credential refresh (docs/agent.md "Credential refresh", docs/security.md): a proxy renewed in the
job's spool while its pilot runs is in the pod's Secret after that job's next update, i.e. within
one router polling period; never another job's file; failures are retried and never cost the pod.

The schedd renews a spooled proxy by writing `<x509userproxy>.tmp` and renaming it over the old
file (HTCondor src/condor_schedd.V6/schedd.cpp, Scheduler::updateGSICred and
UpdateGSICredContinuation::finish_update); `renew` does the same.

On the in-memory fakes (tests/agent/fakes.py): the refresh runs at the pod's turn when
`run_effects` says, and its back-off moves with the fake clock. The files' times are the
kernel's: after a create, the agent compares them with the real time of its read; after a restart,
with the pod's creationTimestamp, so the restart test starts its fake clock at the real time.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from pathlib import Path

import pytest

from ce_k8s.agent import routedjob
from ce_k8s.agent.credentials import RETRY_CAP_S, credential_paths
from ce_k8s.pods.names import pod_name, secret_name

from .conftest import GJID, make_spool, routed_ad, update
from .fakes import FakeClock, api_error, fake_agent, run_effects

NAME = pod_name(GJID, 0)
RUNNING = {"phase": "Running", "startTime": "2025-10-09T08:55:00Z",
           "containerStatuses": [{"name": "pilot", "state": {"running": {"startedAt": "2025-10-09T08:55:00Z"}}}]}


@pytest.fixture
def agent(settings):
    return fake_agent(settings)



def secret_file(api, key="x509up") -> bytes | None:
    secret = api.secrets.get(secret_name(NAME))
    if secret is None or key not in (secret.get("data") or {}):
        return None
    return base64.b64decode(secret["data"][key])


def proxy_path(settings) -> Path:
    return Path(settings.spool) / "4711" / "0" / "cluster4711.proc0.subproc0" / "x509up"


def renew(path: Path, content: bytes) -> None:
    """What the CE schedd does on a proxy refresh: a new file, renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def running_pilot(agent, settings):
    """A routed pilot whose pod runs and whose Secret the agent created; returns its routed ad."""
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    run_effects(agent)
    assert secret_file(agent.api) == b"PROXY"
    assert agent.cache.get(NAME)
    agent.api.set_status(NAME, RUNNING)
    assert agent.cache.get(NAME).phase == "Running"
    assert update(agent, ad)["JobStatus"] == 2
    return ad


def settled(agent) -> None:
    """Run the queued refreshes: then the refresher has nothing queued or in flight."""
    run_effects(agent)
    assert agent.effects.refreshes_waiting() == 0
    assert not any(r.credentials is not None and r.credentials.busy for r in agent.jobs.values())


def test_renewed_proxy_is_in_the_secret_after_one_update(agent, settings, caplog):
    ad = running_pilot(agent, settings)
    for _ in range(3):
        update(agent, ad)
    settled(agent)
    assert agent.api.calls[("patch", "secrets")] == 0          # unchanged files: no patch, ever
    renew(proxy_path(settings), b"RENEWED PROXY")
    with caplog.at_level(logging.INFO, logger="ce_k8s.agent.credentials"):
        update(agent, ad)                                      # the job's next poll, and no other
        run_effects(agent)                                     # the pod's turn on the work queue
        assert secret_file(agent.api) == b"RENEWED PROXY"
    assert agent.api.calls[("patch", "secrets")] == 1
    refreshed = [r.getMessage() for r in caplog.records if "event=credential-refreshed" in r.getMessage()]
    assert len(refreshed) == 1 and f"job={ad['ClusterId']}.0 " in refreshed[0] and "keys=x509up" in refreshed[0]
    assert agent.metrics["credentials_refreshed"] == 1
    assert "ce_k8s_credential_refreshes_total 1.0" in agent.prom.render().decode()
    secret = agent.api.secrets[secret_name(NAME)]
    assert base64.b64decode(secret["data"]["glidein_startup.sh"]) == b"#!/bin/sh\necho pilot\n"   # untouched
    for _ in range(3):
        update(agent, ad)
    settled(agent)
    assert agent.api.calls[("patch", "secrets")] == 1          # the same file is not copied twice


def test_in_place_rewrite_is_noticed_too(agent, settings):
    ad = running_pilot(agent, settings)
    update(agent, ad)
    settled(agent)
    path = proxy_path(settings)
    path.write_bytes(b"REWRITTEN IN PLACE, LONGER")   # same inode: size, mtime and ctime change
    update(agent, ad)
    run_effects(agent)
    assert secret_file(agent.api) == b"REWRITTEN IN PLACE, LONGER"


def test_unchanged_files_are_not_read_on_the_update_path(agent, settings, monkeypatch):
    ad = running_pilot(agent, settings)
    update(agent, ad)
    settled(agent)
    reads = []
    real = agent.creator.read_credentials
    monkeypatch.setattr(agent.creator, "read_credentials", lambda *a, **k: reads.append(1) or real(*a, **k))
    for _ in range(20):
        update(agent, ad)
    settled(agent)
    assert reads == []


def test_symlink_to_another_jobs_proxy_is_never_copied(agent, settings, caplog):
    """sandbox_io's rule holds for refreshes too: no link out of the job's own spool directory."""
    other = make_spool(Path(settings.spool).parent, cluster=4712)
    (other / "x509up").write_bytes(b"ANOTHER JOB'S PROXY")
    ad = running_pilot(agent, settings)
    update(agent, ad)
    settled(agent)
    path = proxy_path(settings)
    path.unlink()
    path.symlink_to(other / "x509up")
    with caplog.at_level(logging.WARNING, logger="ce_k8s.agent.credentials"):
        out = update(agent, ad)
        settled(agent)
    assert secret_file(agent.api) == b"PROXY"
    assert agent.api.calls[("patch", "secrets")] == 0
    assert any("event=credential-refresh-failed" in r.getMessage() and "why=read" in r.getMessage()
               for r in caplog.records)
    assert 'ce_k8s_credential_refresh_failures_total{why="read"} 1.0' in agent.prom.render().decode()
    assert "JobStatus" not in out and NAME in agent.api.pods   # still running, pod kept


def test_failed_patch_is_retried_and_the_pod_is_kept_even_when_the_proxy_expired(agent, settings):
    ad = running_pilot(agent, settings)
    ad["x509UserProxyExpiration"] = 1_000_000_000              # long expired: not our reason to kill
    update(agent, ad)
    settled(agent)
    agent.api.fail[("patch", "secrets")] = [api_error(500, "etcd unavailable") for _ in range(2)]
    renew(proxy_path(settings), b"RENEWED AFTER FAILURES")
    rec = agent.jobs[NAME]
    statuses = []
    for _ in range(10):
        agent.clock.advance(RETRY_CAP_S)                       # past the back-off: the next update retries
        statuses.append(update(agent, ad).get("JobStatus"))
        settled(agent)
        if secret_file(agent.api) == b"RENEWED AFTER FAILURES":
            break
    assert secret_file(agent.api) == b"RENEWED AFTER FAILURES"
    assert agent.api.calls[("patch", "secrets")] == 3 and rec.credentials.failures == 0
    assert 'ce_k8s_credential_refresh_failures_total{why="api"} 2.0' in agent.prom.render().decode()
    assert statuses == [None] * len(statuses)                  # never held, never idle again
    assert agent.api.calls[("delete", "pods")] == 0 and NAME in agent.api.pods


def test_failure_waits_for_its_back_off(agent, settings):
    ad = running_pilot(agent, settings)
    update(agent, ad)
    settled(agent)
    agent.api.fail[("patch", "secrets")] = [api_error(500, "etcd unavailable")]
    renew(proxy_path(settings), b"RENEWED")
    update(agent, ad)
    settled(agent)
    assert agent.jobs[NAME].credentials.failures == 1 and agent.jobs[NAME].credentials.next_try > 0
    for _ in range(3):
        update(agent, ad)           # within the back-off: no new attempt
    settled(agent)
    assert agent.api.calls[("patch", "secrets")] == 1 and secret_file(agent.api) == b"PROXY"
    agent.clock.advance(RETRY_CAP_S)          # the back-off is over
    update(agent, ad)
    settled(agent)
    assert agent.api.calls[("patch", "secrets")] == 2 and secret_file(agent.api) == b"RENEWED"


def test_restarted_agent_copies_a_proxy_renewed_while_it_was_down(settings):
    first = fake_agent(settings, clock=FakeClock(time.time()))    # creationTimestamp on the files' clock
    ad = running_pilot(first, settings)
    second = fake_agent(settings, api=first.api)       # restarted: same cluster, a new memory
    assert second.cache.get(NAME) is not None and second.cache.get(NAME).phase == "Running"
    update(second, ad)
    settled(second)
    assert second.api.calls[("patch", "secrets")] == 0    # no file changed after the pod was made
    path = proxy_path(settings)
    renew(path, b"RENEWED WHILE NOBODY WATCHED")
    later = time.time() + 60          # as if renewed a minute after the pod started (no waiting here)
    os.utime(path, (later, later))
    third = fake_agent(settings, api=first.api)        # and restarted again
    assert third.cache.get(NAME) is not None
    update(third, ad)
    run_effects(third)
    assert secret_file(third.api) == b"RENEWED WHILE NOBODY WATCHED"
    assert third.api.calls[("patch", "secrets")] == 1


def test_finished_pod_gets_no_refresh(agent, settings):
    ad = running_pilot(agent, settings)
    update(agent, ad)
    settled(agent)

    done = {"phase": "Succeeded", "containerStatuses": [{"name": "pilot", "state": {"terminated": {
        "exitCode": 0, "startedAt": "2025-10-09T08:55:00Z", "finishedAt": "2025-10-09T09:05:00Z"}}}]}
    agent.api.set_status(NAME, done)
    assert agent.cache.get(NAME).phase == "Succeeded"
    renew(proxy_path(settings), b"TOO LATE")
    update(agent, ad)
    settled(agent)
    assert agent.api.calls[("patch", "secrets")] == 0 and secret_file(agent.api) == b"PROXY"


def test_only_paths_below_the_spool_are_watched():
    """A path the caller names elsewhere (a factory-side ScitokensFile, or /etc/shadow) is never
    even stat'ed; relative names are taken below Iwd."""
    attrs = {"x509userproxy": '"x509up"', "iwd": '"/spool/1/0/cluster1.proc0.subproc0"',
             "scitokensfile": '"/etc/shadow"'}
    assert credential_paths(_routed(attrs), "/spool") == ("/spool/1/0/cluster1.proc0.subproc0/x509up",)
    attrs = {"x509userproxy": '"/spool/../etc/shadow"', "scitokensfile": '"/spool/1/0/c/token"'}
    assert credential_paths(_routed(attrs), "/spool/") == ("/spool/1/0/c/token",)
    assert credential_paths(_routed({"x509userproxy": '"x509up"'}), "/spool") == ()     # relative, and no Iwd


def _routed(attrs: dict[str, str]) -> routedjob.RoutedJob:
    """The routed-job view of an ad with these lines (raw literals)."""
    return routedjob.read("".join(f"{name} = {value}\n" for name, value in attrs.items()))
