"""The real-HTCondor bed's configuration text: the test bed's layer over ce-k8s's shipped files,
the batch pool's, the agent's knobs, and the BLAH recorders.

Pure functions of the state directory (and the poll interval, the interpreter, the batch flag),
so the configuration can be read and tested without a root (tests/real/test_realcondor_batch.py).
"""

from __future__ import annotations

from pathlib import Path

from ce_k8s.real.condor.condorlayout import (
    BATCH_SCHEDD,
    BATCH_SLOT_MEMORY,
    BATCH_SLOTS,
    CE_SCHEDD,
    COLLECTOR_PORT,
    FACTORY_SCHEDD,
    HOOK_DIR,
)

#: Authentication and authorization among the test accounts of one root (loopback only): the
#: default bed's whole CE and the stock mode's factory host (ce_k8s.real.condor.stockce), never its CE.
LOCAL_TRUST = """\
SEC_DEFAULT_AUTHENTICATION_METHODS = FS, CLAIMTOBE
SEC_CLIENT_AUTHENTICATION_METHODS = FS, CLAIMTOBE
ALLOW_READ = *
ALLOW_WRITE = *
ALLOW_NEGOTIATOR = *
ALLOW_ADMINISTRATOR = *
ALLOW_DAEMON = *
ALLOW_OWNER = *
QUEUE_SUPER_USERS = root, condor
"""


#: The pilot image's name (ce_k8s.real.node.pilotimage.PILOT_IMAGE, which this room may not import;
#: tests/real/node/test_pilot_real.py checks the two agree).
DEMO_PILOT_IMAGE = "ce-k8s.invalid/pilot:25.14.1"


def agent_and_demo_config(state: Path) -> str:
    """The agent's files in the state directory, and the DemoScenario transform: the same on the
    default bed and on the CE's own configuration (ce_k8s.real.condor.stockce)."""
    return f"""\
CE_K8S_HOOK_DIR = {HOOK_DIR}
CE_K8S_SOCKET = {state}/run/agent.sock
CE_K8S_SPOOL = {state}/spool
CE_K8S_OUTPUT_DIR = {state}/output
CE_K8S_KUBECONFIG = {state}/kubeconfig
CE_K8S_CE_NAME = real-condor-testbed
CE_K8S_METRICS_ADDRESS =
# the wrapper already appends the agent's stderr to $(LOG)/CeK8sAgentLog: no second writer
CE_K8S_AGENT_LOG = none
CE_K8S_GC_GRACE = 30
CE_K8S_HOOK_TIMEOUT = 30
# The emulator's kubelets answer the Summary API at the API server's node proxy only (docs/testbed.md).
CE_K8S_USAGE_SOURCE = proxy

# The kubelet simulator plays each pilot's DemoScenario (ce_k8s.sim.pilots).
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES) DemoScenario
JOB_ROUTER_TRANSFORM_DemoScenario @=jrt
    REQUIREMENTS DemoScenario isnt undefined
    SET K8sAnnotations [ 'sim.ce-k8s.io/scenario' = "$(MY.DemoScenario)" ]
@jrt

# A pilot the demo sends to a real node (ce_k8s.real.node.node) runs its own glidein script in busybox,
# the one image the node has; only pods that select and tolerate the real node land there.
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES) DemoRealNode
JOB_ROUTER_TRANSFORM_DemoRealNode @=jrt
    REQUIREMENTS DemoRealNode is true
    SET K8sImage "ce-k8s.invalid/busybox:1.35"
    SET K8sNodeSelector [ 'ce-k8s.test/real-node' = "true" ]
    SET K8sTolerations {{ [ key = "ce-k8s.test/real-node"; operator = "Exists"; effect = "NoSchedule" ] }}
@jrt

# A real pilot (`ce-k8s demo --pilot real`; docs/pilot.md): the pilot image, imported into the real
# node (no registry: Never), whose entry point the factory's executable starts.
JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES = $(JOB_ROUTER_POST_ROUTE_TRANSFORM_NAMES) DemoPilotImage
JOB_ROUTER_TRANSFORM_DemoPilotImage @=jrt
    REQUIREMENTS DemoPilotImage is true
    SET K8sImage "{DEMO_PILOT_IMAGE}"
    SET K8sImagePullPolicy "Never"
    SET K8sNodeSelector [ 'ce-k8s.test/real-node' = "true" ]
    SET K8sTolerations {{ [ key = "ce-k8s.test/real-node"; operator = "Exists"; effect = "NoSchedule" ] }}
@jrt
"""


def testbed_config(state: Path, poll: int, python_prefix: str, batch: bool = False) -> str:
    """The test bed's own layer over the shipped ce-k8s files (sorted last: `99-`); with `batch`, the
    batch pool's layer (`batch_config`) at its end, so that it overrides what it must."""
    return f"""\
# ce-k8s real-HTCondor test bed (ce_k8s/real/condor/condor.py; docs/real-condor.md).
CONDOR_HOST = 127.0.0.1
NETWORK_INTERFACE = 127.0.0.1
USE_SHARED_PORT = False
COLLECTOR_HOST = 127.0.0.1:{COLLECTOR_PORT}
DAEMON_LIST = MASTER, COLLECTOR, SCHEDD, JOB_ROUTER, FACTORY_SCHEDD, CE_K8S_AGENT
SCHEDD_NAME = {CE_SCHEDD}
SPOOL = {state}/spool
# Loopback only; every user on this root is a test account.
{LOCAL_TRUST}SCHEDD_INTERVAL = 5
SCHEDD_MIN_INTERVAL = 1
JOB_ROUTER_POLLING_PERIOD = {poll}
JOB_ROUTER_SCHEDD1_SPOOL = $(SPOOL)
# A completed routed job leaves the queue by the schedd's periodic-expression pass (it is
# "ScheddDone", schedd.cpp PeriodicExprEval); the router must not forget a retired job sooner
# (MAX_JOB_MIRROR_UPDATE_LAG, default 600 s), or it adopts the finished job again.
PERIODIC_EXPR_INTERVAL = 5
# so that `condor_restart -daemon job_router` finds the router (it advertises no ad)
JOB_ROUTER_ADDRESS_FILE = $(LOG)/.job_router_address
JOB_ROUTER_DEBUG = D_FULLDEBUG
GRIDMANAGER_JOB_PROBE_INTERVAL = 5
C_GAHP_CONTACT_SCHEDD_DELAY = 2
GRIDMANAGER_MAX_SUBMITTED_JOBS_PER_RESOURCE = 1000
MASTER_NEW_BINARY_RESTARTS = NEVER
MASTER_BACKOFF_CONSTANT = 1
MASTER_BACKOFF_CEILING = 5

# The factory: a second schedd that submits pilots to the CE over HTCondor-C, as GlideinWMS does.
FACTORY_SCHEDD = $(SCHEDD)
FACTORY_SCHEDD_ARGS = -local-name {FACTORY_SCHEDD}
{FACTORY_SCHEDD}.SCHEDD_NAME = {FACTORY_SCHEDD}
{FACTORY_SCHEDD}.SPOOL = {state}/factory-spool
{FACTORY_SCHEDD}.SCHEDD_LOG = $(LOG)/SchedLog.{FACTORY_SCHEDD}
{FACTORY_SCHEDD}.SCHEDD_ADDRESS_FILE = {state}/factory-spool/.schedd_address
{FACTORY_SCHEDD}.JOB_QUEUE_LOG = {state}/factory-spool/job_queue.log
{FACTORY_SCHEDD}.SCHEDD_DAEMON_AD_FILE = {state}/factory-spool/.schedd_classad
DC_DAEMON_LIST = + FACTORY_SCHEDD

# ce-k8s: the agent under condor_master (non-DaemonCore) and the information provider in the
# CE schedd's cron, both on this checkout's interpreter.
CE_K8S_INFO_EXECUTABLE = {python_prefix}/bin/ce-k8s
CE_K8S_INFO_CONFIG = /etc/condor/condor_config
{FACTORY_SCHEDD}.SCHEDD_CRON_CEK8SINFO_EXECUTABLE = /bin/true
CE_K8S_AGENT = {HOOK_DIR}/ce-k8s-agent-testbed
CE_K8S_AGENT_ARGS = agent --verbose --config /etc/condor/condor_config
CE_K8S_AGENT_ENVIRONMENT = "CONDOR_CONFIG=/etc/condor/condor_config PYTHONUNBUFFERED=1"
{agent_and_demo_config(state)}
# A batch route next to ours, as on a mixed CE (HTCondor-CE's own Slurm route shape). It takes
# only jobs that ask for it, and it is tried first.
JOB_ROUTER_ROUTE_Slurm_Cluster @=jrt
    REQUIREMENTS TestBatchRoute =?= true
    UNIVERSE 9
    GridResource = "batch slurm"
@jrt
JOB_ROUTER_ROUTE_NAMES = Slurm_Cluster $(JOB_ROUTER_ROUTE_NAMES)
""" + (batch_config(state) if batch else "")


#: The batch startd's START: only jobs whose GlobalJobId the batch schedd wrote. Each schedd sets
#: GlobalJobId itself at submit (`<Name>#<cluster>.<proc>#<qdate>`, the batch schedd's Name being
#: `batch@<host>`), overwriting a `+GlobalJobId` of the submit file; a job attribute of the
#: submitter's choosing (`+BatchJob = true`) could not keep a CE job off the slots. But a job's
#: owner may `condor_qedit` GlobalJobId afterwards (seen: a CE job edited to `batch@...` was
#: claimed and started within seconds), so batch mode also makes it a PROTECTED_JOB_ATTRS
#: (only the queue super users, root and condor, may change it).
BATCH_START = f'regexp("^{BATCH_SCHEDD}@", TARGET.GlobalJobId ?: "")'


def batch_config(state: Path) -> str:
    """The batch pool (`RealCondor(batch=True)`): a third schedd, a negotiator and a startd under the
    same master and collector, and IDTOKENS beside FS/CLAIMTOBE (docs/real-condor.md, "The batch pool").

    Why each part:

    * **The START rule.** With a negotiator and a startd in the pool, the CE schedd's idle vanilla
      source jobs are candidates for a match like any job. A pilot must run once, where the router
      sends it (a Kubernetes pod), never also on a local slot; so the startd takes only jobs whose
      GlobalJobId the batch schedd wrote (`BATCH_START`), and GlobalJobId is protected from its
      owner's `condor_qedit`.
    * **Short intervals**, so that a batch job starts within seconds instead of HTCondor's minute:
      negotiation every 2 s, and NEGOTIATOR_CYCLE_DELAY (the negotiator's own floor between two
      cycles, 20 s by default and in no param table; with it, cycles ran 20 s apart whatever
      NEGOTIATOR_INTERVAL said) at 1 s. The CE schedd keeps the bed's SCHEDD_INTERVAL of 5 s.
    * **Static slots** (`BATCH_SLOTS` of `BATCH_SLOT_MEMORY` MB): a fixed pool on any machine; no
      benchmarks at start (the first slot sat in Benchmarking).
    * **MOUNT_UNDER_SCRATCH empty**: the starter gives a job a private /tmp and /var/tmp with
      unshare(CLONE_NEWNS), which a chrooted process is refused ("Failed to unshare the mount
      namespace", errno 22: every job was held before exec).
    * **IDTOKENS, required authentication.** A client outside the root (the host's `htcondor2`)
      cannot use FS (the server looks for the client's file in its own /tmp) and must not use
      CLAIMTOBE (it could be anyone), so it presents an IDTOKEN signed with the root's POOL key
      (`RealCondor.batch_token`). Authentication is REQUIRED: without it a client whose methods
      all failed went on unauthenticated, and ALLOW_WRITE = * let it in (`htcondor2.ping` said
      `unauthenticated@unmapped`, WRITE authorized). READ too: Debian's 23.9 package makes it
      optional (`security:recommended_v9_0`, which its 25 package no longer ships), and a host
      client without a token then read the batch queue on 23.9 only. The bed's own accounts in the
      root are unaffected: their client list stays FS, CLAIMTOBE, and CLAIMTOBE always authenticates.
    """
    spool = f"{state}/{BATCH_SCHEDD}-spool"
    return f"""
# ---- The batch pool (RealCondor(batch=True); docs/real-condor.md, "The batch pool").
DAEMON_LIST = $(DAEMON_LIST), BATCH_SCHEDD, NEGOTIATOR, STARTD
BATCH_SCHEDD = $(SCHEDD)
BATCH_SCHEDD_ARGS = -local-name {BATCH_SCHEDD}
{BATCH_SCHEDD}.SCHEDD_NAME = {BATCH_SCHEDD}
{BATCH_SCHEDD}.SPOOL = {spool}
{BATCH_SCHEDD}.SCHEDD_LOG = $(LOG)/SchedLog.{BATCH_SCHEDD}
{BATCH_SCHEDD}.SCHEDD_ADDRESS_FILE = {spool}/.schedd_address
{BATCH_SCHEDD}.JOB_QUEUE_LOG = {spool}/job_queue.log
{BATCH_SCHEDD}.SCHEDD_DAEMON_AD_FILE = {spool}/.schedd_classad
{BATCH_SCHEDD}.SCHEDD_CRON_CEK8SINFO_EXECUTABLE = /bin/true
{BATCH_SCHEDD}.SCHEDD_INTERVAL = 2
DC_DAEMON_LIST = $(DC_DAEMON_LIST), BATCH_SCHEDD

# Negotiation within seconds (NEGOTIATOR_CYCLE_DELAY: 20 s between cycles unless set).
NEGOTIATOR_INTERVAL = 2
NEGOTIATOR_MIN_INTERVAL = 1
NEGOTIATOR_CYCLE_DELAY = 1
NEGOTIATOR_UPDATE_INTERVAL = 2
STARTD.UPDATE_INTERVAL = 2

# The startd: {BATCH_SLOTS} static slots whatever the machine has; it runs the batch schedd's jobs only.
NUM_CPUS = {BATCH_SLOTS}
MEMORY = {BATCH_SLOTS * BATCH_SLOT_MEMORY}
SLOT_TYPE_1 = cpus=1, memory={BATCH_SLOT_MEMORY}
NUM_SLOTS_TYPE_1 = {BATCH_SLOTS}
RUNBENCHMARKS = False
use POLICY : ALWAYS_RUN_JOBS
START = {BATCH_START}
# only the schedds set GlobalJobId: a job owner's condor_qedit of it would get past START
PROTECTED_JOB_ATTRS = GlobalJobId
# a chrooted starter cannot unshare a mount namespace for a private /tmp
MOUNT_UNDER_SCRATCH =

# Tokens from outside the root; FS and CLAIMTOBE stay for the bed's accounts inside it.
SEC_DEFAULT_AUTHENTICATION_METHODS = IDTOKENS, FS, CLAIMTOBE
SEC_DEFAULT_AUTHENTICATION = REQUIRED
# Debian's 23.9 package makes READ optional (its 00-htcondor-9.0.config, security:recommended_v9_0)
SEC_READ_AUTHENTICATION = REQUIRED
"""


BLAH_RECORDER = """#!/bin/sh
# ce-k8s real-HTCondor test bed: records the call instead of talking to a batch system.
echo "$(date +%s) $(basename "$0") $*" >> {log}
case "$(basename "$0")" in
  *_submit.sh) echo "BLAHP_JOBID_PREFIX$(date +%s%N)" ;;
  *_status.sh) echo "[BatchJobId=\\"$2\\"; JobStatus=1;]" ;;
esac
exit 0
"""
