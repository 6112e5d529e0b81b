"""The `ce-k8s` admin command: argument parsing and dispatch only.

Only the module of the command being run is imported, so `ce-k8s route` does not pay for the
Kubernetes client and `ce-k8s agent` does not pay for the emulators. Each command module exposes
`add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys

# (command words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("route",), "ce_k8s.condor.cli_route", "show which route takes each job and what comes out"),
    (("routes", "check"), "ce_k8s.condor.cli_check", "check the route configuration"),
    (("routes", "convert"), "ce_k8s.condor.cli_convert", "convert old JOB_ROUTER_ENTRIES routes"),
    (("agent",), "ce_k8s.agent.main", "run the agent daemon that owns the Kubernetes side"),
    (("htcjob-operator",), "ce_k8s.htcjob.operator",
     "run the HTCJob operator: Kubernetes users' HTCondor jobs (docs/htcjob.md)"),
    (("info",), "ce_k8s.info.provider", "print the schedd cron output advertising cluster capacity"),
    (("demo",), "ce_k8s.demos.cli_demo", "run pilots through the whole path (emulated, or real Kubernetes)"),
    (("demo", "htcjob"), "ce_k8s.demos.cli_htcjobdemo",
     "an HTCJob (queue: 3) through the real control plane, the operator and the real schedd"),
    (("sim", "serve"), "ce_k8s.sim.serve", "serve the Kubernetes API emulator with simulated kubelets"),
    (("testbed", "real-condor"), "ce_k8s.real.condor.cli_realcondor", "a real HTCondor 25 or 23.9 (up/down/status)"),
    (("testbed", "real-kube"), "ce_k8s.real.kube.cli_realkube",
     "a real Kubernetes control plane with kwok nodes (build/up/down/status)"),
    (("status",), "ce_k8s.ops.status", "list routed pilots with their pods"),
    (("accounting",), "ce_k8s.ops.accounting", "summarise per-job history files (pilots, core-hours, CPU efficiency)"),
    (("doctor",), "ce_k8s.ops.doctor", "check a CE host end to end"),
    (("install",), "ce_k8s.ops.install", "install knobs, routes and hook launchers into a CE"),
    (("nodes", "reclaim"), "ce_k8s.ops.nodes", "hand a node over to an HPC scheduler"),
    (("nodes", "release"), "ce_k8s.ops.nodes", "give a node back to pilots"),
]


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _usage() -> str:
    lines = ["usage: ce-k8s [--debug] COMMAND [ARGS...]", "", "commands:"]
    for words, module, help_text in COMMANDS:
        if _available(module):
            lines.append(f"  {' '.join(words):<16} {help_text}")
    lines.append("")
    lines.append("Run 'ce-k8s COMMAND --help' for a command's options.")
    return "\n".join(lines)


def _find_command(argv: list[str]) -> tuple[tuple[str, ...], str, str] | None:
    for entry in sorted(COMMANDS, key=lambda c: -len(c[0])):
        words = entry[0]
        if tuple(argv[: len(words)]) == words:
            return entry
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = False
    while argv and argv[0].startswith("-"):
        flag = argv.pop(0)
        if flag == "--debug":
            debug = True
        elif flag in ("-h", "--help"):
            print(_usage())
            return 0
        else:
            print(f"ce-k8s: unknown option {flag}\n\n{_usage()}", file=sys.stderr)
            return 2
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    entry = _find_command(argv)
    if entry is None or not _available(entry[1]):
        what = " ".join(argv[:2]) if argv else ""
        prefix = f"ce-k8s: unknown command '{what}'\n\n" if argv else ""
        print(prefix + _usage(), file=sys.stderr)
        return 2
    words, module_name, help_text = entry
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog="ce-k8s " + " ".join(words), description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(argv[len(words):])
    args.command_words = words
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
