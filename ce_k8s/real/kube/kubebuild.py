"""Build the real Kubernetes control plane from the Go module proxy, into a cache (test tool only).

`k8s.io/kubernetes` cannot be `go install`ed: its go.mod requires every staging module
(`k8s.io/api`, `k8s.io/client-go`, ...) at v0.0.0 and replaces it with `./staging/...`, a path
that is not in the module zip. So a small wrapper module is written in the cache: it requires
`k8s.io/kubernetes vX.Y.Z` and replaces each staging module (the list is read from the `.mod`
file the proxy serves, never hard-coded) with its published tag `v0.Y.Z`. etcd's server module
has relative replaces too and gets a wrapper of its own (so its gRPC pins do not move the
Kubernetes build); kwok's go.mod has none and is built in a third one. Nothing built is
committed; GOMODCACHE and GOCACHE stay on the machine, so a warm start only checks stamps.

    ce-k8s testbed real-kube build [--kubernetes 1.37] [--cache DIR]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("CE_K8S_REAL_KUBE_CACHE", "/var/cache/ce-k8s/kube"))
# The newest release the proxy serves (go list -m -versions k8s.io/kubernetes, 2026-11-27) and the
# older minor we also support; kwok and etcd as their releases pair with them.
RELEASES = {"1.37": "v1.37.2", "1.36": "v1.36.3"}
DEFAULT_MINOR = "1.37"
ETCD = "v3.6.16"
KWOK = "v0.8.0"
KUBE_CMDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")
# The kubelet of the same release plays the bed's real nodes (ce_k8s.real.node.node); a cache built
# before it was added has every other binary and only needs it (a warm build cache: about 2 min).
STAMP = ".ce-k8s-built"


class BuildError(RuntimeError):
    """A build step failed; the message names the module, the version and Go's own words."""


@dataclass(frozen=True)
class Binaries:
    """Paths of one built set (bin directory of one release)."""

    bin: Path
    version: str

    def __getitem__(self, name: str) -> str:
        return str(self.bin / name)


def _go(args: list[str], cwd: Path, progress, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false", "CGO_ENABLED": "0",
                "GOTOOLCHAIN": "local", **(env or {})}
    progress(f"go {' '.join(args[:3])}{' ...' if len(args) > 3 else ''} (in {cwd.name})")
    proc = subprocess.run(["go", *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          check=False, timeout=3600)
    if proc.returncode != 0:
        raise BuildError(f"go {' '.join(args)} failed in {cwd}:\n{proc.stderr.strip()[-3000:]}")
    return proc.stdout


def staging_modules(version: str, cwd: Path, progress) -> list[str]:
    """The modules k8s.io/kubernetes@version replaces with ./staging paths, from its served go.mod."""
    info = json.loads(_go(["mod", "download", "-json", f"k8s.io/kubernetes@{version}"], cwd, progress))
    if info.get("Error"):
        raise BuildError(f"the module proxy refused k8s.io/kubernetes@{version}: {info['Error']}")
    text = Path(info["GoMod"]).read_text()
    mods = re.findall(r"^\s*(k8s\.io/[A-Za-z0-9_.-]+)\s+=>\s+\./staging/", text, re.M)
    if not mods:
        raise BuildError(f"k8s.io/kubernetes@{version}'s go.mod names no staging replace; the recipe is stale")
    return mods


def _wrapper(path: Path, name: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "go.mod").exists():
        (path / "go.mod").write_text(f"module {name}\n\ngo 1.26.0\n")


def build(minor: str = DEFAULT_MINOR, cache: Path = CACHE, progress=print) -> Binaries:
    """Build (or find) every binary of one release; idempotent, a warm call costs a stat."""
    if minor not in RELEASES:
        raise BuildError(f"Kubernetes {minor} is not one we build; choose one of {', '.join(RELEASES)}")
    version = RELEASES[minor]
    if shutil.which("go") is None:
        raise BuildError("no `go` on PATH: the real Kubernetes bed builds its binaries with Go >= 1.26")
    base = cache / version
    bindir = base / "bin"
    stamp = bindir / STAMP
    if stamp.exists() and all((bindir / c).exists() for c in (*KUBE_CMDS, "etcd", "kwok")):
        return Binaries(bindir, version)
    stamp.unlink(missing_ok=True)
    bindir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # --- Kubernetes
    kube = base / "kubernetes"
    _wrapper(kube, "cek8s.local/kubebins")
    mods = staging_modules(version, kube, progress)
    staging = "v0." + version.split(".", 1)[1]          # v1.37.2 -> v0.37.2
    _go(["mod", "edit", *[f"-replace={m}={m}@{staging}" for m in mods],
         f"-require=k8s.io/kubernetes@{version}"], kube, progress)
    pkgs = [f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_CMDS]
    _go(["get", *[f"{p}@{version}" for p in pkgs]], kube, progress)
    major_minor = version[1:].split(".")
    ver_pkgs = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    flags = ["-s", "-w"]
    for p in ver_pkgs:
        flags += [f"-X {p}.gitVersion={version}", f"-X {p}.gitMajor={major_minor[0]}",
                  f"-X {p}.gitMinor={major_minor[1]}", f"-X {p}.gitTreeState=clean"]
    _go(["build", "-trimpath", "-ldflags", " ".join(flags), "-o", str(bindir) + "/", *pkgs], kube, progress)
    # --- etcd
    etcd = base / "etcd"
    _wrapper(etcd, "cek8s.local/etcdbin")
    _go(["get", f"go.etcd.io/etcd/server/v3@{ETCD}"], etcd, progress)
    _go(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(bindir / "etcd"), "go.etcd.io/etcd/server/v3"],
        etcd, progress)
    # --- kwok
    kwok = base / "kwok"
    _wrapper(kwok, "cek8s.local/kwokbin")
    _go(["get", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK}"], kwok, progress)
    _go(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(bindir / "kwok"), "sigs.k8s.io/kwok/cmd/kwok"],
        kwok, progress)
    stamp.write_text(json.dumps({"kubernetes": version, "etcd": ETCD, "kwok": KWOK,
                                 "seconds": round(time.monotonic() - started, 1)}) + "\n")
    progress(f"built Kubernetes {version}, etcd {ETCD}, kwok {KWOK} in {time.monotonic() - started:.0f} s")
    return Binaries(bindir, version)


if __name__ == "__main__":   # .ci/run: before the venv exists (this module is stdlib only)
    import sys

    built = build(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MINOR,
                  progress=lambda msg: print(f"kubebuild: {msg}", flush=True))
    print(f"kubebuild: Kubernetes {built.version} in {built.bin}", flush=True)
