"""`ce-k8s status`: every routed pilot with its pod, as an admin wants to see it next to `condor_ce_q`.

    ce-k8s status [--config PATH] [--json] [--socket PATH] [--kubeconfig F] [--source auto|agent|api]

Why this exists: `condor_ce_q` shows jobs, `kubectl get pods` shows pods, and the question an
admin has ("which pilot is where, and why is it not running?") needs both (htcondor-ce.md §4.1:
`RoutedToJobId`, `RouteName`, `HoldReason` and the node/pod name must be visible). Each row is
one pod of one routed pilot: routed and source job id, owner, route, pod, node, pod phase, the job
state the agent reports for it, age, and the hold (or pending) reason.

Where the rows come from:

* the agent, when its protocol offers the `list` verb (`protocol.VERB_LIST`): its watch cache plus
  what it learned from the hooks (the routed job id is only known there);
* otherwise the API server: one label-selected, paged LIST of this CE's pods, and the job state is
  computed with the agent's own mapping (`ce_k8s.agent.status.decide`), so the column says what
  the next update hook will report.

The helpers `load_config_and_settings` and `new_api_client` are shared with `doctor` and `nodes`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from ce_k8s.kubeclient import new_api_client

log = logging.getLogger(__name__)

LIST_PAGE = 500
AGENT_TIMEOUT = 10.0
API_TIMEOUT = 20.0
REASON_WIDTH = 70
JOB_STATES = {1: "Idle", 2: "Running", 3: "Removed", 4: "Completed", 5: "Held"}

LABEL_ROUTE = "ce-k8s.htcondor.org/route"
LABEL_JOB = "ce-k8s.htcondor.org/job"
LABEL_ATTEMPT = "ce-k8s.htcondor.org/attempt"
ANN_ROUTED_FROM = "ce-k8s.htcondor.org/routed-from"


class StatusError(Exception):
    """The pilots could not be listed (agent and API both unusable, or bad configuration)."""


# --------------------------------------------------------------------------------------------
# Shared helpers (doctor and nodes use them too)


def load_config_and_settings(path: str | None):
    """(CondorConfig, Settings) from `--config`, else `$CONDOR_CONFIG`, else the shipped defaults.

    Raises `ce_k8s.condor.config.ConfigError` (a SettingsError is one) naming file and line.
    """
    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.settings import Settings

    cfg = CondorConfig.load(path or os.environ.get("CONDOR_CONFIG") or None)
    return cfg, Settings.from_config(cfg)


def kubeconfig_from(arg: str | None, settings) -> str | None:
    """`--kubeconfig`, else the `CE_K8S_KUBECONFIG` knob, else the environment variable, else None."""
    return arg or getattr(settings, "kubeconfig", "") or os.environ.get("CE_K8S_KUBECONFIG") or None


def short(exc: object, limit: int = 200) -> str:
    """One line of an exception, for a status line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# Rows


@dataclass(frozen=True)
class PilotRow:
    """One pod of one routed pilot (also the JSON object of `--json` and of the agent's `list`)."""

    routed_job: str          # the routed job's "cluster.proc" ("" when only the API was asked)
    source_job: str          # the CE job the factory submitted (RoutedFromJobId)
    owner: str
    route: str
    namespace: str
    pod: str
    node: str
    phase: str               # the pod's phase; "Terminating" while it is being deleted
    status: str              # the routed job's state as the agent maps it: Idle, Running, Held, ...
    attempt: int
    created: int | None      # pod creation, epoch seconds
    age: int | None          # seconds since `created` when the listing was made
    hold_reason: str
    reason: str              # scheduler/kubelet reason while pending, eviction note

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], now: float) -> PilotRow:
        """A row from a JSON object (the agent's reply); unknown keys are ignored, missing ones empty."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            v = obj.get(f.name)
            if f.name in ("attempt",):
                values[f.name] = v if isinstance(v, int) and not isinstance(v, bool) else 0
            elif f.name in ("created", "age"):
                values[f.name] = v if isinstance(v, int) and not isinstance(v, bool) else None
            else:
                values[f.name] = "" if v is None else str(v)
        if values["age"] is None and values["created"] is not None:
            values["age"] = max(int(now) - values["created"], 0)
        return cls(**values)


def job_sort_key(job_id: str) -> tuple:
    """"12.3" sorts numerically (12.3 before 100.0); anything else after, by text."""
    cluster, _, proc = job_id.partition(".")
    if cluster.isdigit() and proc.isdigit():
        return (0, int(cluster), int(proc), "")
    return (1, 0, 0, job_id)


def sort_rows(rows: Iterable[PilotRow]) -> list[PilotRow]:
    """By source job (numerically), then attempt, then pod name: a pilot's attempts stay together."""
    return sorted(rows, key=lambda r: (job_sort_key(r.source_job), r.attempt, r.namespace, r.pod))


def row_from_pod(pod: Mapping[str, Any], settings, now: float) -> PilotRow:
    """Summarise one pod as the API returns it, with the job state the agent would report."""
    from ce_k8s.agent.agent import CONFIG_ERROR_GRACE
    from ce_k8s.agent.podinfo import PodInfo
    from ce_k8s.agent.status import CREATE_DONE, CreateInfo, JobView, decide
    from ce_k8s.pods.names import pod_name

    info = PodInfo.from_dict(dict(pod))
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    try:
        attempt = int(labels.get(LABEL_ATTEMPT, "0"))
    except ValueError:
        attempt = 0
    gjid = info.global_job_id or None
    next_name = None
    if gjid and attempt < 999_999:
        try:
            next_name = pod_name(gjid, attempt + 1)
        except ValueError:
            next_name = None
    job = JobView(pod_name=info.name, attempt=attempt, max_attempts=settings.max_attempts,
                  pending_timeout=settings.pending_timeout, pod_uid=info.uid, global_job_id=gjid)
    decision = decide(job, info, None, CreateInfo(state=CREATE_DONE), int(now), settings.image_pull_timeout,
                      CONFIG_ERROR_GRACE, next_name)
    attrs = decision.attrs
    code = attrs.get("JobStatus")
    state = JOB_STATES.get(code, "") if isinstance(code, int) else ""
    if info.deleting and not state:
        state = "Removed"
    phase = "Terminating" if info.deleting and not info.finished else info.phase
    if info.phase == "Failed" and info.disrupted:
        phase = "Evicted"
    created = info.created
    return PilotRow(
        routed_job="",
        source_job=str(ann.get(ANN_ROUTED_FROM) or labels.get(LABEL_JOB) or ""),
        owner=info.owner,
        route=str(labels.get(LABEL_ROUTE) or ""),
        namespace=info.namespace,
        pod=info.name,
        node=info.node,
        phase=phase,
        status=state or "?",
        attempt=attempt,
        created=created,
        age=max(int(now) - created, 0) if created is not None else None,
        hold_reason=str(attrs.get("HoldReason") or ""),
        reason=str(attrs.get("K8sPodReason") or ""),
    )


# --------------------------------------------------------------------------------------------
# Sources


def agent_offers_list() -> bool:
    """Whether this installation's agent protocol has the `list` verb (else the API is asked)."""
    from ce_k8s import protocol

    verb = getattr(protocol, "VERB_LIST", None)
    return bool(verb) and verb in protocol.VERBS


def rows_from_agent(socket_path: str, timeout: float = AGENT_TIMEOUT) -> list[PilotRow]:
    """Ask the agent for its pilots: reply `ok` with one part, `{"pilots": [PilotRow JSON, ...]}`."""
    from ce_k8s import protocol

    verb = getattr(protocol, "VERB_LIST", "list")
    now = time.time()
    try:
        answer = protocol.ask(socket_path, verb, b"", timeout)
    except (OSError, protocol.ProtocolError) as exc:
        raise StatusError(f"agent {socket_path}: {short(exc)}") from None
    if answer.status != protocol.STATUS_OK:
        detail = answer.message().strip()
        raise StatusError(f"agent {socket_path} answered {answer.status}" + (f": {short(detail)}" if detail else ""))
    parts = answer.parts
    try:
        doc = json.loads(parts[0]) if parts else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise StatusError(f"agent {socket_path}: list reply is not JSON: {short(exc)}") from None
    pilots = doc.get("pilots") if isinstance(doc, dict) else None
    if not isinstance(pilots, list):
        raise StatusError(f"agent {socket_path}: list reply has no 'pilots' list")
    return [PilotRow.from_json(p, now) for p in pilots if isinstance(p, dict)]


def list_our_pods(api_client, selector: str, timeout: float = API_TIMEOUT) -> list[dict]:
    """Every pod matching `selector` in all namespaces, paged, as raw JSON dicts, within `timeout`."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    items: list[dict] = []
    cont = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StatusError(f"listing pods took longer than {timeout:g}s")
        kwargs: dict[str, Any] = {"label_selector": selector, "limit": LIST_PAGE, "_preload_content": False,
                                  "_request_timeout": (min(5.0, left), left)}
        if cont:
            kwargs["_continue"] = cont
        resp = core.list_pod_for_all_namespaces(**kwargs)
        body = json.loads(resp.data)
        items.extend(body.get("items") or ())
        cont = (body.get("metadata") or {}).get("continue")
        if not cont:
            return items


def ce_selector(settings) -> str:
    """This CE's pods: the labels the pod builder stamps (docs/internals.md "Identity")."""
    from ce_k8s.agent.podinfo import LABEL_CE, LABEL_MANAGED_BY, MANAGER
    from ce_k8s.pods.names import label_value

    return f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_CE}={label_value(settings.ce_name)}"


def rows_from_api(api_client, settings, timeout: float = API_TIMEOUT) -> list[PilotRow]:
    """The rows from one label-selected LIST of this CE's pods."""
    now = time.time()
    try:
        pods = list_our_pods(api_client, ce_selector(settings), timeout)
    except StatusError:
        raise
    except Exception as exc:  # ApiException, connection refused, TLS, timeouts
        raise StatusError(f"Kubernetes API: {short(exc)}") from None
    return [row_from_pod(p, settings, now) for p in pods]


# --------------------------------------------------------------------------------------------
# Rendering


def format_age(seconds: int | None) -> str:
    """kubectl-style: 45s, 12m, 3h, 2d (whole units, rounded down)."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


HEADERS = ("ROUTED", "SOURCE", "OWNER", "ROUTE", "POD", "NODE", "PHASE", "STATUS", "AGE", "REASON")


def render_table(rows: list[PilotRow], wide: bool = False) -> str:
    """Aligned columns (like `condor_q`/`kubectl get`), `-` for empty cells, one summary line."""
    table: list[tuple[str, ...]] = [HEADERS]
    for r in rows:
        reason = r.hold_reason or r.reason
        if not wide and len(reason) > REASON_WIDTH:
            reason = reason[: REASON_WIDTH - 3] + "..."
        pod = r.pod if r.namespace in ("", "default") else f"{r.namespace}/{r.pod}"
        table.append(tuple(v or "-" for v in (
            r.routed_job, r.source_job, r.owner, r.route, pod, r.node, r.phase, r.status, format_age(r.age),
            reason)))
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADERS) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
             for row in table]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items()))
    lines.append(f"{len(rows)} pilot pod(s)" + (f": {summary}" if summary else ""))
    return "\n".join(line.rstrip() for line in lines)


def render_json(rows: list[PilotRow], source: str) -> str:
    return json.dumps({"source": source, "pilots": [asdict(r) for r in rows]}, indent=2, sort_keys=True)


# --------------------------------------------------------------------------------------------
# Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH",
                        help="condor_config file or config directory (default: $CONDOR_CONFIG, else the shipped "
                             "defaults)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--socket", metavar="PATH", help="the agent's socket (default: CE_K8S_SOCKET)")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig for the API fallback (default: CE_K8S_KUBECONFIG, else in-cluster)")
    parser.add_argument("--source", choices=("auto", "agent", "api"), default="auto",
                        help="where the pilots come from (default: the agent if it can list, else the API)")
    parser.add_argument("--wide", action="store_true", help="do not shorten the REASON column")


def collect(args: argparse.Namespace, settings) -> tuple[list[PilotRow], str]:
    """(rows, source description) following `--source`; raises StatusError."""
    socket_path = args.socket or settings.socket
    want_agent = args.source == "agent" or (args.source == "auto" and agent_offers_list())
    if want_agent:
        try:
            return rows_from_agent(socket_path), f"agent {socket_path}"
        except StatusError as exc:
            if args.source == "agent":
                raise
            print(f"ce-k8s status: {exc}; asking the Kubernetes API instead", file=sys.stderr)
    kubeconfig = kubeconfig_from(args.kubeconfig, settings)
    try:
        api_client = new_api_client(kubeconfig)
    except Exception as exc:
        raise StatusError(f"no Kubernetes credentials ({kubeconfig or 'in-cluster'}): {short(exc)}") from None
    try:
        return rows_from_api(api_client, settings), f"api {api_client.configuration.host}"
    finally:
        api_client.close()


def run(args: argparse.Namespace) -> int:
    """Exit 0 with the listing, 1 when neither the agent nor the API answered, 2 on bad configuration."""
    from ce_k8s.condor.config import ConfigError

    try:
        _cfg, settings = load_config_and_settings(args.config)
    except (ConfigError, OSError) as exc:
        print(f"ce-k8s status: {exc}", file=sys.stderr)
        return 2
    try:
        rows, source = collect(args, settings)
    except StatusError as exc:
        print(f"ce-k8s status: {exc}", file=sys.stderr)
        return 1
    rows = sort_rows(rows)
    print(render_json(rows, source) if args.json else render_table(rows, wide=args.wide))
    return 0
