"""A real node's container runtime and images, fetched and built here into a cache (test tool only).

The real-Kubernetes bed's real nodes (:mod:`ce_k8s.real.node.node`) run the kubelet built with the
control plane (:mod:`ce_k8s.real.kube.kubebuild`) on **containerd 2.1.9** and the **CNI plugins 1.9.1**
from Debian sid. The `.deb` files come from Debian's own archive through a private apt directory
(the host's apt state is not touched) and are unpacked with `dpkg-deb -x`, never installed.

**runc 1.3.7** is built here from the Go module proxy (:func:`build_runc`): Debian 12's runc 1.1.5
has no idmapped mounts, so containerd reports no user-namespace support and the kubelet refuses a
pod with `hostUsers: false`; sid's and trixie's runc need glibc 2.38 (this base has 2.36). runc
needs cgo (nsenter) and, for seccomp, `libseccomp-dev`: **the build installs `libseccomp-dev`
with apt when its header is missing** (the one change to the host's packages). At run time runc
needs only glibc and `libseccomp.so.2` (`libseccomp2`, on the base already).

There is no container registry here, so the two images a pod needs are built as OCI archives:

* `ce-k8s.invalid/busybox:1.35` — Debian 12's `busybox-static` with its applets, `/etc/passwd`
  naming root, nobody and the pilot account (uid 1000, as ce-k8s's restricted pods run);
* `ce-k8s.invalid/pause:3.10.2` — the sandbox's pause, compiled with `gcc -static` from
  `build/pause/linux/pause.c` of the `k8s.io/kubernetes` module the control plane was built from.

`.invalid` is a name that never resolves (RFC 6761): an image that is not in the node's store can
only fail. Nothing is committed; the cache is `/var/cache/ce-k8s/node`.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("CE_K8S_REAL_NODE_CACHE", "/var/cache/ce-k8s/node"))
# Exact versions, so that a suite that moves on fails loudly instead of testing another runtime.
PACKAGES = {
    "containerd": ("sid", "2.1.9+ds1-5"),
    "containernetworking-plugins": ("sid", "1.9.1+ds1-1"),
    "busybox-static": ("bookworm", "1:1.35.0-4+deb12u1+b1"),
}
# runc from the Go module proxy: the newest v1.3.x it serves (go list -m -versions, 2026-11-28;
# containerd 2.1 is released against runc 1.3). Built with cgo and seccomp, as its Makefile does.
RUNC = "v1.3.7"
RUNC_MODULE = "github.com/opencontainers/runc"
RUNC_TAGS = "seccomp urfave_cli_no_docs"
IMAGE_REGISTRY = "ce-k8s.invalid"
BUSYBOX_IMAGE = f"{IMAGE_REGISTRY}/busybox:1.35"
PAUSE_IMAGE = f"{IMAGE_REGISTRY}/pause:3.10.2"
PILOT_UID = 1000
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STAMP = ".ce-k8s-node-built"
APT_OPTIONS = ("-o", "Acquire::Check-Valid-Until=false", "-o", "Debug::NoLocking=1",
               "-o", "Dir::State::status=/dev/null", "-o", "APT::Sandbox::User=root")


class NodeBuildError(RuntimeError):
    """Fetching the runtime or building an image failed; the message says which step and why."""


@dataclass(frozen=True)
class NodeRuntime:
    """Paths of one fetched runtime and its images."""

    root: Path          # the unpacked packages

    @property
    def containerd(self) -> Path:
        return self.root / "usr" / "bin" / "containerd"

    @property
    def shim(self) -> Path:
        return self.root / "usr" / "bin" / "containerd-shim-runc-v2"

    @property
    def ctr(self) -> Path:
        return self.root / "usr" / "bin" / "ctr"

    @property
    def runc(self) -> Path:
        """The runc built by :func:`build_runc`, where a runc .deb would put it (containerd's PATH)."""
        return self.root / "usr" / "sbin" / "runc"

    @property
    def cni_bin(self) -> Path:
        return self.root / "usr" / "lib" / "cni"

    @property
    def images(self) -> dict[str, Path]:
        base = self.root.parent / "images"
        return {BUSYBOX_IMAGE: base / "busybox.oci.tar", PAUSE_IMAGE: base / "pause.oci.tar"}


def _run(argv: list[str], what: str, **kw) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900, **kw)
    if proc.returncode != 0:
        raise NodeBuildError(f"{what} failed ({' '.join(argv[:4])} ...): {proc.stderr.strip()[-2000:]}")
    return proc


def _debian_uri() -> str:
    """The Debian archive this machine's own apt uses (deb822 or one-line sources)."""
    for path in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2:
                return next(w for w in words[1:] if "://" in w)
    raise NodeBuildError("no Debian archive in /etc/apt/sources.list{,.d/debian.sources}: cannot fetch the runtime")


def fetch_packages(dest: Path, progress: Callable[[str], None]) -> None:
    """Download the pinned .debs with a private apt directory and unpack them into `dest`."""
    apt = dest.parent / "apt"
    shutil.rmtree(apt, ignore_errors=True)
    for sub in ("etc/sources.list.d", "etc/apt.conf.d", "etc/preferences.d", "state/lists/partial",
                "cache/archives/partial", "debs"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "etc" / "sources.list").write_text("")
    suites = " ".join(sorted({suite for suite, _ in PACKAGES.values()}))
    (apt / "etc" / "sources.list.d" / "node.sources").write_text(
        f"Types: deb\nURIs: {_debian_uri()}\nSuites: {suites}\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    opts = [*APT_OPTIONS, "-o", f"Dir::Etc={apt / 'etc'}", "-o", f"Dir::State={apt / 'state'}",
            "-o", f"Dir::Cache={apt / 'cache'}"]
    progress(f"apt-get update (private lists: {suites})")
    _run(["apt-get", *opts, "update", "-qq"], "apt-get update")
    wanted = [f"{name}={version}" for name, (_, version) in PACKAGES.items()]
    progress(f"apt-get download {' '.join(wanted)}")
    _run(["apt-get", *opts, "download", *wanted], "apt-get download", cwd=apt / "debs")
    for deb in sorted((apt / "debs").glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(dest)], f"dpkg-deb -x {deb.name}")
    shutil.rmtree(apt, ignore_errors=True)


# ------------------------------------------------------------------ OCI archives
def _blob(out: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mtime = len(data), 0
    out.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _file(layer: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    layer.addfile(info, io.BytesIO(data))


#: One layer entry: its header and where its bytes come from (a regular file's content or a path
#: to stream it from; None for directories and links).
LayerEntry = tuple[tarfile.TarInfo, "bytes | Path | None"]


class _Digesting(io.RawIOBase):
    """A write-only stream that hashes what passes through and counts it (the layer's diff_id)."""

    def __init__(self, out) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


def write_oci_image(path: Path, name: str, entries: list[LayerEntry], image_config: dict[str, object],
                    compresslevel: int = 9) -> str:
    """One-layer OCI image layout as a tar, named for `ctr images import`; returns its digest.

    `entries` are written in the order given (the caller sorts them, so the same input gives the
    same image), each with mtime 0 and root's numeric owner unless its TarInfo says otherwise.
    The layer is streamed through gzip into a file beside `path` (a real root's layer is hundreds
    of MB), hashed on the way: the uncompressed digest is the config's diff_id."""
    tmp = path.with_suffix(".tmp")
    layer_file = path.with_suffix(".layer.tmp")
    try:
        with open(layer_file, "wb") as raw_out:
            compressed_sha = _Digesting(raw_out)
            with gzip.GzipFile(filename="", mode="wb", fileobj=compressed_sha, compresslevel=compresslevel,
                               mtime=0) as gz:
                plain = _Digesting(gz)
                with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as layer:
                    for info, source in entries:
                        info.mtime = 0
                        info.uname = info.gname = ""
                        if isinstance(source, Path):
                            with open(source, "rb") as fh:
                                layer.addfile(info, fh)
                        elif source is not None:
                            info.size = len(source)
                            layer.addfile(info, io.BytesIO(source))
                        else:
                            layer.addfile(info)
        config = {"architecture": "amd64", "os": "linux", "config": image_config,
                  "rootfs": {"type": "layers", "diff_ids": [f"sha256:{plain.sha.hexdigest()}"]}}
        layer_digest = compressed_sha.sha.hexdigest()
        with tarfile.open(tmp, mode="w") as out:
            info = tarfile.TarInfo(f"blobs/sha256/{layer_digest}")
            info.size, info.mtime = compressed_sha.size, 0
            with open(layer_file, "rb") as fh:
                out.addfile(info, fh)
            layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                          "digest": f"sha256:{layer_digest}", "size": compressed_sha.size}
            config_desc = _blob(out, json.dumps(config, sort_keys=True).encode(),
                                "application/vnd.oci.image.config.v1+json")
            manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "config": config_desc, "layers": [layer_desc]}
            manifest_desc = _blob(out, json.dumps(manifest, sort_keys=True).encode(),
                                  "application/vnd.oci.image.manifest.v1+json")
            tag = name.rsplit(":", 1)[1]
            manifest_desc["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}
            index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                     "manifests": [manifest_desc]}
            _file(out, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            _file(out, "index.json", json.dumps(index, sort_keys=True).encode())
        tmp.replace(path)
    finally:
        layer_file.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return str(manifest_desc["digest"])


def write_oci_archive(path: Path, name: str, files: dict[str, tuple[bytes, int]],
                      links: dict[str, str], dirs: dict[str, int], cmd: list[str]) -> str:
    """A small image from memory (`write_oci_image`): `files` maps a path to (content, mode),
    `links` a path to its symlink target, `dirs` a directory to its mode; directories first,
    then files, then links, each sorted."""
    entries: list[LayerEntry] = []
    for d, mode in sorted(dirs.items()):
        info = tarfile.TarInfo(d)
        info.type, info.mode = tarfile.DIRTYPE, mode
        entries.append((info, None))
    for f, (data, mode) in sorted(files.items()):
        info = tarfile.TarInfo(f)
        info.mode = mode
        entries.append((info, data))
    for link, target in sorted(links.items()):
        info = tarfile.TarInfo(link)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        entries.append((info, None))
    return write_oci_image(path, name, entries, {"Env": [DEFAULT_PATH], "Cmd": cmd})


def _passwd_files() -> dict[str, tuple[bytes, int]]:
    passwd = (f"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
              f"pilot:x:{PILOT_UID}:{PILOT_UID}:pilot:/ce-k8s/scratch:/bin/sh\n")
    group = f"root:x:0:\nnogroup:x:65534:\npilot:x:{PILOT_UID}:\n"
    return {"etc/passwd": (passwd.encode(), 0o644), "etc/group": (group.encode(), 0o644)}


def build_busybox(root: Path, out: Path) -> str:
    """busybox with every applet it lists, linked in /bin, and the accounts a restricted pod uses."""
    busybox = root / "bin" / "busybox"
    applets = _run([str(busybox), "--list"], "busybox --list").stdout.split()
    files = {"bin/busybox": (busybox.read_bytes(), 0o755), **_passwd_files()}
    links = {f"bin/{a}": "busybox" for a in applets if a != "busybox"}
    dirs = {"bin": 0o755, "etc": 0o755, "tmp": 0o1777, "root": 0o700}
    return write_oci_archive(out, BUSYBOX_IMAGE, files, links, dirs, ["sh"])


def _pause_source(kube_version: str) -> Path:
    gomodcache = _run(["go", "env", "GOMODCACHE"], "go env GOMODCACHE").stdout.strip()
    src = Path(gomodcache) / f"k8s.io/kubernetes@{kube_version}" / "build" / "pause" / "linux" / "pause.c"
    if not src.is_file():
        _run(["go", "mod", "download", f"k8s.io/kubernetes@{kube_version}"], "go mod download k8s.io/kubernetes",
             env={**os.environ, "GOFLAGS": "-mod=mod"})
    if not src.is_file():
        raise NodeBuildError(f"{src} is missing from the k8s.io/kubernetes module: the pause recipe is stale")
    return src


def build_pause(kube_version: str, out: Path) -> str:
    """pause compiled as upstream's build/pause/Makefile does (-Os -static, VERSION set)."""
    src = _pause_source(kube_version)
    binary = out.with_name("pause.bin")
    tag = PAUSE_IMAGE.rsplit(":", 1)[1]
    _run(["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{tag}-ce-k8s", "-o", str(binary), str(src)],
         "gcc -static pause.c (needs gcc and libc6-dev)")
    digest = write_oci_archive(out, PAUSE_IMAGE, {"pause": (binary.read_bytes(), 0o755)}, {}, {}, ["/pause"])
    binary.unlink()
    return digest


# ------------------------------------------------------------------ runc
def ensure_libseccomp_dev(progress: Callable[[str], None]) -> None:
    """runc's seccomp (libseccomp-golang, cgo) compiles against libseccomp's header: install
    Debian's `libseccomp-dev` when it is missing (apt-get update first if the lists are stale)."""
    if Path("/usr/include/seccomp.h").exists():
        return
    progress("apt-get install libseccomp-dev (runc's seccomp needs its header)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "libseccomp-dev"]
    if subprocess.run(install, capture_output=True, text=True, check=False, timeout=900, env=env).returncode != 0:
        _run(["apt-get", "update", "-qq"], "apt-get update", env=env)
        _run(install, "apt-get install libseccomp-dev", env=env)
    if not Path("/usr/include/seccomp.h").exists():
        raise NodeBuildError("libseccomp-dev is installed but /usr/include/seccomp.h is missing")


def build_runc(out: Path, workdir: Path, progress: Callable[[str], None]) -> None:
    """runc `RUNC` built from the module proxy in a wrapper module (`workdir`), with cgo and the
    Makefile's build tags; the version is the module's embedded VERSION, the commit field names
    the module version (the proxy gives no commit)."""
    if shutil.which("go") is None:
        raise NodeBuildError("no `go` on PATH: runc is built with Go")
    ensure_libseccomp_dev(progress)
    workdir.mkdir(parents=True, exist_ok=True)
    if not (workdir / "go.mod").exists():
        (workdir / "go.mod").write_text("module cek8s.local/runcbin\n\ngo 1.26.0\n")
    env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false", "CGO_ENABLED": "1", "GOTOOLCHAIN": "local"}
    progress(f"go get {RUNC_MODULE}@{RUNC}")
    _run(["go", "get", f"{RUNC_MODULE}@{RUNC}"], f"go get {RUNC_MODULE}@{RUNC}", cwd=workdir, env=env)
    progress(f"go build {RUNC_MODULE} (cgo, tags {RUNC_TAGS})")
    out.parent.mkdir(parents=True, exist_ok=True)
    _run(["go", "build", "-trimpath", "-tags", RUNC_TAGS,
          "-ldflags", f"-s -w -X main.gitCommit={RUNC}-goproxy", "-o", str(out), RUNC_MODULE],
         f"go build {RUNC_MODULE}@{RUNC}", cwd=workdir, env=env)
    said = _run([str(out), "--version"], "runc --version").stdout
    if f"runc version {RUNC.lstrip('v')}" not in said or "libseccomp: " not in said:
        raise NodeBuildError(f"the runc built from {RUNC_MODULE}@{RUNC} says {said!r}: not that version with seccomp")


def build(kube_version: str, cache: Path = CACHE, progress: Callable[[str], None] = print) -> NodeRuntime:
    """Fetch (or find) the runtime, build runc and the images (or find them); a warm call costs a stat."""
    key = "-".join([*(v.split(":")[-1] for _, v in PACKAGES.values()), f"runc-{RUNC}"])
    base = cache / f"{kube_version}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    runtime = NodeRuntime(base / "root")
    if (base / STAMP).exists():
        return runtime
    # Beds of several sessions start at once on this machine: one builds, the others wait for it.
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{base.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (base / STAMP).exists():
            return runtime
        return _build_locked(kube_version, base, runtime, progress)


def _build_locked(kube_version: str, base: Path, runtime: NodeRuntime, progress: Callable[[str], None]) -> NodeRuntime:
    started = time.monotonic()
    if base.exists():
        shutil.rmtree(base)
    (base / "images").mkdir(parents=True)
    fetch_packages(runtime.root, progress)
    for path in (runtime.containerd, runtime.shim, runtime.ctr, runtime.cni_bin / "bridge"):
        if not path.exists():
            raise NodeBuildError(f"{path} is not in the unpacked packages: the package layout changed")
    runc_started = time.monotonic()
    build_runc(runtime.runc, base / "runc-module", progress)
    runc_seconds = round(time.monotonic() - runc_started, 1)
    progress("building the images (busybox, pause) as OCI archives")
    build_busybox(runtime.root, runtime.images[BUSYBOX_IMAGE])
    build_pause(kube_version, runtime.images[PAUSE_IMAGE])
    (base / STAMP).write_text(json.dumps({"packages": PACKAGES, "runc": RUNC, "kubernetes": kube_version,
                                          "runc_seconds": runc_seconds,
                                          "seconds": round(time.monotonic() - started, 1)}) + "\n")
    progress(f"node runtime ready in {time.monotonic() - started:.1f} s: {base}")
    return runtime
