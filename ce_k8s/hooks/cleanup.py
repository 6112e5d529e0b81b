"""JOB_CLEANUP hook: ask the agent to delete the routed job's pod and Secret.

Called once a routed ad exists, after success or failure (docs/hook-protocol.md §2.5). Exit 0
means "done" to the router; any other exit is retried on every poll until it succeeds, which is
what we want while the agent is unreachable: the pod must not outlive its job. "Not found" is
success. A routed ad without `K8sPodName` never got a pod, so there is nothing to do, and neither
is there for another backend's job (its `GridResource` does not start with the words of
`CE_K8S_GRID_RESOURCE`, docs/routes.md "CEs with other backends"): exit 0 without asking the agent.
"""

import sys

from ce_k8s import protocol
from ce_k8s.hooks._common import ad_grid_resource, arm_deadline, grid_resource_matches, log, read_stdin, scan_attrs

EXIT_RETRY = 1


def main() -> int:
    path, timeout = protocol.hook_settings()
    arm_deadline(timeout, EXIT_RETRY)
    data = read_stdin()
    if data is None:
        return EXIT_RETRY
    if not grid_resource_matches(ad_grid_resource(data), protocol.hook_grid_resource()):
        return 0
    if "k8spodname" not in scan_attrs(data.decode("utf-8", "replace"), frozenset({"k8spodname"})):
        return 0
    try:
        answer = protocol.ask(path, protocol.VERB_CLEANUP, data, timeout)
    except (OSError, protocol.ProtocolError) as exc:
        log(f"agent at {path} unreachable: {exc}; cleanup will be retried")
        return EXIT_RETRY
    if answer.status in (protocol.STATUS_OK, protocol.STATUS_NOTFOUND):
        return 0
    log(f"agent answered {answer.status}: {answer.message()}; cleanup will be retried")
    return EXIT_RETRY


if __name__ == "__main__":
    sys.exit(main())
