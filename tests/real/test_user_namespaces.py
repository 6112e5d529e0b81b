"""User namespaces (`hostUsers: false`) on the bed's real node (issue "Real nodes", item 4).

The real node runs runc 1.3 built from the Go module proxy (ce_k8s.real.node.noderuntime): with its
idmapped mounts containerd reports user-namespace support, and the kubelet (UserNamespacesSupport,
GA and locked on since 1.36) gives a pod with `hostUsers: false` a range of 65536 host ids of its
own. Inside, the pilot is uid 1000 as always; on the host its processes belong to an id far from
every real account. Read from both sides: the container's `/proc/self/uid_map` and the host's
`/proc/<pid>/status` of the container's process, found by its cgroup below the node's cgroup root.
A route asks for it with `K8sPodPatch` (it loosens nothing, so the patch is allowed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from ce_k8s.real.node.noderuntime import PILOT_UID

from .conftest import running_agent, wait_for
from .test_lifecycle import until
from .test_real_node import finished, log, pod_manifest, run, terminated
from .test_real_node_pilots import finalize_output, pilot

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
IDS_PER_POD = 65536          # the kubelet's range per pod (pkg/kubelet/userns: userNsLength)
HOST_USERS_FALSE = [{"op": "add", "path": "/spec/hostUsers", "value": False}]
# What the container prints about itself, then it stays up while the test looks from the host.
SELF_REPORT = "id -u; cat /proc/self/uid_map /proc/self/gid_map; stat -c '%u:%g' /bin/busybox; echo reported"


@pytest.fixture(scope="module")
def real_node(real_kube) -> str:
    names = real_kube.real_node_names()
    assert names, "the bed has no real node (RealKube.up(real_nodes=1))"
    return names[0]


@pytest.fixture
def bed(real_kube, pilot_namespace):
    """The agent on its own ServiceAccount token, as test_real_node_pilots runs it."""
    with running_agent(real_kube, pilot_namespace, usage_source="kubelet",
                       kubelet_ca=str(real_kube.kubelet_ca)) as (agent, settings, root):
        yield agent, settings, root


def uid_map(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(f) for f in line.split()) for line in text.splitlines() if len(line.split()) == 3]


def container_process(real_kube, pod) -> int:
    """The pid (host's view) of the pod's `main` container: the process whose memory cgroup is
    `<node cgroupRoot>/kubepods/.../pod<uid>/<container id>`."""
    (node,) = real_kube.state().real_nodes
    cid = next(s for s in pod.status.container_statuses if s.name == "main").container_id.split("://", 1)[1]
    root, tail = node["cgroup_root"].rstrip("/") + "/kubepods/", f"/pod{pod.metadata.uid}/{cid}"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            lines = (entry / "cgroup").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(",") and path.startswith(root) and path.endswith(tail):
                return int(entry.name)
    raise AssertionError(f"no process in a cgroup {root}...{tail}")


def host_ids(pid: int) -> tuple[int, int]:
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":\t" in line)
    return int(status["Uid"].split()[0]), int(status["Gid"].split()[0])


def running_and_reported(admin_core, ns: str, name: str):
    def ready():
        pod = admin_core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase == "Running" and "reported" in log(admin_core, ns, name) else None
    return wait_for(ready, 60, what=f"{name} running and reporting")


def look(real_kube, admin_core, ns: str, host_users: bool | None):
    """Run the self-report on the real node; return (its lines, its uid map, the host's uid and gid
    of the container's process, the pod)."""
    manifest = pod_manifest(f"userns-{'default' if host_users is None else str(host_users).lower()}",
                            f"{SELF_REPORT}; exec sleep 60", grace=0)
    if host_users is not None:
        manifest["spec"]["hostUsers"] = host_users
    name = run(admin_core, ns, manifest)
    pod = running_and_reported(admin_core, ns, name)
    lines = log(admin_core, ns, name).splitlines()
    ids = host_ids(container_process(real_kube, pod))
    admin_core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    return lines, uid_map(lines[1]), ids, pod


def test_the_real_node_reports_user_namespace_support_for_runc(admin_core, real_node):
    handlers = {h.name: h.features for h in admin_core.read_node(real_node).status.runtime_handlers}
    assert handlers["runc"].user_namespaces is True, handlers
    assert handlers[""].user_namespaces is True, handlers       # the default handler (runc)


def test_a_pod_with_host_users_false_is_uid_1000_inside_and_an_unmapped_uid_on_the_host(
        real_kube, admin_core, pilot_namespace, real_node):
    # The restricted profile admits it: the namespace enforces restricted and the create succeeded.
    labels = admin_core.read_namespace(pilot_namespace).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels
    lines, mapping, (uid, gid), pod = look(real_kube, admin_core, pilot_namespace, host_users=False)
    assert pod.spec.host_users is False and pod.spec.node_name == real_node
    assert lines[0] == str(PILOT_UID)
    # One range of 65536 ids, 0 inside at a multiple of 65536 outside, never the host's own ids.
    ((inside, outside, length),) = mapping
    assert (inside, length) == (0, IDS_PER_POD) and outside >= IDS_PER_POD and outside % IDS_PER_POD == 0, mapping
    assert uid_map(lines[2]) == mapping                                  # gid_map: the same range
    assert (uid, gid) == (outside + PILOT_UID, outside + PILOT_UID), (uid, gid, mapping)
    # The image's files are root's inside (idmapped rootfs), not overflow ids (65534).
    assert lines[3] == "0:0", lines


def test_without_host_users_false_the_container_is_uid_1000_on_the_host_too(real_kube, admin_core,
                                                                           pilot_namespace, real_node):
    """The contrast: the identity map, and the pilot's uid is the host's uid 1000."""
    lines, mapping, ids, pod = look(real_kube, admin_core, pilot_namespace, host_users=None)
    assert pod.spec.host_users in (None, True)
    assert lines[0] == str(PILOT_UID) and mapping == [(0, 0, 2**32 - 1)]
    assert ids == (PILOT_UID, PILOT_UID)


def test_restricted_checks_still_hold_in_a_user_namespace(admin_core, pilot_namespace, real_node):
    """hostUsers: false takes nothing away from the restricted profile inside the container."""
    script = ("grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd):' /proc/self/status; "
              "touch /root/x 2>/dev/null && echo root-writable || echo root-denied")
    manifest = pod_manifest("userns-restricted", script)
    manifest["spec"]["hostUsers"] = False
    name = run(admin_core, pilot_namespace, manifest)
    pod = finished(admin_core, pilot_namespace, name)
    assert terminated(pod).exit_code == 0
    lines = log(admin_core, pilot_namespace, name).splitlines()
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"
    assert int(fields["CapEff"], 16) == 0 == int(fields["CapBnd"], 16)
    assert lines[-1] == "root-denied"


# ------------------------------------------------------------------ through the product
def route_config(tmp_path: Path) -> Path:
    """The shipped configuration (config.d, then routes/ in their order) with the Pilots route
    asking for a user namespace through K8sPodPatch, as a site would write it."""
    from ops.ops_helpers import shipped_config

    conf = shipped_config(tmp_path / "config")
    pilots = conf / "70-ce-k8s-route-90-pilots.conf"
    text = pilots.read_text()
    anchor = '    SET K8sCpuLimit "request"\n'
    assert anchor in text, "the shipped Pilots route changed: update this test"
    patch = json.dumps(HOST_USERS_FALSE).replace('"', '\\"')
    pilots.write_text(text.replace(anchor, f'{anchor}    SET K8sPodPatch "{patch}"\n'))
    return conf


def test_a_route_s_pod_patch_gives_the_pilot_pod_host_users_false_and_restricted_admits_it(
        tmp_path, agent_client, pilot_namespace):
    """`ce-k8s route` (the agent's own builder) on the shipped example pilot: the pod carries
    hostUsers: false, and the real API server admits it under restricted with the agent's token."""
    proc = subprocess.run([str(Path(sys.executable).parent / "ce-k8s"), "route", "--json",
                           "--config", str(route_config(tmp_path)), "--jobads", str(REPO / "examples/pilot-cpu8.ad")],
                          capture_output=True, text=True, check=False, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (job,) = json.loads(proc.stdout)
    assert job["route"] == "Pilots" and job["errors"] == [], job
    assert json.loads(job["routed_ad"]["K8sPodPatch"]) == HOST_USERS_FALSE
    spec = job["pod"]["spec"]
    assert spec["hostUsers"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True     # the rest of the posture is as always
    body = dict(job["pod"], metadata=dict(job["pod"]["metadata"], namespace=pilot_namespace))
    pod = client.CoreV1Api(agent_client).create_namespaced_pod(pilot_namespace, body, dry_run="All")
    assert pod.spec.host_users is False


def test_a_pilot_with_host_users_false_runs_through_the_agent_on_the_real_node(bed, pilot_namespace, real_node):
    """The product's whole pod in a user namespace: the sandbox Secret (mode 0400, readable through
    fsGroup), the init container's links in the scratch emptyDir, the pilot's exit code and output."""
    agent, settings, _ = bed
    script = ('echo "uid=$(id -u)"; cat /proc/self/uid_map; head -c 12 "$X509_USER_PROXY" >/dev/null && '
              'echo proxy-readable; ls -l "$PWD" | grep -c -- "->"; exit 7')
    ad = pilot(settings, pilot_namespace, script, cluster=5160, K8sPodPatch=json.dumps(HOST_USERS_FALSE))
    until(agent, ad, lambda a: a.get("JobStatus") in (4, 5), "the pilot's end")
    assert ad["JobStatus"] == 4 and ad["ExitCode"] == 7, dict(ad)
    assert ad["K8sNodeName"] == real_node
    out, err = finalize_output(agent, settings, ad)
    lines = out.splitlines()
    assert lines[0] == f"uid={PILOT_UID}", out + err
    ((inside, outside, length),) = uid_map(lines[1])
    assert (inside, length) == (0, IDS_PER_POD) and outside >= IDS_PER_POD, lines[1]
    assert "proxy-readable" in lines, out + err
    assert int(lines[-1]) >= 1, out + err            # the init container's links to the sandbox
