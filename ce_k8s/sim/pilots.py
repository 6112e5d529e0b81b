"""GlideinWMS-shaped pilot job ads, as they sit in a CE's queue after Condor-C (htcondor-ce.md §6).

The demo, the end-to-end tests and the benchmarks need pilots that look like what a factory
really submits, so that the shipped routes and the CE's default transforms see the attributes
they key on: ``xcount``/``maxMemory``/``maxWallTime`` from the entry's submit_attrs,
``RequestGPUs`` or ``WantWholeNode`` for special entries, token or proxy identity, the
``Glidein*`` bookkeeping, ``Out``/``Err`` as ``_condor_stdout``/``_condor_stderr`` and Condor-C's
``LeaveJobInQueue``. Values follow the illustrative ad of htcondor-ce.md §6.3; they are not secrets.

Each pilot also carries ``DemoScenario``: what its pod will do in the kubelet simulator
(``ce_k8s.sim.kube.scenario`` grammar, no double quotes so it survives ``$(MY.DemoScenario)``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import classad2

# (shape, weight): the mix a busy multi-VO CE sees; each shape is taken by a shipped route.
SHAPES: tuple[tuple[str, int], ...] = (("cpu8", 55), ("cpu1", 20), ("cms", 15), ("gpu", 6), ("wholenode", 4))
OWNERS = {"cpu8": "osg01", "cpu1": "osg01", "cms": "cmspilot", "gpu": "osggpu", "wholenode": "atlaspilot"}
CMS_ISSUER = "https://cms-auth.web.cern.ch/"


@dataclass(frozen=True)
class Pilot:
    """One generated pilot: its shape, the scenario its pod plays and the ad to submit."""

    shape: str
    owner: str
    scenario: str
    exit_code: int
    evicted: bool
    ad: dict[str, object]


def _scenario(index: int, run_s: float, exit_code: int, evict: bool) -> str:
    out = f"stdout='glidein {index} starting' stdout='glidein {index} ran {run_s:g}s' stderr='glidein {index} stderr'"
    if evict:
        # Long enough for the test bed to evict the first pod through the API (policy/v1 Eviction).
        return f"run={run_s * 10:g}s exit={exit_code} {out}"
    return f"run={run_s:g}s exit={exit_code} {out}"


def make_pilot(index: int, shape: str, run_s: float = 20.0, evict: bool = False, exit_code: int = 0) -> Pilot:
    """A pilot of ``shape`` as Condor-C hands it to the CE, before the schedd spools its sandbox.

    ``Cmd``, ``Iwd`` and ``x509userproxy`` are relative here; :func:`spool_sandbox` moves them
    into the job's spool directory once the job has an id, as the CE schedd does.
    """
    owner = OWNERS[shape]
    entry = f"OSG_US_EXAMPLE_CE1_{shape}"
    now = int(time.time())
    ad: dict[str, object] = {
        "JobUniverse": 5,
        "Owner": owner,
        "Cmd": "glidein_startup.sh",
        "Arguments": (f"-v std -name gfactory_instance -entry {entry} -clientname OSG_flock.main "
                      f"-schedd schedd_glideins3@gfactory-2.example.org -factory OSG -dir OSG "
                      f"-slotslayout partitionable -submitcredid {1000 + index}"),
        "Environment": "IDTOKENS_FILE=idtoken LOG_RECIPIENTS=''",
        "Out": "_condor_stdout",
        "Err": "_condor_stderr",
        "TransferOutputRemaps": (f"_condor_stdout=/var/log/gwms-factory/client/job.{index}.0.out;"
                                 f"_condor_stderr=/var/log/gwms-factory/client/job.{index}.0.err"),
        "TransferOutput": "",
        "TransferInput": "idtoken",
        "WhenToTransferOutput": "ON_EXIT",
        "ShouldTransferFiles": "YES",
        "x509userproxy": "x509up",
        "JobLeaseDuration": 2400,
        "StageInStart": now + 1,
        "StageInFinish": now + 40,
        "SubmitterId": "gfactory-2.example.org",
        "SubmitterGlobalJobId": f"schedd_glideins3@gfactory-2.example.org#{98765 + index}.0#{now}",
        "TimerRemove": now + 86400,  # the factory's lease: stays after completion until staged out
        "LeaveJobInQueue": classad2.ExprTree("JobStatus == 4 && ( time() < TimerRemove )"),
        "JobNotification": 0,
        "RequestCpus": 1,
        "RequestMemory": 2048,
        "RequestDisk": 1000000,
        "maxWallTime": 2880,
        "GlideinFactory": "OSG",
        "GlideinName": "gfactory_instance",
        "GlideinEntryName": entry,
        "GlideinClient": "OSG_flock.main",
        "GlideinFrontendName": "OSG_flock:main",
        "GlideinCredentialIdentifier": str(1000 + index),
        "GlideinSecurityClass": "frontend",
        "GlideinWebBase": "https://gfactory-2.example.org/factory/stage",
        "GlideinLogNr": "20251020",
        "GlideinWorkDir": "OSG",
        "GlideinSlotsLayout": "partitionable",
        "GlideinMaxWalltime": 171000,
        "fename": "fe",
    }
    if shape == "cpu8":
        ad.update(xcount=8, maxMemory=16000)
    elif shape == "cpu1":
        ad.update(xcount=1, maxMemory=2500)
    elif shape == "cms":
        ad.update(xcount=8, maxMemory=16000, AuthTokenIssuer=CMS_ISSUER,
                  AuthTokenSubject=f"cms-pilot-{index}", AuthTokenScopes="compute.create,compute.read")
    elif shape == "gpu":
        ad.update(xcount=4, maxMemory=16000, RequestGPUs=1)
    elif shape == "wholenode":
        ad.update(WantWholeNode=True)
    scenario = _scenario(index, run_s, exit_code, evict)
    ad["DemoScenario"] = scenario
    return Pilot(shape, owner, scenario, exit_code, evict, ad)


def spool_paths(spool: Path, job: str) -> tuple[Path, Path]:
    """(job spool directory, copy_to_spool executable) of job ``C.P`` (spooled_job_files.cpp):
    ``$(SPOOL)/<C % 10000>/<P % 10000>/clusterC.procP.subproc0`` and
    ``$(SPOOL)/<C % 10000>/clusterC.ickpt.subproc0``."""
    cluster, proc = (int(x) for x in job.split("."))
    base = spool / str(cluster % 10000)
    return base / str(proc % 10000) / f"cluster{cluster}.proc{proc}.subproc0", base / f"cluster{cluster}.ickpt.subproc0"


def spool_sandbox(spool: Path, job: str) -> dict[str, str]:
    """Write what a spooled pilot has on the CE (the glidein script, a fake proxy, an IDTOKEN)
    and return the attribute values the schedd points at them (Iwd, Cmd, x509userproxy)."""
    iwd, ickpt = spool_paths(spool, job)
    iwd.mkdir(parents=True, exist_ok=True)
    ickpt.write_text("#!/bin/sh\n# demo glidein: the kubelet simulator plays DemoScenario instead\nexit 0\n")
    ickpt.chmod(0o755)
    proxy = iwd / "x509up"
    proxy.write_text("-----BEGIN CERTIFICATE-----\nZmFrZSBkZW1vIHByb3h5\n-----END CERTIFICATE-----\n")
    proxy.chmod(0o600)
    (iwd / "idtoken").write_text("eyJhbGciOiJub25lIn0.e30.\n")
    return {"Iwd": str(iwd), "Cmd": str(ickpt), "x509userproxy": str(proxy)}


def generate(count: int, seed: int = 1, evict_fraction: float = 0.0, run_s: float = 20.0,
             fail_fraction: float = 0.05, shapes: tuple[tuple[str, int], ...] = SHAPES) -> list[Pilot]:
    """``count`` pilots in a reproducible mix; a fraction is evicted once, a few exit non-zero."""
    rng = random.Random(seed)  # noqa: S311 - reproducible workload, not security
    names = [s for s, _ in shapes]
    weights = [w for _, w in shapes]
    pilots = []
    for index in range(count):
        shape = rng.choices(names, weights)[0]
        evict = rng.random() < evict_fraction
        exit_code = 1 if rng.random() < fail_fraction else 0
        pilot = make_pilot(index, shape, run_s=run_s * rng.uniform(0.5, 1.5), evict=evict,
                           exit_code=exit_code)
        pilots.append(pilot)
    return pilots
