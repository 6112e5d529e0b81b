"""`ce-k8s agent`: run the agent daemon (condor_master or systemd starts it; see docs/agent.md).

    ce-k8s agent [--config PATH] [--kubeconfig FILE] [--socket PATH] [--spool DIR]
    ce-k8s agent --install-hooks DIR [--socket PATH]

Settings come from the CE's HTCondor configuration (`CE_K8S_*` knobs, docs/design.md Decision 9), plus
the agent-only knobs of `ce_k8s.agent.options` (output directory and size, metrics address);
the options override the knobs. Credentials: `--kubeconfig`, else `CE_K8S_KUBECONFIG` (knob or
environment), else the in-cluster service account. `--install-hooks` writes the four fast hook
launchers (see `ce_k8s.agent.launchers`) and exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH",
                        help="condor_config file or config directory (default: the CE's CONDOR_CONFIG, "
                             "else the shipped defaults)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: CE_K8S_KUBECONFIG, else in-cluster)")
    parser.add_argument("--socket", metavar="PATH", help="Unix socket the hooks connect to (default: CE_K8S_SOCKET)")
    parser.add_argument("--spool", metavar="DIR", help="the CE's spool directory (default: CE_K8S_SPOOL)")
    parser.add_argument("--install-hooks", metavar="DIR",
                        help="write the four hook launchers into DIR and exit")
    parser.add_argument("--verbose", action="store_true", help="log every pod event and hook call at INFO")


def load_settings(config: str | None):
    """(Settings, AgentOptions) from `--config`, else `$CONDOR_CONFIG`, else the shipped defaults."""
    from ce_k8s.agent.options import AgentOptions
    from ce_k8s.condor.config import CondorConfig
    from ce_k8s.settings import Settings

    path = config or os.environ.get("CONDOR_CONFIG") or None
    cfg = CondorConfig.load(path)
    return Settings.from_config(cfg), AgentOptions.from_config(cfg)


def hook_install_arguments(settings) -> dict[str, object]:
    """The CE settings `launchers.install_hooks` bakes into the launchers, as its keyword arguments.

    Shared by `--install-hooks` and `ce-k8s install`, so both write the same launchers for the
    same configuration: the socket and deadline (how hooks reach the agent), the spool
    (finalize's fallback) and `CE_K8S_GRID_RESOURCE` (which routed jobs are ours).
    """
    return {"socket_path": settings.socket, "hook_timeout": settings.hook_timeout,
            "spool": settings.spool, "grid_resource": settings.grid_resource}


def connection_pool_size(settings) -> int:
    """Connections to keep open to the API server: one for every agent thread that may call it.

    Why: the client keeps `cpu_count * 5` connections by default (10 on a 2-core CE) while the
    agent calls from its create workers, its I/O pool, the watch and the garbage collector at
    once. A request beyond the pool opens a new connection (a TLS handshake on a real cluster)
    and drops it afterwards: the pipeline benchmark counted two new connections per pilot.
    """
    workers = max(1, settings.create_concurrency)
    return workers + max(4, workers) + 4          # create workers, I/O pool, watch + GC + spare


def api_client_for(kubeconfig: str | None, pool_size: int | None = None):
    """A kubernetes ApiClient from a kubeconfig file, or the in-cluster service account."""
    from kubernetes import client, config

    from ce_k8s.kubeclient import pin_proxy

    conf = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=conf)
    else:
        config.load_incluster_config(client_configuration=conf)
    if pool_size:
        conf.connection_pool_maxsize = pool_size
    pin_proxy(conf)
    return client.ApiClient(conf)


def log_to_file(path: str) -> logging.Handler | None:
    """Also log to `path` (`Settings.agent_log`, the CE's LOG directory by default).

    Why: condor_master runs the agent as a non-DaemonCore daemon and keeps nothing of its stderr.
    WatchedFileHandler reopens the file after logrotate moves it. A file that cannot be opened is
    one line on stderr, not a reason to stop serving the hooks.
    """
    from logging.handlers import WatchedFileHandler

    try:
        handler = WatchedFileHandler(path)
    except OSError as exc:
        print(f"ce-k8s agent: cannot open the log {path}: {exc.strerror or exc}; logging to stderr only",
              file=sys.stderr)
        return None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


def run(args: argparse.Namespace) -> int:
    if args.verbose:
        logging.getLogger("ce_k8s").setLevel(logging.INFO)
    try:
        settings, options = load_settings(args.config)
    except Exception as exc:   # ConfigError / SettingsError / OptionsError carry file:line
        print(f"ce-k8s agent: {exc}", file=sys.stderr)
        return 2
    if settings.agent_log and not args.install_hooks:
        log_to_file(settings.agent_log)
    overrides = {k: v for k, v in (("socket", args.socket), ("spool", args.spool)) if v}
    if args.kubeconfig:
        overrides["kubeconfig"] = args.kubeconfig
    elif not settings.kubeconfig and os.environ.get("CE_K8S_KUBECONFIG"):
        overrides["kubeconfig"] = os.environ["CE_K8S_KUBECONFIG"]
    settings = dataclasses.replace(settings, **overrides)

    if args.install_hooks:
        from ce_k8s.agent.launchers import install_hooks

        for path in install_hooks(args.install_hooks, **hook_install_arguments(settings)):
            print(path)
        return 0

    from ce_k8s.agent.agent import Agent

    try:
        api_client = api_client_for(settings.kubeconfig or None, connection_pool_size(settings))
    except Exception as exc:
        print(f"ce-k8s agent: no Kubernetes credentials: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, lambda *_: done.set())
    try:
        agent = Agent(settings, api_client, options=options)
    except OSError as exc:      # the output directory is unusable (OutputDirError says why)
        print(f"ce-k8s agent: {exc}", file=sys.stderr)
        return 2
    # Everything allocated so far (the kubernetes client's ~250 pydantic models, the modules)
    # lives as long as the process: moving it out of the cyclic GC's reach saves every later
    # full collection from walking ~115,000 objects, a third of a 20,000-pod relist's time
    # (docs/performance.md "Fast relist"). Refcounting still frees what becomes garbage.
    gc.freeze()
    try:
        agent.start(wait_ready=None)
    except OSError as exc:
        print(f"ce-k8s agent: cannot serve on {settings.socket}: {exc}", file=sys.stderr)
        agent.stop()
        return 1
    print(f"ce-k8s agent: serving on {settings.socket}", file=sys.stderr, flush=True)
    done.wait()
    agent.stop()
    return 0
