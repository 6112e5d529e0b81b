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
    pin_proxy(conf)
    return client.ApiClient(conf)


def pin_proxy(conf) -> None:
    """Keep the proxy the loader resolved from the environment, instead of resolving it per request.

    Why: both loaders install a `refresh_api_key_hook` that runs before every request and assigns
    `conf.host` again, and the `kubernetes` client's host setter then re-reads every proxy variable
    of the environment (`urllib.request.getproxies`) to pick the proxy for the host. The pool
    manager took its proxy when the ApiClient was built, so the result is never used; the cost
    was the largest single item of the agent's CPU per pilot under a profile (docs/performance.md).
    Assigning the resolved value through the public setter marks it as chosen, once, here.
    """
    conf.proxy = conf.proxy
