"""A GPU for a real node that has none: the kubelet's device-plugin API with stand-in devices (test tool only).

These machines have no GPU (`ls /dev/nvidia*` finds nothing), so the one piece a real node lacks
is the device and its vendor's plugin. `fake_gpu_plugin.go` (beside this module) speaks the
kubelet's own device-plugin API (v1beta1, from `k8s.io/kubelet` of the bed's release): it registers
`nvidia.com/gpu`, lists N healthy devices with IDs of a GPU UUID's shape, and answers each allocation with
`NVIDIA_VISIBLE_DEVICES`, as NVIDIA's plugin does in its default `envvar`/`uuid` strategy.
Everything else is the real system's: the kubelet advertises the devices as the node's capacity,
the scheduler counts them, the kubelet's device manager picks which device a container gets and
never gives one to two containers, and runc puts the variable into the container. A pod that asks
for more than is free waits, Unschedulable.

The plugin is built in the bed's Kubernetes wrapper module (:mod:`ce_k8s.real.kube.kubebuild`),
where `k8s.io/kubelet` and gRPC of the same release already are; the binary is cached beside the
bed's binaries, named by its source's hash. It runs in the real node's mount namespace, where the
kubelet's device-plugin directory is the node's own (`/var/lib` is bound there:
:mod:`ce_k8s.real.node.node`), and is killed with the node at `down`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

from ce_k8s.real.kube import kubebuild
from ce_k8s.real.processes import terminate

SOURCE = Path(__file__).with_name("fake_gpu_plugin.go")
RESOURCE = "nvidia.com/gpu"
PREFIX = "GPU-00000000-0000-4000-8000-ce8c"          # and 8 hex digits: a GPU UUID's shape
CMD = "ce-k8s-fake-gpu"


class FakeGPUError(RuntimeError):
    """The plugin could not be built or did not register; the message says where to look."""


def build(version: str, cache: Path = kubebuild.CACHE, progress=print) -> Path:
    """The plugin's binary for Kubernetes `version` (built once per source; warm: a stat)."""
    source = SOURCE.read_bytes()
    out = cache / version / "bin" / f"{CMD}-{hashlib.sha256(source).hexdigest()[:12]}"
    if out.exists():
        return out
    module = cache / version / "kubernetes"
    if not (module / "go.mod").exists():
        raise FakeGPUError(f"no Kubernetes {version} build in {module}: run `python -m ce_k8s.real.kube.kubebuild`")
    pkg = module / "cmd" / CMD
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "main.go").write_bytes(source)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    kubebuild._go(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp), f"./cmd/{CMD}"], module, progress)
    os.replace(tmp, out)
    return out


class FakeGPUs:
    """The plugin running on one real node: `start`, `allocations`, `stop`."""

    def __init__(self, binary: Path, holder_pid: int, log_dir: Path, count: int = 2) -> None:
        self.binary = binary
        self.holder_pid = holder_pid
        self.log = log_dir / f"{CMD}.log"
        self.count = count
        self.pid: int | None = None

    def start(self, timeout: float = 30) -> None:
        """Start it in the node's mount namespace and wait for the kubelet to accept its registration."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as out:
            proc = subprocess.Popen(["nsenter", f"--target={self.holder_pid}", "--mount", "--", str(self.binary),
                                     f"--count={self.count}", f"--resource={RESOURCE}", f"--prefix={PREFIX}"],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = proc.pid
        deadline = time.monotonic() + timeout
        while "registered" not in self.log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise FakeGPUError(f"the fake GPU plugin did not register with the kubelet: {self.log.read_text()}")
            time.sleep(0.1)

    def allocations(self) -> list[list[str]]:
        """The device IDs of each allocation the kubelet asked for, in order."""
        return [line.split(" ", 1)[1].split(",") for line in self.log.read_text().splitlines()
                if line.startswith("allocate ")]

    def stop(self) -> None:
        if self.pid is not None:
            terminate(self.pid, timeout=5)
            self.pid = None
