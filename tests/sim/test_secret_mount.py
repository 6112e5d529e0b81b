"""The kubelet simulator's view of Secret volumes (ce_k8s/sim/kube/kubelet_secrets.py): what a pod's
containers read, projected at mount time and replaced as a whole when the Secret changes, as the
kubelet's atomic writer does; and, on the whole demo path, a proxy renewed in the spool while the
pilot runs shows up in its pod's mounted Secret one router poll later (docs/agent.md "Credential
refresh")."""

from __future__ import annotations

import base64

from ce_k8s.demos.credrefresh import CredentialDrill
from ce_k8s.sim.testbed import TestBed


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret_body(**data: str) -> dict:
    return {"metadata": {"name": "sbx"}, "data": {k.replace("_", "-"): b64(v) for k, v in data.items()}}


def sandbox_pod(pod_body, items: list[dict] | None = None) -> dict:
    body = pod_body("p1", scenario="run=forever")
    volume: dict = {"secretName": "sbx", "defaultMode": 0o440}
    if items is not None:
        volume["items"] = items
    body["spec"]["volumes"] = [{"name": "sandbox", "secret": volume}]
    return body


def running(cluster, name="p1") -> bool:
    p = cluster.store.get("pods", "default", name)
    return bool(p) and p["status"].get("phase") == "Running"


def test_mounted_files_follow_items_and_a_patched_secret(cluster, kcore, pod_body):
    kl = cluster.kubelet
    items = [{"key": "x509up", "path": "x509up", "mode": 0o400}, {"key": "exe", "path": "bin/run", "mode": 0o550}]
    kcore.create_namespaced_pod("default", sandbox_pod(pod_body, items))
    assert kl.mounted_files("default", "p1") is None                  # no Secret yet: nothing mounted
    kcore.create_namespaced_secret("default", secret_body(x509up="OLD", exe="#!/bin/sh", unlisted="no"))
    cluster.wait_for(lambda: running(cluster))
    assert kl.mounted_files("default", "p1") == {"x509up": b"OLD", "bin/run": b"#!/bin/sh"}
    kcore.patch_namespaced_secret("sbx", "default", {"data": {"x509up": b64("NEW")}})
    # the store event reached the kubelet before the PATCH was answered
    assert kl.mounted_files("default", "p1") == {"x509up": b"NEW", "bin/run": b"#!/bin/sh"}
    assert kl.mounted_files("default", "p1", "sandbox") == {"x509up": b"NEW", "bin/run": b"#!/bin/sh"}
    assert kl.mounted_files("default", "p1", "no-such-volume") is None


def test_without_items_every_key_is_a_file_and_a_deleted_secret_stays_mounted(cluster, kcore, pod_body):
    kl = cluster.kubelet
    kcore.create_namespaced_secret("default", secret_body(a="1", b="2"))
    kcore.create_namespaced_pod("default", sandbox_pod(pod_body))
    cluster.wait_for(lambda: running(cluster))
    assert kl.mounted_files("default", "p1") == {"a": b"1", "b": b"2"}
    kcore.delete_namespaced_secret("sbx", "default")
    assert kl.mounted_files("default", "p1") == {"a": b"1", "b": b"2"}   # the kubelet keeps the last contents
    kcore.create_namespaced_secret("default", secret_body(a="3"))
    assert kl.mounted_files("default", "p1") == {"a": b"3"}
    kcore.delete_namespaced_pod("p1", "default", grace_period_seconds=0)
    cluster.wait_for(lambda: cluster.store.get("pods", "default", "p1") is None)
    cluster.wait_for(lambda: kl.mounted_files("default", "p1") is None)


def test_a_secret_change_reaches_only_the_pods_mounting_it(cluster, kcore, pod_body):
    kl = cluster.kubelet
    kcore.create_namespaced_secret("default", secret_body(a="1"))
    kcore.create_namespaced_secret("default", {"metadata": {"name": "other"}, "data": {"a": b64("x")}})
    kcore.create_namespaced_pod("default", sandbox_pod(pod_body))
    body = pod_body("p2", scenario="run=forever")
    body["spec"]["volumes"] = [{"name": "sandbox", "secret": {"secretName": "other"}}]
    kcore.create_namespaced_pod("default", body)
    cluster.wait_for(lambda: running(cluster, "p1") and running(cluster, "p2"))
    kcore.patch_namespaced_secret("other", "default", {"data": {"a": b64("y")}})
    assert kl.mounted_files("default", "p1") == {"a": b"1"}
    assert kl.mounted_files("default", "p2") == {"a": b"y"}


def test_demo_path_renewed_proxy_is_in_the_running_pod_one_poll_later():
    """Router emulator + real hooks + the real agent process + API emulator and kubelet simulator:
    every chosen pilot's proxy is renewed while its pod runs and its pod's mounted Secret shows the
    new proxy after the next router poll (the job's next update hook call)."""
    drill = CredentialDrill(1.0, seed=3)
    with TestBed(seed=3, time_scale=0.05) as bed:
        pilots = bed.make_pilots(3, run_s=4.0, fail_fraction=0.0)
        assert drill.choose(pilots, poll_s=0.5, time_scale=0.05) == 3

        def turn(b) -> None:
            drill.turn(b)
        assert bed.submit(pilots)
        assert bed.run(timeout=120, poll_interval=0.5, progress=turn)
        summary = drill.summary()
        assert bed.summary()["completed"] == 3
        assert bed.server.calls[("patch", "secrets")] == 3            # one patch per renewal, no more
    assert summary["credentials_renewed"] == 3 and summary["credentials_refreshed"] == 3
    assert summary["credentials_all_seen"] and summary["credentials_pod_ended_first"] == 0
    assert summary["credential_refresh_polls_max"] == 1
