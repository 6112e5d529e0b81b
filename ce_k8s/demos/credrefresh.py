"""The demo's credential drill: renew the proxy of some running pilots and watch their pods see it.

Why: a long pilot outlives the proxy it started with; the factory renews it over Condor-C, the CE
schedd writes the new proxy next to the old one and renames it over it (HTCondor
src/condor_schedd.V6/schedd.cpp: Scheduler::updateGSICred, then
UpdateGSICredContinuation::finish_update, which also updates `x509UserProxyExpiration`). The
agent must copy it into the pod's Secret at the job's next update, and the kubelet into the
running container's files (docs/agent.md "Credential refresh"). The drill does the schedd's part
for a seeded choice of pilots once they run and reads the pod's mounted Secret from the kubelet
simulator after each router poll, so the demo can say how many pods saw their new proxy and after
how many polling periods.

Chosen pilots run long enough to be renewed mid-run: at least `MIN_RUN_POLLS` router polls.
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIN_RUN_POLLS = 8
_RUN = re.compile(r"\brun=([0-9.]+)s\b")


@dataclass
class Renewal:
    """One renewed proxy: whose, where, what, when; and when its pod's mounted Secret showed it."""

    job: str
    pod: str
    namespace: str
    content: bytes
    poll: int
    at: float
    seen_poll: int | None = None
    seen_at: float | None = None
    ended: bool = False          # the pod was gone before it showed the new content


class CredentialDrill:
    """`choose` before submitting, `turn(bed)` after every router poll, `summary()` at the end."""

    def __init__(self, fraction: float, seed: int = 1) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("the fraction of pilots to renew must be between 0 and 1")
        self.fraction = fraction
        self.seed = seed
        self._chosen: set[int] = set()
        self.renewals: dict[str, Renewal] = {}

    def choose(self, pilots: list, poll_s: float, time_scale: float) -> int:
        """Pick the pilots to renew (never evicted or Slurm-routed ones) and make them run long
        enough to be renewed and watched; returns how many were picked."""
        eligible = [p for p in pilots if not p.evicted and not p.ad.get("TestBatchRoute")]
        count = round(len(eligible) * self.fraction)
        picked = random.Random(self.seed + 7).sample(eligible, count)  # noqa: S311 - reproducible demo
        min_run = MIN_RUN_POLLS * poll_s / time_scale if time_scale > 0 else 0.0
        for pilot in picked:
            scenario = str(pilot.ad.get("DemoScenario") or "")
            pilot.ad["DemoScenario"] = _RUN.sub(lambda m: f"run={max(float(m.group(1)), min_run):g}s", scenario, 1)
            self._chosen.add(id(pilot))
        return count

    def turn(self, bed: Any) -> None:
        """Check the renewals not yet seen, then renew the chosen pilots that run now."""
        kubelet = getattr(bed.server, "kubelet", None)
        if kubelet is None or bed.router is None:
            return
        polls = bed.router.poll_count
        for r in self.renewals.values():
            if r.seen_poll is not None or r.ended:
                continue
            files = kubelet.mounted_files(r.namespace, r.pod)
            if files is None:
                r.ended = True
            elif r.content in files.values():
                r.seen_poll, r.seen_at = polls, time.monotonic()
        for job, out in bed.outcomes.items():
            if id(out.pilot) in self._chosen and job not in self.renewals and out.status == "queued":
                self._renew(bed, kubelet, job, polls)

    def _renew(self, bed: Any, kubelet: Any, job: str, polls: int) -> None:
        from ce_k8s.sim.condor.schedd import eval_int, eval_str

        source = bed.schedd.get(job)
        rj = bed.router.jobs.get(job)
        routed = bed.schedd.get(rj.dest_key) if rj is not None and rj.dest_key else None
        if source is None or routed is None or eval_int(routed, "JobStatus") != 2:
            return
        pod, namespace = eval_str(routed, "K8sPodName"), eval_str(routed, "K8sPodNamespace")
        proxy = eval_str(source, "x509userproxy")
        if not pod or not namespace or not proxy or kubelet.mounted_files(namespace, pod) is None:
            return
        content = f"-----BEGIN CERTIFICATE-----\nrenewed proxy of {job} at poll {polls}\n-----END CERTIFICATE-----\n"
        path = Path(proxy)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(content)
        tmp.chmod(0o600)
        os.replace(tmp, path)
        bed.schedd.set_attributes(job, {"x509UserProxyExpiration": int(time.time()) + 86400}, as_user=False)
        self.renewals[job] = Renewal(job, pod, namespace, content.encode(), polls, time.monotonic())

    def summary(self) -> dict[str, object]:
        """`credentials_renewed` (proxies replaced mid-run), `credentials_refreshed` (pods whose
        mounted Secret showed the new proxy), `credentials_all_seen`, and the worst delay."""
        seen = [r for r in self.renewals.values() if r.seen_poll is not None]
        return {
            "credentials_renewed": len(self.renewals),
            "credentials_refreshed": len(seen),
            "credentials_pod_ended_first": sum(1 for r in self.renewals.values() if r.ended),
            "credentials_all_seen": len(seen) == len(self.renewals),
            "credential_refresh_polls_max": max((r.seen_poll - r.poll for r in seen), default=0),
            "credential_refresh_s_max": round(max((r.seen_at - r.at for r in seen), default=0.0), 2),
        }
