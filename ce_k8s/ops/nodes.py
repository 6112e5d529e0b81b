"""`ce-k8s nodes reclaim NODE` / `ce-k8s nodes release NODE`: hand a node to an HPC scheduler and back.

    ce-k8s nodes reclaim NODE [--grace S] [--evict-timeout S] [--all-pods] [--kubeconfig F] [--config PATH]
    ce-k8s nodes release NODE [--force] [--kubeconfig F] [--config PATH]

Why: sites that share nodes between Slurm and Kubernetes hand a node over in Slurm's
`PrologSlurmctld` and take it back in `EpilogSlurmctld` (Ryax's BeBiDa scheme; docs/operations.md).
Their failure mode is that pods vanish under the pilots; here the hand-over is orderly instead:

1. **cordon** (`spec.unschedulable`), so no new pod lands there; the information provider stops
   counting the node at once (`ce_k8s.info.capacity.node_is_schedulable`);
2. pilots bound to the node that have **not started** are evicted at once (they lose nothing and
   can start elsewhere sooner);
3. **running** pilots get `--grace` seconds to finish;
4. the rest are **evicted through the Eviction API**: the API server sets the pod's
   `DisruptionTarget` condition, which the agent maps to a new attempt (JobStatus idle,
   `GridJobStatus = PENDING`, next pod name), not to a failure (Kubernetes "Pod disruption conditions"; docs/holds.md);
5. it waits (`--evict-timeout`) until no pilot pod is left on the node.

Both commands are idempotent and bounded in time, print one line per action (Slurm scripts send
it to syslog), and exit with a documented code (`EXIT_*`, docs/operations.md). `reclaim` marks the
node with an annotation; `release` uncordons only nodes that carry it, so a node an admin cordoned
for maintenance is not put back into service by a Slurm job ending (`--force` overrides).

The credentials are not the agent's: this runs on the Slurm controller with a kubeconfig whose
identity may patch nodes and evict pods (containers/slurm/rbac.yaml grants exactly that).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ce_k8s.ops.status import kubeconfig_from, load_config_and_settings, new_api_client, short

log = logging.getLogger(__name__)

EXIT_OK = 0           # reclaim: cordoned and no pilot left on the node; release: schedulable (or left cordoned)
EXIT_ERROR = 1        # an API call failed (credentials, network, permissions)
EXIT_USAGE = 2        # bad arguments or configuration
EXIT_TIMEOUT = 3      # reclaim: cordoned, but pilot pods were still on the node when the time ran out
EXIT_NO_NODE = 4      # no such Kubernetes node (a Slurm-only node): nothing to do

ANN_RECLAIMED = "ce-k8s.htcondor.org/reclaimed"
PILOT_SELECTOR = "app.kubernetes.io/managed-by=ce-k8s"
FINISHED = ("Succeeded", "Failed")
REQUEST_TIMEOUT = 10.0
PATCH_ATTEMPTS = 3


class NodeError(Exception):
    """An API failure that ends the command with EXIT_ERROR."""


@dataclass
class Options:
    """What one run does (parsed arguments, kept apart from argparse for tests)."""

    node: str
    grace: float = 300.0
    evict_timeout: float = 120.0
    poll: float = 2.0
    all_pods: bool = False
    force: bool = False


class NodeHandover:
    """The API calls of reclaim/release; `say` receives one line per action."""

    def __init__(self, api_client, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.say = say
        self.clock = clock
        self.sleep = sleep

    # -- node ------------------------------------------------------------------------------------

    def read_node(self, name: str) -> dict | None:
        """The node as JSON, or None if it does not exist."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.core.read_node(name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise NodeError(f"reading node {name}: HTTP {exc.status} {exc.reason}") from None
        except Exception as exc:
            raise NodeError(f"reading node {name}: {short(exc)}") from None
        return json.loads(resp.data)

    def patch_node(self, name: str, body: dict) -> bool:
        """Merge-patch the node; False on a resourceVersion conflict (someone else changed it)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.patch_node(name, body, _content_type="application/merge-patch+json",
                                 _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise NodeError(f"patching node {name}: HTTP {exc.status} {exc.reason}") from None
        except Exception as exc:
            raise NodeError(f"patching node {name}: {short(exc)}") from None
        return True

    def cordon(self, name: str) -> int | None:
        """Cordon and mark the node; None if it does not exist, else EXIT_OK. Idempotent."""
        for _ in range(PATCH_ATTEMPTS):
            node = self.read_node(name)
            if node is None:
                return None
            meta = node.get("metadata") or {}
            marked = (meta.get("annotations") or {}).get(ANN_RECLAIMED)
            if (node.get("spec") or {}).get("unschedulable"):
                if marked:
                    self.say(f"node {name}: already cordoned by ce-k8s (since {marked})")
                else:
                    self.say(f"node {name}: already cordoned by someone else; 'release' will leave it cordoned")
                return EXIT_OK
            stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            body = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                 "annotations": {ANN_RECLAIMED: stamp}},
                    "spec": {"unschedulable": True}}
            if self.patch_node(name, body):
                self.say(f"node {name}: cordoned")
                return EXIT_OK
        raise NodeError(f"node {name} kept changing while cordoning it; try again")

    def uncordon(self, name: str, force: bool) -> int:
        """Uncordon a node ce-k8s cordoned (or any, with force). Idempotent."""
        for _ in range(PATCH_ATTEMPTS):
            node = self.read_node(name)
            if node is None:
                self.say(f"node {name}: not a Kubernetes node; nothing to do")
                return EXIT_NO_NODE
            meta = node.get("metadata") or {}
            marked = (meta.get("annotations") or {}).get(ANN_RECLAIMED)
            cordoned = bool((node.get("spec") or {}).get("unschedulable"))
            if not cordoned and not marked:
                self.say(f"node {name}: already schedulable")
                return EXIT_OK
            if cordoned and not marked and not force:
                self.say(f"node {name}: cordoned, but not by ce-k8s; left cordoned (use --force to uncordon)")
                return EXIT_OK
            body = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {ANN_RECLAIMED: None}},
                    "spec": {"unschedulable": None}}
            if self.patch_node(name, body):
                self.say(f"node {name}: uncordoned" if cordoned else f"node {name}: reclaim mark removed")
                return EXIT_OK
        raise NodeError(f"node {name} kept changing while uncordoning it; try again")

    # -- pods --------------------------------------------------------------------------------------

    def pods_on(self, name: str, all_pods: bool) -> list[dict]:
        """Unfinished pods bound to the node: our pilots, or (all_pods) everything a drain would evict."""
        kwargs: dict[str, Any] = {"field_selector": f"spec.nodeName={name}", "_preload_content": False,
                                  "_request_timeout": REQUEST_TIMEOUT}
        if not all_pods:
            kwargs["label_selector"] = PILOT_SELECTOR
        try:
            resp = self.core.list_pod_for_all_namespaces(**kwargs)
        except Exception as exc:
            raise NodeError(f"listing pods on node {name}: {short(exc)}") from None
        pods = []
        for pod in json.loads(resp.data).get("items") or ():
            if (pod.get("status") or {}).get("phase") in FINISHED:
                continue
            if all_pods and not evictable(pod):
                continue
            pods.append(pod)
        return pods

    def evict(self, pod: dict, why: str) -> bool:
        """POST pods/eviction; True when the pod is going (or gone), False when refused for now."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace") or "", meta.get("name") or ""
        body = client.V1Eviction(api_version="policy/v1", kind="Eviction",
                                 metadata=client.V1ObjectMeta(name=name, namespace=ns))
        try:
            self.core.create_namespaced_pod_eviction(name, ns, body, _preload_content=False,
                                                     _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return True
            if exc.status in (429, 500, 503):   # a PodDisruptionBudget says not now (429), or overload
                self.say(f"pod {ns}/{name}: eviction refused for now (HTTP {exc.status}); will retry")
                return False
            raise NodeError(f"evicting pod {ns}/{name}: HTTP {exc.status} {exc.reason}") from None
        except Exception as exc:
            raise NodeError(f"evicting pod {ns}/{name}: {short(exc)}") from None
        self.say(f"pod {ns}/{name}: evicted ({why})")
        return True

    def reclaim(self, opt: Options) -> int:
        """Cordon, evict what has not started, let running pods finish for `grace`, evict the rest, wait."""
        start = self.clock()
        result = self.cordon(opt.node)
        if result is None:
            self.say(f"node {opt.node}: not a Kubernetes node; nothing to do")
            return EXIT_NO_NODE
        grace_end = start + max(opt.grace, 0.0)
        end = grace_end + max(opt.evict_timeout, 0.0)
        evicted: set[str] = set()
        announced = False
        rounds = 0
        while True:
            pods = self.pods_on(opt.node, opt.all_pods)
            now = self.clock()
            for pod in pods:
                meta = pod.get("metadata") or {}
                uid = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
                if uid in evicted or meta.get("deletionTimestamp"):
                    continue
                started = (pod.get("status") or {}).get("phase") == "Running"
                if not started:
                    if self.evict(pod, "not started yet"):
                        evicted.add(uid)
                elif now >= grace_end:
                    if self.evict(pod, f"grace period of {opt.grace:g}s over"):
                        evicted.add(uid)
            if not pods:
                self.say(f"node {opt.node}: no {'pods' if opt.all_pods else 'pilot pods'} left; "
                         f"handed over after {now - start:.0f}s")
                return EXIT_OK
            if now >= end:
                names = ", ".join(sorted(f"{(p.get('metadata') or {}).get('namespace')}/"
                                         f"{(p.get('metadata') or {}).get('name')}" for p in pods)[:5])
                self.say(f"node {opt.node}: {len(pods)} pod(s) still on the node after {now - start:.0f}s: {names}")
                return EXIT_TIMEOUT
            if not announced and now < grace_end:
                running = sum((p.get("status") or {}).get("phase") == "Running" for p in pods)
                if running:
                    self.say(f"node {opt.node}: waiting up to {grace_end - now:.0f}s for {running} running "
                             "pilot(s) to finish")
                announced = True
            # Quick first looks (evicted pods usually leave within a second), then every --poll seconds.
            rounds += 1
            interval = min(opt.poll, 0.1 * 2 ** min(rounds, 10))
            self.sleep(max(min(interval, (grace_end if now < grace_end else end) - now), 0.05))


def evictable(pod: dict) -> bool:
    """What `kubectl drain --ignore-daemonsets` evicts: not a mirror (static) pod, not a DaemonSet's."""
    meta = pod.get("metadata") or {}
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return not any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or ())


# --------------------------------------------------------------------------------------------
# Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", metavar="NODE", help="the Kubernetes node name (Slurm's node name)")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig of an identity that may patch nodes and evict pods "
                             "(default: CE_K8S_KUBECONFIG from --config or the environment, else in-cluster)")
    parser.add_argument("--config", metavar="PATH", help="a condor_config to read CE_K8S_KUBECONFIG from")
    # One module serves both commands; the dispatcher names the parser "ce-k8s nodes <command>".
    if not getattr(parser, "prog", "").endswith(" release"):
        parser.add_argument("--grace", type=float, default=300.0, metavar="S",
                            help="seconds running pilots may keep running before they are evicted (default 300)")
        parser.add_argument("--evict-timeout", type=float, default=120.0, metavar="S",
                            help="seconds to wait after the grace period for evicted pods to leave (default 120)")
        parser.add_argument("--poll", type=float, default=2.0, metavar="S", help="seconds between checks (default 2)")
        parser.add_argument("--all-pods", action="store_true",
                            help="evict every pod a drain would (not only ce-k8s pilots); DaemonSets stay")
    else:
        parser.add_argument("--force", action="store_true",
                            help="uncordon even if the node was not cordoned by 'ce-k8s nodes reclaim'")


def _say(command: str) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"ce-k8s nodes {command}: {line}", flush=True)
        log.info("%s: %s", command, line)
    return say


def run(args: argparse.Namespace) -> int:
    command = args.command_words[-1] if getattr(args, "command_words", None) else "reclaim"
    say = _say(command)
    if command == "reclaim" and (args.grace < 0 or args.evict_timeout < 0 or not args.poll > 0):
        print("ce-k8s nodes reclaim: --grace and --evict-timeout must be >= 0, --poll > 0", file=sys.stderr)
        return EXIT_USAGE
    settings = None
    if args.config:
        from ce_k8s.condor.config import ConfigError

        try:
            _cfg, settings = load_config_and_settings(args.config)
        except (ConfigError, OSError) as exc:
            print(f"ce-k8s nodes {command}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    kubeconfig = kubeconfig_from(args.kubeconfig, settings)
    try:
        api_client = new_api_client(kubeconfig)
    except Exception as exc:
        say(f"node {args.node}: no Kubernetes credentials ({kubeconfig or 'in-cluster'}): {short(exc)}")
        return EXIT_ERROR
    try:
        handover = NodeHandover(api_client, say)
        if command == "release":
            return handover.uncordon(args.node, args.force)
        return handover.reclaim(Options(node=args.node, grace=args.grace, evict_timeout=args.evict_timeout,
                                        poll=args.poll, all_pods=args.all_pods))
    except NodeError as exc:
        say(f"node {args.node}: {exc}")
        return EXIT_ERROR
    finally:
        api_client.close()
