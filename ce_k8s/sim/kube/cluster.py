"""Simulated node pools from a compact spec string, e.g. ``cpu:3x16c64g,gpu:1x32c256g4gpu:taint=…``.

Tests, the demo and the benchmarks need clusters of a known shape (how many pilots fit, which need
a toleration) without writing Node manifests. The grammar (also in docs/testbed.md)::

    SPEC   := POOL ("," POOL)*
    POOL   := NAME ":" COUNT "x" SHAPE (":" OPTION)*
    SHAPE  := (NUMBER UNIT)+          UNIT: c = cpus, g = GiB memory, gpu = nvidia.com/gpu,
                                            d = GiB ephemeral-storage (default 100)
    OPTION := taint=KEY[=VALUE]:EFFECT | label=KEY=VALUE | pods=N | res=NAME=QTY | cordon

Nodes are named ``NAME-1`` … ``NAME-COUNT`` and labelled ``sim.ce-k8s.io/pool=NAME``. A bad spec
raises :class:`NodeSpecError` naming the offending part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ce_k8s.sim.kube.validate import DNS1123_LABEL

DEFAULT_NODES = "cpu:3x16c64g"
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_SHAPE_PART = re.compile(r"(\d+(?:\.\d+)?)(gpu|c|g|d)")


class NodeSpecError(ValueError):
    """A node spec string that does not parse."""


@dataclass
class NodeSpec:
    """One simulated node."""

    name: str
    cpu: str = "16"
    memory: str = "64Gi"
    gpus: int = 0
    ephemeral_storage: str = "100Gi"
    pods: int = 110
    extended: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    unschedulable: bool = False

    def capacity(self) -> dict[str, str]:
        """``status.capacity`` (allocatable is the same: the sim reserves nothing for the system)."""
        cap = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods),
               "ephemeral-storage": self.ephemeral_storage}
        if self.gpus:
            cap["nvidia.com/gpu"] = str(self.gpus)
        cap.update(self.extended)
        return cap

    def manifest(self, index: int = 0) -> dict[str, object]:
        """The Node object as a kubelet would register it."""
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64", **self.labels}
        spec: dict[str, object] = {}
        if self.taints:
            spec["taints"] = [dict(t) for t in self.taints]
        if self.unschedulable:
            spec["unschedulable"] = True
        cap = self.capacity()
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": spec,
            "status": {
                "capacity": dict(cap), "allocatable": dict(cap),
                "addresses": [{"type": "InternalIP", "address": f"10.0.{index // 250}.{index % 250 + 2}"},
                              {"type": "Hostname", "address": self.name}],
                "nodeInfo": {"kubeletVersion": "v1.32.4-ce-k8s-sim", "containerRuntimeVersion": "containerd://1.7",
                             "operatingSystem": "linux", "architecture": "amd64", "osImage": "ce-k8s sim",
                             "kernelVersion": "6.1.0", "machineID": "", "systemUUID": "", "bootID": "",
                             "kubeProxyVersion": ""},
                "conditions": [],
            },
        }


def _parse_taint(text: str, where: str) -> dict[str, str]:
    body, _, effect = text.rpartition(":")
    if effect not in _EFFECTS or not body:
        raise NodeSpecError(f"{where}: taint {text!r} must be KEY[=VALUE]:EFFECT with EFFECT one of {_EFFECTS}")
    key, _, value = body.partition("=")
    taint = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return taint


def parse_nodes(spec: str) -> list[NodeSpec]:
    """Parse a node spec string into :class:`NodeSpec` objects (see the module docstring)."""
    nodes: list[NodeSpec] = []
    if not spec or not spec.strip():
        return nodes
    for pool_text in spec.split(","):
        pool_text = pool_text.strip()
        where = f"node spec {pool_text!r}"
        raw = pool_text.split(":")
        # ":NoSchedule" belongs to the taint before it, not a new option.
        parts: list[str] = []
        for p in raw:
            if p in _EFFECTS and parts and parts[-1].startswith("taint="):
                parts[-1] += ":" + p
            else:
                parts.append(p)
        if len(parts) < 2:
            raise NodeSpecError(f"{where}: expected NAME:COUNTxSHAPE, e.g. cpu:3x16c64g")
        name = parts[0]
        if not DNS1123_LABEL.match(name) or len(name) > 50:
            raise NodeSpecError(f"{where}: pool name {name!r} must be a lowercase DNS label")
        m = re.fullmatch(r"(\d+)x(.+)", parts[1])
        if not m:
            raise NodeSpecError(f"{where}: {parts[1]!r} is not COUNTxSHAPE")
        count, shape = int(m[1]), m[2]
        if count < 1:
            raise NodeSpecError(f"{where}: count must be at least 1")
        if _SHAPE_PART.sub("", shape):
            raise NodeSpecError(f"{where}: shape {shape!r} must be NUMBER+UNIT parts with units c, g, gpu, d")
        base = NodeSpec(name="")
        for num, unit in _SHAPE_PART.findall(shape):
            if unit == "c":
                base.cpu = num
            elif unit == "g":
                base.memory = f"{num}Gi"
            elif unit == "gpu":
                base.gpus = int(float(num))
            else:
                base.ephemeral_storage = f"{num}Gi"
        for opt in parts[2:]:
            key, _, val = opt.partition("=")
            if key == "taint":
                base.taints.append(_parse_taint(val, where))
            elif key == "label":
                lk, _, lv = val.partition("=")
                if not lk:
                    raise NodeSpecError(f"{where}: label needs KEY=VALUE")
                base.labels[lk] = lv
            elif key == "pods" and val.isdigit():
                base.pods = int(val)
            elif key == "res":
                rk, _, rv = val.partition("=")
                if not rk or not rv:
                    raise NodeSpecError(f"{where}: res needs NAME=QUANTITY")
                base.extended[rk] = rv
            elif key == "cordon" and not val:
                base.unschedulable = True
            else:
                raise NodeSpecError(f"{where}: unknown option {opt!r} (taint=, label=, pods=, res=, cordon)")
        for i in range(1, count + 1):
            nodes.append(NodeSpec(name=f"{name}-{i}", cpu=base.cpu, memory=base.memory, gpus=base.gpus,
                                  ephemeral_storage=base.ephemeral_storage, pods=base.pods,
                                  extended=dict(base.extended),
                                  labels={"sim.ce-k8s.io/pool": name, **base.labels},
                                  taints=[dict(t) for t in base.taints], unschedulable=base.unschedulable))
    names = [n.name for n in nodes]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise NodeSpecError(f"node spec {spec!r}: duplicate node names {sorted(dup)}")
    return nodes
