"""The pilot image's recipe on a small fake root, and the OCI layout it writes
(ce_k8s.real.node.pilotimage, ce_k8s.real.node.noderuntime.write_oci_image). No root, no daemons:
tests/real/node/test_pilot_real.py builds the real one and runs it."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest

from ce_k8s.real.node import noderuntime, pilotimage


def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "condor-sid"
    files = {
        "usr/sbin/condor_master": "master", "usr/sbin/condor_startd": "startd", "usr/sbin/condor_schedd": "schedd",
        "usr/sbin/condor_collector": "collector", "usr/libexec/condor/condor_job_router": "router",
        "usr/libexec/condor/condor_starter_helper": "keep",
        "usr/bin/su": "setuid", "usr/bin/a": "linked", "usr/bin/secretish": "0600 file",
        "usr/share/doc/pkg/copyright": "license", "usr/share/doc/pkg/README": "docs",
        "usr/share/man/man1/x.1": "man", "usr/share/locale/de/x.mo": "de",
        "etc/condor/condor_config": "RELEASE_DIR = /usr", "etc/condor/config.d/99-bed.conf": "bed",
        "etc/condor/passwords.d/POOL": "signing key", "etc/condor/tokens.d/t": "token",
        "etc/condor/hostkey.pem": "key", "etc/ssl/private/snakeoil.key": "key", "etc/shadow": "x",
        "etc/resolv.conf": "nameserver 1.1.1.1", "etc/passwd": "root:x:0:0:root:/root:/bin/bash\n"
        "condor:x:101:101:HTCondor:/var/lib/condor:/usr/sbin/nologin\nnobody:x:65534:65534::/:/bin/false\n"
        "osg01:x:47001:47001::/home/osg01:/bin/sh\n",
        "etc/group": "root:x:0:\ncondor:x:101:\nnogroup:x:65534:\nosg01:x:47001:\n",
        "var/cache/apt/pkgcache.bin": "cache", "var/lib/apt/lists/sid": "lists", "var/log/condor/MasterLog": "log",
        "var/lib/dpkg/status": "Package: condor", "usr/libexec/ce-k8s/hook": "bed hook",
        "opt/ce-k8s/lib/x": "bind mount point", "work/main/x": "bind mount point",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "usr/bin/su").chmod(0o4755)
    (root / "usr/bin/secretish").chmod(0o600)
    os.link(root / "usr/bin/a", root / "usr/bin/b")
    os.symlink("usr/bin", root / "bin")
    (root / ".ce-k8s-root").write_text(json.dumps({"suite": "sid", "version": "25.14.1"}) + "\n")
    return root


def read_image(archive: Path) -> tuple[dict, dict, dict[str, tarfile.TarInfo], dict[str, bytes], bytes, dict]:
    """(index, manifest, layer entries, their contents, the compressed layer, the config)."""
    with tarfile.open(archive) as oci:
        names = oci.getnames()
        assert "oci-layout" in names and "index.json" in names
        index = json.load(oci.extractfile("index.json"))
        blob = lambda d: oci.extractfile(f"blobs/sha256/{d.split(':')[1]}").read()  # noqa: E731
        manifest_bytes = blob(index["manifests"][0]["digest"])
        assert hashlib.sha256(manifest_bytes).hexdigest() == index["manifests"][0]["digest"].split(":")[1]
        manifest = json.loads(manifest_bytes)
        config = json.loads(blob(manifest["config"]["digest"]))
        layer = blob(manifest["layers"][0]["digest"])
    entries, contents = {}, {}
    with tarfile.open(fileobj=__import__("io").BytesIO(gzip.decompress(layer))) as tar:
        for info in tar:
            entries[info.name] = info
            if info.isreg():
                contents[info.name] = tar.extractfile(info).read()
    return index, manifest, entries, contents, layer, config


def test_the_pilot_image_from_a_fake_root(tmp_path):
    root = fake_root(tmp_path)
    image = pilotimage.build(root, cache=tmp_path / "cache", progress=lambda m: None)
    assert not image.warm and image.name == "ce-k8s.invalid/pilot:25.14.1"
    assert image.archive.parent == tmp_path / "cache" / "images"
    assert image.size == image.archive.stat().st_size and image.dropped_setid == 1
    index, manifest, entries, contents, layer, config = read_image(image.archive)

    # the OCI layout: digests and the diff_id are what the bytes are
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == pilotimage.PILOT_IMAGE
    assert manifest["layers"][0]["digest"] == f"sha256:{hashlib.sha256(layer).hexdigest()}"
    assert manifest["layers"][0]["size"] == len(layer)
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(gzip.decompress(layer)).hexdigest()}"]
    assert config["config"]["User"] == "1000:1000" and config["config"]["Cmd"] == ["/usr/local/bin/ce-k8s-pilot"]
    assert config["config"]["WorkingDir"] == "/home/pilot"
    assert image.digest == index["manifests"][0]["digest"]

    # kept, dropped, rewritten, added
    for kept in ("usr/sbin/condor_master", "usr/sbin/condor_startd", "usr/share/doc/pkg/copyright",
                 "usr/libexec/condor/condor_starter_helper", "etc/condor/condor_config", "var/lib/dpkg/status"):
        assert kept in entries, kept
    for dropped in ("usr/sbin/condor_schedd", "usr/sbin/condor_collector", "usr/libexec/condor/condor_job_router",
                    "usr/share/doc/pkg/README", "usr/share/man", "usr/share/locale", "etc/condor/config.d",
                    "etc/condor/passwords.d", "etc/condor/tokens.d", "etc/condor/hostkey.pem", "etc/ssl/private",
                    "etc/shadow", "etc/resolv.conf", "var/cache/apt", "var/lib/apt/lists", "var/log/condor",
                    "usr/libexec/ce-k8s", "opt/ce-k8s/lib/x", "work"):
        assert dropped not in entries, dropped
    assert contents["etc/passwd"].decode().splitlines() == [
        "root:x:0:0:root:/root:/bin/bash", "condor:x:101:101:HTCondor:/var/lib/condor:/usr/sbin/nologin",
        "nobody:x:65534:65534::/:/bin/false", "pilot:x:1000:1000:ce-k8s pilot:/home/pilot:/bin/sh"]
    assert contents["etc/group"].decode().splitlines() == ["root:x:0:", "condor:x:101:", "nogroup:x:65534:",
                                                           "pilot:x:1000:"]
    assert entries["home/pilot"].isdir() and entries["home/pilot"].uid == 1000
    assert entries["tmp"].mode == 0o1777 and entries["var/tmp"].mode == 0o1777
    assert entries["usr/bin/su"].mode == 0o755                 # setuid dropped
    assert entries["usr/bin/secretish"].mode == 0o644          # readable by the pilot
    assert entries["bin"].issym() and entries["bin"].linkname == "usr/bin"
    assert entries["usr/bin/b"].islnk() and entries["usr/bin/b"].linkname == "usr/bin/a"
    assert all(i.mtime == 0 and (i.uid, i.gid) in ((0, 0), (1000, 1000)) for i in entries.values())
    assert list(entries) == sorted(entries)
    launcher = entries["usr/local/bin/ce-k8s-pilot"]
    assert launcher.mode == 0o755 and contents[launcher.name].decode() == pilotimage.LAUNCHER_TEXT
    for module in ("entrypoint.py", "pilotconfig.py", "sizing.py", "__init__.py"):
        rel = f"opt/ce-k8s/lib/ce_k8s/pilot/{module}"
        assert contents[rel] == (pilotimage.PACKAGE / module).read_bytes()
    assert contents["opt/ce-k8s/lib/ce_k8s/__init__.py"] == b""


def test_the_cache_key_follows_the_root(tmp_path):
    root = fake_root(tmp_path)
    cache = tmp_path / "cache"
    first = pilotimage.build(root, cache=cache, progress=lambda m: None)
    again = pilotimage.build(root, cache=cache, progress=lambda m: None)
    assert again.warm and again.archive == first.archive and again.digest == first.digest
    assert again.build_seconds == first.build_seconds
    # the same input gives the same image
    other = pilotimage.build(root, cache=tmp_path / "cache2", progress=lambda m: None)
    assert other.digest == first.digest
    # a rebuilt root (its marker rewritten) is a new key; the old archive goes
    marker = root / ".ce-k8s-root"
    os.utime(marker, ns=(marker.stat().st_atime_ns, marker.stat().st_mtime_ns + 10**9))
    rebuilt = pilotimage.build(root, cache=cache, progress=lambda m: None)
    assert not rebuilt.warm and rebuilt.archive != first.archive
    assert not first.archive.exists() and sorted(p.name for p in (cache / "images").glob("*.oci.tar")) == [
        rebuilt.archive.name]


def test_a_root_without_its_marker_or_of_another_version(tmp_path):
    root = fake_root(tmp_path)
    (root / ".ce-k8s-root").write_text(json.dumps({"version": "23.9.6"}))
    with pytest.raises(noderuntime.NodeBuildError, match=r"not the pilot's 25\.14\.1"):
        pilotimage.build(root, cache=tmp_path / "cache")
    (root / ".ce-k8s-root").unlink()
    with pytest.raises(noderuntime.NodeBuildError, match="build the HTCondor root first"):
        pilotimage.build(root, cache=tmp_path / "cache")


def test_write_oci_archive_small_images(tmp_path):
    """The busybox/pause writer on top of write_oci_image: directories, files, then links, sorted."""
    out = tmp_path / "small.oci.tar"
    digest = noderuntime.write_oci_archive(out, "ce-k8s.invalid/small:1", {"bin/tool": (b"#!/bin/sh\n", 0o755),
                                                                          "etc/passwd": (b"root\n", 0o644)},
                                           {"bin/sh": "tool"}, {"bin": 0o755, "tmp": 0o1777}, ["sh"])
    index, _manifest, entries, contents, _layer, config = read_image(out)
    assert digest == index["manifests"][0]["digest"]
    assert list(entries) == ["bin", "tmp", "bin/tool", "etc/passwd", "bin/sh"]
    assert entries["tmp"].mode == 0o1777 and entries["bin/sh"].linkname == "tool"
    assert contents["bin/tool"] == b"#!/bin/sh\n" and entries["bin/tool"].mode == 0o755
    assert config["config"] == {"Env": [noderuntime.DEFAULT_PATH], "Cmd": ["sh"]}
    assert not list(tmp_path.glob("*.tmp"))
    # deterministic: the same input is the same image
    again = noderuntime.write_oci_archive(tmp_path / "again.oci.tar", "ce-k8s.invalid/small:1",
                                          {"bin/tool": (b"#!/bin/sh\n", 0o755), "etc/passwd": (b"root\n", 0o644)},
                                          {"bin/sh": "tool"}, {"bin": 0o755, "tmp": 0o1777}, ["sh"])
    assert again == digest
