"""The information provider: what the cluster can take, advertised in the CE schedd's ad.

Modules, each depending only on the ones before it (no cycle; tests/test_rooms.py checks):

* ``quantity`` -- a pod's effective requests in scheduler units (quantities read by ``ce_k8s.quantity``);
* ``snapshot`` -- nodes, pods and quotas from a ``kubectl`` dump, the API or the agent;
* ``capacity`` -- pure placement and quota arithmetic over a snapshot, per pilot shape;
* ``health`` -- the run's verdict (OK, WARNING, CRITICAL) and its reasons;
* ``catalog`` -- one catalog entry's configuration per Kubernetes route (routed, built pilot);
* ``provider`` -- ``ce-k8s info``: the cluster view, the ad, the cron output.

Nothing is imported here, so ``import ce_k8s.info.quantity`` stays cheap.
"""
