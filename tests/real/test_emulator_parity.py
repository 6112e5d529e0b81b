"""The emulator answers to the real API server (issue 25, item 6).

Every test here sends the same requests, and plays the same pod lives, to the emulator
(ce_k8s.sim.kube.apiserver with its kubelet simulator) and to the real kube-apiserver v1.37 of the
test bed (admin client; kwok plays the kubelet from the same `sim.ce-k8s.io/scenario` grammar),
and compares what the product reads: HTTP status, `reason`, the words of `message` it matches,
the shapes podschema/PodInfo decode, the order of watch events. Why both in one test: a
difference is then one failing assertion naming both answers, not two tests that drift apart.

Where they still differ on purpose, the test asserts the difference as it stands, and
docs/testbed.md "Where the emulator differs from a real API server" says why it stays; each such
test says so in its docstring. The emulator's own test directories (tests/sim, tests/agent,
tests/e2e) then exercise the real behaviour wherever the product depends on it.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.config import new_client_from_config

from ce_k8s.agent.podinfo import PodInfo
from ce_k8s.sim.kube.apiserver import ApiServer

from .conftest import wait_for
from .test_findings import restricted_pod

pytestmark = pytest.mark.slow

SCENARIO = "sim.ce-k8s.io/scenario"
SPARE_NODE = "spare-1"
# The emulator's nodes: a CPU pool, and the bed's spare node with its taint, so a pod pinned to
# `spare-1` runs on both sides.
EMULATOR_NODES = "cpu:3x64c256g,spare:1x16c64g:taint=ce-k8s.test/spare:NoSchedule"
WHOLE_SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
LOST_TOLERATION = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 5},
                   {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 5},
                   {"key": "ce-k8s.test/spare", "operator": "Exists", "effect": "NoSchedule"}]


@dataclass
class Side:
    """One API server with a fresh namespace: the same calls go to each."""

    name: str
    core: client.CoreV1Api
    ns: str
    compact: Callable[[], None]
    lose_node: Callable[[str], None]
    return_node: Callable[[str], None]

    def error(self, fn: Callable[..., object], *args, **kwargs) -> tuple[int, str, str]:
        """(status, reason, message) of a call that must fail."""
        with pytest.raises(ApiException) as err:
            fn(*args, **kwargs)
        body = json.loads(err.value.body or "{}")
        return err.value.status, body.get("reason", ""), body.get("message", "")

    def outcome(self, fn: Callable[..., object], *args, **kwargs) -> tuple[int, str, str]:
        """(status, reason, message) of a call, (200, "", body) when it succeeds."""
        try:
            data = fn(*args, _preload_content=False, **kwargs).data
        except ApiException as exc:
            body = json.loads(exc.body or "{}")
            return exc.status, body.get("reason", ""), body.get("message", "")
        return 200, "", data.decode()

    def raw(self, fn: Callable[..., object], *args, **kwargs) -> dict:
        """The JSON body as sent, not the client's model: the agent decodes raw bodies too
        (podschema), and a model would hide fields that one side has and the other lacks."""
        return json.loads(fn(*args, _preload_content=False, **kwargs).data)

    def pod(self, name: str) -> dict | None:
        """The pod as stored now, None once it is gone."""
        try:
            return self.raw(self.core.read_namespaced_pod, name, self.ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def events(self, name: str, since: str, until: Callable[[dict], bool], timeout: int = 30) -> list[dict]:
        """The watch events of pod `name` after resourceVersion `since`, up to the first for which
        `until` holds (the watch replays history, so the calls can come before the watch)."""
        seen: list[dict] = []
        resp = self.core.list_namespaced_pod(self.ns, watch=True, resource_version=since,
                                             field_selector=f"metadata.name={name}", timeout_seconds=timeout,
                                             _preload_content=False)
        for line in resp:
            ev = json.loads(line)
            if ev["type"] == "BOOKMARK":
                continue
            seen.append(ev)
            if until(ev):
                break
        resp.release_conn()
        return seen


@pytest.fixture(scope="module")
def emulator() -> Iterator[ApiServer]:
    """The emulator with its kubelet simulator, timed like the bed (a scenario second is 0.05 s
    on both) and, like kwok, running a pod without a scenario until it is deleted; a long image
    pull back-off keeps a failed pull in `ImagePullBackOff` while a test reads it."""
    with ApiServer.running(nodes=EMULATOR_NODES, time_scale=0.05,
                           kubelet_options={"default_scenario": "run=forever", "image_pull_backoff": 600}) as srv:
        yield srv


def _emulator_side(srv: ApiServer, ns: str) -> Iterator[Side]:
    api = new_client_from_config(config_file=srv.kubeconfig_path)
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ns, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest"}}})
    yield Side("emulator", core, ns, compact=lambda: srv.call(srv.store.compact, "pods"),
               lose_node=srv.kubelet.lose_node, return_node=srv.kubelet.restore_node)
    core.delete_namespace(ns)
    api.close()


def _etcd_compact(etcd: str) -> None:
    """Compact etcd at its current revision (its JSON gateway), as kube-apiserver does every 5 min."""
    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(etcd + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())
    rev = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": rev, "physical": True})


def _real_side(real_kube, admin_client, ns: str) -> Iterator[Side]:
    from ce_k8s.real.kube.kubeserver import RealKubeServer

    server = RealKubeServer(real_kube)
    server.prepare_namespace(ns)
    server.stop()
    core = client.CoreV1Api(admin_client)

    def lose(node: str) -> None:
        assert node == SPARE_NODE
        real_kube.lose_spare_node()

    def back(node: str) -> None:
        real_kube.return_spare_node()
    yield Side("real", core, ns, compact=lambda: _etcd_compact(real_kube.state().etcd), lose_node=lose,
               return_node=back)
    core.delete_namespace(ns)


@pytest.fixture
def sides(emulator, real_kube, admin_client, request) -> Iterator[dict[str, Side]]:
    """{"emulator": Side, "real": Side}, each with a fresh namespace labelled `restricted` like
    the shipped pilot namespace."""
    ns = "par-" + request.node.name.lower().replace("_", "-")[5:35].strip("-") + "-" + os.urandom(2).hex()
    emu, real = _emulator_side(emulator, ns), _real_side(real_kube, admin_client, ns)
    out = {"emulator": next(emu), "real": next(real)}
    yield out
    for gen in (emu, real):
        next(gen, None)


def both(sides: dict[str, Side], fn: Callable[[Side], object]) -> dict[str, object]:
    """`fn` on each side, one after the other (the emulator first), for differences that stay."""
    return {name: fn(side) for name, side in sides.items()}


def same(sides: dict[str, Side], fn: Callable[[Side], object]) -> object:
    """`fn` on both sides; they must agree. Returns the common answer."""
    got = both(sides, fn)
    assert got["emulator"] == got["real"], got
    return got["real"]


def pod_body(name: str, scenario: str | None = None, **spec) -> dict:
    """A pod both sides admit (`restricted`) whose life is the scenario's, on the kubelet
    simulator and on kwok alike (the same annotation grammar)."""
    return restricted_pod(name, {SCENARIO: scenario} if scenario else None, **spec)


# --------------------------------------------------------------------------------------------
# Errors: status, reason and message of what the agent classifies


def test_errors_the_agent_classifies_have_the_same_status_reason_and_message(sides):
    """404, 409 AlreadyExists (dry run too), 409 Conflict, 400 and 422, as creator.classify and
    the `.status ==` checks of ce_k8s/agent read them."""
    def errors(s: Side) -> dict[str, tuple]:
        s.core.create_namespaced_pod(s.ns, pod_body("p1"))
        stale = s.raw(s.core.read_namespaced_pod, "p1", s.ns)
        s.core.patch_namespaced_pod("p1", s.ns, {"metadata": {"labels": {"touched": "yes"}}})
        stale["metadata"]["labels"] = {"x": "y"}
        bad = pod_body("Bad_Name")
        return {
            "get missing": s.error(s.core.read_namespaced_pod, "nope", s.ns),
            "delete missing": s.error(s.core.delete_namespaced_pod, "nope", s.ns),
            "create existing": s.error(s.core.create_namespaced_pod, s.ns, pod_body("p1")),
            "dry-run existing": s.error(s.core.create_namespaced_pod, s.ns, pod_body("p1"), dry_run="All"),
            "stale replace": s.error(s.core.replace_namespaced_pod, "p1", s.ns, stale)[:2],
            "missing namespace": s.error(s.core.create_namespaced_pod, "no-such-ns", pod_body("p2")),
            "bad selector": s.error(s.core.list_namespaced_pod, s.ns, label_selector="a in (b")[:2],
            "bad name": s.error(s.core.create_namespaced_pod, s.ns, bad)[:2],
            "evict missing": s.error(s.core.create_namespaced_pod_eviction, "nope", s.ns,
                                     {"metadata": {"name": "nope", "namespace": s.ns}}),
        }
    got = same(sides, errors)
    assert got["create existing"] == (409, "AlreadyExists", 'pods "p1" already exists')
    assert got["stale replace"] == (409, "Conflict")


def test_dry_run_create_answers_the_pod_and_stores_nothing(sides):
    """The creator's dry-run probe: 201 with the defaulted pod (a uid, no resourceVersion) and
    nothing stored; the agent only reads whether it failed, and how."""
    def dry(s: Side) -> dict:
        pod = s.raw(s.core.create_namespaced_pod, s.ns, pod_body("d1"), dry_run="All")
        meta = pod["metadata"]
        return {"uid": bool(meta.get("uid")), "rv": meta.get("resourceVersion"),
                "created": bool(WHOLE_SECONDS.match(meta.get("creationTimestamp", ""))),
                "phase": pod["status"].get("phase"), "qos": pod["status"].get("qosClass"),
                "stored": s.pod("d1") is not None}
    assert same(sides, dry) == {"uid": True, "rv": None, "created": True, "phase": "Pending",
                                "qos": "Guaranteed", "stored": False}


# --------------------------------------------------------------------------------------------
# ResourceQuota admission


def _quota(s: Side, hard: dict[str, str]) -> None:
    s.core.create_namespaced_resource_quota(s.ns, {"metadata": {"name": "q"}, "spec": {"hard": hard}})
    wait_for(lambda: (s.core.read_namespaced_resource_quota("q", s.ns).status.hard or {}), what="quota status")


def test_quota_answers_before_already_exists_dry_runs_included(sides):
    """Finding 1 on both: at a full quota, a create (or dry run) of a pod that exists is 403
    "exceeded quota", never 409, with the same message; the creator's re-run depends on it."""
    def full(s: Side) -> list[tuple]:
        _quota(s, {"pods": "1"})
        s.core.create_namespaced_pod(s.ns, pod_body("p1"))
        wait_for(lambda: (s.core.read_namespaced_resource_quota("q", s.ns).status.used or {}).get("pods") == "1",
                 what="quota used")
        return [s.error(s.core.create_namespaced_pod, s.ns, pod_body("p1"), dry_run="All"),
                s.error(s.core.create_namespaced_pod, s.ns, pod_body("p1")),
                s.error(s.core.create_namespaced_pod, s.ns, pod_body("p2"))]
    got = same(sides, full)
    for status, reason, message in got:
        assert (status, reason) == (403, "Forbidden") and "exceeded quota" in message


def test_quota_on_cpu_needs_requests_with_the_same_words(sides):
    """A quota on requests.cpu refuses a container without a CPU request: 403, the agent holds
    it as admission-denied (not the "exceeded quota" retry)."""
    def missing(s: Side) -> tuple:
        _quota(s, {"requests.cpu": "1"})
        body = pod_body("p1")
        body["spec"]["containers"][0]["resources"] = {"limits": {"memory": "64Mi"}}
        return s.error(s.core.create_namespaced_pod, s.ns, body)
    assert same(sides, missing) == (403, "Forbidden",
                                    'pods "p1" is forbidden: failed quota: q: must specify requests.cpu for: c')


# --------------------------------------------------------------------------------------------
# Watch, lists and the pod lifecycle


def _phases(events: list[dict]) -> list[tuple[str, str, bool]]:
    """(type, phase, terminating) of each event, repeats folded: what the agent's cache acts on."""
    out: list[tuple[str, str, bool]] = []
    for ev in events:
        obj = ev["object"]
        step = (ev["type"], obj.get("status", {}).get("phase", ""), bool(obj["metadata"].get("deletionTimestamp")))
        if not out or out[-1] != step:
            out.append(step)
    return out


def test_watch_order_create_run_finish_delete_and_the_deleted_event(sides):
    """ADDED Pending → MODIFIED Running → MODIFIED Succeeded → DELETED (a finished pod goes at
    once: no grace, no Terminating step), and the DELETED event carries the pod's last state,
    which the agent keeps as the tombstone it decides on."""
    def life(s: Side) -> dict:
        since = s.raw(s.core.list_namespaced_pod, s.ns)["metadata"]["resourceVersion"]
        s.core.create_namespaced_pod(s.ns, pod_body("w1", "run=20s exit=0"))
        wait_for(lambda: (s.pod("w1") or {}).get("status", {}).get("phase") == "Succeeded", what="Succeeded")
        s.core.delete_namespaced_pod("w1", s.ns)
        events = s.events("w1", since, lambda ev: ev["type"] == "DELETED")
        last = events[-1]["object"]
        info = PodInfo.from_dict(last)
        term = last["status"]["containerStatuses"][0]["state"]["terminated"]
        return {"order": _phases(events), "kind": (last.get("kind"), last.get("apiVersion")),
                "deleted": (info.phase, info.exit_code, info.term_reason, info.finished, info.deleting),
                "terminated keys": sorted(k for k in term if k != "containerID"),
                "node": bool(info.node)}
    got = same(sides, life)
    assert got["order"][0][:2] == ("ADDED", "Pending") and got["order"][-2:] == [
        ("MODIFIED", "Succeeded", True), ("DELETED", "Succeeded", True)]


def test_paged_list_continue_and_a_compacted_continue(sides):
    """limit/continue: the same pages, remainingItemCount and one resourceVersion across pages;
    after a compaction (etcd's, the emulator's store.compact) a continue taken before it is still
    served by both (kube-apiserver 1.37 serves continuations from its watch cache snapshots)."""
    def pages(s: Side) -> dict:
        for i in range(3):
            s.core.create_namespaced_pod(s.ns, pod_body(f"l{i}"))
        first = s.raw(s.core.list_namespaced_pod, s.ns, limit=2)
        s.compact()
        rest = s.raw(s.core.list_namespaced_pod, s.ns, limit=2, _continue=first["metadata"]["continue"])
        return {"kind": (first["kind"], first["apiVersion"]),
                "names": [[p["metadata"]["name"] for p in page["items"]] for page in (first, rest)],
                "remaining": first["metadata"].get("remainingItemCount"),
                "same rv": first["metadata"]["resourceVersion"] == rest["metadata"]["resourceVersion"],
                "last has continue": "continue" in rest["metadata"],
                "items carry kind": any("kind" in p for p in first["items"])}
    assert same(sides, pages) == {"kind": ("PodList", "v1"), "names": [["l0", "l1"], ["l2"]], "remaining": 1,
                                  "same rv": True, "last has continue": False, "items carry kind": False}


def test_timestamps_are_whole_seconds(sides):
    """metav1.Time is whole seconds on the wire: creationTimestamp, startTime, conditions,
    container start and finish; the agent's parse_time and its same-second rule rely on it."""
    def stamps(s: Side) -> list[str]:
        s.core.create_namespaced_pod(s.ns, pod_body("t1", "run=10s exit=0"))
        pod = wait_for(lambda: (p := s.pod("t1")) and p["status"].get("phase") == "Succeeded" and p,
                       what="Succeeded")
        found = [pod["metadata"]["creationTimestamp"], pod["status"]["startTime"]]
        found += [c["lastTransitionTime"] for c in pod["status"]["conditions"] if c.get("lastTransitionTime")]
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        found += [term["startedAt"], term["finishedAt"]]
        return [bool(WHOLE_SECONDS.match(t)) for t in found if t]
    got = both(sides, stamps)
    assert all(got["emulator"]) and all(got["real"]), got


def test_running_and_failed_pods_decode_alike(sides):
    """The fields PodInfo decodes (podschema) from a running pod and from one that exited 3."""
    def decoded(s: Side) -> dict:
        s.core.create_namespaced_pod(s.ns, pod_body("r1"))
        s.core.create_namespaced_pod(s.ns, pod_body("f1", "run=5s exit=3"))
        run = wait_for(lambda: (p := s.pod("r1")) and p["status"].get("phase") == "Running" and p, what="Running")
        wait_for(lambda: (p := s.pod("r1")) and p["status"]["containerStatuses"][0].get("ready"), what="ready")
        run = s.pod("r1")
        fail = wait_for(lambda: (p := s.pod("f1")) and p["status"].get("phase") == "Failed" and p, what="Failed")
        r, f = PodInfo.from_dict(run), PodInfo.from_dict(fail)
        conds = sorted(c["type"] + "=" + c["status"] for c in run["status"]["conditions"])
        return {"running": (r.phase, bool(r.node), bool(r.started_at), r.exit_code, r.waiting_reason, r.disruption),
                "running conditions": conds,
                "failed": (f.phase, f.exit_code, f.term_reason, f.reason, f.finished, bool(f.finished_at))}
    got = same(sides, decoded)
    assert got["failed"] == ("Failed", 3, "Error", "", True, True)


# --------------------------------------------------------------------------------------------
# The Eviction API


def test_eviction_of_running_and_finished_pods(sides):
    """201 and a Success Status; both pods get DisruptionTarget=True EvictionByEvictionAPI before
    they go, the finished one too (finding 4: the agent then reads it as finished, not evicted)."""
    def evict(s: Side) -> dict:
        s.core.create_namespaced_pod(s.ns, pod_body("e-run"))
        s.core.create_namespaced_pod(s.ns, pod_body("e-done", "run=5s exit=0"))
        wait_for(lambda: (s.pod("e-run") or {}).get("status", {}).get("phase") == "Running", what="Running")
        wait_for(lambda: (s.pod("e-done") or {}).get("status", {}).get("phase") == "Succeeded", what="Succeeded")
        out = {}
        for name in ("e-run", "e-done"):
            since = s.pod(name)["metadata"]["resourceVersion"]
            answer = s.raw(s.core.create_namespaced_pod_eviction, name, s.ns,
                           {"metadata": {"name": name, "namespace": s.ns}})
            events = s.events(name, since, lambda ev: ev["type"] == "DELETED")
            conds = [c for ev in events for c in ev["object"]["status"].get("conditions") or []
                     if c["type"] == "DisruptionTarget"]
            last = PodInfo.from_dict(events[-1]["object"])
            out[name] = {"answer": (answer.get("kind"), answer.get("status")),
                         "condition": (conds[0]["status"], conds[0]["reason"], conds[0]["message"]) if conds else None,
                         "deleted": events[-1]["type"] == "DELETED", "disrupted": last.disrupted,
                         "last phase": last.phase if name == "e-done" else None}
        return out
    got = same(sides, evict)
    assert got["e-done"]["condition"] == ("True", "EvictionByEvictionAPI", "Eviction API: evicting")
    assert got["e-done"]["disrupted"] is False and got["e-run"]["disrupted"] is True


# --------------------------------------------------------------------------------------------
# pods/log


def test_log_of_a_waiting_container_is_400_with_the_kubelets_words(sides):
    """A container that cannot pull its image: 400 BadRequest, `container "c" in pod "p" is
    waiting to start: trying and failing to pull image` (the kubelet's words; on the bed the
    kubelet stub says them for kwok); an unscheduled pod's log has no kubelet to ask at all."""
    def logs(s: Side) -> dict:
        body = pod_body("g1")
        body["spec"]["containers"][0]["image"] = "registry.example.org/does-not-exist:1"
        s.core.create_namespaced_pod(s.ns, body)
        wait_for(lambda: ((s.pod("g1") or {}).get("status", {}).get("containerStatuses") or [{}])[0]
                 .get("state", {}).get("waiting", {}).get("reason") == "ImagePullBackOff",
                 what="the pull failure")
        s.core.create_namespaced_pod(s.ns, pod_body("u1", nodeSelector={"no-such": "label"}))
        return {"pull": s.outcome(s.core.read_namespaced_pod_log, "g1", s.ns, container="c"),
                "unscheduled": s.outcome(s.core.read_namespaced_pod_log, "u1", s.ns, container="c")}
    got = both(sides, logs)
    assert got["emulator"]["pull"] == got["real"]["pull"] == (
        400, "BadRequest", 'container "c" in pod "g1" is waiting to start: trying and failing to pull image')
    assert got["emulator"]["unscheduled"] == got["real"]["unscheduled"], got


# --------------------------------------------------------------------------------------------
# A lost node


def test_pods_of_a_lost_node_stay_running_and_terminating(sides):
    """Finding 5 on both: the node goes Ready=Unknown, the taint manager marks the pod
    DisruptionTarget=True DeletionByTaintManager after its unreachable toleration and deletes it
    gracefully; the pod stays Running with a deletionTimestamp while nobody can confirm the kill
    (the agent starts the next attempt on the DisruptionTarget), and goes once the node is back."""
    def lost(s: Side) -> dict:
        s.core.create_namespaced_pod(s.ns, pod_body("n1", nodeName=SPARE_NODE, tolerations=LOST_TOLERATION))
        wait_for(lambda: (s.pod("n1") or {}).get("status", {}).get("phase") == "Running", what="Running")
        s.lose_node(SPARE_NODE)
        try:
            pod = wait_for(lambda: (p := s.pod("n1")) and p["metadata"].get("deletionTimestamp") and p,
                           timeout=120, what=f"{s.name}: the taint manager's deletion")
            time.sleep(2)        # long enough for a simulator that would end it to have done so
            later = s.pod("n1")
            ready = {c["type"]: c["status"] for c in
                     s.raw(s.core.read_node, SPARE_NODE)["status"]["conditions"]}["Ready"]
        finally:
            s.return_node(SPARE_NODE)
        conds = {c["type"]: (c["status"], c.get("reason")) for c in pod["status"]["conditions"]}
        info = PodInfo.from_dict(pod)
        gone = bool(wait_for(lambda: s.pod("n1") is None, timeout=90, what="the pod gone once the node is back"))
        return {"phase": (pod["status"]["phase"], pod["status"].get("reason")),
                "still there": later is not None and later["status"]["phase"],
                "disruption": conds.get("DisruptionTarget"), "node ready": ready,
                "agent reads": (info.disrupted, info.finished, info.deleting), "gone after return": gone}
    assert same(sides, lost) == {"phase": ("Running", None), "still there": "Running",
                                 "disruption": ("True", "DeletionByTaintManager"), "node ready": "Unknown",
                                 "agent reads": (True, False, True), "gone after return": True}


# --------------------------------------------------------------------------------------------
# Admission the emulator does not have: PodSecurity and LimitRanger


def test_podsecurity_restricted_refuses_what_the_emulator_admits(sides):
    """Stays different (docs/testbed.md): the real server refuses a hostPath volume in a
    `restricted` namespace with 403 'violates PodSecurity "restricted:latest"'; the emulator has
    no PodSecurity admission and stores the pod. The agent reads any 403 that is not "exceeded
    quota" as admission-denied (creator.classify), which the emulated tests reach through
    enforce_rbac's 403; the shipped manifests' own pods are checked in tests/real/test_findings.py."""
    def refused(s: Side) -> tuple:
        body = pod_body("h1")
        body["spec"]["volumes"] = [{"name": "cvmfs", "hostPath": {"path": "/cvmfs"}}]
        return s.outcome(s.core.create_namespaced_pod, s.ns, body, dry_run="All")
    got = both(sides, refused)
    status, reason, message = got["real"]
    assert (status, reason) == (403, "Forbidden") and 'violates PodSecurity "restricted:latest"' in message
    assert "hostPath" in message and "exceeded quota" not in message
    assert got["emulator"][0] == 200      # the difference as it stands


def test_limitrange_defaults_are_the_real_servers_alone(sides):
    """Stays different (docs/testbed.md): a LimitRange with a CPU `max` and no `default` makes
    the max every limit-less container's limit on the real server (the API defaults `default` to
    `max`); the emulator serves no `limitranges` at all (404), as a server without that API. The
    agent never reads limits it did not set; the shipped LimitRange is confirmed in
    tests/real/test_findings.py."""
    def limits(s: Side) -> object:
        lr = {"metadata": {"name": "lr"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "8"},
                                                               "defaultRequest": {"cpu": "1", "memory": "1Gi"},
                                                               "default": {"memory": "1Gi"}}]}}
        answer = s.outcome(s.core.create_namespaced_limit_range, s.ns, lr)
        if answer[0] != 200 and answer[0] != 201:
            return answer[:2]
        body = pod_body("lr1")
        body["spec"]["containers"][0]["resources"] = {}
        pod = s.raw(s.core.create_namespaced_pod, s.ns, body, dry_run="All")
        return pod["spec"]["containers"][0]["resources"]
    got = both(sides, limits)
    assert got["real"] == {"limits": {"cpu": "8", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}
    assert got["emulator"] == (404, "NotFound")


def test_log_stream_parameter_is_refused_while_its_gate_is_off(sides):
    """pods/log `stream=Stdout` (KEP-3288, alpha gate PodLogsQuerySplitStreams, off by default):
    422 `stream: Forbidden`, which the agent reads as "no split streams here" (_rejects_stream)
    and falls back to the combined log. The emulator's default `log_streams="forbid"`."""
    def stream(s: Side) -> tuple:
        s.core.create_namespaced_pod(s.ns, pod_body("s1", 'run=forever out="hello"'))
        wait_for(lambda: (s.pod("s1") or {}).get("status", {}).get("phase") == "Running", what="Running")
        status, reason, message = s.outcome(s.core.read_namespaced_pod_log, "s1", s.ns, container="c",
                                            stream="Stdout")
        return status, reason, "stream" in message and "Forbidden" in message
    assert same(sides, stream) == (422, "Invalid", True)


def test_events_of_a_pod_are_found_by_involved_object(sides):
    """The creator's history probe (existed_before): events listed with the field selector
    `involvedObject.kind=Pod,involvedObject.name=<pod>` and `limit=1` find the scheduler's."""
    def history(s: Side) -> tuple:
        s.core.create_namespaced_pod(s.ns, pod_body("v1"))
        sel = "involvedObject.kind=Pod,involvedObject.name=v1"
        found = wait_for(lambda: s.raw(s.core.list_namespaced_event, s.ns, field_selector=sel, limit=1)["items"],
                         what="an event of the pod")
        none = s.raw(s.core.list_namespaced_event, s.ns, field_selector="involvedObject.kind=Pod,"
                     "involvedObject.name=never-was", limit=1)["items"]
        return len(found), found[0]["involvedObject"]["name"], none
    assert same(sides, history) == (1, "v1", [])


# --------------------------------------------------------------------------------------------
# Garbage collection by owner reference


def test_a_secret_goes_with_its_pod_and_with_an_owner_that_never_was(sides):
    """The creator makes each pilot's Secret owned by its pod: deleting the pod takes the Secret
    with it, and a Secret whose owner uid does not exist (the pod vanished before the Secret was
    made) is collected too. Both by the garbage collector, on both sides."""
    def collected(s: Side) -> tuple[bool, bool]:
        pod = s.raw(s.core.create_namespaced_pod, s.ns, pod_body("o1"))
        owner = {"apiVersion": "v1", "kind": "Pod", "name": "o1", "uid": pod["metadata"]["uid"]}
        ghost = dict(owner, name="o-ghost", uid="00000000-0000-4000-8000-000000000000")
        for name, ref in (("s-owned", owner), ("s-ghost", ghost)):
            s.core.create_namespaced_secret(s.ns, {"metadata": {"name": name, "ownerReferences": [ref]},
                                                   "stringData": {"k": "v"}})
        s.core.delete_namespaced_pod("o1", s.ns, grace_period_seconds=0)

        def gone(name: str) -> bool:
            try:
                s.core.read_namespaced_secret(name, s.ns)
                return False
            except ApiException as exc:
                return exc.status == 404
        return (bool(wait_for(lambda: gone("s-owned"), timeout=60, what=f"{s.name}: the owned Secret gone")),
                bool(wait_for(lambda: gone("s-ghost"), timeout=60, what=f"{s.name}: the orphan Secret gone")))
    assert same(sides, collected) == (True, True)
