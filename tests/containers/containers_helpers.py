"""Helpers for the container and manifest tests: render kustomizations, pick objects out of them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "containers" / "k8s"
KUSTOMIZATIONS = ("base", "ce", "overlays/example-site")
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
#: kustomize's generated names: <name>-<10-character content hash>.
HASHED = re.compile(r"^(?P<base>.+)-[a-z0-9]{10}$")


def kustomize(rel: str) -> list[dict]:
    """Render one kustomization with `kubectl kustomize` (offline) and parse the YAML stream."""
    proc = subprocess.run([KUBECTL, "kustomize", str(K8S / rel)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize {rel} failed: {proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
    """Objects of a kind (optionally by name/namespace)."""
    out = []
    for d in docs:
        md = d.get("metadata") or {}
        if d.get("kind") != kind:
            continue
        if name is not None and md.get("name") != name:
            m = HASHED.match(str(md.get("name", "")))
            if not (kind in ("ConfigMap", "Secret") and m and m.group("base") == name):
                continue
        if namespace is not None and md.get("namespace") != namespace:
            continue
        out.append(d)
    return out


def one(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> dict:
    found = find(docs, kind, name, namespace)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
