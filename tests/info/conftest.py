"""Shared helpers for the information-provider tests (tests/info)."""

from __future__ import annotations

import json
from pathlib import Path

import classad2
import pytest

from ce_k8s import cli

REPO = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).parent / "snapshots"
TEST_CONFIG = "tests/info/config/condor_config"  # relative: LOCAL_CONFIG_DIR is relative to the cwd
NOW = 1760000000


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    """The test configuration names config.d/ relative to the source tree root."""
    monkeypatch.chdir(REPO)


def run_info(capsys, *args: str) -> tuple[str, int]:
    """Run `ce-k8s info` in-process; return (stdout, exit code)."""
    code = cli.main(["info", "--now", str(NOW), *args])
    return capsys.readouterr().out, code


def parse(text: str) -> classad2.ClassAd:
    """Read the cron output the way the schedd does: one Insert() per line, '-' lines end a record."""
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("-")]
    return classad2.parseOne("\n".join(lines) + "\n", classad2.ParserType.Old)


def catalog(ad: classad2.ClassAd) -> dict[str, dict[str, object]]:
    return {str(e["Name"]): dict(e) for e in ad["OSG_ResourceCatalog"]}


def snapshot_doc(name: str) -> dict:
    return json.loads((SNAPSHOTS / f"{name}.json").read_text())


def write_doc(tmp_path: Path, doc: dict, name: str = "cluster.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)
