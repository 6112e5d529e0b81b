#!/bin/bash
# PrologSlurmctld: hand the nodes of a starting Slurm job over from Kubernetes pilots to Slurm.
#
# slurmctld runs this as SlurmUser before the job starts (slurm.conf: PrologSlurmctld=...).
# For every node of the allocation, in parallel: `ce-k8s nodes reclaim NODE` cordons it, lets
# running pilots finish for CE_K8S_GRACE seconds, evicts the rest through the Eviction API (the
# CE reports them back to the factory as idle, and they start elsewhere) and waits until no pilot
# is left. See docs/operations.md, "Sharing nodes with Slurm".
#
# Exit status: 0 unless CE_K8S_STRICT=1 and a node could not be handed over, in which case
# slurmctld requeues (batch) or cancels the job. Every line goes to syslog (tag ce-k8s-slurm).
set -u

# -- site settings (slurmctld passes a minimal environment: set them here) ----------------------
CE_K8S_BIN=${CE_K8S_BIN:-/usr/bin/ce-k8s}
CE_K8S_KUBECONFIG=${CE_K8S_KUBECONFIG:-/etc/ce-k8s/node-handover.kubeconfig}
CE_K8S_GRACE=${CE_K8S_GRACE:-120}            # seconds running pilots may keep running
CE_K8S_EVICT_TIMEOUT=${CE_K8S_EVICT_TIMEOUT:-60}  # seconds evicted pilots get to leave
CE_K8S_STRICT=${CE_K8S_STRICT:-0}            # 1: fail the prolog when a node is not free
CE_K8S_LOG=${CE_K8S_LOG:-logger -t ce-k8s-slurm}  # where lines go ("cat" for stdout)
# ------------------------------------------------------------------------------------------------

say() { printf '%s\n' "job ${SLURM_JOB_ID:-?}: $*" | $CE_K8S_LOG; }

if [ -z "${SLURM_JOB_NODELIST:-}" ]; then
    say "no SLURM_JOB_NODELIST: nothing to reclaim"
    exit 0
fi
if ! nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST"); then
    say "cannot expand node list '$SLURM_JOB_NODELIST'"
    [ "$CE_K8S_STRICT" = 1 ] && exit 1
    exit 0
fi

pids=()
names=()
for node in $nodes; do
    # pipefail: the subshell's status is ce-k8s's, not the logger's
    ( set -o pipefail
      "$CE_K8S_BIN" nodes reclaim "$node" --kubeconfig "$CE_K8S_KUBECONFIG" \
          --grace "$CE_K8S_GRACE" --evict-timeout "$CE_K8S_EVICT_TIMEOUT" 2>&1 | $CE_K8S_LOG ) &
    pids+=("$!")
    names+=("$node")
done

failed=0
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    node=${names[$i]}
    case $rc in
        0) ;;                                   # cordoned, no pilot left
        4) ;;                                   # not a Kubernetes node: nothing to hand over
        3) say "node $node: pilots still terminating; the job starts anyway"; failed=1 ;;
        *) say "node $node: hand-over failed (exit $rc); the node may still take pilots"; failed=1 ;;
    esac
done

if [ "$failed" = 1 ] && [ "$CE_K8S_STRICT" = 1 ]; then
    exit 1
fi
exit 0
