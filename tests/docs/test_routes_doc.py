"""docs/routes.md says what the commands do: every example in it is run here.

Convention (stated in the doc): a fenced block starting with ``# file: NAME`` is written to a
scratch directory; each ``console`` block is one ``$ ce-k8s ...`` command run there (with
``examples/`` linked in), whose output must match line for line, ``...`` matching any lines, and
a final ``[exit N]`` giving the exit status (0 when absent).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from ce_k8s.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "routes.md"
_BLOCK = re.compile(r"^```(\S*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(DOC.read_text())]


def console_blocks() -> list[str]:
    return [body for lang, body in blocks() if lang == "console"]


def matches(expected: list[str], actual: list[str]) -> bool:
    """Line-by-line match where an expected '...' line matches any run of lines (even none)."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and actual[0] == expected[0] and matches(expected[1:], actual[1:])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("routes-doc")
    for lang, body in blocks():
        first = body.split("\n", 1)[0]
        if lang == "condor-config" and first.startswith("# file: "):
            (work / first[len("# file: "):].strip()).write_text(body)
    (work / "examples").symlink_to(ROOT / "examples")
    return work


def test_doc_has_runnable_examples():
    assert len(console_blocks()) >= 4
    assert "## Kubernetes attributes" in DOC.read_text()


@pytest.mark.parametrize("index", range(len(console_blocks())))
def test_console_example(index, workdir, capsys):
    lines = console_blocks()[index].rstrip("\n").split("\n")
    assert lines[0].startswith("$ ce-k8s ")
    argv = shlex.split(lines[0][len("$ ce-k8s "):])
    expected = lines[1:]
    status = 0
    if expected and re.fullmatch(r"\[exit \d+\]", expected[-1]):
        status = int(expected.pop()[6:-1])
    old = Path.cwd()
    os.chdir(workdir)
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(argv)
    finally:
        os.chdir(old)
    actual = out.getvalue().rstrip("\n").split("\n")
    assert code == status, out.getvalue()
    assert matches(expected, actual), "\n".join(actual[:60])
