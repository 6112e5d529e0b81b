"""`ce-k8s htcjob-operator`: one watch on HTCJobs, a keyed work queue, a few workers (3 by default).

The shape of client-go's sample-controller: the watch says *which* resource changed (its key goes
into the queue) and keeps a copy of every resource (ce_k8s.htcjob.cache, the lister); a worker
runs one reconcile pass (ce_k8s.htcjob.reconcile) on the copy, and the pass says when it wants to
run again (the schedd does not push, so an active HTCJob is looked at every `--poll` seconds). A
pass reads the API server only where the copy cannot do: a key the copy lacks, the pass after a
failed or conflicting one, and before a submit (reconcile: a stale read acts on nothing). The
queue is the one the agent's effects use (ce_k8s.workqueue): a key waits at most once, at its
earliest due time, and a pass that failed comes back after that key's own back-off. Our own
writes come back as watch events; those that change neither generation, finalizers nor deletion
are not queued (the pass already saw that state), nor is our own finalizer patch (the pass that
made it went on with the version it answered).

Several workers, as sample-controller runs two and kube-controller-manager several syncs per
controller: a pass spends most of its time waiting for the API server, and another worker overlaps
that wait with another HTCJob's pass (bench/bench_htcjob.py: 1, 2 and 3 workers measured,
docs/performance.md; 3 was the first under 1.5× the bare writes in every run). The queue hands a
key to one worker at a time, so one HTCJob's passes never run side by side; the schedd calls are
serialised by ce_k8s.htcjob.schedd's lock (the bindings' configuration is process-wide); what the
workers share here (the schedd clients, the counters, the watch's fingerprints) is behind `_lock`.

Why not kopf: kopf brings its own API client and keeps handler progress in annotations; here the
state is the resource and the schedd only, each pass is idempotent and decides from both, and
the official client talks to the API server as the rest of ce-k8s does. What kopf would add
(a watch, a queue, retries, finalizers) is the ~150 lines below.

Run exactly one replica (the Deployment says `replicas: 1`, `strategy: Recreate`): two operators
would both be safe from double submits only as far as the uid lookup races (docs/htcjob.md).
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ce_k8s.htcjob.cache import ObjectCache, key_of
from ce_k8s.htcjob.reconcile import (
    FINALIZER,
    GROUP,
    PLURAL,
    VERSION,
    Conflict,
    Context,
    TargetError,
    is_settled,
    reconcile,
)
from ce_k8s.htcjob.schedd import HTCondorSchedd, Schedd
from ce_k8s.htcjob.spec import Target
from ce_k8s.workqueue import WorkQueue

log = logging.getLogger(__name__)

RETRY_BASE_S = 5.0


class Kube:
    """The operator's Kubernetes calls (every one is granted in containers/k8s/htcjob/rbac.yaml)."""

    def __init__(self, api_client) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    @staticmethod
    def _conditional(call) -> dict[str, Any]:
        # resourceVersion in a merge patch makes it conditional (the status subresource's too): a
        # 409 means the resource moved on since that version was read.
        from kubernetes.client.exceptions import ApiException

        try:
            return call()
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"resourceVersion conflict: {exc.reason}") from exc
            raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any],
                     resource_version: str) -> dict[str, Any]:
        return self._conditional(lambda: self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name,
            {"metadata": {"resourceVersion": resource_version}, "status": status}))

    def set_finalizers(self, namespace: str, name: str, finalizers: list[str],
                       resource_version: str) -> dict[str, Any]:
        return self._conditional(lambda: self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name,
            {"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}}))

    def read_data(self, kind: str, namespace: str, name: str) -> dict[str, bytes]:
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "secret":
                obj = self.core.read_namespaced_secret(name, namespace)
                return {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
            obj = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise KeyError(name) from exc
            raise
        data = {k: v.encode() for k, v in (obj.data or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (obj.binary_data or {}).items()})
        return data

    def put_output(self, namespace: str, name: str, owner: dict[str, Any], data: dict[str, str],
                   binary: dict[str, str]) -> None:
        """Create the output ConfigMap, owned by the HTCJob (deleted with it); replace our own."""
        from kubernetes.client.exceptions import ApiException

        from ce_k8s.htcjob.output import OutputError

        meta = owner["metadata"]
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/managed-by": "ce-k8s-htcjob-operator",
                                        "ce-k8s.io/htcjob": meta["name"]},
                             "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "HTCJob",
                                                  "name": meta["name"], "uid": meta["uid"],
                                                  "controller": True}]},
                "data": data, "binaryData": binary or None}
        try:
            self.core.create_namespaced_config_map(namespace, body)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = self.core.read_namespaced_config_map(name, namespace)
        owners = [r.uid for r in (existing.metadata.owner_references or [])]
        if meta["uid"] not in owners:
            raise OutputError(f"ConfigMap {namespace}/{name} exists and is not this HTCJob's; output not written")
        body["metadata"]["resourceVersion"] = existing.metadata.resource_version
        self.core.replace_namespaced_config_map(name, namespace, body)


class Operator:
    """The watch, the queue and the worker."""

    def __init__(self, api_client, *, namespace: str | None, default_target: Target,
                 default_token: str | None, work_root: Path, claims_root: Path, poll: float,
                 upload_grace: float = 60.0, schedd_factory=None, workers: int = 3) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.kube = Kube(api_client)
        self.workers = workers
        self._lock = threading.Lock()
        self.namespace = namespace
        self.default_target = default_target
        self.default_token = default_token
        # A failed pass comes back after 2.5-5 s, then twice that, up to 5 minutes (per HTCJob).
        self.queue: WorkQueue[str] = WorkQueue(base=RETRY_BASE_S, cap=300.0)
        self.stop = threading.Event()
        self._seen: dict[str, tuple] = {}
        self.cache = ObjectCache()
        self._reread: set[str] = set()    # keys whose next pass reads the API server (behind _lock)
        self._schedds: dict[tuple, Schedd] = {}
        # (collector, schedd name, token) → Schedd; tests hand in a fake beside the real one.
        self.schedd_factory = schedd_factory or (
            lambda collector, name, token: HTCondorSchedd(collector, name, token, work_root / ".tokens"))
        self.passes = 0
        self.reads = 0                    # GETs of an HTCJob by work_once (the bench reports them)
        work_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.ctx = Context(kube=self.kube, schedd_for=self.schedd_for, work_root=work_root,
                           claims_root=claims_root, clock=time.time, poll=poll, upload_grace=upload_grace,
                           remember=self._remember)

    # ------------------------------------------------------------------ schedds
    def schedd_for(self, target: Target, namespace: str) -> Schedd:
        if target.remote:
            try:
                token = self.kube.read_data("secret", namespace, target.token_secret or "")
            except KeyError as exc:
                raise TargetError(f"token Secret {target.token_secret!r} not found in namespace {namespace}") from exc
            if target.token_key not in token:
                raise TargetError(f"token Secret {target.token_secret!r} has no key {target.token_key!r}")
            key = (target.collector, target.schedd, token[target.token_key].decode().strip())
        else:
            key = (self.default_target.collector, target.schedd or self.default_target.schedd, self.default_token)
        with self._lock:
            if key not in self._schedds:
                self._schedds[key] = self.schedd_factory(*key)
            return self._schedds[key]

    # ------------------------------------------------------------------ watch
    def _list_call(self, **kw):
        if self.namespace:
            return self.kube.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, **kw)
        return self.kube.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw)

    @staticmethod
    def _fingerprint(meta: dict[str, Any]) -> tuple:
        return (meta.get("uid"), meta.get("generation"), tuple(meta.get("finalizers") or ()),
                bool(meta.get("deletionTimestamp")))

    def _remember(self, obj: dict[str, Any]) -> None:
        """A version a pass wrote (or read): into the copy. If it differs from the last one queued for
        by our finalizer alone, its watch event is no news: the pass that patched it went on."""
        key = key_of(obj)
        if not self.cache.put(obj, known_only=True):
            return
        new = self._fingerprint(obj["metadata"])
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and (seen[0], seen[1], seen[3]) == (new[0], new[1], new[3]) \
                    and set(seen[2]) ^ set(new[2]) <= {FINALIZER}:
                self._seen[key] = new

    def _note(self, obj: dict[str, Any], event: str) -> None:
        meta = obj["metadata"]
        key = key_of(obj)
        if event == "DELETED":
            with self._lock:
                self._seen.pop(key, None)
            self.cache.drop(key)
            return
        self.cache.put(obj)
        fingerprint = self._fingerprint(meta)
        with self._lock:
            news = self._seen.get(key) != fingerprint
            self._seen[key] = fingerprint
        if news and not is_settled(obj):      # a resource being deleted is never settled
            self.queue.add(key)

    def watch(self) -> None:
        """List, then watch from the list's resourceVersion; relist after a 410 or a broken stream."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        version = None
        while not self.stop.is_set():
            try:
                if version is None:
                    listed = self._list_call()
                    for obj in listed.get("items", []):
                        self._note(obj, "ADDED")
                    for key in self.cache.keep_only({key_of(o) for o in listed.get("items", [])}):
                        with self._lock:
                            self._seen.pop(key, None)    # deleted while the watch was down
                    version = listed["metadata"]["resourceVersion"]
                    log.info("htcjob-operator: listed %d HTCJob(s)", len(listed.get("items", [])))
                w = watch.Watch()
                for event in w.stream(self._list_call, resource_version=version, timeout_seconds=30,
                                      allow_watch_bookmarks=True):
                    if self.stop.is_set():
                        w.stop()
                        break
                    obj = event["object"]
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._note(obj, event["type"])
            except ApiException as exc:
                if exc.status == 410:
                    version = None
                    continue
                log.warning("htcjob-operator: watch failed (%s); retrying", exc.status)
                self.stop.wait(2)
            except Exception as exc:     # a broken connection: resume from the last version
                log.warning("htcjob-operator: watch interrupted (%s); resuming", exc)
                self.stop.wait(1)

    # ------------------------------------------------------------------ work
    def _read(self, key: str) -> tuple[dict[str, Any] | None, bool]:
        """The resource a pass starts from, and whether it was read from the API server just now:
        the watch copy, unless the copy lacks it or the key's last pass failed or conflicted."""
        with self._lock:
            reread = key in self._reread
        obj = None if reread else self.cache.get(key)
        if obj is not None:
            return obj, False
        namespace, name = key.split("/", 1)
        with self._lock:
            self.reads += 1
        obj = self.kube.get(namespace, name)
        with self._lock:
            self._reread.discard(key)
        if obj is None:
            self.cache.drop(key)
        else:
            self.cache.put(obj)
        return obj, True

    def work_once(self, key: str) -> None:
        """One pass over the HTCJob `key` (namespace/name), then its next turn in the queue: when the
        pass asks for one, soon after a conflict, after the key's own back-off after a failure. The
        pass after a conflict or a failure reads the resource from the API server."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            self.passes += 1
        try:
            obj, fresh = self._read(key)
            delay = None if obj is None else reconcile(obj, self.ctx, fresh=fresh)
        except (Conflict, ApiException) as exc:
            self._reread_next(key)
            if isinstance(exc, Conflict) or exc.status == 409:    # a conflict: read again soon
                self.queue.add(key, 0.5)
                return
            log.warning("htcjob %s: API error %s; again in %.0f s", key, exc.status, self.queue.retry(key))
            return
        except Exception:
            self._reread_next(key)
            log.exception("htcjob %s: pass failed; again in %.0f s", key, self.queue.retry(key))
            return
        self.queue.forget(key)
        if delay is not None:
            self.queue.add(key, delay)

    def _reread_next(self, key: str) -> None:
        with self._lock:
            self._reread.add(key)

    def work(self) -> None:
        """One worker: take a key, run its pass, hand the key back; until `stop`."""
        while not self.stop.is_set():
            key = self.queue.get(self.stop)
            if key is not None:
                try:
                    self.work_once(key)
                finally:
                    self.queue.done(key)

    def start_workers(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.work, name=f"htcjob-worker-{i}", daemon=True)
                   for i in range(self.workers)]
        for thread in threads:
            thread.start()
        return threads

    def run(self) -> None:
        watcher = threading.Thread(target=self.watch, name="htcjob-watch", daemon=True)
        watcher.start()
        log.info("htcjob-operator: started (namespace %s, default schedd %s in %s, %d workers)",
                 self.namespace or "all", self.default_target.schedd or "local",
                 self.default_target.collector or "the local pool", self.workers)
        for thread in self.start_workers():
            thread.join()
        watcher.join(timeout=5)
        log.info("htcjob-operator: stopped")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--kubeconfig", default=env("CE_K8S_HTCJOB_KUBECONFIG"),
                        help="kubeconfig (default: in-cluster account, then ~/.kube/config)")
    parser.add_argument("--namespace", default=env("CE_K8S_HTCJOB_NAMESPACE"),
                        help="watch one namespace (default: all)")
    parser.add_argument("--collector", default=env("CE_K8S_HTCJOB_COLLECTOR"),
                        help="the site's collector, host[:port] (default: the local HTCondor configuration's)")
    parser.add_argument("--schedd", default=env("CE_K8S_HTCJOB_SCHEDD"),
                        help="the site's schedd by Name (default: the pool's local schedd)")
    parser.add_argument("--token-file", default=env("CE_K8S_HTCJOB_TOKEN_FILE"),
                        help="an IDTOKEN for the site's schedd (a mounted Secret)")
    parser.add_argument("--work-dir", default=env("CE_K8S_HTCJOB_WORK_DIR", "/var/lib/ce-k8s-htcjob"),
                        help="where inputs are staged and output is retrieved (an emptyDir)")
    parser.add_argument("--claims-root", default=env("CE_K8S_HTCJOB_CLAIMS_ROOT", "/claims"),
                        help="where the site mounts the PVCs output may go to, one directory per claim")
    parser.add_argument("--poll", type=float, default=float(env("CE_K8S_HTCJOB_POLL", "10")),
                        help="seconds between looks at an active HTCJob's jobs (default 10)")
    parser.add_argument("--upload-grace", type=float, default=60.0,
                        help="age after which a cluster still waiting for its input is resubmitted (s)")
    parser.add_argument("--workers", type=int, default=int(env("CE_K8S_HTCJOB_WORKERS", "3")),
                        help="passes run side by side, each on a different HTCJob (default 3)")


def run(args: argparse.Namespace) -> int:
    from ce_k8s.kubeclient import new_api_client

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    op = Operator(new_api_client(args.kubeconfig), namespace=args.namespace,
                  default_target=Target(schedd=args.schedd, collector=args.collector), default_token=token,
                  work_root=Path(args.work_dir), claims_root=Path(args.claims_root), poll=args.poll,
                  upload_grace=args.upload_grace, workers=args.workers)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: op.stop.set())
    op.run()
    return 0
