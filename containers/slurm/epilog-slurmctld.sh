#!/bin/bash
# EpilogSlurmctld: give the nodes of a finished Slurm job back to Kubernetes pilots.
#
# slurmctld runs this as SlurmUser after the job ends (slurm.conf: EpilogSlurmctld=...). For every
# node of the allocation that no other Slurm job still uses, `ce-k8s nodes release NODE` uncordons
# it, but only if `ce-k8s nodes reclaim` cordoned it: a node an admin cordoned stays cordoned.
# The information provider advertises the node again on its next run. See docs/operations.md.
#
# Exit status: always 0 (an epilog failure cannot undo the job); problems go to syslog.
set -u

# -- site settings (slurmctld passes a minimal environment: set them here) ----------------------
CE_K8S_BIN=${CE_K8S_BIN:-/usr/bin/ce-k8s}
CE_K8S_KUBECONFIG=${CE_K8S_KUBECONFIG:-/etc/ce-k8s/node-handover.kubeconfig}
CE_K8S_LOG=${CE_K8S_LOG:-logger -t ce-k8s-slurm}  # where lines go ("cat" for stdout)
# ------------------------------------------------------------------------------------------------

say() { printf '%s\n' "job ${SLURM_JOB_ID:-?}: $*" | $CE_K8S_LOG; }

if [ -z "${SLURM_JOB_NODELIST:-}" ]; then
    say "no SLURM_JOB_NODELIST: nothing to release"
    exit 0
fi
if ! nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST"); then
    say "cannot expand node list '$SLURM_JOB_NODELIST'"
    exit 0
fi

for node in $nodes; do
    # Another job still on the node (shared partitions): it stays with Slurm until that one ends.
    others=$(squeue --noheader --nodelist="$node" --states=CONFIGURING,RUNNING,SUSPENDED --format=%A 2>/dev/null \
             | grep -v -x -F "${SLURM_JOB_ID:-}")
    if [ -n "$others" ]; then
        say "node $node: still used by Slurm job(s) $(printf "%s " $others); not released"
        continue
    fi
    ( set -o pipefail
      "$CE_K8S_BIN" nodes release "$node" --kubeconfig "$CE_K8S_KUBECONFIG" 2>&1 | $CE_K8S_LOG ) &
done
wait
exit 0
