"""One typed view of the routed job a hook request carries (`RoutedJob`), read once where the request comes in.

Why: the `update`, `cleanup` and `logs` verbs and the parts they call (access, release,
credentials, accounting) each need a few values of the routed ad. Each used to scan, unquote and
convert them where it needed them, build "ClusterId.ProcId" by hand, and look for the ad's
GridResource in another pass over the text. Now `read` passes over the text once
(`adtext.scan_job`: the scan of every attribute any verb reads, and the hooks' GridResource rule on
the same lines), converts each value once, and the verb hands the view on.

The view keeps the raw literals (`attrs`, lower-case names): an update prints an attribute only
when its rendering differs from the ad's raw literal (`adtext.changed_lines`), and a log line may
quote the ad's own text. The full ClassAd parse (classad2) is not done here: the creator does it,
once per pod, from the ad text it is queued with (creator.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ce_k8s.agent import adtext
from ce_k8s.agent.accounting import IDENTITY_WANTED
from ce_k8s.agent.status import JobView

if TYPE_CHECKING:
    from ce_k8s.settings import Settings

# Every attribute a verb reads or may rewrite (adtext.WANTED) and the identity the attempt's
# history file keeps (accounting.IDENTITY_ATTRS): one scan finds them all.
ROUTED_WANTED = adtext.WANTED | IDENTITY_WANTED


@dataclass(frozen=True, slots=True)
class RoutedJob:
    """The routed ad's values the agent acts on, converted once (`read`). A string field is None when
    the ad has no such string literal; an int field None when it has no integer literal."""

    attrs: dict[str, str]              # raw right-hand sides, lower-case names (adtext.scan)
    job_id: str                        # the routed job's "ClusterId.ProcId" ("?" for a missing part)
    owner: str                         # Owner ("" when absent)
    pod_name: str | None               # K8sPodName: set by our translate hook, None for a job it never saw
    attempt: int                       # K8sAttempt (0 when absent)
    max_attempts: int | None           # K8sMaxAttempts (None: the agent's default)
    pending_timeout: int | None        # K8sPendingTimeout (None: the agent's default)
    job_status: int | None             # JobStatus
    hold_reason: str | None            # HoldReason
    pod_uid: str | None                # K8sPodUid: set once an update reported a live pod
    pod_reason: str | None             # K8sPodReason
    replied: bool                      # the ad has a K8sPodReason line: an agent answered an update for it
    global_job_id: str | None          # GlobalJobId of the routed job itself
    source_global_job_id: str | None   # K8sSourceGlobalJobId: the source job's, which names the pods
    routed_from: str                   # RoutedFromJobId, the source job's "ClusterId.ProcId" ("" when absent)
    routed: bool                       # the ad has a RouteName line (of any value): a routed job
    route_name: str                    # RouteName ("" when absent or not a string)
    grid_resource: str | None          # GridResource by the hooks' rule (adtext.grid_resource_line)
    job_start_date: int | None         # JobStartDate
    num_job_starts: int | None         # NumJobStarts
    retry_after: int | None            # K8sRetryAfter
    remote_wall_clock_time: float      # RemoteWallClockTime, a number literal (0.0 when absent or not a number)
    iwd: str                           # Iwd ("" when absent)
    x509userproxy: str | None          # x509userproxy: the proxy file, relative to Iwd or absolute
    scitokensfile: str | None          # ScitokensFile: the token file, likewise

    def identity(self) -> dict[str, str]:
        """The identity attributes (raw literals) the attempt's history file keeps (accounting.history_ad)."""
        attrs = self.attrs
        return {name: attrs[name] for name in IDENTITY_WANTED if name in attrs}

    def job_view(self, pod_name: str, attempt: int, settings: Settings) -> JobView:
        """What the status decision (`status.decide`) needs of this job for pod `pod_name` of `attempt`;
        the route's limits that the ad does not set are the agent's defaults."""
        return JobView(
            pod_name=pod_name,
            attempt=attempt,
            max_attempts=self.max_attempts or settings.max_attempts,
            pending_timeout=self.pending_timeout or settings.pending_timeout,
            job_status=self.job_status,
            pod_uid=self.pod_uid,
            job_start_date=self.job_start_date,
            global_job_id=self.source_global_job_id,
            ce_removes_restarts=settings.ce_removes_restarts,
            retry_wait=settings.retry_wait,
            retry_after=self.retry_after,
            num_job_starts=self.num_job_starts,
        )


def read(text: str) -> RoutedJob:
    """The view of the routed ad `text` (sPrintAd lines): one pass over the text, each value converted once."""
    attrs, grid = adtext.scan_job(text, ROUTED_WANTED)
    get = attrs.get
    unquote, as_int = adtext.unquote, adtext.as_int
    wall = _seconds(get("remotewallclocktime"))
    return RoutedJob(
        attrs=attrs,
        job_id=f"{get('clusterid', '?')}.{get('procid', '?')}",
        owner=unquote(get("owner")) or "",
        pod_name=unquote(get("k8spodname")),
        attempt=as_int(get("k8sattempt")) or 0,
        max_attempts=as_int(get("k8smaxattempts")),
        pending_timeout=as_int(get("k8spendingtimeout")),
        job_status=as_int(get("jobstatus")),
        hold_reason=unquote(get("holdreason")),
        pod_uid=unquote(get("k8spoduid")),
        pod_reason=unquote(get("k8spodreason")),
        replied="k8spodreason" in attrs,
        global_job_id=unquote(get("globaljobid")),
        source_global_job_id=unquote(get("k8ssourceglobaljobid")),
        routed_from=unquote(get("routedfromjobid")) or "",
        routed="routename" in attrs,
        route_name=unquote(get("routename")) or "",
        grid_resource=grid,
        job_start_date=as_int(get("jobstartdate")),
        num_job_starts=as_int(get("numjobstarts")),
        retry_after=as_int(get("k8sretryafter")),
        remote_wall_clock_time=wall,
        iwd=unquote(get("iwd")) or "",
        x509userproxy=unquote(get("x509userproxy")),
        scitokensfile=unquote(get("scitokensfile")),
    )


def _seconds(raw: str | None) -> float:
    """A number literal of the ad (`600`, `600.0`, `6e2`) as seconds; 0.0 for anything else.

    HTCondor writes `RemoteWallClockTime` as a real. Until 2026-11-28 it was read as a string
    literal, which it never is, so an attempt's wall time replaced the earlier attempts' instead of
    adding to them; a quoted number is still accepted. An expression or a non-finite value is 0:
    the agent does not evaluate ClassAd expressions on the update path.
    """
    text = adtext.unquote(raw) if raw is not None and raw.startswith('"') else raw
    try:
        value = float(text) if text is not None else 0.0
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value >= 0 else 0.0
