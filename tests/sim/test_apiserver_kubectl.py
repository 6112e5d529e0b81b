"""kubectl 1.32 (/usr/bin/kubectl) against the emulator: the commands that fail on plain kmock
(docs/design.md "kmock 0.8, measured": "get pods" resolves to metrics.k8s.io, "create -f" cannot download
openapi, "get ns" is a 500) work here, with validation on."""

from __future__ import annotations

import json
import subprocess

import pytest

POD_YAML = """\
apiVersion: v1
kind: Pod
metadata:
  name: kp
  labels: {app: demo}
  annotations: {sim.ce-k8s.io/scenario: 'run=1s stdout="hi from kp"'}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: busybox:1.36
"""


@pytest.fixture
def kubectl(cluster, tmp_path):
    def run(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = ["kubectl", "--kubeconfig", cluster.kubeconfig_path, "--cache-dir", str(tmp_path / "cache"), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, input=stdin)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc
    return run


def test_kubectl_create_get_logs_delete(kubectl, cluster, tmp_path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD_YAML)
    assert "pod/kp created" in kubectl("create", "-f", str(manifest)).stdout
    names = kubectl("get", "pods", "-l", "app=demo", "-o", "name").stdout.split()
    assert names == ["pod/kp"]
    assert kubectl("get", "pods", "-l", "app=other", "-o", "name").stdout.strip() == ""
    cluster.wait_for(lambda: cluster.store.get("pods", "default", "kp")["status"]["phase"] == "Succeeded")
    doc = json.loads(kubectl("get", "pod", "kp", "-o", "json").stdout)
    assert doc["kind"] == "Pod" and doc["status"]["phase"] == "Succeeded" and doc["metadata"]["uid"]
    assert kubectl("logs", "kp").stdout == "hi from kp\n"
    assert 'pod "kp" deleted' in kubectl("delete", "pod", "kp").stdout
    assert cluster.store.get("pods", "default", "kp") is None
    missing = kubectl("get", "pod", "kp", check=False)
    assert missing.returncode == 1 and 'pods "kp" not found' in missing.stderr


def test_kubectl_nodes_namespaces_and_jsonpath(kubectl):
    nodes = kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    assert nodes == ["cpu-1", "cpu-2", "gpu-1"]
    assert "default" in kubectl("get", "ns", "-o", "name").stdout
    ready = kubectl("get", "node", "gpu-1", "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
    assert ready.stdout == "True"


def test_kubectl_reports_server_errors(kubectl):
    bad = POD_YAML.replace("name: kp", "name: Bad_Name")
    proc = kubectl("create", "-f", "-", check=False, stdin=bad)
    assert proc.returncode == 1 and 'The Pod "Bad_Name" is invalid' in proc.stderr
    kubectl("create", "-f", "-", stdin=POD_YAML)
    dup = kubectl("create", "-f", "-", check=False, stdin=POD_YAML)
    assert dup.returncode == 1 and "AlreadyExists" in dup.stderr
