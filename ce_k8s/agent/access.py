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
from ce_k8s.agent import adtext
from ce_k8s.agent.logfmt import fields
from ce_k8s.hooks._common import ad_grid_resource, grid_resource_matches
from ce_k8s.pods.names import label_value

if TYPE_CHECKING:
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.settings import Settings

log = logging.getLogger(__name__)

Identified = tuple[dict[str, str], str | None, str]
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

    def identify(self, text: str, uid: int, verb: str) -> Identified | Reply:
        """(scanned attributes, pod name, owner) or an error reply tuple."""
        attrs = adtext.scan(text)
        name = adtext.unquote(attrs.get("k8spodname"))
        owner = adtext.unquote(attrs.get("owner")) or ""
        if not self.authorized(owner, uid):
            self.metrics["denied"] += 1
            job = f"{attrs.get('clusterid', '?')}.{attrs.get('procid', '?')}"
            log.warning("%s", fields(event="request-denied", verb=verb, job=job, owner=owner, caller_uid=uid))
            return (protocol.STATUS_DENIED, [f"uid {uid} may not act on jobs of {owner!r}".encode()])
        return attrs, name, owner

    def other_backend(self, text: str, attrs: dict[str, str]) -> bool:
        """A routed job (it has `RouteName`) of another backend: its GridResource does not start with
        CE_K8S_GRID_RESOURCE (docs/routes.md "CEs with other backends", the hooks' own rule and
        parser). The hooks never send one; an old launcher or a forged call might, and the agent then
        answers with no record, no pod and no API call. An ad with no `RouteName` keeps the usual rules."""
        if "routename" not in attrs:
            return False
        found = ad_grid_resource(text.encode("utf-8", "surrogateescape"))
        return not grid_resource_matches(found, self.settings.grid_resource)


def same_job(pod: PodInfo, owner: str, gjid: str | None) -> bool:
    """An existing pod is ours to report on only if its labels/annotations name this job and owner."""
    if pod.owner and pod.owner not in (owner, label_value(owner)):
        return False
    return not (gjid and pod.global_job_id and pod.global_job_id != gjid)
