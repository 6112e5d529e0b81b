"""Create the pod and its Secret for a routed job: exactly once, within the API budget.

Order: **pod first, then the Secret with an ownerReference to the pod's uid.** Why: a Secret
holds the pilot's credentials and must never outlive its pod; with the owner set at creation,
Kubernetes' garbage collector deletes it with the pod in every failure case (agent crash, pod
deleted out of band). The price is that the pod may briefly wait for its Secret volume
(`ContainerCreating`, or `CreateContainerConfigError` if something reads it early); the status
mapping gives that a grace period, and after a restart the agent re-ensures the Secret of pods
that still wait. The alternative (Secret first, owner patched in later) leaves an ownerless Secret
behind whenever the agent dies between the two calls.

Exactly one pod per attempt (docs/design.md Decision 5): the name comes from the routed ad, so a retry
after a timeout (the server may have created the pod anyway) gets 409 AlreadyExists and adopts
the pod, but only if its annotations name the same source job and owner.

Failures: quota (403 "exceeded quota"), 429, 5xx and network errors are temporary (the job
stays idle and the pod's key comes back on the agent's work queue after its own back-off,
effects.py); other 4xx are the cluster refusing the pod (admission webhooks, policy, invalid
spec) and hold the job.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from ce_k8s.agent import adtext, apiwarnings
from ce_k8s.agent.corecalls import drained
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.status import CREATE_DONE, CREATE_HOLD, CREATE_NONE, CREATE_PENDING, CREATE_RETRY, CreateInfo
from ce_k8s.pods.errors import PodBuildError

if TYPE_CHECKING:
    from ce_k8s.agent.cache import PodCache
    from ce_k8s.agent.corecalls import CoreCalls
    from ce_k8s.agent.deleter import Deleter
    from ce_k8s.agent.effects import Effects
    from ce_k8s.agent.jobs import JobRecord, JobTable
    from ce_k8s.agent.journal import PostJournal
    from ce_k8s.agent.metrics import AgentMetrics
    from ce_k8s.ratelimit import TokenBucket
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)

ANN_GJID = "ce-k8s.htcondor.org/global-job-id"
ANN_OWNER = "ce-k8s.htcondor.org/owner"


class Temporary(Exception):
    """Try again later (quota, throttling, server or network trouble)."""


class Ended(Exception):
    """This attempt's pod existed and is gone: the attempt is over, its pod must not be made again."""


class Permanent(Exception):
    """The cluster refuses; holds the job with `code`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def classify(exc: BaseException, what: str) -> Exception:
    """Map an API failure to Temporary or Permanent (see the module docstring)."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        message = _api_message(exc)
        if status == 403 and "exceeded quota" in message.lower():
            return Temporary(f"{what}: quota exceeded: {message}")
        if status in (400, 403, 404, 405, 413, 422):
            return Permanent("admission-denied", f"{what}: HTTP {status}: {message}")
        return Temporary(f"{what}: HTTP {status}: {message}")
    return Temporary(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")


def _quota_refusal(exc: ApiException) -> bool:
    """A 403 from ResourceQuota admission ("exceeded quota"), which says nothing about existence."""
    return exc.status == 403 and "exceeded quota" in _api_message(exc).lower()


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason or "")[:500]
    except (ValueError, AttributeError):
        return str(exc.body or exc.reason or "")[:500]


class Creator:
    """The create of a routed job's pod and Secret; its turns come from the agent's one work queue
    (effects.py), keyed by pod name, on `CE_K8S_CREATE_CONCURRENCY` workers."""

    def __init__(self, settings: Settings, jobs: JobTable, cache: PodCache, journal: PostJournal,
                 core: CoreV1Api, calls: CoreCalls, bucket: TokenBucket, stop: threading.Event,
                 request_timeout: float, prom: AgentMetrics, metrics: dict[str, int], deleter: Deleter,
                 effects: Effects, seed: Callable[[JobRecord, object, float], None]) -> None:
        self.settings = settings
        self.jobs = jobs
        self.cache = cache
        self.journal = journal
        self.core = core
        self.calls = calls
        self.bucket = bucket
        self.stop = stop
        self.request_timeout = request_timeout
        self.prom = prom
        self.metrics = metrics
        self.deleter = deleter
        self.effects = effects
        # What the new Secret holds, told to the credential refresher (credentials.seed).
        self.seed = seed

    @property
    def queue(self):
        """The effects' WorkQueue (a new one after a stop and start): per-pod back-off of a failed create."""
        return self.effects.queue

    def turn(self, name: str) -> None:
        """A turn of pod `name`: create it if its record still asks for that (queued by an update,
        or a temporary failure's back-off ran out), else nothing."""
        rec = self.jobs.get(name)
        if rec is None or rec.creation.info.state not in (CREATE_PENDING, CREATE_RETRY) or rec.creation.ad_text is None:
            return
        if self.stop.is_set():
            return
        try:
            self.run(rec)
        except Exception as exc:
            log.exception("%s", fields(event="create-crashed", job=rec.reporting.routed_job or "?", pod=rec.pod_name,
                                       error=type(exc).__name__))
            self._retry(rec, "internal error (see the agent log)")

    # -- one job ---------------------------------------------------------------------------------

    def build(self, text: str, owner: str | None = None, caller_uid: int | None = None):
        """Routed ad text → BuiltPod with the sandbox files read; PodBuildError on bad input.

        `owner` is the Owner the request was authorised for (the agent's line scan) and
        `caller_uid` the SO_PEERCRED uid: the full parse must agree on the Owner (a line such as
        `Owner="B"` is skipped by the scan but read by ClassAd), and a pilot account's request
        may only put that account's own files into the Secret (sandbox_io.read_sandbox).
        """
        from ce_k8s.agent.sandbox_io import read_sandbox
        from ce_k8s.pods.builder import build_manifests

        settings = self.settings
        ad, items, pilot_uid = self._plan(text, owner, caller_uid)
        attempt = ad.get_int("K8sAttempt", 0, code="missing-job-id") or 0
        files = read_sandbox(items, settings.spool, settings.secret_max_bytes, owner_uid=pilot_uid)
        return build_manifests(ad, settings, files, attempt=attempt)

    def read_credentials(self, text: str, caller_uid: int | None = None) -> dict[str, bytes]:
        """Only the proxy/token files of the routed ad's sandbox (Secret key -> contents), read with
        exactly the checks of a create (credentials.py refreshes the Secret with them)."""
        from ce_k8s.agent.credentials import CREDENTIAL_ROLES
        from ce_k8s.agent.sandbox_io import read_sandbox

        settings = self.settings
        owner = adtext.unquote(adtext.scan(text, frozenset({"owner"})).get("owner")) or ""
        _ad, items, pilot_uid = self._plan(text, owner, caller_uid)
        items = [item for item in items if item.role in CREDENTIAL_ROLES]
        return read_sandbox(items, settings.spool, settings.secret_max_bytes, owner_uid=pilot_uid)

    def _plan(self, text: str, owner: str | None, caller_uid: int | None):
        """(JobAd, sandbox plan, the pilot uid whose files alone may be read) of a routed ad's text."""
        from ce_k8s.condor import wire
        from ce_k8s.pods.jobad import JobAd
        from ce_k8s.pods.sandbox import sandbox_plan

        try:
            ads = wire.parse_old_ads(text, "<update hook stdin>")
        except ValueError as exc:
            raise PodBuildError("internal-error", f"routed ad does not parse: {exc}") from exc
        if len(ads) != 1:
            raise PodBuildError("internal-error", f"expected one routed ad, got {len(ads)}")
        ad = JobAd(wire.evaluate_ad(ads[0]))
        if owner is not None and (ad.get("Owner") or "") != owner:
            raise PodBuildError("internal-error", "the routed ad names two different Owners")
        items = sandbox_plan(ad, self.settings)
        pilot_uid = caller_uid if caller_uid not in (None, 0, os.geteuid()) else None
        return ad, items, pilot_uid

    def run(self, rec) -> None:
        """Build, create (or adopt) the pod, then its Secret; record the outcome on `rec`."""
        text, rec.creation.ad_text = rec.creation.ad_text, None
        if rec.cleanup.asked_at or text is None:
            rec.creation.info.state = CREATE_DONE if rec.creation.namespace else CREATE_NONE
            self.queue.forget(rec.pod_name)
            return
        job = rec.reporting.routed_job or "?"
        read_at = time.time()
        try:
            built = self.build(text, adtext.unquote(adtext.scan(text).get("owner")) or "", rec.creation.caller_uid)
        except PodBuildError as exc:
            log.warning("%s", fields(event="build-failed", job=job, pod=rec.pod_name, code=exc.code,
                                     error=exc.message))
            rec.creation.info = CreateInfo(CREATE_HOLD, exc.code, {"message": exc.message}, exc.message)
            self.queue.forget(rec.pod_name)
            return
        if built.name != rec.pod_name:
            rec.creation.info = CreateInfo(CREATE_HOLD, "internal-error",
                                    {"message": f"built pod name {built.name} != K8sPodName {rec.pod_name}"})
            return
        rec.creation.namespace = built.namespace
        pod: dict = {}
        try:
            if (rec.creation.check_history and not rec.creation.seen_uid and self.cache.get(built.name) is None
                    and not self.journal.posted(built.name)):    # the journal answers better (create_pod)
                if self.existed_before(built):
                    raise Ended("an Event names an earlier pod of this attempt")
                rec.creation.check_history = False       # looked once: from now on this process is the witness
            pod = self.create_pod(built, job, rec)
            if built.secret is not None:
                self.ensure_secret(built, pod, job, rec)
                self.seed(rec, built, read_at)     # what the Secret now holds (credentials.py)
        except Ended as exc:
            # F1/F3: count the vanished pod as this attempt's one pod; the status mapping moves the
            # job to the next attempt (a tombstone says why; without one, "vanished").
            log.info("%s", fields(event="create-skipped", job=job, pod=rec.pod_name, why=str(exc)))
            self.queue.forget(rec.pod_name)
            rec.creation.failures = 0
            rec.creation.info = CreateInfo(CREATE_DONE)
            return
        except Temporary as exc:
            if rec.creation.ad_text is None:
                rec.creation.ad_text = text          # kept for the retry (unless an update brought a newer one)
            self._retry(rec, str(exc))
            log.info("%s", fields(event="create-delayed", job=job, pod=rec.pod_name, error=str(exc),
                                  attempt=rec.creation.failures, retry_s=round(rec.creation.next_try - time.time(), 1)))
            return
        except Permanent as exc:
            log.warning("%s", fields(event="create-refused", job=job, pod=rec.pod_name, code=exc.code,
                                     error=exc.message))
            rec.creation.info = CreateInfo(CREATE_HOLD, exc.code, {"message": exc.message}, exc.message)
            self.queue.forget(rec.pod_name)
            if exc.code == "secret-create-failed":
                self.deleter.delete_async(_Named(built.name, built.namespace, _uid(pod)), why="hold", job=job)
            return
        self.cache.observe(pod)
        rec.creation.seen_uid = (pod.get("metadata") or {}).get("uid") or rec.creation.seen_uid
        self.queue.forget(rec.pod_name)
        rec.creation.failures = 0
        rec.creation.info = CreateInfo(CREATE_DONE)
        if rec.cleanup.asked_at:        # cleanup arrived while we were creating: undo at once
            # With the uid, a cleanup that already deleted this very pod is seen (deletions.py):
            # the pod is deleted once, and its Secret is not deleted by name after a 404.
            self.deleter.delete_async(_Named(built.name, built.namespace, _uid(pod)), why="cleanup", job=job)

    def _retry(self, rec, message: str) -> None:
        """A temporary failure: the pod's key comes back after its own back-off (and an update poll
        after `next_try` may bring it back with a newer ad)."""
        delay = self.queue.retry(rec.pod_name)
        rec.creation.failures = self.queue.failures(rec.pod_name)
        rec.creation.next_try = time.time() + delay           # before the state: an update reads them in this order
        rec.creation.info = CreateInfo(CREATE_RETRY, message=message)

    def _call(self, what: str, fn, *args, **kwargs):
        """One API call under the QPS budget; failures counted by verb, resource and code (metrics).
        A 409 on create is the normal "exists, adopt" answer, not an error."""
        if not self.bucket.acquire(self.stop):
            raise Temporary("agent stopping")
        try:
            return drained(fn(*args, _preload_content=False, _request_timeout=self.request_timeout, **kwargs))
        except Exception as exc:
            verb, _, resource = what.partition(" ")
            if not (verb == "create" and getattr(exc, "status", None) == 409):
                self.prom.api_error(verb, resource + "s", exc)
            raise

    call = _call     # the credential refresher's Secret patches share the budget and the metrics

    def existed_before(self, built) -> bool:
        """Whether an Event names a pod of this name: it was created before this agent started (F1).

        Why Events: a pod that vanished while no agent watched leaves no tombstone and no
        K8sPodUid, but the scheduler's and kubelet's Events about it stay for an hour. A 403 (the
        Role lacks `events: list`) falls back to creating, as before; other failures retry later.
        """
        core: CoreV1Api = self.core
        try:
            resp = self._call("list event", core.list_namespaced_event, built.namespace,
                              field_selector=f"involvedObject.kind=Pod,involvedObject.name={built.name}", limit=1)
        except ApiException as exc:
            if exc.status == 403:
                log.warning("%s", fields(event="history-unknown", pod=built.name, error="events: list forbidden"))
                return False
            raise classify(exc, "list events") from exc
        except (Temporary, Permanent):
            raise
        except Exception as exc:
            raise Temporary(f"list events: {type(exc).__name__}: {str(exc)[:300]}") from exc
        return bool(json.loads(resp.data).get("items"))

    def _ended(self, rec, name: str) -> bool:
        """Whether this attempt's pod was seen and is gone now (tombstone, or a uid with no live pod)."""
        cache = self.cache
        seen = bool(rec is not None and rec.creation.seen_uid)
        return cache.get_gone(name) is not None or (seen and cache.get(name) is None)

    def create_pod(self, built, job: str = "?", rec=None) -> dict:
        """Create the pod, or adopt an existing one that is provably the same job's.

        A re-run (an earlier try failed, maybe after the server applied it, or the pod was seen)
        first probes with a dry-run create: AlreadyExists → adopt; absent and seen before → `Ended`
        (F3: a second POST could land after an eviction and bring the ended attempt back). Right
        before every real POST the cache is checked once more for a tombstone of the name.
        """
        name = built.name
        journal = self.journal
        posted = journal.posted(name)
        if posted or (rec is not None and (rec.creation.failures or rec.creation.seen_uid
                                           or self.cache.get(name) is not None
                                           or self.cache.get_gone(name) is not None)):
            try:
                self._call("create pod", self.calls.create_namespaced_pod, built.namespace, built.pod,
                           dry_run="All")
            except ApiException as exc:
                if exc.status == 409:
                    return self._adopt(built, job)
                if not _quota_refusal(exc):
                    raise classify(exc, "create pod (dry run)") from exc
                # A real API server runs ResourceQuota admission before its AlreadyExists check,
                # dry runs included: at a full quota the probe answers 403 whether the pod exists
                # or not (finding 1 of docs/real-kubernetes.md). Ask for the pod itself instead.
                if self._exists(built):
                    return self._adopt(built, job)
            except (Temporary, Permanent):
                raise
            except Exception as exc:
                raise classify(exc, "create pod (dry run)") from exc
            if self._ended(rec, name):
                raise Ended("the pod of this attempt was seen and is gone")
            if posted:
                # A create of this name was sent (by this process or one before a restart) and not
                # refused, and no pod of the name exists now: it was made and has gone, or the
                # request was lost on the way. Counting it as the attempt's pod is the safe side
                # (journal.py; docs/reliability.md, F1).
                raise Ended("a create of this pod was sent before and the pod is gone")
            if rec is not None and rec.creation.failures and self.existed_before(built):
                # An earlier POST may have been applied while its answer was lost, and the pod
                # evicted and deleted while the watch was cut (a relist leaves no tombstone):
                # its Events outlive it (docs/reliability.md, F3).
                raise Ended("an Event names an earlier pod of this attempt")
        if self._ended(rec, name):
            raise Ended("the pod of this attempt was seen and is gone")
        journal.record_post(name)      # before the request leaves: a SIGKILL after it must not forget
        try:
            t0 = time.monotonic()
            resp = self._call("create pod", self.calls.create_namespaced_pod, built.namespace, built.pod)
            self.prom.create_seconds.observe(time.monotonic() - t0)
            self.prom.pods_created.inc()
            self.metrics["creates"] += 1
            log.info("%s", fields(event="pod-created", job=job, pod=built.name, namespace=built.namespace))
            self.note_warnings(resp, "pods", built.name, built.namespace, job, rec)
            return json.loads(resp.data)
        except ApiException as exc:
            if exc.status != 409:
                if exc.status and exc.status != 504:
                    journal.record_refused(name)     # an error answer: nothing was stored
                raise classify(exc, "create pod") from exc
        except (Temporary, Permanent):
            journal.record_refused(name)             # the QPS bucket refused: nothing was sent
            raise
        except Exception as exc:      # timeouts: the server may have created it; the retry will tell
            raise classify(exc, "create pod") from exc
        return self._adopt(built, job)

    def _exists(self, built) -> bool:
        """Whether a pod of the built name exists now (a GET; 404 is no)."""
        try:
            self._call("get pod", self.core.read_namespaced_pod, built.name, built.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise classify(exc, "read existing pod") from exc
        except (Temporary, Permanent):
            raise
        except Exception as exc:
            raise classify(exc, "read existing pod") from exc
        return True

    def _adopt(self, built, job: str) -> dict:
        """The existing pod (after AlreadyExists), if its annotations name this job and owner."""
        core = self.core
        try:
            existing = json.loads(self._call("get pod", core.read_namespaced_pod, built.name, built.namespace).data)
        except ApiException as exc:
            if exc.status == 404:      # it existed a moment ago (409) and is gone: the attempt ended
                raise Ended("the pod existed (AlreadyExists) and vanished before it was read") from exc
            raise classify(exc, "read existing pod") from exc
        except (Temporary, Permanent):
            raise
        except Exception as exc:
            raise classify(exc, "read existing pod") from exc
        want = built.pod["metadata"].get("annotations") or {}
        have = (existing.get("metadata") or {}).get("annotations") or {}
        for key in (ANN_GJID, ANN_OWNER):
            if want.get(key) != have.get(key):
                raise Permanent("admission-denied", f"pod {built.name} already exists for another job or "
                                                    f"owner ({key} differs); not touched")
        self.metrics["adopted"] += 1
        self.prom.pods_adopted.inc()
        log.info("%s", fields(event="pod-adopted", job=job, pod=built.name, namespace=built.namespace))
        return existing

    def note_warnings(self, resp, resource: str, pod: str, namespace: str, job: str = "?", rec=None) -> None:
        """Log, count and remember the API server's `Warning` headers on a write for `pod`
        (ce_k8s.agent.apiwarnings): each text once per pod (its JobRecord), never a hold.

        `rec` keeps the notes the update replies add to `K8sPodReason` (update.with_warnings);
        without one (a test's direct call) the warnings are only logged and counted.
        """
        try:
            warnings = apiwarnings.of_response(resp)
        except Exception as exc:       # a header we cannot read must not fail a write that succeeded
            log.warning("%s", fields(event="api-warning", job=job, pod=pod, namespace=namespace, resource=resource,
                                     kind="unreadable", error=f"{type(exc).__name__}: {str(exc)[:200]}"))
            return
        for w in warnings:
            if rec is not None:
                notes = rec.warnings
                if w.text in notes.texts:
                    continue
                rec.warnings = notes = dataclasses.replace(notes, texts=(*notes.texts, w.text))
            kind = w.kind
            effect = apiwarnings.KINDS[kind]
            self.prom.api_warnings.labels(resource, kind).inc()
            log.warning("%s", fields(event="api-warning", job=job, pod=pod, namespace=namespace, resource=resource,
                                     kind=kind, effect=effect, text=w.text))
            if rec is not None and effect == apiwarnings.PLACEMENT:
                rec.warnings = dataclasses.replace(notes, pending=apiwarnings.join(notes.pending, w.text))
            elif rec is not None and effect == apiwarnings.IGNORED:
                rec.warnings = dataclasses.replace(notes, always=apiwarnings.join(notes.always, w.text))

    def ensure_secret(self, built, pod: dict, job: str = "?", rec=None) -> None:
        """Create the Secret owned by `pod`; if it exists, make its data and owner ours."""
        from ce_k8s.pods.builder import owner_reference

        core = self.core
        uid = (pod.get("metadata") or {}).get("uid") or ""
        secret = dict(built.secret)
        meta = dict(secret.get("metadata") or {})
        if uid:
            meta["ownerReferences"] = [owner_reference(built.name, uid)]
        secret["metadata"] = meta
        try:
            resp = self._call("create secret", self.calls.create_namespaced_secret, built.namespace, secret)
            self.note_warnings(resp, "secrets", built.name, built.namespace, job, rec)
            return
        except ApiException as exc:
            if exc.status != 409:
                err = classify(exc, "create secret")
                if isinstance(err, Permanent):
                    raise Permanent("secret-create-failed", err.message) from exc
                raise err from exc
        except (Temporary, Permanent):
            raise
        except Exception as exc:
            raise classify(exc, "create secret") from exc
        patch = {"metadata": {"ownerReferences": meta.get("ownerReferences") or []}, "data": secret.get("data") or {}}
        try:
            resp = self._call("patch secret", core.patch_namespaced_secret, meta["name"], built.namespace, patch)
        except Exception as exc:
            err = classify(exc, "patch secret")
            if isinstance(err, Permanent):
                raise Permanent("secret-create-failed", err.message) from exc
            raise err from exc
        self.note_warnings(resp, "secrets", built.name, built.namespace, job, rec)


@dataclasses.dataclass(frozen=True)
class _Named:
    """Just enough of a PodInfo for Deleter.delete_async."""

    name: str
    namespace: str
    uid: str = ""                    # from the create (or adoption) reply; "" when unknown
    secrets: tuple[str, ...] = ()
    deleting: bool = False


def _uid(pod: dict) -> str:
    """The uid of a pod object the API returned ("" for none)."""
    return (pod.get("metadata") or {}).get("uid") or ""
