"""HTCJob: Kubernetes users submit HTCondor jobs through a custom resource (docs/htcjob.md).

The other direction from the rest of ce-k8s: an `HTCJob` in a namespace becomes one cluster of
jobs on a schedd, and the schedd's own view of those jobs (queue, then history) becomes the
resource's status. As everywhere in ce-k8s, Kubernetes and the schedd are the only state: the
resource's uid is written into every job ad (`HTCJobUid`) and looked up before any submit, so
an operator restart finds what it submitted instead of submitting again.

Modules: `spec.py` (the resource's spec as a typed value, and the checks the CRD's schema cannot
make), `submitdesc.py` (spec → submit description), `jobstate.py` (job ads → status, pure),
`schedd.py` (the schedd through the htcondor2 bindings), `output.py` (retrieved sandboxes →
ConfigMap or claim directory), `reconcile.py` (one resource: decide, then act), `operator.py` (the
watch, the work queue and `ce-k8s htcjob-operator`).
"""
