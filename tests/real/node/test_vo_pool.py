"""A VO user's job runs in a pilot on the real node (issue 34, items 2 and 4).

The VO's pool (ce_k8s.real.node.vopool: collector, negotiator and schedd of HTCondor 25.14.1, in
the node's network namespace on the pods' gateway) takes a user's plain vanilla job; a pilot pod
(the pilot image, run as ce-k8s runs a pilot: test_pilot_pod.pilot_pod) joins the pool with the
token the pool signed; the pool's negotiator matches the job to the pilot's slot, its schedd runs
it there, the output comes back to the user's directory, and the pilot leaves when idle.

What the real node, runc and HTCondor judge: the job ran in the pod (its hostname is the pod's
name) as uid 1000, never root, and its output returned; a pilot deleted or evicted while its job
runs gets SIGTERM, vacates the job and ends 143 inside the pod's grace, and the user's job goes
back to idle in the VO pool, not lost: the next pilot runs it. Through the agent, a whole-node
pilot offers the pod's CPUs and a GPU pilot the one device the kubelet gave its pod (stand-in
devices of ce_k8s.real.kube.fakegpu: this machine has no GPU). A node lost outright (its kubelet,
runtime and pods SIGKILLed at once) loses no user's job, and its pilot never runs again when the
node comes back. A pilot whose credential is a SciToken of the VO's issuer (a real HTTPS issuer in
the node's network, scitokens-cpp in the collector) joins as an IDTOKEN pilot does.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import classad2
import pytest

from ce_k8s.holds import HOLDS
from ce_k8s.pods.builder import SCRATCH_DIR
from ce_k8s.real.condor.issuer import TestIssuer
from ce_k8s.real.kube import fakegpu
from ce_k8s.real.node import pilotimage
from ce_k8s.real.node.vopool import COLLECTOR_CERT, COLLECTOR_NAME, PILOT_IDENTITY, SCITOKEN_SUBJECT, VOPool

from ..conftest import running_agent, wait_for
from ..test_lifecycle import until, update
from ..test_real_node import finished, log, pod_manifest, removed, terminated
from ..test_real_node_pilots import REAL_NODE_TOLERATION, finalize_output, pilot
from .conftest import FIGURES
from .test_pilot_pod import (
    GRACE,
    TOKEN_DIR,
    container_cgroup,
    ensure_bridge,
    gateway,
    pilot_pod,
    processes,
    token_secret,
    wait_for_join,
)

pytestmark = pytest.mark.slow

ATTRS = ("ClusterId", "ProcId", "JobStatus", "ExitCode", "RemoteHost", "LastRemoteHost", "NumJobStarts",
         "QDate", "JobStartDate", "JobCurrentStartDate", "CompletionDate", "RemoteWallClockTime")
RUNNING, IDLE, COMPLETED = 2, 1, 4
UPDATE = 5                       # the pilots' UPDATE_INTERVAL: the pool sees them soon after they start
VO_ISSUER_PORT = 9643            # in the node's network namespace, on its loopback

JOB = """\
#!/bin/sh
# a VO user's job: who and where it ran, and a file of its own to bring back
echo "uid=$(id -u) gid=$(id -g) host=$(hostname)"
echo "result of $1" > result.txt
sleep "$2"
"""


def description(seconds: int, tag: str) -> str:
    return (f"universe = vanilla\nexecutable = job.sh\narguments = {tag} {seconds}\n"
            "output = job.out\nerror = job.err\nlog = job.log\n"
            "should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT\n"
            "request_cpus = 1\nrequest_memory = 128\nrequest_disk = 10000\nqueue 1\n")


@pytest.fixture(scope="module")
def vo_pool(real_kube, admin_client, node, pilot_image):
    from kubernetes import client

    ensure_bridge(client.CoreV1Api(admin_client), node)
    base = Path(tempfile.mkdtemp(prefix="ce-k8s-vo-pool-", dir="/var/tmp"))
    pool = VOPool(rootfs=base / "rootfs", netns_pid=node.pids["holder"], ip=gateway(node))
    # the VO's SciTokens issuer, on the node network's loopback where only the pool's collector reaches it
    issuer = TestIssuer(base / "issuer", VO_ISSUER_PORT)
    try:
        issuer.create({COLLECTOR_CERT: [COLLECTOR_NAME, pool.ip]})
        pool.prepare(pilot_image.archive, pilotimage.default_root())
        pool.trust_scitokens(issuer)
        issuer.start(netns_pid=node.pids["holder"])
        pool.start(progress=lambda m: print(m, flush=True))
        yield pool
    finally:
        pool.stop()
        issuer.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def pool_left_clean(vo_pool, admin_core, pilot_namespace):
    """After each test, whatever its end: none of its users' jobs left in the pool's queue and none
    of its live pilots left in the pool. The pool lives for the module; a failed test's job and
    idle pilot once took the next tests' slots and made four of them time out. (A pilot whose
    node was lost outright left no startd to say goodbye: its ad stays until the collector drops
    it, and it can take no job.)"""
    yield
    live = [p.metadata.name for p in admin_core.list_namespaced_pod(pilot_namespace).items
            if p.status.phase in ("Pending", "Running")]
    vo_pool.run("condor_rm -all", cwd="/", check=False)
    admin_core.delete_collection_namespaced_pod(pilot_namespace)

    def startds() -> list[str]:
        return vo_pool.run("condor_status -startd -af Machine", cwd="/", check=False).stdout.split()
    wait_for(lambda: not set(live) & set(startds()), 90, poll=0.5, what=f"the test's pilots {live} to leave the pool",
             on_timeout=startds)


def job(pool: VOPool, cluster: int) -> dict:
    ads = pool.jobs(cluster, ATTRS)
    assert len(ads) == 1, ads
    return ads[0]


def job_process(cgroup: Path) -> dict:
    """The pilot container's processes once the user's job (its `sleep`) is among them: JobStatus 2
    comes with the shadow's start, before the starter has the job's input and starts it."""
    return wait_for(lambda: (p := processes(cgroup)) and "sleep" in {comm for comm, _, _ in p.values()} and p,
                    30, poll=0.2, what="the job's process in the pilot's container",
                    on_timeout=lambda: f"{processes(cgroup)}")


def retire(admin_core, ns: str, pool: VOPool, *names: str) -> None:
    """Delete a test's long-lived pilots and wait until their startds have left the pool: the pool
    lives for the module, and a pilot left idle would take the next test's jobs."""
    for name in names:
        admin_core.delete_namespaced_pod(name, ns)

    def startds() -> list[str]:
        return pool.run("condor_status -startd -af Machine", cwd="/").stdout.split()
    wait_for(lambda: not set(names) & set(startds()), 60, poll=0.5, what=f"{names} to leave the pool",
             on_timeout=startds)


def start_pilot(admin_core, ns: str, pool: VOPool, name: str, **env: str) -> None:
    admin_core.create_namespaced_pod(ns, pilot_pod(name, pool.address, CE_K8S_PILOT_UPDATE_INTERVAL=str(UPDATE),
                                                   **env))
    wait_for_join(admin_core, ns, name)


def test_a_users_job_runs_in_the_pilot_as_uid_1000_and_its_output_comes_back(admin_core, pilot_namespace, node,
                                                                             vo_pool):
    token_secret(admin_core, pilot_namespace, vo_pool.pilot_token())
    cluster = vo_pool.submit("hello", description(5, "hello"), {"job.sh": JOB})
    submitted = time.monotonic()
    name = "pilot-user-job"
    start_pilot(admin_core, pilot_namespace, vo_pool, name, CE_K8S_PILOT_IDLE_SECONDS="20")
    running = wait_for(lambda: (ad := job(vo_pool, cluster))["JobStatus"] == RUNNING and ad, 120, poll=1,
                       what=f"the user's job {cluster} to run in {name}",
                       on_timeout=lambda: f"{job(vo_pool, cluster)}\n{vo_pool.log('NegotiatorLog')}")
    assert name in running["RemoteHost"], running                     # the pilot's slot, by its pod's name
    # seen from the host: the job's process is in the pod's container cgroup, uid 1000
    cgroup = container_cgroup(node, admin_core.read_namespaced_pod(name, pilot_namespace))
    procs = job_process(cgroup)
    assert all(uids == [1000] * 4 for _, uids, _ in procs.values()), procs
    done = wait_for(lambda: (ad := job(vo_pool, cluster))["JobStatus"] == COMPLETED and ad, 120, poll=1,
                    what=f"the user's job {cluster} to complete")
    assert done["ExitCode"] == 0, done
    out = vo_pool.user_file("hello", "job.out")
    assert out.strip() == f"uid=1000 gid=1000 host={name}", out
    assert vo_pool.user_file("hello", "result.txt") == "result of hello\n"
    # the pilot leaves when idle, exit 0
    pod = finished(admin_core, pilot_namespace, name, timeout=120)
    term, text = terminated(pod), log(admin_core, pilot_namespace, name)
    assert term.exit_code == 0 and "exit 0 (IDLE)" in text, text
    FIGURES["user_job"] = {"submit_to_start_s": done["JobStartDate"] - done["QDate"],
                           "job_wall_s": done.get("RemoteWallClockTime"),
                           "submit_to_pilot_end_s": round(time.monotonic() - submitted, 1),
                           "pilot_exit": term.exit_code}
    print(f"user_job: {json.dumps(FIGURES['user_job'])}\n{text}", flush=True)


@pytest.mark.parametrize("how", ["delete", "evict"])
def test_a_pilot_removed_while_its_job_runs_vacates_it_and_the_next_pilot_runs_it(admin_core, pilot_namespace,
                                                                                   node, vo_pool, how):
    from kubernetes import client

    token_secret(admin_core, pilot_namespace, vo_pool.pilot_token())
    cluster = vo_pool.submit(f"long-{how}", description(600, how), {"job.sh": JOB})
    first = f"pilot-{how}-1"
    start_pilot(admin_core, pilot_namespace, vo_pool, first, CE_K8S_PILOT_IDLE_SECONDS="600")
    wait_for(lambda: job(vo_pool, cluster)["JobStatus"] == RUNNING, 120, poll=1,
             what=f"the user's job to run in {first}")
    job_process(container_cgroup(node, admin_core.read_namespaced_pod(first, pilot_namespace)))
    if how == "delete":
        remove = lambda: admin_core.delete_namespaced_pod(first, pilot_namespace)    # noqa: E731
    else:
        remove = lambda: admin_core.create_namespaced_pod_eviction(                  # noqa: E731
            first, pilot_namespace, client.V1Eviction(metadata=client.V1ObjectMeta(name=first,
                                                                                   namespace=pilot_namespace)))
    term, seconds, text = removed(admin_core, pilot_namespace, first, remove, GRACE + 30)   # the pod's own grace
    # the pilot ended itself inside the grace, 143 (the kubelet's SIGKILL would be 137), vacating the job
    assert term.exit_code == 143 and seconds < GRACE, (term, seconds, text)
    assert "SIGTERM: shutting the startd down gracefully" in text and "exit 143 (SIGTERM)" in text, text
    # the user's job is back to idle in the VO pool, having started once: not lost, not completed
    back = wait_for(lambda: (ad := job(vo_pool, cluster))["JobStatus"] == IDLE and ad, 60, poll=1,
                    what="the vacated job to be idle again",
                    on_timeout=lambda: f"{job(vo_pool, cluster)}\npilot: {text}\n{vo_pool.log('ShadowLog')}"
                                       f"\n{vo_pool.log('SchedLog')}")
    assert back["NumJobStarts"] >= 1 and first in back.get("LastRemoteHost", ""), back
    # nothing lost: the next pilot runs it
    second = f"pilot-{how}-2"
    start_pilot(admin_core, pilot_namespace, vo_pool, second, CE_K8S_PILOT_IDLE_SECONDS="600")
    wait_for(lambda: job(vo_pool, cluster)["JobStatus"] == RUNNING, 120, poll=1,
             what=f"the user's job to run again in {second}")
    job_process(container_cgroup(node, admin_core.read_namespaced_pod(second, pilot_namespace)))
    # (NumJobStarts is the shadow's to update, at its next queue update: not looked at here)
    again = job(vo_pool, cluster)
    assert second in again["RemoteHost"] and first in again["LastRemoteHost"], again
    assert again["JobCurrentStartDate"] > back["JobCurrentStartDate"], (back, again)
    FIGURES[f"vacate_{how}"] = {"removal_to_pilot_exit_s": round(seconds, 1), "pilot_exit": term.exit_code,
                                "restart_after_s": again["JobCurrentStartDate"] - back["JobCurrentStartDate"]}
    print(f"vacate_{how}: {json.dumps(FIGURES[f'vacate_{how}'])}", flush=True)
    vo_pool.run(f"condor_rm {cluster}", cwd="/")
    retire(admin_core, pilot_namespace, vo_pool, second)
    admin_core.delete_namespaced_pod(second, pilot_namespace)


# ------------------------------------------------------------------ a SciToken of the VO's issuer
def test_a_pilot_with_a_scitoken_of_the_vo_s_issuer_joins_and_runs_a_users_job(admin_core, pilot_namespace,
                                                                                vo_pool):
    """The pilot's credential is a SciToken (WLCG profile, RS256) of the VO's issuer, a real HTTPS
    issuer (ce_k8s.real.condor.issuer) in the node's network: the pool's collector verifies it as an
    OSG pool does, scitokens-cpp fetching the issuer's keys over TLS, and maps issuer and subject to
    the pilot's identity; the pilot checks the collector's host certificate with the VO's CA, a file
    of its Secret beside the token (CE_K8S_PILOT_CA_FILE). A user's job then runs in it. A token
    for another audience is refused, and the pilot says so and ends 3 (TOKEN) at once."""
    def secret(name: str, token: str) -> None:
        admin_core.create_namespaced_secret(pilot_namespace, {"metadata": {"name": name}, "stringData": {
            "token": token + "\n", "ca.crt": vo_pool.issuer.ca_file.read_text()}})

    def scitoken_pilot(name: str) -> dict:
        manifest = pilot_pod(name, vo_pool.named_address, secret=name, CE_K8S_PILOT_CA_FILE=f"{TOKEN_DIR}/ca.crt",
                             CE_K8S_PILOT_UPDATE_INTERVAL=str(UPDATE), CE_K8S_PILOT_IDLE_SECONDS="20")
        manifest["spec"]["hostAliases"] = [vo_pool.host_alias()]
        return manifest

    name = "pilot-scitoken"
    secret(name, vo_pool.pilot_scitoken())
    cluster = vo_pool.submit("sci", description(5, "sci"), {"job.sh": JOB})
    admin_core.create_namespaced_pod(pilot_namespace, scitoken_pilot(name))
    wait_for_join(admin_core, pilot_namespace, name)
    text = log(admin_core, pilot_namespace, name)
    assert f"SCITOKENS for {SCITOKEN_SUBJECT}" in text, text
    out = vo_pool.run("condor_status -startd -af Name AuthenticationMethod AuthenticatedIdentity", cwd="/").stdout
    assert [line.split()[1:] for line in out.splitlines() if name in line] == [["SCITOKENS", PILOT_IDENTITY]], out
    done = wait_for(lambda: (a := job(vo_pool, cluster))["JobStatus"] == COMPLETED and a, 120, poll=1,
                    what="the user's job to complete in the SciToken pilot")
    assert done["ExitCode"] == 0 and name in done["LastRemoteHost"], done
    assert vo_pool.user_file("sci", "job.out").strip() == f"uid=1000 gid=1000 host={name}"
    retire(admin_core, pilot_namespace, vo_pool, name)

    secret("pilot-scitoken-elsewhere", vo_pool.pilot_scitoken(audience="elsewhere.example:9618"))
    started = time.monotonic()
    admin_core.create_namespaced_pod(pilot_namespace, scitoken_pilot("pilot-scitoken-elsewhere"))
    pod = finished(admin_core, pilot_namespace, "pilot-scitoken-elsewhere", timeout=120)
    seconds = time.monotonic() - started
    refused = log(admin_core, pilot_namespace, "pilot-scitoken-elsewhere")
    assert terminated(pod).exit_code == 3 and "refused the pilot's token" in refused, refused
    FIGURES["scitoken"] = {"wrong_audience_exit": 3, "wrong_audience_s": round(seconds, 1)}
    print(f"scitoken: {json.dumps(FIGURES['scitoken'])}", flush=True)


# ------------------------------------------------------------------ a node lost outright
LEASE = 20          # the user's job_lease_duration: how long its schedd waits for a lost pilot


def node_ready(admin_core, name: str) -> str:
    conds = admin_core.read_node(name).status.conditions or []
    return next((c.status for c in conds if c.type == "Ready"), "?")


def test_a_node_lost_outright_loses_no_users_job_and_its_pilot_never_runs_again(
        real_kube, ce_agent, admin_core, pilot_namespace, node, vo_pool):
    """The node is lost while a user's job runs in a pilot the agent made: kubelet, containerd,
    shims and containers SIGKILLed at once (KubeNodes.lose_real), no SIGTERM, nobody told. The API
    server's node controller marks the node Unknown; the agent keeps the routed job running (nobody
    knows better) and makes no second pod; the VO pool's schedd cannot reach the pilot and, when the
    job's lease runs out, gives the job back: idle, not lost. The node comes back, as after a reboot,
    before the taint manager evicted the pod (the route tolerates an unreachable node for an hour; a
    pod tolerates it 300 s by default): the real kubelet finds the pilot's container dead and, the pod
    being restartPolicy Never, ends it Failed without starting it again (a pilot runs once); the
    runtime's `Unknown` 255 is not the pilot's exit code, so the agent holds the routed job
    `container-crashed`. The next pilot runs the user's job to completion."""
    agent, settings, _ = ce_agent
    leased = description(8, "lost").replace("queue 1", f"job_lease_duration = {LEASE}\nqueue 1")
    cluster = vo_pool.submit("lost", leased, {"job.sh": JOB})
    unreachable = ", ".join(
        f'[ key = "{key}"; operator = "Exists"; effect = "NoExecute"; tolerationSeconds = 3600 ]'
        for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"))
    ad = image_pilot(agent, settings, pilot_namespace, vo_pool, 5190, "node-lost", RequestCpus=1, RequestMemory=512,
                     K8sTolerations=classad2.ExprTree(f"{{ {REAL_NODE_TOLERATION}, {unreachable} }}"))
    first = ad["K8sPodName"]
    wait_for(lambda: job(vo_pool, cluster)["JobStatus"] == RUNNING, 120, poll=1,
             what=f"the user's job to run in {first}")
    before = admin_core.read_namespaced_pod(first, pilot_namespace)
    job_process(container_cgroup(node, before))
    started = before.status.container_statuses[0].state.running.started_at

    lost = time.monotonic()
    real_kube.nodes.lose_real(1, progress=lambda m: print(m, flush=True))
    try:
        wait_for(lambda: node_ready(admin_core, node.name) == "Unknown", 60, poll=0.5,
                 what="the node controller to mark the lost node Unknown")
        unknown_s = time.monotonic() - lost
        back = wait_for(lambda: (a := job(vo_pool, cluster))["JobStatus"] == IDLE and a, LEASE + 120, poll=1,
                        what="the user's job to be idle again when its lease ran out",
                        on_timeout=lambda: f"{job(vo_pool, cluster)}\n{vo_pool.log('ShadowLog')}")
        idle_s = time.monotonic() - lost
        assert first in back.get("LastRemoteHost", ""), back
        # the API server still has the pod Running on the lost node, and so has the CE
        assert admin_core.read_namespaced_pod(first, pilot_namespace).status.phase == "Running"
        update(agent, ad)
        assert ad["JobStatus"] == 2, dict(ad)
    finally:
        real_kube.nodes.return_real(1, progress=lambda m: print(m, flush=True))

    def ended():
        pod = admin_core.read_namespaced_pod(first, pilot_namespace)
        return pod.status.phase in ("Failed", "Succeeded") and pod
    after = wait_for(ended, 120, poll=0.5, what="the returned kubelet to end the lost pilot's pod",
                     on_timeout=lambda: admin_core.read_namespaced_pod(first, pilot_namespace).status)
    status = after.status.container_statuses[0]
    term = status.state.terminated
    assert after.status.phase == "Failed" and status.restart_count == 0 and term is not None, after.status
    assert term.started_at == started and status.last_state.terminated is None, status    # never started again
    until(agent, ad, lambda a: a.get("JobStatus") == 5, "the routed job held", timeout=60)
    assert ad["HoldReasonSubCode"] == HOLDS["container-crashed"].subcode, dict(ad)
    assert f"ended {term.reason} (the runtime's placeholder {term.exit_code}" in ad["HoldReason"], ad["HoldReason"]
    pods = [p.metadata.name for p in admin_core.list_namespaced_pod(pilot_namespace).items]
    assert [name for name in pods if name.startswith("ce-5190-")] == [first], pods      # no second attempt

    second = "pilot-lost-2"
    token_secret(admin_core, pilot_namespace, vo_pool.pilot_token())
    start_pilot(admin_core, pilot_namespace, vo_pool, second)
    done = wait_for(lambda: (a := job(vo_pool, cluster))["JobStatus"] == COMPLETED and a, 180, poll=1,
                    what=f"the user's job to complete in {second}")
    assert done["ExitCode"] == 0 and second in done["LastRemoteHost"], done
    assert vo_pool.user_file("lost", "job.out").startswith(f"uid=1000 gid=1000 host={second}")
    retire(admin_core, pilot_namespace, vo_pool, second)
    FIGURES["node_lost"] = {"to_node_unknown_s": round(unknown_s, 1), "to_job_idle_s": round(idle_s, 1),
                            "lease_s": LEASE, "lost_pod": f"{after.status.phase} {term.reason} {term.exit_code}",
                            "ce": f"held {ad['HoldReasonCode']}/{ad['HoldReasonSubCode']}"}
    print(f"node_lost: {json.dumps(FIGURES['node_lost'])}", flush=True)


# ------------------------------------------------------------------ the CE's pilot, through the agent
@pytest.fixture
def ce_agent(real_kube, pilot_namespace):
    """The agent as test_real_node_pilots.py runs it (its ServiceAccount's token, the kubelet's usage)."""
    with running_agent(real_kube, pilot_namespace, usage_source="kubelet", usage_interval=1.0,
                       kubelet_ca=str(real_kube.kubelet_ca)) as bed:
        yield bed


def image_pilot(agent, settings, ns: str, pool: VOPool, cluster: int, kind: str, **shape):
    """A routed pilot of the pilot image (`Never`), as a factory sends it: its executable execs the
    entry point, the pool's token is an input file; returned once the agent sees it running."""
    ad = pilot(settings, ns, f"exec /{pilotimage.LAUNCHER}", cluster=cluster,
               image=pilotimage.PILOT_IMAGE, K8sImagePullPolicy="Never", TransferInput="idtoken",
               BatchRuntime=3600, **shape,
               Environment=f"CE_K8S_PILOT_COLLECTOR={pool.address} "
                           f"CE_K8S_PILOT_TOKEN_FILE={SCRATCH_DIR}/idtoken "
                           f"CE_K8S_PILOT_IDLE_SECONDS=20 CE_K8S_PILOT_UPDATE_INTERVAL={UPDATE}")
    (Path(ad["Iwd"]) / "idtoken").write_text(pool.pilot_token() + "\n")      # the factory's transfer
    until(agent, ad, lambda a: a.get("JobStatus") == 2, f"the {kind} pilot running", timeout=120)
    return ad


def test_a_whole_node_pilot_the_agent_runs_from_the_image_serves_users_jobs_on_the_pods_cpus(
        ce_agent, admin_core, pilot_namespace, node, vo_pool):
    """The product's own pod (the agent on its ServiceAccount's token, the pod builder's restricted
    pod, the sandbox from a Secret): a routed pilot whose route names the pilot image (`Never`) and
    whose executable, as a factory's glidein_startup.sh does, starts the image's entry point with
    the token the factory transferred as an input file. The route is a whole-node one
    (`WantWholeNode`, its node shape K8sWholeNodeCpus 2: the real node's two cores): the startd's
    partitionable slot has the pod's 2 CPUs, read from the cgroup runc made, so two one-CPU user
    jobs run side by side in the one pilot and a third waits for one of them: the slots the pod
    was given, no more. The pilot plans its end by its pod's deadline (the builder's
    CE_K8S_DEADLINE_SECONDS), leaves idle, and the agent reports the routed job completed with
    exit code 0 and the pilot's own last words."""
    agent, settings, _ = ce_agent
    cluster = vo_pool.submit("whole", description(8, "whole").replace("queue 1", "queue 3"), {"job.sh": JOB})
    ad = image_pilot(agent, settings, pilot_namespace, vo_pool, 5170, "whole-node",
                     WantWholeNode=True, K8sWholeNodeCpus=2, K8sWholeNodeMemory=1024)
    pod = ad["K8sPodName"]

    def user_ads() -> list[dict]:
        return vo_pool.jobs(cluster, ATTRS)

    two = wait_for(lambda: (ads := user_ads()) and sum(1 for a in ads if a["JobStatus"] == RUNNING) == 2 and ads,
                   120, poll=1, what="two user jobs running side by side in the pilot",
                   on_timeout=lambda: f"{user_ads()}\n{vo_pool.log('NegotiatorLog')}")
    assert all(pod in a["RemoteHost"] for a in two if a["JobStatus"] == RUNNING), two
    assert sum(1 for a in two if a["JobStatus"] == IDLE) == 1, two       # the third waits: no third CPU
    slots = vo_pool.run('condor_status -af Name TotalSlotCpus -constraint "PartitionableSlot =?= true"',
                        cwd="/").stdout
    assert [line.split()[1] for line in slots.splitlines() if pod in line] == ["2"], slots
    done = wait_for(lambda: (ads := user_ads()) and all(a["JobStatus"] == COMPLETED for a in ads) and ads, 180,
                    poll=1, what="the three user jobs to complete in the pilot")
    assert {a["ExitCode"] for a in done} == {0} and all(pod in a["LastRemoteHost"] for a in done), done
    assert vo_pool.user_file("whole", "job.out").strip() == f"uid=1000 gid=1000 host={pod}"
    until(agent, ad, lambda a: a.get("JobStatus") == 4, "the pilot completed", timeout=120)
    assert ad["ExitCode"] == 0 and ad["K8sNodeName"] == node.name, dict(ad)
    out, err = finalize_output(agent, settings, ad)
    assert "joined the collector" in out + err and "exit 0 (IDLE)" in out + err, out + err
    assert "2 CPUs (cgroup CPU quota (2 CPUs)), 1024 MB (cgroup memory limit)" in out + err, out + err
    # its end planned by its pod's deadline (CE_K8S_DEADLINE_SECONDS = activeDeadlineSeconds 3600):
    # ToDie = 3600 - grace 25 - margin 60 after its start
    assert "retires in 3515 s, dies in 3515 s" in out + err, out + err


# ------------------------------------------------------------------ a GPU route (stand-in devices)
GPU_JOB = """\
#!/bin/sh
# a VO user's GPU job: the devices HTCondor assigned it, as CUDA would be told
echo "uid=$(id -u) assigned=$_CONDOR_AssignedGPUs cuda=$CUDA_VISIBLE_DEVICES host=$(hostname)"
sleep "$2"
"""


def gpu_description(gpus: int, seconds: int) -> str:
    return description(seconds, f"gpu{gpus}").replace("request_cpus = 1", f"request_cpus = 1\nrequest_gpus = {gpus}")


def node_gpus(admin_core, name: str) -> tuple[str | None, str | None]:
    status = admin_core.read_node(name).status
    return (status.capacity or {}).get(fakegpu.RESOURCE), (status.allocatable or {}).get(fakegpu.RESOURCE)


@pytest.fixture
def fake_gpus(real_kube, admin_core, node):
    """Two stand-in GPUs on the real node (ce_k8s.real.kube.fakegpu: the kubelet's device-plugin API;
    the kubelet, the scheduler and runc do the rest). Stopped after the test: the kubelet then marks
    them unhealthy at once (allocatable 0), and forgets them after its grace period."""
    st = real_kube.state()
    binary = fakegpu.build(st.version, progress=lambda m: print(f"fake gpu: {m}", flush=True))
    gpus = fakegpu.FakeGPUs(binary, node.pids["holder"], Path(node.dir), count=2)
    gpus.start()
    try:
        wait_for(lambda: node_gpus(admin_core, node.name) == ("2", "2"), 60, poll=0.5,
                 what="the node's allocatable nvidia.com/gpu 2", on_timeout=lambda: node_gpus(admin_core, node.name))
        yield gpus
    finally:
        gpus.stop()
        wait_for(lambda: node_gpus(admin_core, node.name)[1] in (None, "0"), 60, poll=0.5,
                 what="the kubelet to take the stopped plugin's GPUs out of allocatable")


def test_a_gpu_pilot_offers_the_one_gpu_the_kubelet_gave_its_pod_and_no_more(
        ce_agent, admin_core, pilot_namespace, node, vo_pool, fake_gpus):
    """A GPU route (`RequestGPUs = 1`) on a node with two GPUs: the pod asks for one
    `nvidia.com/gpu`, the kubelet's device manager picks the device and the plugin's answer puts
    NVIDIA_VISIBLE_DEVICES into the container. The pilot's startd offers that one device, by its
    UUID: a user's one-GPU job runs with CUDA_VISIBLE_DEVICES naming it, and a two-GPU job never
    matches (the slots the pod was given, no more). The node's second GPU is still free, and a pod
    asking for two waits, Unschedulable: Kubernetes, not the pilot, decides who holds a device."""
    agent, settings, _ = ce_agent
    one = vo_pool.submit("gpu1", gpu_description(1, 5), {"job.sh": GPU_JOB})
    two = vo_pool.submit("gpu2", gpu_description(2, 5), {"job.sh": GPU_JOB})
    ad = image_pilot(agent, settings, pilot_namespace, vo_pool, 5180, "GPU",
                     RequestCpus=1, RequestMemory=512, RequestGPUs=1)
    pod = ad["K8sPodName"]
    limits = admin_core.read_namespaced_pod(pod, pilot_namespace).spec.containers[0].resources.limits
    assert limits[fakegpu.RESOURCE] == "1", limits
    # one Allocate per container of the pod that asks (the sandbox's init container too): the
    # kubelet hands the init container's device on to the pilot's, one device in all
    allocations = fake_gpus.allocations()
    assert {tuple(a) for a in allocations} == {(allocations[0][0],)}, allocations
    device = allocations[0][0]

    # the node's other GPU is free; two are not, so a pod asking for two waits
    greedy = pod_manifest("wants-two-gpus", "sleep 60")
    greedy["spec"]["containers"][0]["resources"]["limits"][fakegpu.RESOURCE] = "2"
    greedy["spec"]["containers"][0]["resources"]["requests"][fakegpu.RESOURCE] = "2"
    admin_core.create_namespaced_pod(pilot_namespace, greedy)
    try:
        def unschedulable():
            conds = admin_core.read_namespaced_pod("wants-two-gpus", pilot_namespace).status.conditions or []
            return next((c for c in conds if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)
        cond = wait_for(unschedulable, 60, poll=0.5, what="the two-GPU pod Unschedulable")
        assert f"Insufficient {fakegpu.RESOURCE}" in cond.message, cond.message
    finally:
        admin_core.delete_namespaced_pod("wants-two-gpus", pilot_namespace, grace_period_seconds=0)

    done = wait_for(lambda: (a := job(vo_pool, one))["JobStatus"] == COMPLETED and a, 180, poll=1,
                    what="the one-GPU job to complete in the pilot",
                    on_timeout=lambda: f"{job(vo_pool, one)}\n{vo_pool.log('NegotiatorLog')}")
    assert done["ExitCode"] == 0 and pod in done["LastRemoteHost"], done
    assert vo_pool.user_file("gpu1", "job.out").strip() == f"uid=1000 assigned={device} cuda={device} host={pod}"
    slots = vo_pool.run('condor_status -af Name TotalSlotGPUs AssignedGPUs -constraint "PartitionableSlot =?= true"',
                        cwd="/").stdout
    assert [line.split()[1:] for line in slots.splitlines() if pod in line] == [["1", device]], slots
    until(agent, ad, lambda a: a.get("JobStatus") == 4, "the GPU pilot completed", timeout=120)
    assert ad["ExitCode"] == 0, dict(ad)
    assert job(vo_pool, two)["JobStatus"] == IDLE          # never matched: the pilot had one GPU
    vo_pool.run(f"condor_rm {two}", cwd="/")
    out, err = finalize_output(agent, settings, ad)
    assert f"1 GPUs ({device})" in out + err and "exit 0 (IDLE)" in out + err, out + err
