"""`ce-k8s install`: the shipped knobs, routes and launchers land where a stock HTCondor-CE reads
them, in an order that leaves every route enabled, and an admin's edit is never overwritten.

HTCondor reads a config directory in name order (LOCAL_CONFIG_DIR, condor_config.cpp; the same
rule as ce_k8s.condor.config) and skips dot files (LOCAL_CONFIG_DIR_EXCLUDE_REGEXP).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from ops_helpers import REPO

from ce_k8s import cli
from ce_k8s.condor.config import CondorConfig
from ce_k8s.ops import install

ROUTES = sorted((REPO / "routes").glob("*.conf"))
KNOBS = sorted(p for p in (REPO / "config.d").glob("*.conf") if p.name != "01-ce-router-defaults.conf")
LAUNCHERS = ("ce-k8s-translate", "ce-k8s-update", "ce-k8s-finalize", "ce-k8s-cleanup")


def shipped_route_names() -> list[str]:
    """Route names in the shipped order: each routes/ file appends one to JOB_ROUTER_ROUTE_NAMES."""
    names = []
    for f in ROUTES:
        m = re.search(r"^JOB_ROUTER_ROUTE_NAMES = \$\(JOB_ROUTER_ROUTE_NAMES\) (\w+)$", f.read_text(), re.MULTILINE)
        assert m, f
        names.append(m.group(1))
    return names


def run(*argv: str) -> tuple[int, list[str], str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["install", *argv])
    return code, out.getvalue().splitlines(), err.getvalue()


@pytest.fixture
def dirs(tmp_path):
    """A copy of an /etc/condor-ce/config.d holding a site file, and a hooks directory to come."""
    conf = tmp_path / "config.d"
    conf.mkdir()
    (conf / "99-local.conf").write_text(f"CE_K8S_SOCKET = {tmp_path}/run/agent.sock\n"
                                        "CE_K8S_HOOK_TIMEOUT = 7\nCE_K8S_SPOOL = /srv/spool\n"
                                        f"CE_K8S_HOOK_DIR = {tmp_path}/libexec\n")
    os.chmod(tmp_path, 0o755)
    return conf, tmp_path / "libexec"


def install_into(conf: Path, hooks: Path, *extra: str) -> tuple[int, list[str], str]:
    return run("--config-dir", str(conf), "--hooks-dir", str(hooks), *extra)


def actions(lines: list[str]) -> dict[str, str]:
    """{file name: action} from the one-line-per-file output."""
    found = {}
    for line in lines:
        action, path = line.split()[:2]
        found[os.path.basename(path)] = action
    return found


def expected_names() -> list[str]:
    return [k.name for k in KNOBS] + [f"70-ce-k8s-route-{r.name}" for r in ROUTES] + list(LAUNCHERS)


def test_fresh_install_puts_every_file_in_place(dirs):
    conf, hooks = dirs
    code, lines, err = install_into(conf, hooks)
    assert code == 0, err
    assert actions(lines) == dict.fromkeys(expected_names(), "installed")
    for knob in KNOBS:
        assert (conf / knob.name).read_bytes() == knob.read_bytes()
    for route in ROUTES:
        assert (conf / f"70-ce-k8s-route-{route.name}").read_bytes() == route.read_bytes()
    # HTCondor-CE's own defaults file is never installed on a real CE (see its header).
    assert not (conf / "01-ce-router-defaults.conf").exists()
    assert (conf / "99-local.conf").exists()


def test_rerun_is_all_unchanged_and_writes_nothing(dirs):
    conf, hooks = dirs
    install_into(conf, hooks)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for d in (conf, hooks) for p in d.iterdir()}
    code, lines, _ = install_into(conf, hooks)
    assert code == 0
    assert actions(lines) == dict.fromkeys(expected_names(), "unchanged")
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for d in (conf, hooks) for p in d.iterdir()}
    assert after == before


def test_every_shipped_route_is_enabled_in_the_shipped_order(dirs):
    """The regression test: copied as-is, routes/10-cms-token.conf sorts before
    20-ce-k8s-routing.conf, which empties JOB_ROUTER_ROUTE_NAMES, and the CMS route is gone."""
    conf, hooks = dirs
    assert install_into(conf, hooks)[0] == 0
    names = CondorConfig.load(conf).get("JOB_ROUTER_ROUTE_NAMES").split()
    assert names == shipped_route_names() and "CMS_Pilots" in names

    naive = conf.parent / "naive"
    naive.mkdir()
    for f in KNOBS + ROUTES:
        shutil.copy(f, naive / f.name)
    assert "CMS_Pilots" not in CondorConfig.load(naive).get("JOB_ROUTER_ROUTE_NAMES").split()


def test_route_files_sort_after_every_knob_file_with_the_loader_rule(dirs):
    conf, hooks = dirs
    install_into(conf, hooks)
    read = [os.path.basename(s) for s in CondorConfig.load(conf).sources]
    last_knob = max(read.index(k.name) for k in KNOBS)
    first_route = min(read.index(f"70-ce-k8s-route-{r.name}") for r in ROUTES)
    assert last_knob < first_route < read.index("99-local.conf")
    assert install.route_order_problems(CondorConfig.load(conf).sources) == []


def test_admin_edit_is_kept_and_the_new_version_written_beside_it(dirs):
    conf, hooks = dirs
    install_into(conf, hooks)
    edited = conf / "40-ce-k8s-settings.conf"
    edited.write_text(edited.read_text() + "CE_K8S_QPS = 7\n")
    route = conf / "70-ce-k8s-route-90-pilots.conf"
    route.write_text(route.read_text().replace("default_queue = pilots", "default_queue = short"))
    code, lines, _ = install_into(conf, hooks)
    assert code == 0
    found = actions(lines)
    assert found["40-ce-k8s-settings.conf"] == "kept" and found["70-ce-k8s-route-90-pilots.conf"] == "kept"
    assert {a for n, a in found.items() if n not in ("40-ce-k8s-settings.conf",
                                                      "70-ce-k8s-route-90-pilots.conf")} == {"unchanged"}
    assert edited.read_text().endswith("CE_K8S_QPS = 7\n")
    beside = conf / ".40-ce-k8s-settings.conf.ce-k8s-new"
    assert beside.read_bytes() == (REPO / "config.d/40-ce-k8s-settings.conf").read_bytes()
    assert str(beside) in next(line for line in lines if "40-ce-k8s-settings.conf" in line.split()[1])
    # The new version beside it is not configuration: HTCondor skips dot files, so the edit holds
    # and the route is defined once.
    cfg = CondorConfig.load(conf)
    assert cfg.get("CE_K8S_QPS") == "7"
    assert cfg.get("JOB_ROUTER_ROUTE_NAMES").split() == shipped_route_names()
    assert "default_queue = short" in cfg.raw("JOB_ROUTER_ROUTE_Pilots")
    # Still edited on the next run: still kept.
    assert actions(install_into(conf, hooks)[1])["40-ce-k8s-settings.conf"] == "kept"


def test_a_file_we_installed_is_updated_silently_when_the_shipped_one_changed(dirs):
    """An older shipped version, recorded in the manifest, is ours: it is replaced."""
    conf, hooks = dirs
    old = b"# ce-k8s: an older 60-ce-k8s-info.conf\nCE_K8S_INFO_MAX_AGE = 600\n"
    (conf / "60-ce-k8s-info.conf").write_bytes(old)
    (conf / ".ce-k8s-install.json").write_text(
        json.dumps({"files": {"60-ce-k8s-info.conf": hashlib.sha256(old).hexdigest()}}))
    code, lines, _ = install_into(conf, hooks)
    assert code == 0
    assert actions(lines)["60-ce-k8s-info.conf"] == "updated"
    assert (conf / "60-ce-k8s-info.conf").read_bytes() == (REPO / "config.d/60-ce-k8s-info.conf").read_bytes()
    assert not (conf / ".60-ce-k8s-info.conf.ce-k8s-new").exists()


def test_an_unrecorded_file_that_differs_is_kept(dirs):
    """Without a record we cannot tell an admin's file from an old one of ours: keep it."""
    conf, hooks = dirs
    (conf / "50-ce-k8s-hooks.conf").write_text("JOB_ROUTER_HOOK_KEYWORD = CE_K8S\n")
    _, lines, _ = install_into(conf, hooks)
    assert actions(lines)["50-ce-k8s-hooks.conf"] == "kept"
    assert (conf / "50-ce-k8s-hooks.conf").read_text() == "JOB_ROUTER_HOOK_KEYWORD = CE_K8S\n"


def test_launchers_are_written_executable_with_the_resulting_settings(dirs):
    conf, hooks = dirs
    install_into(conf, hooks)
    assert (hooks.stat().st_mode & 0o777) == 0o755
    for name in LAUNCHERS:
        path = hooks / name
        assert path.stat().st_mode & 0o777 == 0o755 and os.access(path, os.X_OK)
        text = path.read_text()
        # settings from the configuration the CE will read (99-local.conf wins over the knob file)
        assert f"protocol.DEFAULT_SOCKET = '{conf.parent}/run/agent.sock'" in text
        assert "protocol.DEFAULT_HOOK_TIMEOUT = 7.0" in text
        assert "protocol.DEFAULT_SPOOL = '/srv/spool'" in text
        assert "protocol.DEFAULT_GRID_RESOURCE = 'batch k8s'" in text


def test_launchers_are_what_agent_install_hooks_writes(dirs, tmp_path):
    conf, hooks = dirs
    install_into(conf, hooks)
    other = tmp_path / "other"
    assert cli.main(["agent", "--config", str(conf), "--install-hooks", str(other)]) == 0
    for name in LAUNCHERS:
        assert (hooks / name).read_bytes() == (other / name).read_bytes()


def test_changed_socket_updates_the_launchers(dirs):
    conf, hooks = dirs
    install_into(conf, hooks)
    with (conf / "99-local.conf").open("a") as fh:
        fh.write("CE_K8S_SOCKET = /run/elsewhere.sock\n")
    found = actions(install_into(conf, hooks)[1])
    assert {found[n] for n in LAUNCHERS} == {"updated"}
    assert "/run/elsewhere.sock" in (hooks / "ce-k8s-update").read_text()


def test_dry_run_writes_nothing(dirs):
    conf, hooks = dirs
    before = sorted(p.name for p in conf.iterdir())
    code, lines, _ = install_into(conf, hooks, "--dry-run")
    assert code == 0
    assert actions([line.removeprefix("[dry-run] ") for line in lines[:-1]]) == dict.fromkeys(
        expected_names(), "installed")
    assert lines[-1] == "ce-k8s install: dry run, nothing was written"
    assert sorted(p.name for p in conf.iterdir()) == before
    assert not hooks.exists()

    install_into(conf, hooks)
    edited = conf / "20-ce-k8s-routing.conf"
    edited.write_text(edited.read_text() + "# site note\n")
    _, lines, _ = install_into(conf, hooks, "--dry-run")
    assert "kept" in next(line for line in lines if "20-ce-k8s-routing.conf" in line)
    assert not (conf / ".20-ce-k8s-routing.conf.ce-k8s-new").exists()


def test_unwritable_target_exits_1_naming_the_file(dirs, tmp_path):
    conf, _ = dirs
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    code, _, err = install_into(conf, blocker / "libexec")
    assert code == 1
    assert str(blocker / "libexec") in err and err.startswith("ce-k8s install: ")
    assert not (conf / "20-ce-k8s-routing.conf").exists()   # checked before the first write


def test_world_writable_hooks_dir_is_refused(dirs):
    """The router ignores hooks in a world-writable directory (docs/hook-protocol.md §1.1)."""
    conf, hooks = dirs
    hooks.mkdir()
    os.chmod(hooks, 0o777)
    code, _, err = install_into(conf, hooks)
    assert code == 1 and str(hooks) in err and "world-writable" in err
    assert not (conf / "20-ce-k8s-routing.conf").exists()


def test_invalid_resulting_configuration_names_the_ce_file(dirs):
    conf, hooks = dirs
    (conf / "99-local.conf").write_text("CE_K8S_HOOK_TIMEOUT = soon\n")
    code, _, err = install_into(conf, hooks)
    assert code == 1
    assert f"{conf}/99-local.conf:1" in err
    assert not (conf / "20-ce-k8s-routing.conf").exists()


def test_hand_copied_route_before_the_knobs_is_warned_about(dirs):
    """A route file copied by the old manual instructions is disabled by 20-ce-k8s-routing.conf."""
    conf, hooks = dirs
    shutil.copy(REPO / "routes/10-cms-token.conf", conf / "10-cms-token.conf")
    code, _, err = install_into(conf, hooks)
    assert code == 0
    assert f"{conf}/10-cms-token.conf is read before" in err


def test_hooks_dir_the_router_does_not_use_is_warned_about(dirs, tmp_path):
    conf, _ = dirs
    code, _, err = install_into(conf, tmp_path / "elsewhere")
    assert code == 0
    assert f"CE_K8S_HOOK_DIR is {tmp_path}/libexec" in err and f"{tmp_path}/elsewhere" in err


def test_no_warning_on_a_clean_install(dirs):
    conf, hooks = dirs
    assert install_into(conf, hooks)[2] == ""
