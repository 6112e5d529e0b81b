"""The pilot image for real: its layer unpacked, its entry point run against a real collector.

The image is built from the real-HTCondor bed's sid root (ce_k8s.real.node.pilotimage, cached in
the node cache), its layer unpacked into a directory, and the image's own launcher run there as the
image runs it: uid 1000, in `unshare --mount --pid` (the entry point is pid 1, as in a container)
and `chroot`. The collector is the sid root's `condor_collector`, copied into the unpacked tree
for the test only (the image leaves it out), requiring IDTOKENS signed with its own key. No node,
kubelet or control plane is started. Needs root (chroot, mounts), as CI runs.

The collector listens on 127.0.0.2: on one host a startd first offers the collector its master's
family session (a local peer), which the collector rejects; the startd negotiates afresh at its
next update, every 2 s here (`CE_K8S_PILOT_UPDATE_INTERVAL`). docs/pilot.md, "Tests".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import polling
import pytest

from ce_k8s.pilot.pilotconfig import layout
from ce_k8s.real.node import pilotimage
from ce_k8s.real.node.vopool import in_namespaces
from ce_k8s.real.node.vopool import unpack_image as unpack

pytestmark = pytest.mark.slow

COLLECTOR_IP = "127.0.0.2"
PILOT_UID = 1000
TRUST_DOMAIN = "vo.ce-k8s.test"
IDENTITY = f"pilot@{TRUST_DOMAIN}"


def in_namespace(rootfs: Path, argv: str) -> list[str]:
    """`argv` (a shell word list) as uid 1000 in `rootfs`, in a mount and pid namespace of its own
    with /proc and /dev: gone, mounts and all, when its pid 1 ends (or unshare is killed)."""
    return in_namespaces(None, rootfs, argv)


def collector_config(port: int, keydir: str, ip: str = COLLECTOR_IP) -> str:
    return f"""\
{layout("/cm", PILOT_UID, PILOT_UID)}COLLECTOR_HOST = {ip}:{port}
NETWORK_INTERFACE = {ip}
USE_SHARED_PORT = False
TRUST_DOMAIN = {TRUST_DOMAIN}
SEC_DEFAULT_AUTHENTICATION = REQUIRED
SEC_DEFAULT_AUTHENTICATION_METHODS = IDTOKENS
SEC_PASSWORD_DIRECTORY = {keydir}
SEC_TOKEN_POOL_SIGNING_KEY_FILE = {keydir}/POOL
SEC_TOKEN_DIRECTORY = /cm/tokens.d
SEC_TOKEN_SYSTEM_DIRECTORY = /cm/tokens.d
ALLOW_READ = *
ALLOW_WRITE = *
ALLOW_DAEMON = *
ALLOW_ADVERTISE_STARTD = {IDENTITY}
"""


def token(rootfs: Path, keydir: str) -> str:
    """An IDTOKEN for IDENTITY, signed by `condor_token_create` in the tree with the key in `keydir`."""
    proc = subprocess.run(["chroot", f"--userspec={PILOT_UID}:{PILOT_UID}", str(rootfs), "env", "-i",
                           f"CONDOR_CONFIG={keydir.rsplit('/', 1)[0]}/condor_config", "PATH=/usr/bin:/usr/sbin",
                           "condor_token_create", "-identity", IDENTITY, "-key", "POOL"],
                          capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.strip()


def inner_pid(unshare_pid: int) -> int:
    """The process unshare forked: the namespace's pid 1 (sh, which exec'd chroot and what it ran)."""
    return int(Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()[0])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((COLLECTOR_IP, 0))
        return sock.getsockname()[1]


def accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((COLLECTOR_IP, port), timeout=1):
        return True
    return False


def prepare_pool(rootfs: Path, port: int, ip: str) -> None:
    """The sid root's collector copied into the unpacked image, its configuration (`/cm`, listening on
    `ip:port`) and another pool's (`/other`, another key), `/secret/good` and `/secret/wrong` tokens
    signed with each key, and a world-writable `/scratch`."""
    shutil.copy2(pilotimage.default_root() / "usr/sbin/condor_collector", rootfs / "usr/sbin/condor_collector")
    shutil.copy("/etc/hosts", rootfs / "etc/hosts")
    for name, keydir in (("cm", "/cm/passwords.d"), ("other", "/other/passwords.d")):
        d = rootfs / name
        for sub in ("log", "spool", "lock", "run", "tokens.d", "passwords.d"):
            (d / sub).mkdir(parents=True)
        (d / "condor_config").write_text(collector_config(port, keydir, ip))
        (d / "passwords.d" / "POOL").write_bytes(os.urandom(48).hex().encode())
        for path in [d, *d.rglob("*")]:
            os.chown(path, PILOT_UID, PILOT_UID)
        (d / "passwords.d").chmod(0o700)
        (d / "passwords.d" / "POOL").chmod(0o600)
    secret = rootfs / "secret"
    secret.mkdir()
    # the good token is signed with the collector's key; the wrong one with another key of the same name
    for name, keydir in (("good", "/cm/passwords.d"), ("wrong", "/other/passwords.d")):
        (secret / name).write_text(token(rootfs, keydir) + "\n")
        (secret / name).chmod(0o444)
    (rootfs / "scratch").mkdir()
    (rootfs / "scratch").chmod(0o777)           # the pod's emptyDir, writable by the pilot


@pytest.fixture(scope="module")
def image():
    if os.geteuid() != 0:
        pytest.fail("the pilot's real tests need root (chroot, mounts; CI runs as root): docs/pilot.md")
    from ce_k8s.real.condor.condor import build_root

    root = build_root(progress=lambda m: print(f"condor root: {m}", flush=True))
    return pilotimage.build(root, progress=lambda m: print(f"pilot image: {m}", flush=True))


@pytest.fixture(scope="module")
def pool(image, tmp_path_factory):
    """The unpacked image with a running collector; yields (rootfs, port, good token, wrong token)."""
    base = tmp_path_factory.mktemp("pilot")
    rootfs = base / "rootfs"
    config = unpack(image.archive, rootfs)
    pool = {"rootfs": rootfs, "config": config, "had_collector": (rootfs / "usr/sbin/condor_collector").exists()}
    port = free_port()
    prepare_pool(rootfs, port, COLLECTOR_IP)
    collector = subprocess.Popen(in_namespace(rootfs, f"env -i CONDOR_CONFIG=/cm/condor_config PATH=/usr/bin:/usr/sbin "
                                                      f"/usr/sbin/condor_collector -f -p {port}"),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        polling.wait_for(lambda: accepts(port) or collector.poll() is not None, timeout=60, what="the collector")
        assert collector.poll() is None, (rootfs / "cm/log/CollectorLog").read_text()[-2000:]
        yield {**pool, "port": port}
    finally:
        # unshare ignores SIGTERM while it waits for its child: signal the collector, the namespace's pid 1
        with contextlib.suppress(OSError, IndexError, ValueError):
            os.kill(inner_pid(collector.pid), signal.SIGTERM)
        try:
            collector.wait(timeout=30)
        except subprocess.TimeoutExpired:
            collector.kill()                    # --kill-child: SIGKILL to unshare takes its child along
            collector.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def pilot_argv(pool, name: str, token_name: str, **env: str) -> list[str]:
    variables = {"PATH": "/usr/local/bin:/usr/bin:/usr/sbin:/bin", "HOME": "/home/pilot",
                 "CE_K8S_PILOT_COLLECTOR": f"{COLLECTOR_IP}:{pool['port']}",
                 "CE_K8S_PILOT_TOKEN_FILE": f"/secret/{token_name}",
                 "CE_K8S_PILOT_LOCAL_DIR": f"/scratch/{name}", "CE_K8S_PILOT_NAME": name,
                 "CE_K8S_PILOT_NETWORK_INTERFACE": "127.0.0.1", "CE_K8S_PILOT_UPDATE_INTERVAL": "2",
                 "CE_K8S_PILOT_CPUS": "1", "CE_K8S_PILOT_MEMORY_MB": "512", "CE_K8S_PILOT_JOIN_TIMEOUT": "30",
                 **env}
    words = " ".join(f"{k}={v}" for k, v in variables.items())
    return in_namespace(pool["rootfs"], f"env -i {words} {pool['config']['config']['Cmd'][0]}")


def run_pilot(pool, name: str, token_name: str, timeout: float = 120, **env: str) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.run(pilot_argv(pool, name, token_name, **env), capture_output=True, text=True,
                          timeout=timeout, check=False)
    return proc.returncode, proc.stderr, time.monotonic() - started


def logs(pool, name: str) -> str:
    out = []
    for log in sorted((pool["rootfs"] / "scratch" / name / "log").glob("*Log")):
        out.append(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}")
    return "\n".join(out)


# ------------------------------------------------------------------ the image
def test_the_ce_beds_route_names_this_image():
    """The bed's DemoPilotImage transform (ce_k8s.real.condor, which may not import this room) names it."""
    from ce_k8s.real.condor.condorconfig import DEMO_PILOT_IMAGE, agent_and_demo_config

    assert DEMO_PILOT_IMAGE == pilotimage.PILOT_IMAGE
    assert f'SET K8sImage "{pilotimage.PILOT_IMAGE}"' in agent_and_demo_config(Path("/state"))


def test_the_image_is_a_startd_pilot_and_nothing_of_the_bed(image, pool):
    rootfs = pool["rootfs"]
    print(f"pilot image: {json.dumps(image.as_dict())}")
    assert image.name == "ce-k8s.invalid/pilot:25.14.1" and image.size < 150_000_000
    assert pool["config"]["config"]["User"] == "1000:1000"
    assert pool["config"]["config"]["Cmd"] == ["/usr/local/bin/ce-k8s-pilot"]
    assert "pilot:x:1000:1000:" in (rootfs / "etc/passwd").read_text()
    assert not any(int(line.split(":")[2]) >= 40000 for line in (rootfs / "etc/passwd").read_text().splitlines()
                   if line.split(":")[2] != "65534")                     # no bed account
    assert (rootfs / "home/pilot").stat().st_uid == PILOT_UID
    for present in ("usr/sbin/condor_master", "usr/sbin/condor_startd", "usr/sbin/condor_starter",
                    "usr/sbin/condor_procd", "usr/bin/condor_status", "usr/bin/python3",
                    "opt/ce-k8s/lib/ce_k8s/pilot/entrypoint.py"):
        assert (rootfs / present).exists(), present
    assert not pool["had_collector"] and not (rootfs / "usr/sbin/condor_schedd").exists()
    assert not (rootfs / "etc/condor/passwords.d").exists() and not (rootfs / "etc/condor/config.d").exists()
    assert not list((rootfs / "etc/condor").glob("*.pem")) and not (rootfs / "etc/shadow").exists()
    assert not (rootfs / "usr/share/man").exists() and not (rootfs / "var/lib/apt/lists").exists()
    setid = [p for p in (rootfs / "usr").rglob("*") if p.is_file() and not p.is_symlink()
             and p.stat().st_mode & 0o6000]
    assert setid == []
    again = pilotimage.build(pilotimage.default_root())
    assert again.warm and again.archive == image.archive and again.digest == image.digest


# ------------------------------------------------------------------ the entry point
def test_a_good_token_joins_and_the_idle_pilot_exits_zero(pool):
    rc, err, seconds = run_pilot(pool, "good", "good", CE_K8S_PILOT_IDLE_SECONDS="10")
    assert rc == 0, f"{err}\n{logs(pool, 'good')}"
    assert "joined the collector" in err and "exit 0 (IDLE)" in err
    assert f"IDTOKENS for {IDENTITY}" in err and "1 CPUs (CE_K8S_PILOT_CPUS), 512 MB" in err
    assert seconds < 60
    # the daemons ran as the pilot's user, in the pod's scratch directory
    assert (pool["rootfs"] / "scratch/good/log/StartLog").stat().st_uid == PILOT_UID


def test_a_wrong_token_fails_fast_with_its_reason(pool):
    rc, err, seconds = run_pilot(pool, "wrong", "wrong", CE_K8S_PILOT_IDLE_SECONDS="600")
    assert rc == 3, f"{err}\n{logs(pool, 'wrong')}"
    assert "refused the pilot's token" in err and "exit 3 (TOKEN)" in err
    assert seconds < 20                  # the join timeout is 30 s and the idle time 600 s: neither waited for
    print(f"wrong token: exit 3 in {seconds:.1f} s")


def test_sigterm_is_forwarded_and_exits_143(pool):
    proc = subprocess.Popen(pilot_argv(pool, "term", "good", CE_K8S_PILOT_IDLE_SECONDS="600"),
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        polling.wait_for(lambda: any("joined the collector" in line for line in lines) or proc.poll() is not None,
                         timeout=60, what="the pilot's join")
        assert proc.poll() is None, "".join(lines)
        # the entry point is unshare's child (sh exec'd chroot, env and the launcher): the pod's pid 1
        os.kill(inner_pid(proc.pid), signal.SIGTERM)
        assert proc.wait(timeout=60) == 143, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    err = "".join(lines)
    assert "SIGTERM: shutting the startd down gracefully" in err and "exit 143 (SIGTERM)" in err
    assert "Got SIGTERM" in (pool["rootfs"] / "scratch/term/log/MasterLog").read_text()


def test_the_deadline_stops_the_pilot_before_the_pods(pool):
    # deadline 20 s, grace 5 s, margin 2 s: GLIDEIN_ToDie 13 s after the start
    rc, err, seconds = run_pilot(pool, "deadline", "good", CE_K8S_PILOT_IDLE_SECONDS="600",
                                 CE_K8S_PILOT_DEADLINE_SECONDS="20", CE_K8S_PILOT_GRACE_SECONDS="5")
    assert rc == 5, f"{err}\n{logs(pool, 'deadline')}"
    assert "dies in 13 s" in err and "exit 5 (DEADLINE)" in err
    assert seconds < 20                                  # before the pod's own deadline
    config = (pool["rootfs"] / "scratch/deadline/condor_config").read_text()
    assert "GLIDEIN_ToDie = " in config and "STARTD.DAEMON_SHUTDOWN = time() > $(GLIDEIN_ToDie)" in config
