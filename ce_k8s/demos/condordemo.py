"""Pilots through the real HTCondor test bed (`ce-k8s demo --condor real [--factory]`).

The pilots of `ce_k8s.sim.pilots` are submitted with the real `condor_submit`: to the CE schedd
with `-spool` by their pilot accounts (as the CE's own Condor-C receiver leaves them), or, with
`--factory`, by the factory account on the factory schedd as `universe = grid`,
`grid_resource = condor <CE schedd> <CE collector>`, with a token file in the input sandbox, as
GlideinWMS submits. The real job router routes them, our hooks and agent run them as pods on the
emulated cluster, and this module plays the factory: it evicts the first pod of the pilots
marked for it (through the API, as a drain would), collects completed pilots' output
(`condor_transfer_data`, or the factory's own HTCondor-C stage-out) and removes held ones. A pilot
the CE removed (HTCondor-CE's no-retry policy after an eviction) is counted as removed, with the
CE's reason (`ce_k8s.sim.outcomes`); the run ends once every pilot has an outcome.

The summary has the keys of the emulated demo (`ce_k8s.sim.testbed.TestBed.summary`) that
mean the same here, plus `factory_*` when the factory submitted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ce_k8s.real.condor.condor import RealCondor
from ce_k8s.sim.outcomes import COMPLETED, HELD, JOB_HELD, LOST, QUEUED, REMOVED, ce_job_id, classify
from ce_k8s.sim.pilots import Pilot

log = logging.getLogger(__name__)

# Submit-file lines for the attributes a pilot's shape sets (make_pilot), as a factory entry sets them.
SHAPE_ATTRS = ("xcount", "maxMemory", "maxWallTime", "RequestGPUs", "WantWholeNode", "GlideinEntryName",
               "GlideinFactory", "GlideinClient", "GlideinFrontendName")
PILOT_SCRIPT = "#!/bin/sh\n# demo glidein: the kubelet simulator plays DemoScenario instead\nexit 0\n"
# The glidein a pilot on a real node runs (busybox sh, as the pilot account, the restricted
# profile): it does what a glidein does first, in small (its token readable from the sandbox, the
# node and the CPUs it was given), burns a second of CPU, works for `-run` seconds, ends on
# SIGTERM as a glidein does (143), and exits with the pilot's code.
REAL_PILOT_SCRIPT = """#!/bin/sh
index=; code=0; run=1
while [ $# -gt 0 ]; do
  case "$1" in -index) index=$2; shift;; -exit) code=$2; shift;; -run) run=$2; shift;; esac
  shift
done
trap 'echo "glidein $index stderr: SIGTERM" >&2; exit 143' TERM
if [ ! -r "$IDTOKENS_FILE" ]; then echo "glidein $index stderr: no token at $IDTOKENS_FILE" >&2; exit 2; fi
echo "glidein $index ran on node $CE_K8S_NODE_NAME as uid $(id -u) with $(nproc) cpu(s) in $PWD"
end=$(( $(date +%s) + 1 )); while [ "$(date +%s)" -lt "$end" ]; do :; done
sleep "$run" & wait $!
echo "glidein $index stderr: done" >&2
exit "$code"
"""
STATUS_ATTRS = ("ClusterId", "ProcId", "JobStatus", "ExitCode", "HoldReason", "HoldReasonCode", "DemoIndex",
                "JobFinishedHookDone", "RemoveReason", "GridJobId")


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class RealOutcome:
    pilot: Pilot
    index: int
    job: str = ""            # the job the submitter knows (CE source job, or the factory's job)
    status: str = QUEUED     # queued | completed | held | removed | lost (ce_k8s.sim.outcomes)
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    hold_reason: str = ""
    remove_reason: str = ""


class RealDemo:
    """Submit, evict, collect and count, over a running :class:`RealCondor`."""

    def __init__(self, env: RealCondor, factory: bool = False, restart_agent: bool = False,
                 scitokens_file: str | None = None, real_node_share: float = 0.0) -> None:
        self.env = env
        # This share of the pilots (cpu shapes, one CPU each) goes to the bed's real nodes, where
        # REAL_PILOT_SCRIPT runs in a container (the DemoRealNode route transform of ce_k8s.real.condor.condor).
        self.real_node_share = real_node_share
        self.real_nodes: set[int] = set()
        self.real_pods: dict[str, dict[str, float]] = {}      # pod name -> created, started (epoch s)
        self.node_cpu_start: float | None = None
        self.factory = factory
        # The factory's grid jobs authenticate to the CE with this SciToken (`scitokens_file`, as a
        # GlideinWMS factory submits: one C-GAHP per token), not the factory account's IDTOKEN.
        self.scitokens_file = scitokens_file
        # SIGKILL the agent once, when half the pilots have pods: condor_master starts a new one,
        # which must rebuild from a relist and lose, rerun or leave nothing.
        self.restart_agent = restart_agent
        self.agent_restarts = 0
        self.outcomes: dict[str, RealOutcome] = {}
        self.evicted: set[str] = set()
        self.started = 0.0
        self.workdir = env.state_dir / "submit" / ("factory" if factory else "ce") / str(int(time.time() * 1000))
        self.workdir.mkdir(parents=True)
        self.workdir.chmod(0o777)  # the pilot accounts write their output here

    # ------------------------------------------------------------------ submission
    def submit_description(self, pilots: list[tuple[int, Pilot]]) -> str:
        """One submit description for pilots of one shape: shared lines, then one queue statement.

        One `queue DemoIndex,DemoScenario from (...)` with a line per pilot, not a queue statement per
        pilot: HTCondor 25's condor_submit refuses a second queue statement ("Extra data found after
        queue statement": SUBMIT_PREVENT_MULTI_QUEUE defaults to true, submit.cpp; 23.9 only warned
        that multiple queue statements are deprecated). The last variable takes the rest of the
        line, so a scenario's spaces survive; scenarios have no double quotes (ce_k8s.sim.pilots).
        """
        first = pilots[0][1]
        real = pilots[0][0] in self.real_nodes
        lines = ["executable = pilot.sh", "arguments = -v std -name gfactory_instance",
                 "transfer_input_files = idtoken", "should_transfer_files = YES", "when_to_transfer_output = ON_EXIT",
                 f"request_cpus = {first.ad.get('RequestCpus', 1)}",
                 f"request_memory = {first.ad.get('RequestMemory', 2048)}"]
        if real:         # one CPU and a little memory: the real node has two cores
            lines = ["executable = pilot-real.sh",
                     "arguments = -v std -name gfactory_instance -index $(DemoIndex) -exit $(DemoExit) -run $(DemoRun)",
                     'environment = "IDTOKENS_FILE=idtoken"', *lines[2:5], "request_cpus = 1", "request_memory = 128",
                     "+DemoRealNode = true"]
        if self.factory:
            lines = ["universe = grid", f"grid_resource = {self.env.grid_resource}",
                     *lines]
            if self.scitokens_file:
                lines.append(f"scitokens_file = {self.scitokens_file}")
        else:
            lines = ["universe = vanilla", *lines]
        for name in SHAPE_ATTRS:
            if name in first.ad and not (real and name in ("xcount", "maxMemory", "RequestGPUs", "WantWholeNode")):
                lines.append(f"+{name} = {_literal(first.ad[name])}")
        lines += ['+DemoScenario = "$(DemoScenario)"', "+DemoIndex = $(DemoIndex)",
                  "output = p$(DemoIndex).out", "error = p$(DemoIndex).err",
                  f"queue DemoIndex,{'DemoExit,DemoRun,' if real else ''}DemoScenario from ("]
        for index, pilot in pilots:
            if '"' in pilot.scenario or "\n" in pilot.scenario:
                raise ValueError(f"pilot {index}: a scenario cannot hold a double quote or a newline")
            extra = f"{pilot.exit_code} {self.real_run_seconds(pilot)} " if real else ""
            lines.append(f"{index} {extra}{pilot.scenario}")
        lines.append(")")
        return "\n".join(lines) + "\n"

    @staticmethod
    def real_run_seconds(pilot: Pilot, time_scale: float = 0.05) -> int:
        """How long a pilot works on a real node: its scenario's `run=` at the bed's pace (kwok's
        time scale), 1 to 10 s (a pilot marked for eviction runs ten times longer)."""
        match = re.search(r"\brun=([0-9.]+)s\b", pilot.scenario)
        run = float(match.group(1)) if match else 20.0
        return max(1, min(10, round(run * time_scale)))

    def choose_real_nodes(self, pilots: list[Pilot]) -> set[int]:
        """The pilots that go to the real nodes: every k-th of the CPU shapes, at least one."""
        if self.real_node_share <= 0:
            return set()
        cpu = [i for i, p in enumerate(pilots) if p.shape in ("cpu1", "cpu8")]
        want = max(1, round(self.real_node_share * len(pilots)))
        step = max(1, len(cpu) // want)
        return set(cpu[::step][:want])

    def submit(self, pilots: list[Pilot]) -> None:
        (self.workdir / "pilot.sh").write_text(PILOT_SCRIPT)
        (self.workdir / "pilot.sh").chmod(0o755)
        (self.workdir / "pilot-real.sh").write_text(REAL_PILOT_SCRIPT)
        (self.workdir / "pilot-real.sh").chmod(0o755)
        self.real_nodes = self.choose_real_nodes(pilots)
        (self.workdir / "idtoken").write_text("eyJhbGciOiJub25lIn0.e30.\n")   # a token file, as the factory sends
        (self.workdir / "idtoken").chmod(0o644)
        groups: dict[tuple[str, str], list[tuple[int, Pilot]]] = {}
        for index, pilot in enumerate(pilots):
            owner = "gfactory" if self.factory else pilot.owner
            shape = "real-node" if index in self.real_nodes else pilot.shape
            groups.setdefault((owner, shape), []).append((index, pilot))
        self.started = time.monotonic()
        self.node_cpu_start = self.node_cpu_seconds()
        for (owner, shape), members in groups.items():
            sub = self.workdir / f"{shape}.{owner}.sub"
            sub.write_text(self.submit_description(members))
            args = ["condor_submit", "-terse", sub.name]
            if self.factory:
                args[1:1] = ["-name", self.env.factory_name]
            else:
                args.insert(1, "-spool")
            out = self.env.run(args, user=owner, cwd=str(self.workdir), timeout=300).stdout.strip()
            first, _, last = out.partition(" - ")
            cluster = int(first.split(".")[0])
            procs = range(int(first.split(".")[1]), int(last.split(".")[1]) + 1)
            for (index, pilot), proc in zip(members, procs, strict=True):
                self.outcomes[f"{cluster}.{proc}"] = RealOutcome(pilot, index, f"{cluster}.{proc}")

    # ------------------------------------------------------------------ driving
    def _schedd_args(self) -> list[str]:
        return ["-name", self.env.factory_name] if self.factory else []

    def _ads(self, command: str, schedd_args: list[str], constraint: str | None = None) -> dict[str, dict]:
        """`condor_q` or `condor_history` as JSON ads by `cluster.proc` (none when the command fails)."""
        args = [command, "-json", *schedd_args, "-attributes", ",".join(STATUS_ATTRS)]
        if command == "condor_q":
            args.insert(1, "-allusers")
        if constraint is not None:
            args += ["-constraint", constraint]
        text = self.env.run(args, check=False, timeout=60).stdout.strip()
        ads = json.loads(text) if text.startswith("[") else []
        return {f"{ad['ClusterId']}.{ad['ProcId']}": ad for ad in ads}

    def _jobs(self) -> dict[str, dict]:
        return self._ads("condor_q", self._schedd_args())

    def _history(self) -> dict[str, dict]:
        return self._ads("condor_history", self._schedd_args())

    def _ce_ads(self, ids: set[str]) -> dict[str, dict]:
        """The CE's ads (queue, else history) of these CE jobs: what became of a factory's held
        pilots there. One query of each for all of them."""
        if not ids:
            return {}
        constraint = " || ".join(f"(ClusterId == {c} && ProcId == {p})"
                                 for c, p in (i.split(".") for i in sorted(ids)))
        found = self._ads("condor_history", [], constraint)
        found.update(self._ads("condor_q", [], constraint))
        return found

    def _evict(self) -> None:
        """Evict the first pod of each pilot marked for it, once that pod runs (policy/v1 Eviction)."""
        from kubernetes.client.rest import ApiException

        todo = {o.index for o in self.outcomes.values() if o.pilot.evicted and o.status == QUEUED} - \
            {int(i) for i in self.evicted}
        if not todo:
            return
        core = self.env.core_api()
        pods = core.list_pod_for_all_namespaces(label_selector="app.kubernetes.io/managed-by=ce-k8s").items
        for pod in pods:
            scenario = (pod.metadata.annotations or {}).get("sim.ce-k8s.io/scenario", "")
            index = next((o.index for o in self.outcomes.values()
                          if o.index in todo and o.pilot.scenario == scenario), None)
            if index is None or pod.status.phase != "Running":
                continue
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace}}
            try:
                core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body,
                                                    _request_timeout=5)
            except ApiException as exc:
                if exc.status != 404:
                    continue
            self.evicted.add(str(index))

    def _collect(self, job: str, outcome: RealOutcome, ad: dict, ce_ad: dict | None = None) -> None:
        """Record the pilot's outcome, if its ad shows one, and do what a factory does with it:
        stage out a completed pilot's output, remove a held one (`ce_ad`: the CE's ad of a factory
        job's CE job, which tells a hold from a removal by the CE)."""
        verdict = classify(ad, ce_ad)
        owner = "gfactory" if self.factory else outcome.pilot.owner
        if verdict.status == COMPLETED:
            if not self.factory:
                self.env.run(["condor_transfer_data", job], user=owner, cwd=str(self.workdir), check=False)
                self.env.run(["condor_rm", job], user=owner, check=False)
            outcome.status = COMPLETED
            outcome.exit_code = ad.get("ExitCode")
            for stream in ("out", "err"):
                path = self.workdir / f"p{outcome.index}.{stream}"
                setattr(outcome, "stdout" if stream == "out" else "stderr",
                        path.read_text(errors="replace") if path.exists() else "")
        elif verdict.status in (HELD, REMOVED):
            outcome.status = verdict.status
            if verdict.status == HELD:
                outcome.hold_reason = verdict.reason
            else:
                outcome.remove_reason = verdict.reason
            if ad.get("JobStatus") == JOB_HELD:
                self.env.run(["condor_rm", *self._schedd_args(), job], user=owner, check=False)

    def run(self, timeout: float = 600, progress=None) -> None:
        """Poll until every pilot has an outcome (completed, held or removed); those still without
        one at `timeout` are lost."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queued = [j for j, o in self.outcomes.items() if o.status == QUEUED]
            if not queued:
                return
            self._turn(queued)
            self._evict()
            self._see_real_pods()
            self._maybe_restart_agent(progress)
            if progress is not None:
                counts = Counter(o.status for o in self.outcomes.values())
                progress(f"[{time.monotonic() - self.started:6.1f}s] completed {counts[COMPLETED]}/"
                         f"{len(self.outcomes)} held {counts[HELD]} removed {counts[REMOVED]} "
                         f"pods {self.stats()['pods']['pods_created']}")
            if any(o.status == QUEUED for o in self.outcomes.values()):
                time.sleep(1.0)
        for o in self.outcomes.values():
            if o.status == QUEUED:
                o.status = LOST

    def _turn(self, queued: list[str]) -> None:
        """One look at the submitter's queue (and history, for jobs that left it) for the pilots
        without an outcome; for a factory's held jobs, at the CE's ads of the jobs they became."""
        jobs = self._jobs()
        missing = [j for j in queued if j not in jobs]
        history = self._history() if missing else {}
        ads = {job: ad for job in queued if (ad := jobs.get(job) or history.get(job)) is not None}
        held = {ce_job_id(ad) for ad in ads.values() if self.factory and ad.get("JobStatus") == JOB_HELD}
        ce_ads = self._ce_ads({i for i in held if i})
        for job, ad in ads.items():
            self._collect(job, self.outcomes[job], ad, ce_ads.get(ce_job_id(ad) or ""))

    def _kube(self):
        """The real control plane under the CE (ce_k8s.real.kube.kube.RealKube), or None."""
        server = getattr(self.env, "kube_server", None)
        return getattr(server, "env", None) if server is not None else None

    def node_cpu_seconds(self) -> float | None:
        """CPU seconds the real nodes' own kubelet and containerd have used (shims come and go
        with their pods and are not counted)."""
        kube = self._kube()
        state = kube.state() if kube is not None else None
        if state is None or not state.real_nodes:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for node in state.real_nodes:
            for name in ("kubelet", "containerd"):
                with contextlib.suppress(OSError, KeyError, IndexError):
                    fields = Path(f"/proc/{node['pids'][name]}/stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / ticks
        return total

    def _see_real_pods(self) -> None:
        """Note when each pod on a real node was created and when its container started (the API's
        whole seconds): the start latency the summary gives."""
        kube = self._kube()
        if kube is None or not self.real_nodes:
            return
        core = self.env.core_api()
        pods = core.list_pod_for_all_namespaces(label_selector="app.kubernetes.io/managed-by=ce-k8s",
                                                field_selector=None).items
        names = set(kube.real_node_names())
        for pod in pods:
            if pod.spec.node_name not in names or pod.metadata.name in self.real_pods:
                continue
            for cs in pod.status.container_statuses or []:
                started = cs.state.running.started_at if cs.state.running else (
                    cs.state.terminated.started_at if cs.state.terminated else None)
                if started is not None:
                    self.real_pods[pod.metadata.name] = {"created": pod.metadata.creation_timestamp.timestamp(),
                                                         "started": started.timestamp(), "node": pod.spec.node_name}

    def real_node_summary(self) -> dict[str, object]:
        mine = [o for o in self.outcomes.values() if o.index in self.real_nodes]
        starts = sorted(p["started"] - p["created"] for p in self.real_pods.values())
        end = self.node_cpu_seconds()
        cpu = round(end - self.node_cpu_start, 2) if end is not None and self.node_cpu_start is not None else None
        return {
            "pilots": len(mine),
            "completed": sum(1 for o in mine if o.status == COMPLETED),
            "exit_codes_right": sum(1 for o in mine if o.status == COMPLETED and o.exit_code == o.pilot.exit_code),
            "stdout_returned": sum(1 for o in mine if o.status == COMPLETED
                                   and f"glidein {o.index} ran on node " in o.stdout),
            # stderr comes back in the stdout file: the log is one stream without the split gate
            "stderr_returned": sum(1 for o in mine if o.status == COMPLETED
                                   and f"glidein {o.index} stderr: done" in o.stdout + o.stderr),
            "pods_seen": len(self.real_pods),
            "create_to_running_s": ({"mean": round(sum(starts) / len(starts), 2), "max": starts[-1]}
                                    if starts else None),
            "node_cpu_s": cpu,
            "node_cpu_s_per_pilot": round(cpu / len(mine), 3) if cpu is not None and mine else None,
        }

    def _maybe_restart_agent(self, progress=None) -> None:
        if not self.restart_agent or self.agent_restarts:
            return
        if self.stats()["pods"]["pods_created"] < max(1, len(self.outcomes) // 2):
            return
        pids = self.env.agent_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if pids:
            self.agent_restarts += 1
            if progress is not None:
                progress(f"agent killed (pid {', '.join(map(str, pids))}); condor_master starts a new one")

    def stats(self) -> dict:
        if self.env.kube_server is not None:     # a real control plane: counted from outside
            return self.env.kube_server.stats()
        state = json.loads((self.env.state_dir / "state.json").read_text())
        with urllib.request.urlopen(f"{state['api_url']}/_sim/stats", timeout=30) as resp:  # noqa: S310 - ours
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def drain(self, timeout: float = 120) -> dict:
        """Until no ce-k8s pod or Secret is left on the cluster (cleanup hooks, the agent's GC)."""
        deadline = time.monotonic() + timeout
        stats = self.stats()
        while (stats["pods_left"] or stats["secrets_left"]) and time.monotonic() < deadline:
            time.sleep(1.0)
            stats = self.stats()
        return stats

    def summary(self, stats: dict) -> dict[str, object]:
        counts = Counter(o.status for o in self.outcomes.values())
        wall = time.monotonic() - self.started
        pods = stats["pods"]
        out: dict[str, object] = {
            "condor": "real",
            "pilots": len(self.outcomes),
            "completed": counts[COMPLETED],
            "held": counts[HELD],
            "removed": counts[REMOVED],
            "remove_reasons": dict(Counter(o.remove_reason for o in self.outcomes.values()
                                           if o.status == REMOVED)),
            "lost": counts[LOST] + counts[QUEUED],
            "pods_created": pods["pods_created"],
            "duplicate_pods": pods["recreated"] + pods["overlapping"],
            "pods_left": stats["pods_left"],
            "secrets_left": stats["secrets_left"],
            "evicted": len(self.evicted),
            "agent_restarts": self.agent_restarts,
            "wall_s": round(wall, 1),
            "pilots_per_s": round(counts[COMPLETED] / wall, 3) if wall > 0 else 0.0,
            "exit_codes_right": sum(1 for o in self.outcomes.values()
                                    if o.status == COMPLETED and o.exit_code == o.pilot.exit_code),
            "stdout_returned": sum(1 for o in self.outcomes.values()
                                   if o.status == COMPLETED and f"glidein {o.index} ran" in o.stdout),
            "stderr_returned": sum(1 for o in self.outcomes.values()
                                   if o.status == COMPLETED and f"glidein {o.index} stderr" in o.stderr),
            "blah_calls_k8s": _count_blah(self.env.blah_log, "k8s_"),
        }
        if self.real_nodes:
            out["real_node"] = self.real_node_summary()
        if self.factory:
            out["factory_completed"] = counts[COMPLETED]
            out["factory_held"] = counts[HELD]
            out["factory_removed"] = counts[REMOVED]
        return out


def _count_blah(path: Path, prefix: str) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.split()[1:2] and
                   line.split()[1].startswith(prefix))
    except OSError:
        return 0
