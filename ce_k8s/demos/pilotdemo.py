"""Real pilots (`ce-k8s demo --kube real --condor real --pilot real`): a VO user's job through the
factory, the CE and a pod, end to end (issue 34; docs/demo.md, "Real pilots").

The VO's pool (ce_k8s.real.node.vopool: collector, negotiator and schedd in the real node's
network namespace) takes the users' jobs first. The factory then sends pilots over HTCondor-C to
the real CE (HTCondor 25 on HTCondor-CE's own configuration), as GlideinWMS does: an executable
that starts the pilot (here `exec /usr/local/bin/ce-k8s-pilot`, the pilot image's entry point, as
glidein_startup.sh starts a startd), the pool's token as an input file, the pool's address in the
environment. The CE's job router routes them on a Kubernetes route; the bed's `DemoPilotImage`
transform (ce_k8s.real.condor.condorconfig) names the pilot image (`Never`: no registry) and the
real node; the agent makes the pods. Each pilot's startd joins the VO pool, the pool's negotiator
matches the users' jobs to it, its schedd runs them in the pod, and the output goes back to the
users' directories; a pilot with no more work leaves after its idle time, exit 0, which the CE and
the factory see.

The driving is RealDemo's (ce_k8s.demos.condordemo: submit, poll the factory's queue, collect);
this module adds the VO side and the summary's `vo` part: per user job the pilot, pod, node, exit
code and seconds from submit to start; jobs per pilot; the pilots' exit codes and the CPU the CE's
accounting recorded for them.
"""

from __future__ import annotations

import json
import time
from collections import Counter

from ce_k8s.demos.condordemo import RealDemo, RealOutcome
from ce_k8s.real.condor.condor import RealCondor
from ce_k8s.real.node.vopool import JOBS, VOPool
from ce_k8s.sim.outcomes import COMPLETED
from ce_k8s.sim.pilots import make_pilot

#: The factory's executable: what glidein_startup.sh is to a GlideinWMS pilot, in one line.
PILOT_EXECUTABLE = ("#!/bin/sh\n# demo glidein: start the pilot image's entry point (docs/pilot.md)\n"
                    "exec /usr/local/bin/ce-k8s-pilot\n")
#: Where the pod builder puts a transferred input file for the pilot: the scratch directory (cwd).
TOKEN_IN_POD = "/ce-k8s/scratch/idtoken"  # noqa: S105 (a path)
#: A VO user's job: who and where it ran, then `$2` seconds of work.
USER_JOB = """#!/bin/sh
echo "user job $1: uid=$(id -u) host=$(hostname)"
sleep "$2"
"""
USER_DIR = "users"
JOB_ATTRS = ("ClusterId", "ProcId", "JobStatus", "ExitCode", "RemoteHost", "LastRemoteHost", "QDate",
             "JobStartDate", "CompletionDate")


class PilotDemo(RealDemo):
    """RealDemo with the factory's pilots running the pilot image against `pool`."""

    def __init__(self, env: RealCondor, pool: VOPool, *, user_jobs: int, job_seconds: int,
                 idle_seconds: int = 20, restart_agent: bool = False) -> None:
        super().__init__(env, factory=True, restart_agent=restart_agent)
        self.pool = pool
        self.user_jobs = user_jobs
        self.job_seconds = job_seconds
        self.idle_seconds = idle_seconds
        self.user_cluster: int | None = None

    def submit_users(self) -> int:
        """The users' jobs, into the VO pool before any pilot exists (as a frontend's demand)."""
        self.user_cluster = self.pool.submit(
            USER_DIR,
            "universe = vanilla\nexecutable = job.sh\narguments = $(Process) "
            f"{self.job_seconds}\noutput = job.$(Process).out\nerror = job.$(Process).err\nlog = jobs.log\n"
            "should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT\n"
            f"request_cpus = 1\nrequest_memory = 64\nrequest_disk = 10000\nqueue {self.user_jobs}\n",
            {"job.sh": USER_JOB})
        return self.user_cluster

    def submit(self, pilots) -> None:
        """The factory's pilots: one cluster over HTCondor-C to the CE, as a factory entry submits."""
        (self.workdir / "pilot-vo.sh").write_text(PILOT_EXECUTABLE)
        (self.workdir / "pilot-vo.sh").chmod(0o755)
        (self.workdir / "idtoken").write_text(self.pool.pilot_token() + "\n")
        (self.workdir / "idtoken").chmod(0o644)     # the factory account reads it; the CE puts it in a Secret
        self.real_nodes = set(range(len(pilots)))
        env = (f"CE_K8S_PILOT_COLLECTOR={self.pool.address} CE_K8S_PILOT_TOKEN_FILE={TOKEN_IN_POD} "
               f"CE_K8S_PILOT_IDLE_SECONDS={self.idle_seconds} CE_K8S_PILOT_UPDATE_INTERVAL=5")
        lines = ["universe = grid", f"grid_resource = {self.env.grid_resource}", "executable = pilot-vo.sh",
                 "transfer_input_files = idtoken", "should_transfer_files = YES",
                 "when_to_transfer_output = ON_EXIT", f'environment = "{env}"', "request_cpus = 1",
                 "request_memory = 512", "+DemoPilotImage = true", "+DemoIndex = $(Process)",
                 "output = p$(Process).out", "error = p$(Process).err", f"queue {len(pilots)}"]
        sub = self.workdir / "pilots.sub"
        sub.write_text("\n".join(lines) + "\n")
        self.started = time.monotonic()
        self.node_cpu_start = self.node_cpu_seconds()
        out = self.env.run(["condor_submit", "-terse", "-name", self.env.factory_name, sub.name], user="gfactory",
                           cwd=str(self.workdir), timeout=300).stdout.strip()
        first, _, last = out.partition(" - ")
        cluster = int(first.split(".")[0])
        for index, proc in enumerate(range(int(first.split(".")[1]), int(last.split(".")[1]) + 1)):
            self.outcomes[f"{cluster}.{proc}"] = RealOutcome(pilots[index], index, f"{cluster}.{proc}")

    @staticmethod
    def pilots(count: int):
        """The pilots' expectations: each leaves idle, exit code 0."""
        return [make_pilot(i, "cpu1", exit_code=0) for i in range(count)]

    # ------------------------------------------------------------------ the summary
    def _user_ads(self) -> list[dict]:
        return self.pool.jobs(self.user_cluster, JOB_ATTRS) if self.user_cluster is not None else []

    def wait_for_users(self, timeout: float) -> None:
        """Until every user job has left the VO pool's queue (done), or `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ads = self._user_ads()
            if ads and all(ad.get("JobStatus") == 4 for ad in ads):
                return
            time.sleep(2.0)

    def _ce_accounting(self) -> dict[str, dict]:
        """The CE's record of each routed pilot (the routed job's history): pod → its CPU and node."""
        text = self.env.run(["condor_history", "-json", "-constraint", "DemoPilotImage =?= true && "
                             "RoutedFromJobId =!= undefined", "-attributes",
                             "K8sPodName,K8sNodeName,RemoteUserCpu,RemoteSysCpu,K8sCpuUsageKnown,ExitCode"],
                            check=False, timeout=60).stdout.strip()
        ads = json.loads(text) if text.startswith("[") else []
        return {ad["K8sPodName"]: ad for ad in ads if ad.get("K8sPodName")}

    def real_node_summary(self) -> dict[str, object]:
        """RealDemo's real-node part, for real pilots: the VO side (`vo`)."""
        ads = sorted(self._user_ads(), key=lambda a: a.get("ProcId", 0))
        accounting = self._ce_accounting()
        jobs = []
        for ad in ads:
            host = ad.get("RemoteHost") or ad.get("LastRemoteHost") or ""
            pod = host.split("@")[1] if host.count("@") >= 1 else None
            jobs.append({
                "job": f"{ad['ClusterId']}.{ad['ProcId']}", "pilot": host or None, "pod": pod,
                "node": (accounting.get(pod or "") or {}).get("K8sNodeName") or self.real_pods.get(pod or "", {}).get(
                    "node"),
                "exit_code": ad.get("ExitCode"),
                "submit_to_start_s": (ad["JobStartDate"] - ad["QDate"]) if ad.get("JobStartDate") else None})
        starts = sorted(j["submit_to_start_s"] for j in jobs if j["submit_to_start_s"] is not None)
        outputs = sum(1 for ad in ads if self._user_output(ad))
        mine = list(self.outcomes.values())
        cpu = [a.get("RemoteUserCpu", 0) + a.get("RemoteSysCpu", 0) for a in accounting.values()]
        return {
            "pilots": len(mine),
            "pilots_completed": sum(1 for o in mine if o.status == COMPLETED),
            "pilot_exit_codes": dict(Counter(str(o.exit_code) for o in mine if o.status == COMPLETED)),
            "pilot_pods_seen": len(self.real_pods),
            "user_jobs": len(ads),
            "user_jobs_completed": sum(1 for ad in ads if ad.get("JobStatus") == 4),
            "user_jobs_exit_0": sum(1 for ad in ads if ad.get("JobStatus") == 4 and ad.get("ExitCode") == 0),
            "user_outputs_returned": outputs,
            "jobs_per_pilot": dict(Counter(j["pod"] for j in jobs if j["pod"])),
            "submit_to_start_s": ({"min": starts[0], "mean": round(sum(starts) / len(starts), 1), "max": starts[-1]}
                                  if starts else None),
            "pilot_cpu_s_accounted": ({"pilots": len(cpu), "total": round(sum(cpu), 2),
                                       "known": sum(1 for a in accounting.values() if a.get("K8sCpuUsageKnown"))}
                                      if accounting else None),
            "jobs": jobs,
        }

    def _user_output(self, ad: dict) -> bool:
        """The job's output came back to the user, naming the pod it ran in, as uid 1000."""
        proc = ad.get("ProcId", 0)
        path = self.pool.rootfs / JOBS.lstrip("/") / USER_DIR / f"job.{proc}.out"
        text = path.read_text(errors="replace") if path.exists() else ""
        return f"user job {proc}: uid=1000 host=" in text
