"""Every command shown in the operations docs is run here, and its output compared with the doc.

Convention (stated in docs/operations.md): in a ```console block, a line starting with `$ ` is a
command; the lines after it, up to the next command, are its output, and a final `[exit N]` its
exit status (0 when absent). `$ ce-k8s ...` commands run in-process on an emulated CE host
(ops_helpers.ce_host: the shipped configuration, an agent, the API emulator with two 16-core nodes
`wn-1`, `wn-2`, and the two pilots of `scenario()`), in document order. The documented paths are
mapped to the host's (`PATHS`), and the host's back to the documented ones in the output. Output
lines match after runs of blanks are collapsed; `<...>` in an expected line matches any text and a
line `...` any run of lines. Commands that need a real cluster or Slurm end with `# real cluster`
or `# on the Slurm controller` and are not run (their manifests and scripts are tested elsewhere).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex

import pytest
from ops_helpers import REPO, ce_host

from ce_k8s import cli

DOCS = ["docs/operations.md", "docs/factory-operators.md", "docs/index.md", "containers/slurm/README.md"]
_BLOCK = re.compile(r"^```(\S*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
NOT_RUN = ("# real cluster", "# on the Slurm controller")
K8S_URL = "https://k8s.example.org:6443"


def commands(doc: str) -> list[tuple[str, list[str]]]:
    """(command line, expected output lines) of every console block, in order."""
    found: list[tuple[str, list[str]]] = []
    for m in _BLOCK.finditer((REPO / doc).read_text()):
        if m.group(1) != "console":
            continue
        for line in m.group(2).rstrip("\n").split("\n"):
            if line.startswith("$ "):
                found.append((line[2:], []))
            else:
                assert found, f"{doc}: output before any command in a console block"
                found[-1][1].append(line)
    return found


def matches(expected: list[str], actual: list[str]) -> bool:
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    if not actual:
        return False
    pattern = ".+?".join(re.escape(part) for part in re.split(r"<[^<>]*>", " ".join(expected[0].split())))
    return re.fullmatch(pattern, " ".join(actual[0].split())) is not None and matches(expected[1:], actual[1:])


def scenario(host) -> None:
    """A running pilot (on wn-1) and an OOM-killed, held one, as a CE would have them."""
    host.submit(1234567, route="Pilots", owner="cmspilot")
    held = host.submit(1234568, image="pilot:oom", route="CMS_Pilots", owner="uscms01", until=None)
    if held.get("JobStatus") != 5:
        host.update_until(1234568, lambda ad: ad.get("JobStatus") == 5, "the OOM-killed pilot held")


def doc_paths(host) -> list[tuple[str, str]]:
    """(documented path, this host's path), most specific first."""
    return [
        ("/etc/condor-ce/config.d", str(host.config_dir)),
        ("/usr/libexec/ce-k8s", str(host.hook_dir)),
        ("/run/ce-k8s", str(host.socket.parent)),
        ("/var/lib/condor-ce/spool", str(host.spool)),
        ("/etc/ce-k8s/kubeconfig", host.kubeconfig),
        ("/etc/ce-k8s/node-handover.kubeconfig", host.kubeconfig),
    ]


def to_host(text: str, host) -> str:
    text = text.replace("/etc/condor-ce/condor_config", str(host.config_dir))
    for doc, real in doc_paths(host):
        text = text.replace(doc, real)
    return text


def to_doc(text: str, host) -> str:
    text = text.replace(host.server.url, K8S_URL)
    text = text.replace(str(host.config_dir) + "/", "/etc/condor-ce/config.d/")
    text = text.replace(str(host.config_dir), "/etc/condor-ce/condor_config")
    for doc, real in doc_paths(host)[1:]:
        text = text.replace(real, doc)
    return text


def run(command: str, host) -> tuple[int, list[str]]:
    argv = shlex.split(to_host(command, host))
    assert argv[0] == "ce-k8s", command
    out = io.StringIO()
    old = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out):
            code = cli.main(argv[1:])
    finally:
        os.chdir(old)
    return code, to_doc(out.getvalue(), host).rstrip("\n").split("\n")


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_in_the_doc_runs_as_shown(doc):
    steps = commands(doc)
    if not steps:
        assert (REPO / doc).exists()
        return
    with ce_host(nodes="wn:2x16c64g") as host:
        host.start_agent()
        scenario(host)
        for command, expected in steps:
            if command.rstrip().endswith(NOT_RUN):
                continue
            status = 0
            if expected and re.fullmatch(r"\[exit \d+\]", expected[-1]):
                status = int(expected[-1][6:-1])
                expected = expected[:-1]
            code, actual = run(command, host)
            assert code == status, f"{doc}: $ {command}\n" + "\n".join(actual)
            assert matches(expected, actual), f"{doc}: $ {command}\n" + "\n".join(actual)


def test_docs_exist_and_are_linked_from_the_index():
    index = (REPO / "docs" / "index.md").read_text()
    for name in ("install.md", "deploy-kubernetes.md", "routes.md", "factory-operators.md", "operations.md",
                 "upgrading.md", "holds.md"):
        assert f"]({name})" in index, name
    for doc in DOCS:
        assert (REPO / doc).exists(), doc


def test_the_matcher_needs_every_line():
    assert matches(["a <x> c", "..."], ["a  bbb c", "d"])
    assert not matches(["a <x> c"], ["a b d"])
    assert not matches(["x", "y"], ["x"])
