"""What the API server's admission makes of a pilot's pod: a dry-run create (nothing is stored).

Why: admission changes or refuses a pod after our builder made it, and the scheduler places what
admission left. A LimitRange fills in requests and limits a container does not state or refuses a
pod beyond its minimum or maximum, RuntimeClass admission adds the pod overhead, a site's mutating
webhooks add sidecars or resources. Re-implementing each would always lag; the API server answers
for all of them, with the agent's own right to create pilots (docs/information-provider.md "Against
the real scheduler": a LimitRange below the whole-node pilot refused every pod of the route while
its nodes were advertised). Its own module: the RBAC scan (tests/containers) derives the verb of
raw requests per module, and snapshot.py's are all GETs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ce_k8s.info.snapshot import _short

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admission:
    """What the API server's admission makes of a pod (a dry-run create): the pod as it would be
    stored, or why it would be refused; both None when the question could not be put."""

    pod: Mapping[str, object] | None = None
    refusal: str | None = None
    quota: bool = False  # refused by the ResourceQuota only (the capacity model counts that room itself)


def admit_dry_run(kubeconfig: str | None, pods: Iterable[Mapping[str, object]], timeout: float = 10.0
                  ) -> list[Admission]:
    """Create each pod with ``dryRun=All``: nothing is stored, but every admission step runs.

    One request per route and run; any failure to ask (timeout, no right, an old server, a missing
    namespace) leaves the pod as built (``Admission()``).
    """
    from ce_k8s.kubeclient import new_api_client

    pods = list(pods)
    try:
        api_client = new_api_client(kubeconfig)
    except Exception as exc:  # the loaders raise several unrelated types for a bad kubeconfig
        log.info("no dry-run admission of the pilots' pods: %s", _short(exc))
        return [Admission() for _ in pods]
    deadline = time.monotonic() + timeout
    out: list[Admission] = []
    try:
        for pod in pods:
            left = deadline - time.monotonic()
            meta = pod.get("metadata") or {}
            if left <= 0 or not isinstance(meta, Mapping):
                out.append(Admission())
                continue
            body = dict(pod)
            # generateName: the probe pod's name may be taken, and a dry run reserves nothing.
            body["metadata"] = {**{k: v for k, v in meta.items() if k != "name"},
                                "generateName": "ce-k8s-info-probe-"}
            namespace = str(meta.get("namespace") or "default")
            try:
                method, url, headers, data, post = api_client.param_serialize(
                    "POST", "/api/v1/namespaces/{namespace}/pods", path_params={"namespace": namespace},
                    query_params=[("dryRun", "All")], body=body,
                    header_params={"Accept": "application/json", "Content-Type": "application/json"},
                    auth_settings=["BearerToken"])
                resp = api_client.call_api(method, url, headers, data, post,
                                           _request_timeout=(min(5.0, left), left))
                raw = resp.read() if hasattr(resp, "read") else resp.data
                doc = json.loads(raw) if raw else {}
            except Exception as exc:  # connection, TLS, timeout, bad JSON: keep the pod as built
                log.info("dry-run admission in %s failed: %s", namespace, _short(exc))
                out.append(Admission())
                continue
            if not isinstance(doc, Mapping):
                doc = {}
            message = str(doc.get("message") or f"HTTP {resp.status}")
            if resp.status in (200, 201) and doc:
                out.append(Admission(pod=doc))
            elif resp.status == 403 and "exceeded quota" in message:
                out.append(Admission(refusal=_short(message, 300), quota=True))
            elif resp.status == 403 and " cannot create resource " in message:
                log.info("dry-run admission not allowed (RBAC): %s", _short(message))
                out.append(Admission())
            elif resp.status in (403, 422):   # a LimitRange, PodSecurity, a webhook, validation ...
                out.append(Admission(refusal=_short(message, 300)))
            else:
                log.info("dry-run admission in %s: HTTP %s", namespace, resp.status)
                out.append(Admission())
    finally:
        api_client.close()
    return out
