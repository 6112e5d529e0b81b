"""Who may act on which job, and which requests are the agent's at all.

Why apart: the `update`, `cleanup` and `logs` verbs begin with the same checks of the routed ad
they are sent (the caller's uid against its `Owner`, and whether it is a Kubernetes job at all),
and `list` applies the same uid rule row by row (docs/agent.md "Permissions and authorisation").
A pod is reported on or deleted only when its own labels and annotations name the ad's job and
owner (`same_job`).
"""

from __future__ import annotations

import logging
import os
import pwd
from typing import TYPE_CHECKING

from ce_k8s import protocol
from ce_k8s.agent.logfmt import fields
from ce_k8s.agent.routedjob import RoutedJob, read
from ce_k8s.hooks._common import grid_resource_matches
from ce_k8s.pods.names import label_value

if TYPE_CHECKING:
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)

Reply = tuple[str, list[bytes]]


class Access:
    """The SO_PEERCRED rule and the routed ad's identity, for every verb; counts refusals in `metrics`."""

    def __init__(self, settings: Settings, metrics: dict[str, int]) -> None:
        self.settings = settings
        self.metrics = metrics
        self._uids: dict[str, int | None] = {}
        self._my_uid = os.getuid()

    def _uid_of(self, owner: str) -> int | None:
        if owner not in self._uids:
            try:
                self._uids[owner] = pwd.getpwnam(owner).pw_uid
            except KeyError:
                self._uids[owner] = None
        return self._uids[owner]

    def authorized(self, owner: str | None, uid: int) -> bool:
        """SO_PEERCRED rule: root and the agent's own uid act on every job, a user on their own only."""
        if uid in (0, self._my_uid):
            return True
        return bool(owner) and self._uid_of(owner) == uid

    def admit(self, text: str, uid: int, verb: str, other: Reply) -> RoutedJob | Reply:
        """The routed job a request's ad `text` names (read once, routedjob.read), or the reply that
        ends the request here: refused for caller `uid`, or `other` for another backend's job."""
        job = read(text)
        if not self.authorized(job.owner, uid):
            self.metrics["denied"] += 1
            log.warning("%s", fields(event="request-denied", verb=verb, job=job.job_id, owner=job.owner,
                                     caller_uid=uid))
            return (protocol.STATUS_DENIED, [f"uid {uid} may not act on jobs of {job.owner!r}".encode()])
        if self.other_backend(job):
            return other
        return job

    def other_backend(self, job: RoutedJob) -> bool:
        """A routed job (it has `RouteName`) of another backend: its GridResource does not start with
        CE_K8S_GRID_RESOURCE (docs/routes.md "CEs with other backends", the hooks' own rule and
        parser: `RoutedJob.grid_resource`, read by it). The hooks never send one; an old launcher or a
        forged call might, and the agent then answers with no record, no pod and no API call. An ad
        with no `RouteName` keeps the usual rules."""
        if not job.routed:
            return False
        return not grid_resource_matches(job.grid_resource, self.settings.grid_resource)


def same_job(pod: PodInfo, owner: str, gjid: str | None) -> bool:
    """An existing pod is ours to report on only if its labels/annotations name this job and owner."""
    if pod.owner and pod.owner not in (owner, label_value(owner)):
        return False
    return not (gjid and pod.global_job_id and pod.global_job_id != gjid)
