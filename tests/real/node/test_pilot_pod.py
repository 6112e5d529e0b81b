"""The pilot image in a real pod: the real kubelet, containerd and runc judge the entry point.

`ce-k8s.invalid/pilot:25.14.1` (ce_k8s.real.node.pilotimage) is built (cached) and imported into
the session bed's real node on demand (`KubeNodes.import_image`: only this module pays for it), and
run as ce-k8s runs a pilot: in the bed's `restricted` PodSecurity namespace, under the pod
builder's own security contexts (`ce_k8s.pods.builder.security_contexts`: uid 1000, no privilege
escalation, ALL capabilities dropped, seccomp RuntimeDefault, fsGroup), its token in a Secret volume
that `CE_K8S_PILOT_TOKEN_FILE` names, its `LOCAL_DIR` an emptyDir, CPU and memory limits, and
`imagePullPolicy: Never` (no registry, no DNS).

The VO collector is the sid root's `condor_collector` (IDTOKENS required, as in
test_pilot_real.py), run in the **node's own network namespace** (the holder's) on the CNI
bridge's gateway, `10.244.<n>.1`: the pods' default route, so a pod reaches it, and nothing leaves
the namespaces the bed made. The daemons on the host's loopback are not reachable from a pod.

What the real node judges: the pilot's size is its pod's limits, read from the cgroup runc made;
its processes are uid 1000 (seen from the host); a good token joins and the idle pilot ends 0; a
token signed with another key, a missing or malformed token end 3 at once; a collector that is not
there ends 4 after the join timeout, long before the deadline; deleting the pod ends it 143 inside
the grace period. docs/pilot.md, "In a real pod", has the figures.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ce_k8s.pods.builder import SCRATCH_DIR, security_contexts
from ce_k8s.real.node import pilotimage, vopool
from ce_k8s.real.node.node import REAL_NODE_LABEL, REAL_NODE_TAINT, NodeState
from ce_k8s.real.node.noderuntime import PILOT_UID

from ..conftest import wait_for
from ..test_real_node import finished, log, removed, terminated
from .conftest import FIGURES
from .test_pilot_real import IDENTITY, in_namespace, inner_pid, prepare_pool, unpack

pytestmark = pytest.mark.slow

COLLECTOR_PORT = 9618
TOKEN_DIR = "/ce-k8s/cred"
GRACE = 20                      # the pod's terminationGracePeriodSeconds
PILOT_GRACE = 15                # CE_K8S_PILOT_GRACE_SECONDS: under the pod's
DEADLINE = 240                  # activeDeadlineSeconds: none of these pilots may come near it
CPU, MEMORY, MEMORY_MB = "1", "512Mi", 512
IDLE, UPDATE = 20, 10           # the idle pilot's STARTD_NOCLAIM_SHUTDOWN and UPDATE_INTERVAL


# ------------------------------------------------------------------ the bed's side
def gateway(node: NodeState) -> str:
    """The CNI bridge's address in the node's network namespace: the pods' gateway (cni_config)."""
    return vopool.gateway(node.index)


def in_node_net(node: NodeState) -> list[str]:
    return ["nsenter", f"--target={node.pids['holder']}", "--net", "--"]


def listening(node: NodeState, port: int) -> bool:
    """A TCP socket listens on `port` in the node's network namespace (its /proc/<pid>/net/tcp)."""
    for line in Path(f"/proc/{node.pids['holder']}/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            return True
    return False


def ensure_bridge(admin_core, node: NodeState) -> None:
    """The bridge and its gateway address come with the first pod's CNI ADD (vopool.ensure_bridge)."""
    vopool.ensure_bridge(admin_core, node.name, node.pids["holder"], gateway(node))


@pytest.fixture(scope="module")
def vo_collector(real_kube, admin_client, node, pilot_image):
    """A collector in the node's network namespace on the pods' gateway; yields its address and
    the two tokens (`good`: its key; `wrong`: another key of the same name and identity)."""
    from kubernetes import client

    ensure_bridge(client.CoreV1Api(admin_client), node)
    base = Path(tempfile.mkdtemp(prefix="ce-k8s-pilot-pod-", dir="/var/tmp"))
    rootfs = base / "rootfs"
    collector = None
    try:
        unpack(pilot_image.archive, rootfs)
        prepare_pool(rootfs, COLLECTOR_PORT, gateway(node))
        collector = subprocess.Popen(
            [*in_node_net(node), *in_namespace(rootfs, "env -i CONDOR_CONFIG=/cm/condor_config PATH=/usr/bin:/usr/sbin "
                                                       f"/usr/sbin/condor_collector -f -p {COLLECTOR_PORT}")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: listening(node, COLLECTOR_PORT) or collector.poll() is not None, 60, what="the collector")
        assert collector.poll() is None, (rootfs / "cm/log/CollectorLog").read_text()[-2000:]
        yield {"address": f"{gateway(node)}:{COLLECTOR_PORT}", "rootfs": rootfs,
               "good": (rootfs / "secret/good").read_text().strip(),
               "wrong": (rootfs / "secret/wrong").read_text().strip()}
    finally:
        if collector is not None:
            # nsenter exec'd unshare, which ignores SIGTERM while it waits: signal its child, the collector
            with contextlib.suppress(OSError, IndexError, ValueError):
                os.kill(inner_pid(collector.pid), signal.SIGTERM)
            try:
                collector.wait(timeout=30)
            except subprocess.TimeoutExpired:
                collector.kill()                  # --kill-child takes the collector along
                collector.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ the pilot's pod
def pilot_pod(name: str, collector: str, *, secret: str | None = "pilot-token", token_file: str | None = None,
              **env: str) -> dict:
    """A pilot pod as ce-k8s would run one on this node: the builder's security contexts, the token's
    Secret mounted (`secret`) and named by path, the scratch emptyDir as LOCAL_DIR, Guaranteed limits."""
    pod_sc, container_sc = security_contexts(PILOT_UID, PILOT_UID)
    limits = {"cpu": CPU, "memory": MEMORY}
    variables = {"CE_K8S_PILOT_COLLECTOR": collector,
                 "CE_K8S_PILOT_TOKEN_FILE": token_file or f"{TOKEN_DIR}/token",
                 "CE_K8S_PILOT_LOCAL_DIR": f"{SCRATCH_DIR}/pilot", "CE_K8S_PILOT_GRACE_SECONDS": str(PILOT_GRACE),
                 **env}
    mounts = [{"name": "scratch", "mountPath": SCRATCH_DIR}]
    volumes: list[dict] = [{"name": "scratch", "emptyDir": {}}]
    if secret is not None:
        mounts.append({"name": "cred", "mountPath": TOKEN_DIR, "readOnly": True})
        volumes.append({"name": "cred", "secret": {"secretName": secret, "defaultMode": 0o400}})
    # no `command`: the image's Cmd, the entry point
    container = {"name": "main", "image": pilotimage.PILOT_IMAGE, "imagePullPolicy": "Never",
                 "resources": {"requests": dict(limits), "limits": limits}, "securityContext": container_sc,
                 "env": [{"name": k, "value": v} for k, v in variables.items()], "volumeMounts": mounts}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": pod_sc, "automountServiceAccountToken": False, "enableServiceLinks": False,
        "terminationGracePeriodSeconds": GRACE, "activeDeadlineSeconds": DEADLINE,
        "containers": [container], "volumes": volumes}}


def token_secret(admin_core, ns: str, text: str, name: str = "pilot-token") -> None:
    admin_core.create_namespaced_secret(ns, {"metadata": {"name": name}, "stringData": {"token": text + "\n"}})


def run_to_end(admin_core, ns: str, manifest: dict, figure: str, timeout: float = 120):
    """Create the pod, wait for the kubelet's verdict; records create→finish (our clock) and the
    container's own run (the kubelet's startedAt→finishedAt, whole seconds). Returns (pod, exit, log)."""
    name = manifest["metadata"]["name"]
    started = time.monotonic()
    admin_core.create_namespaced_pod(ns, manifest)
    pod = finished(admin_core, ns, name, timeout=timeout)
    seconds = time.monotonic() - started
    term = terminated(pod)
    text = log(admin_core, ns, name)
    FIGURES[figure] = {"exit": term.exit_code, "create_to_finished_s": round(seconds, 1),
                       "container_s": (term.finished_at - term.started_at).total_seconds()}
    print(f"{figure}: {json.dumps(FIGURES[figure])}\n{text}", flush=True)
    return pod, term, text, seconds


def wait_for_join(admin_core, ns: str, name: str) -> None:
    """Until the running pilot's log says its startd joined the collector."""
    def joined() -> bool:
        phase = admin_core.read_namespaced_pod(name, ns).status.phase
        if phase in ("Succeeded", "Failed"):       # it will not join any more: say why at once
            raise AssertionError(f"{name} ended {phase} before its startd joined: {log(admin_core, ns, name)[-1500:]}")
        return phase == "Running" and "joined the collector" in log(admin_core, ns, name)
    wait_for(joined, 90, poll=0.5, what=f"the startd of {name} to join",
             on_timeout=lambda: f"its log: {log(admin_core, ns, name)[-1500:]}")


def container_cgroup(node: NodeState, pod) -> Path:
    """The container's cgroup in the memory hierarchy, below the node's cgroupRoot."""
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    root = Path("/sys/fs/cgroup/memory") / node.cgroup_root.strip("/")
    found = [p for p in root.rglob(cid) if p.is_dir()]
    assert len(found) == 1, f"container {cid} under {root}: {found}"
    return found[0]


def processes(cgroup: Path) -> dict[int, tuple[str, list[int], list[int]]]:
    """pid → (comm, [real, effective, saved, fs uid], [gids]) of every process in `cgroup`, from the host."""
    out = {}
    for pid in (int(p) for p in (cgroup / "cgroup.procs").read_text().split()):
        with contextlib.suppress(OSError):
            status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ":\t" in line)
            out[pid] = (status["Name"].strip(), [int(u) for u in status["Uid"].split()],
                        [int(g) for g in status["Gid"].split()])
    return out


def sized_line(text: str) -> str:
    return next(line for line in text.splitlines() if " CPUs (" in line and " MB (" in line)


# ------------------------------------------------------------------ the tests
def test_a_pilot_sized_by_its_pod_joins_as_uid_1000_and_ends_idle(admin_core, pilot_namespace, node, vo_collector):
    token_secret(admin_core, pilot_namespace, vo_collector["good"])
    name = "pilot-idle"
    started = time.monotonic()
    # The startd weighs STARTD_NOCLAIM_SHUTDOWN at its updates: with the default 60 s interval a
    # 20 s idle pilot left after 62 s (seen here); idle + interval bounds it.
    admin_core.create_namespaced_pod(pilot_namespace, pilot_pod(name, vo_collector["address"],
                                                                CE_K8S_PILOT_IDLE_SECONDS=str(IDLE),
                                                                CE_K8S_PILOT_UPDATE_INTERVAL=str(UPDATE)))
    # the host's view of the running pilot: every process of the container is uid 1000
    wait_for_join(admin_core, pilot_namespace, name)
    joined = time.monotonic() - started
    cgroup = container_cgroup(node, admin_core.read_namespaced_pod(name, pilot_namespace))
    procs = processes(cgroup)
    assert {"condor_master", "condor_startd"} <= {comm for comm, _, _ in procs.values()}, procs
    assert all(uids == [PILOT_UID] * 4 and gids == [PILOT_UID] * 4 for _, uids, gids in procs.values()), procs
    assert int((cgroup / "memory.limit_in_bytes").read_text()) == MEMORY_MB << 20
    pod = finished(admin_core, pilot_namespace, name, timeout=120)
    seconds = time.monotonic() - started
    term, text = terminated(pod), log(admin_core, pilot_namespace, name)
    FIGURES["idle"] = {"exit": term.exit_code, "create_to_joined_s": round(joined, 1),
                       "create_to_finished_s": round(seconds, 1),
                       "container_s": (term.finished_at - term.started_at).total_seconds(),
                       "processes": sorted(comm for comm, _, _ in procs.values())}
    print(f"idle: {json.dumps(FIGURES['idle'])}\n{text}", flush=True)
    assert (term.exit_code, pod.status.phase) == (0, "Succeeded"), text
    assert IDLE <= (term.finished_at - term.started_at).total_seconds() <= IDLE + UPDATE + 5
    # its size is what Kubernetes gave the pod, read from the cgroup runc made (no variable said it)
    assert f"{CPU} CPUs (cgroup CPU quota ({CPU} CPUs)), {MEMORY_MB} MB (cgroup memory limit)" in sized_line(text)
    assert f"IDTOKENS for {IDENTITY}" in text and "exit 0 (IDLE)" in text
    assert pod.spec.node_name == node.name


def test_a_token_signed_with_another_key_ends_3_fast(admin_core, pilot_namespace, node, vo_collector):
    token_secret(admin_core, pilot_namespace, vo_collector["wrong"])
    _pod, term, text, seconds = run_to_end(admin_core, pilot_namespace, pilot_pod(
        "pilot-wrong", vo_collector["address"], CE_K8S_PILOT_IDLE_SECONDS="600", CE_K8S_PILOT_JOIN_TIMEOUT="60"),
        "wrong_token")
    assert term.exit_code == 3, text
    assert "refused the pilot's token" in text and "exit 3 (TOKEN)" in text
    assert seconds < 40                  # neither the 60 s join timeout nor the 600 s idle time was waited for


def test_a_collector_that_is_not_there_ends_4_long_before_the_deadline(admin_core, pilot_namespace, node,
                                                                      pilot_image):
    # a well-formed, unexpired token (its key does not matter: nothing will read it)
    token_secret(admin_core, pilot_namespace, _unsigned_token())
    _pod, term, text, seconds = run_to_end(admin_core, pilot_namespace, pilot_pod(
        "pilot-nocm", f"{gateway(node)}:9", CE_K8S_PILOT_JOIN_TIMEOUT="10"), "no_collector")
    assert term.exit_code == 4, text
    assert f"the collector {gateway(node)}:9 is unreachable" in text and "exit 4 (COLLECTOR)" in text
    assert seconds < DEADLINE / 4


@pytest.mark.parametrize(("case", "secret_text", "token_file", "reason"), [
    ("absent", None, "/ce-k8s/cred/token", "does not exist (is the Secret mounted?)"),
    ("malformed", "not-a-jwt", None, "does not hold a JWT"),
])
def test_no_token_or_a_malformed_one_ends_3_at_once(admin_core, pilot_namespace, node, pilot_image, case,
                                                    secret_text, token_file, reason):
    if secret_text is not None:
        token_secret(admin_core, pilot_namespace, secret_text)
    _pod, term, text, seconds = run_to_end(admin_core, pilot_namespace, pilot_pod(
        f"pilot-{case}", f"{gateway(node)}:9618", secret=None if secret_text is None else "pilot-token",
        token_file=token_file), f"token_{case}")
    assert term.exit_code == 3, text
    assert reason in text and "token:" in text
    assert term.finished_at - term.started_at <= datetime.timedelta(seconds=2)     # the kubelet's whole seconds
    assert seconds < 30


def test_deleting_the_pod_ends_the_pilot_143_within_the_grace(admin_core, pilot_namespace, node, vo_collector):
    token_secret(admin_core, pilot_namespace, vo_collector["good"])
    name = "pilot-term"
    admin_core.create_namespaced_pod(pilot_namespace, pilot_pod(name, vo_collector["address"],
                                                                CE_K8S_PILOT_IDLE_SECONDS="600"))
    wait_for_join(admin_core, pilot_namespace, name)
    term, seconds, text = removed(admin_core, pilot_namespace, name,
                                  lambda: admin_core.delete_namespaced_pod(name, pilot_namespace), GRACE + 30)
    FIGURES["sigterm"] = {"exit": term.exit_code, "delete_to_terminated_s": round(seconds, 1)}
    print(f"sigterm: {json.dumps(FIGURES['sigterm'])}\n{text}", flush=True)
    assert term.exit_code == 143, text
    assert seconds < GRACE                  # ended by the pilot itself, not by the kubelet's SIGKILL
    assert "SIGTERM: shutting the startd down gracefully" in text and "exit 143 (SIGTERM)" in text


def _unsigned_token() -> str:
    """A JWT the entry point accepts as a credential (readable claims, not expired); no collector checks it."""
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return ".".join([part({"alg": "HS256", "kid": "POOL"}),
                     part({"sub": IDENTITY, "iss": "vo.ce-k8s.test", "iat": int(time.time()),
                           "exp": int(time.time()) + 3600}), "c2lnbmF0dXJl"])
