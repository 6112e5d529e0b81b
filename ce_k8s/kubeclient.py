"""One way to build a Kubernetes API client for the admin commands and the information provider.

The kubeconfig file if given, else in-cluster credentials, else ~/.kube/config. urllib3 retries
are switched off: every caller has its own deadline (a Slurm prolog must not hang, doctor must
answer, the schedd cron has a period), and silent retries would multiply it. The `kubernetes`
package is imported here, lazily, so that commands that never talk to the API do not pay for it.
"""

from __future__ import annotations


def new_api_client(kubeconfig: str | None):
    """A kubernetes ApiClient; the loaders' own exceptions propagate (callers word them)."""
    from kubernetes import client, config

    conf = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=conf)
    else:
        try:
            config.load_incluster_config(client_configuration=conf)
        except config.ConfigException:
            config.load_kube_config(client_configuration=conf)
    conf.retries = False
    return client.ApiClient(conf)
