"""The README opens with exactly the two commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n(.*?)\n```", text, flags=re.S)


def test_readme_starts_with_two_commands():
    text = (ROOT / "README.md").read_text()
    head = text.split("\n", 2)[2].lstrip()
    assert head.startswith("```sh\n"), "the first thing after the title must be the run command"
    commands = _readme_commands()
    assert len(commands) >= 2
    run, test = commands[0], commands[1]
    assert "\n" not in run and "\n" not in test, "each command is one line"
    assert "ce-k8s route" in run and "pip install" in run
    assert "[test]" in test and "pytest" in test


def test_ci_runs_the_readme_test_command():
    test_command = _readme_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()
