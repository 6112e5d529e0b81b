"""The agent logs into the CE's LOG directory (`$(LOG)/CeK8sAgentLog`), besides stderr.

condor_master runs the agent as a non-DaemonCore daemon and keeps nothing of its stderr, so the
CE's own log directory is where an admin finds it (docs/install.md, "5. Start the agent").
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ce_k8s.agent.main import log_to_file
from ce_k8s.condor.config import CondorConfig
from ce_k8s.settings import Settings

from .conftest import agent_process

ROOT = Path(__file__).resolve().parents[2]


def test_the_log_goes_where_settings_say(tmp_path):
    path = tmp_path / "CeK8sAgentLog"
    handler = log_to_file(str(path))
    try:
        assert handler is not None
        logging.getLogger("ce_k8s.agent.test").warning("pod %s evicted", "ce-1-0-a0-x")
        handler.flush()
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    line = path.read_text().strip()
    assert line.endswith("WARNING ce_k8s.agent.test: pod ce-1-0-a0-x evicted")


def test_an_unopenable_log_is_one_line_on_stderr_not_a_failure(tmp_path, capsys):
    assert log_to_file(str(tmp_path / "missing-dir" / "CeK8sAgentLog")) is None
    err = capsys.readouterr().err
    assert "cannot open the log" in err and "logging to stderr only" in err


def test_agent_subprocess_writes_into_the_ce_log_directory(server, tmp_root):
    """With the CE's LOG set and no CE_K8S_AGENT_LOG, `ce-k8s agent` opens $(LOG)/CeK8sAgentLog."""
    conf = tmp_root / "config"
    shutil.copytree(ROOT / "config.d", conf)
    log_dir = tmp_root / "log"
    log_dir.mkdir()
    (conf / "99-ce.conf").write_text(f"LOG = {log_dir}\n")
    assert Settings.from_config(CondorConfig.load(str(conf))).agent_log == f"{log_dir}/CeK8sAgentLog"
    with agent_process(server, tmp_root, conf):
        assert (log_dir / "CeK8sAgentLog").is_file()
