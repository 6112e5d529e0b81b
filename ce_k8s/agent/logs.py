"""The `logs` verb and the reading of a pod's log through the API server.

Why here, apart from the saving (outputsave.py): the finalize hook's `logs` request is answered
from the saved output when there is one, else from the live pod's log; both that request and the
save of a finished pod's log read the log the same way, with `stream=Stdout|Stderr` when the API
server splits the streams (Kubernetes >= 1.32 with PodLogsQuerySplitStreams), else the combined
log as stdout. Whether it splits is learnt once, by the first read, and kept (`_split_logs`).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from kubernetes.client.exceptions import ApiException

from ce_k8s import protocol
from ce_k8s.agent.access import same_job
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.routedjob import RoutedJob
from ce_k8s.pods.names import label_value

if TYPE_CHECKING:
    from ce_k8s.agent.access import Access
    from ce_k8s.agent.cache import PodCache
    from ce_k8s.agent.corecalls import CoreCalls
    from ce_k8s.agent.metrics import AgentMetrics
    from ce_k8s.agent.output import OutputStore
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.ratelimit import TokenBucket
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)


class Logs:
    """The finalize hook's `logs` verb (`handle`) and the log reads (`read`) under the QPS budget."""

    def __init__(self, settings: Settings, access: Access, cache: PodCache, output: OutputStore, calls: CoreCalls,
                 bucket: TokenBucket, stop_event: threading.Event, request_timeout: float,
                 prom: AgentMetrics) -> None:
        self.spool = settings.spool
        self.access = access
        self.cache = cache
        self.output = output
        self.calls = calls
        self.bucket = bucket
        self.stop_event = stop_event
        self.request_timeout = request_timeout
        self.prom = prom
        self._split_logs: bool | None = None   # does the API server honour `stream=` on pod logs?
        self._stream_probe = threading.Lock()  # one fetch asks that; the others wait for its answer

    def handle(self, text: str, uid: int) -> tuple[str, list[bytes]]:
        """[spool root, stdout, stderr] of the job's pod for the finalize hook: the saved output, else
        the live pod's log; a note on stderr says why output is missing or cut."""
        routed = self.access.admit(text, uid, "logs", (protocol.STATUS_NOTFOUND, [b"not a Kubernetes job"]))
        if not isinstance(routed, RoutedJob):
            return routed                             # refused, or another backend's job
        name, owner = routed.pod_name, routed.owner
        gjid = routed.source_global_job_id
        job = routed.job_id
        saved = self.output.load(name) if name else None
        if saved is not None:
            meta, out, err = saved
            if meta.owner not in (owner, label_value(owner)) or (gjid and meta.global_job_id
                                                                  and meta.global_job_id != gjid):
                log.warning("%s", fields(event="request-denied", verb="logs", job=job, pod=name,
                                         why="saved output belongs to another job or owner"))
                return protocol.STATUS_DENIED, [b"output belongs to another job"]
            if meta.lost:
                err += f"ce-k8s: the pilot's output could not be returned: {meta.lost}\n".encode()
            elif meta.truncated:
                err += (f"ce-k8s: output cut at CE_K8S_MAX_OUTPUT_BYTES = {self.output.max_bytes} bytes "
                        "per stream\n").encode()
            log.info("%s", fields(event="output-returned", job=job, pod=name, stdout_bytes=len(out),
                                  stderr_bytes=len(err), source="saved"))
            return protocol.STATUS_OK, [self.spool.encode(), out, err]
        pod = self.cache.get(name) if name else None
        if pod is None:
            log.warning("%s", fields(event="output-missing", job=job, pod=name))
            return protocol.STATUS_NOTFOUND, [f"no pod {name!r} and no saved output".encode()]
        if not same_job(pod, owner, gjid):
            return protocol.STATUS_DENIED, [b"pod belongs to another job"]
        out, err, _split = self.read(pod, self.output.max_bytes or 1)
        log.info("%s", fields(event="output-returned", job=job, pod=name, stdout_bytes=len(out),
                              stderr_bytes=len(err), source="pod"))
        return protocol.STATUS_OK, [self.spool.encode(), out, err]

    def _log(self, pod: PodInfo, stream: str | None, limit: int) -> bytes:
        self.bucket.acquire(self.stop_event)
        kwargs = {"container": "pilot", "limit_bytes": limit, "_preload_content": False,
                  "_request_timeout": self.request_timeout}
        if stream:
            kwargs["stream"] = stream
        try:
            resp = self.calls.read_namespaced_pod_log(pod.name, pod.namespace, **kwargs)
        except Exception as exc:
            self.prom.api_error("get", "pods/log", exc)
            raise
        return resp.data

    def read(self, pod: PodInfo, limit: int) -> tuple[bytes, bytes, bool]:
        """(stdout, stderr, split): split when the API server honours `stream=` (Kubernetes ≥ 1.32 with
        PodLogsQuerySplitStreams), else the combined log as stdout and an empty stderr.

        Raises ApiException (404: the pod is gone) and transport errors; the caller decides.
        """
        if self._split_logs is None:
            with self._stream_probe:       # one probe: fetches that start meanwhile wait for its answer
                if self._split_logs is None:
                    return self._read_streams(pod, limit)
        if self._split_logs is False:
            return self._log(pod, None, limit), b"", False
        return self._read_streams(pod, limit)

    def _read_streams(self, pod: PodInfo, limit: int) -> tuple[bytes, bytes, bool]:
        """Ask for `Stdout` and `Stderr` apart, and learn from the answers whether the server splits."""
        try:
            out = self._log(pod, "Stdout", limit)
        except ApiException as exc:
            if not _rejects_stream(exc):     # anything but "this server refuses `stream`" is real
                raise
            self._split_logs = False
            return self._log(pod, None, limit), b"", False
        err = self._log(pod, "Stderr", limit)
        if err == out and out:
            self._split_logs = False   # the server ignores `stream`: both were the combined log
            return out, b"", False
        if err != out:
            self._split_logs = True
        return out, err, bool(self._split_logs)


def _rejects_stream(exc: ApiException) -> bool:
    """The API server refused the `stream` log option itself: 400 from a server that reads it as a
    bad parameter, or 422 `stream: Forbidden` from Kubernetes >= 1.32 with PodLogsQuerySplitStreams
    off (the default while the gate is alpha; validation of PodLogOptions, kubernetes#133005)."""
    if exc.status == 400:
        return True
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    return exc.status == 422 and "stream" in body
