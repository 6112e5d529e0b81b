"""The `list` verb (`ce-k8s status`, `ce_k8s/ops/status.py`): one row per pilot, from memory.

Why from the watch cache and the job records, never from the API: `ce-k8s status` is the admin's
look at the pilots while the agent serves the hooks, and must cost neither an API call nor the
update path's time (docs/agent.md "The socket protocol").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ce_k8s import protocol
from ce_k8s.agent.status import (
    CREATE_DONE,
    CREATE_HOLD,
    CREATE_PENDING,
    CREATE_RETRY,
    HELD,
    CreateInfo,
    JobView,
    decide,
)
from ce_k8s.pods.names import pod_name

if TYPE_CHECKING:
    from ce_k8s.agent.access import Access
    from ce_k8s.agent.cache import PodCache
    from ce_k8s.agent.jobs import JobRecord, JobTable
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.settings import Settings

JOB_STATES = {1: "Idle", 2: "Running", 3: "Removed", 4: "Completed", 5: "Held"}


class Listing:
    """The rows of `list`, filtered by the caller's uid (the `Access` rule)."""

    def __init__(self, settings: Settings, access: Access, cache: PodCache, jobs: JobTable,
                 config_error_grace: int, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock              # time.time(); a test passes its own (tests/agent/fakes.py)
        self.settings = settings
        self.access = access
        self.cache = cache
        self.jobs = jobs
        self.config_error_grace = config_error_grace

    def handle(self, uid: int) -> tuple[str, list[bytes]]:
        """Every pilot pod (and held or waiting job without one) the caller may see, as JSON rows in
        the shape of `ce_k8s.ops.status.PilotRow`. Root and the agent's uid see all; a pilot account
        sees its own jobs. Only ids, states and reasons: never an ad, a Secret or a log."""
        if not self.cache.ready.is_set():
            return protocol.STATUS_BUSY, [b"agent is still listing pods"]
        now = int(self.clock())
        rows = []
        for name, pod in list(self.cache.pods.items()):
            rec = self.jobs.get(name)
            owner = pod.owner or (rec.owner if rec else "")
            if self.access.authorized(owner, uid):
                rows.append(self._pod_row(pod, rec, now))
        for name, rec in list(self.jobs.items()):
            if name in self.cache.pods or rec.cleanup.asked_at or not rec.reporting.routed_job:
                continue
            said, create = rec.reporting, rec.creation
            waiting = create.info.state in (CREATE_PENDING, CREATE_RETRY, CREATE_HOLD)
            if (said.job_status == HELD or waiting) and self.access.authorized(rec.owner, uid):
                rows.append(_row(said.routed_job, said.source_job, rec.owner, said.route, create.namespace, name, "",
                                 "Gone" if said.job_status == HELD else "", JOB_STATES.get(said.job_status or 0, "?"),
                                 said.attempt, None, said.hold_reason, said.reason or create.info.message))
        return protocol.STATUS_OK, [json.dumps({"pilots": rows}, separators=(",", ":")).encode()]

    def _pod_row(self, pod: PodInfo, rec: JobRecord | None, now: int) -> dict[str, object]:
        phase = "Terminating" if pod.deleting and not pod.finished else pod.phase
        if pod.phase == "Failed" and pod.disrupted:
            phase = "Evicted"
        said = rec.reporting if rec is not None else None
        if said is not None and said.job_status is not None:
            status, hold, reason = JOB_STATES.get(said.job_status, "?"), said.hold_reason, said.reason
        else:   # no update since this agent started: what the next update would say
            next_name = pod_name(pod.global_job_id, pod.attempt + 1) if pod.global_job_id else None
            job = JobView(pod_name=pod.name, attempt=pod.attempt, max_attempts=self.settings.max_attempts,
                          pending_timeout=self.settings.pending_timeout, pod_uid=pod.uid,
                          global_job_id=pod.global_job_id or None)
            attrs = decide(job, pod, None, CreateInfo(CREATE_DONE), now, self.settings.image_pull_timeout,
                           self.config_error_grace, next_name).attrs
            code = attrs.get("JobStatus")
            status = JOB_STATES.get(code, "?") if isinstance(code, int) else "?"
            hold, reason = str(attrs.get("HoldReason") or ""), str(attrs.get("K8sPodReason") or "")
        return _row(said.routed_job if said else "", (said.source_job if said else "") or pod.source_job,
                    pod.owner or (rec.owner if rec else ""), pod.route or (said.route if said else ""), pod.namespace,
                    pod.name, pod.node, phase, status, pod.attempt, pod.created, hold, reason)


def _row(routed_job: str, source_job: str, owner: str, route: str, namespace: str, pod: str, node: str, phase: str,
         status: str, attempt: int, created: int | None, hold_reason: str, reason: str) -> dict[str, object]:
    """One `list` row: exactly the keys of `ce_k8s.ops.status.PilotRow` the agent knows (age is the client's)."""
    return {"routed_job": routed_job, "source_job": source_job, "owner": owner, "route": route,
            "namespace": namespace, "pod": pod, "node": node, "phase": phase, "status": status,
            "attempt": attempt, "created": created, "hold_reason": hold_reason, "reason": reason}
