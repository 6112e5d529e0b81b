"""Configuration commands as HTCondor runs them, through HTCondor's own reader (ce_k8s.condor.htconfig).

Sources: condor_config.cpp ``process_locals`` (a LOCAL_CONFIG_FILE value holding a '|' is one
command) and ``process_config_source`` (a failing source is fatal); config.cpp ``Open_macro_source``
(the '|' must be last, argv split by ``ArgList::AppendArgsV1RawOrV2Quoted``, ``my_popen`` runs it
without a shell, in the caller's environment and working directory, PATH searched by execvp),
``Close_macro_source`` (a LOCAL_CONFIG_FILE command's non-zero exit status is fatal) and
``Parse_macros`` (an ``include command``'s status is not looked at: ``fclose``, not
``Close_macro_source``). Each expectation below was observed with htcondor 25.14.1.
"""

from __future__ import annotations

import os
import select
import stat
import time
from pathlib import Path

from ce_k8s.condor import htconfig
from ce_k8s.condor.config import CondorConfig, Origin
from ce_k8s.condor.diagnostics import Severity

ARGS_SCRIPT = """#!/bin/sh
i=0
for a in "$@"; do i=$((i+1)); echo "ARG$i = [$a]"; done
echo "N = $#"
echo "CWD = $(pwd)"
echo "FROM_ENV = $CE_K8S_TEST_VALUE"
"""


def script(path: Path, text: str, executable: bool = True) -> Path:
    path.write_text(text)
    path.chmod(0o755 if executable else 0o644)
    return path


def env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **extra}


def assert_ends(pid: int) -> None:
    """The process ``pid`` ends within seconds (it was sent SIGKILL; a pidfd becomes readable when it
    has exited, which may be a moment after it closed its pipes)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        readable, _, _ = select.select([fd], [], [], 30)
    finally:
        os.close(fd)
    assert readable, f"process {pid} is still running"


def load(root: Path, **kw) -> CondorConfig:
    return CondorConfig.load(root, run_commands=True, **kw)


def test_local_config_file_command_output_is_read_with_the_command_line_as_origin(tmp_path, monkeypatch):
    """process_locals: `LOCAL_CONFIG_FILE = cmd args |` runs cmd (argv split V1-raw: quotes are text,
    no shell: `;` and `$HOME` reach the program as written), in our working directory and environment."""
    cmd = script(tmp_path / "args.sh", ARGS_SCRIPT)
    root = tmp_path / "condor_config"
    root.write_text(f'A = 1\nLOCAL_CONFIG_FILE = {cmd} x "y z" a;b $HOME |\n')
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cfg = load(root, environ=env(CE_K8S_TEST_VALUE="passed", HOME="/home/h"))
    assert cfg.read_by_htcondor
    assert [cfg.raw(f"ARG{i}") for i in range(1, 6)] == ["[x]", '["y]', '[z"]', "[a;b]", "[$HOME]"]
    assert cfg.raw("N") == "5"
    assert cfg.raw("CWD") == str(work)
    assert cfg.raw("FROM_ENV") == "passed"
    origin = cfg.origin("ARG1")
    assert origin == Origin(str(root), 2)
    assert origin.via == f'line 1 of the output of `{cmd} x "y z" a;b $HOME |`'
    assert cfg.origin("A") == Origin(str(root), 1)
    assert not [d for d in cfg.diagnostics if d.severity >= Severity.NOTE]


def test_v2_quoted_command_groups_with_single_quotes(tmp_path):
    """ArgList V2 syntax when the whole command is in double quotes: '' groups, "" is a quote."""
    cmd = script(tmp_path / "args.sh", ARGS_SCRIPT)
    root = tmp_path / "condor_config"
    root.write_text(f"""LOCAL_CONFIG_FILE = "{cmd} a 'b c' d""q" |\n""")
    cfg = load(root, environ=env())
    assert [cfg.raw("ARG1"), cfg.raw("ARG2"), cfg.raw("ARG3"), cfg.raw("N")] == ["[a]", "[b c]", '[d"q]', "3"]


def test_include_command_searches_path_and_ignores_the_exit_status(tmp_path):
    """Parse_macros: `include command : cmd` is execvp'd (PATH searched); its exit status is not checked."""
    script(tmp_path / "args.sh", ARGS_SCRIPT)
    script(tmp_path / "fails.sh", "#!/bin/sh\necho 'PARTIAL = yes'\nexit 3\n")
    root = tmp_path / "condor_config"
    root.write_text("include command : args.sh one\ninclude command : fails.sh\nLAST = $(PARTIAL)\n")
    cfg = load(root, environ=env(PATH=f"{tmp_path}:/usr/bin:/bin"))
    assert cfg.raw("ARG1") == "[one]" and cfg.raw("N") == "1"
    assert cfg.raw("PARTIAL") == "yes" and cfg.get("LAST") == "yes"
    assert cfg.origin("PARTIAL") == Origin(str(root), 2)
    assert not [d for d in cfg.diagnostics if d.severity == Severity.ERROR]


def test_failing_local_config_file_command_is_htcondors_error(tmp_path):
    """Close_macro_source: a LOCAL_CONFIG_FILE command exiting non-zero stops the daemon; the message
    is HTCondor's own (the raw wait status, 3 << 8) and is placed at the line naming the command."""
    cmd = script(tmp_path / "fails.sh", "#!/bin/sh\necho 'PARTIAL = yes'\nexit 3\n")
    root = tmp_path / "condor_config"
    root.write_text(f"A = 1\nLOCAL_CONFIG_FILE = {cmd} |\n")
    cfg = load(root, environ=env())
    errors = [d for d in cfg.diagnostics if d.severity == Severity.ERROR]
    assert len(errors) == 1
    assert (errors[0].file, errors[0].line) == (str(root), 2)
    assert "would not start" in errors[0].message
    assert f'Error "{cmd} |": command terminated with exit code 768' in errors[0].message
    assert not cfg.read_by_htcondor and cfg.raw("A") == "1"


def test_command_that_is_not_executable_is_htcondors_error(tmp_path):
    """my_popen: execvp fails (EACCES) and Open_macro_source reports 'not a valid command'."""
    cmd = script(tmp_path / "plain.sh", "X = 1\n", executable=False)
    assert not os.stat(cmd).st_mode & stat.S_IXUSR
    root = tmp_path / "condor_config"
    root.write_text(f"include command : {cmd}\n")
    cfg = load(root, environ=env())
    errors = [d for d in cfg.diagnostics if d.severity == Severity.ERROR]
    assert [(e.file, e.line) for e in errors] == [(str(root), 1)]
    assert "not a valid command, errno=13 : Permission denied" in errors[0].message


def test_include_ifexist_command_that_cannot_run_is_skipped(tmp_path):
    """Parse_macros: with `ifexist` a source that cannot be opened is skipped silently."""
    root = tmp_path / "condor_config"
    root.write_text(f"include ifexist command : {tmp_path}/missing.sh\nY = 2\n")
    cfg = load(root, environ=env())
    assert cfg.raw("Y") == "2"
    assert not [d for d in cfg.diagnostics if d.severity == Severity.ERROR]


def test_no_commands_runs_nothing_and_notes_each_command(tmp_path):
    """--no-commands: the same configuration read by ce-k8s alone; a NOTE per command, at its line."""
    marker = tmp_path / "ran"
    cmd = script(tmp_path / "touch.sh", f"#!/bin/sh\ntouch {marker}\necho 'FROM_CMD = 1'\n")
    root = tmp_path / "condor_config"
    root.write_text(f"A = 1\ninclude command : {cmd}\nLOCAL_CONFIG_FILE = {cmd} |\n")
    cfg = CondorConfig.load(root, run_commands=False)
    assert not marker.exists()
    assert cfg.raw("FROM_CMD") is None and cfg.raw("A") == "1"
    notes = [d for d in cfg.diagnostics if d.severity == Severity.NOTE]
    assert [(d.file, d.line) for d in notes] == [(str(root), 2), (str(root), 3)]
    assert f"`{cmd} |`" in notes[0].message and "--no-commands" in notes[0].message
    # and with commands the same lines are run, once each
    ran = load(root, environ=env())
    assert marker.exists() and ran.raw("FROM_CMD") == "1"


def test_reader_reports_knob_sources_and_metaknob_ids(tmp_path):
    """hash_iter_meta/config_source_by_id: file and line per knob; a `use` line's knobs carry a meta id."""
    root = tmp_path / "condor_config"
    root.write_text("A = 1\nuse security : recommended\nB @=end\n  x\n  y\n@end\n")
    result = htconfig.read(str(root), environ=env())
    assert result.error is None
    rows = {k.name: k for k in result.knobs if k.source == str(root)}
    assert (rows["A"].line, rows["A"].meta_id) == (1, -1)
    assert rows["SEC_DEFAULT_AUTHENTICATION"].line == 2 and rows["SEC_DEFAULT_AUTHENTICATION"].meta_id >= 0
    assert rows["B"].value == "x\ny"


def test_directory_input_reads_like_local_config_dir(tmp_path):
    """A directory (--config DIR) is read as LOCAL_CONFIG_DIR; the synthetic root's own knob is dropped."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "10-a.conf").write_text("X = a\n")
    (d / "20-b.conf").write_text("X += b\n")
    cfg = CondorConfig.load(d, run_commands=True, environ=env())
    assert cfg.read_by_htcondor and cfg.raw("X") == "a b"
    assert cfg.raw("LOCAL_CONFIG_DIR") is None
    assert cfg.origin("X") == Origin(str(d / "20-b.conf"), 1)


def test_subsystem_is_the_job_router(tmp_path):
    """The child sets the subsystem before reading: $(SUBSYSTEM) and JOB_ROUTER.X are the router's."""
    root = tmp_path / "condor_config"
    root.write_text("S = $(SUBSYSTEM)\nK = plain\nJOB_ROUTER.K = router\n")
    cfg = load(root, environ=env())
    assert cfg.get("S") == "JOB_ROUTER"
    assert cfg.raw("K") == "router"  # lookup_macro: SUBSYS.NAME first
    ours = CondorConfig.load(root)
    assert ours.raw("K") == "router" and ours.get("S") == "JOB_ROUTER"


def test_htcondor_is_the_reference_when_our_parser_stops(tmp_path):
    """$RANDOM_CHOICE() is HTCondor's and not ours: our parser stops at the `if`, HTCondor's reads on,
    and its values are used (a NOTE names where ours stopped)."""
    root = tmp_path / "condor_config"
    root.write_text("R = $RANDOM_CHOICE(1,1)\nif $(R)\n  PICKED = yes\nendif\nB @=end\n  x\n@end\n")
    cfg = load(root, environ=env())
    assert cfg.read_by_htcondor and cfg.raw("PICKED") == "yes" and cfg.raw("B") == "x"
    [note] = cfg.diagnostics
    assert (note.file, note.line, note.severity) == (str(root), 2, Severity.NOTE)
    assert cfg.origin("PICKED") == Origin(str(root), 3)


def test_a_reader_that_cannot_start_leaves_our_values(tmp_path, monkeypatch):
    """No usable htcondor wheel in the child: not HTCondor refusing the configuration, just a NOTE."""
    monkeypatch.setattr(htconfig, "_CHILD", f"import sys\nsys.stderr.write('no wheel')\n"
                                            f"sys.exit({htconfig.UNAVAILABLE_STATUS})\n")
    root = tmp_path / "condor_config"
    root.write_text("A = 1\ninclude command : /bin/echo B = 2\n")
    cfg = load(root, environ=env())
    assert not cfg.read_by_htcondor and cfg.raw("A") == "1" and cfg.raw("B") is None
    assert [d.severity for d in cfg.diagnostics] == [Severity.NOTE, Severity.NOTE]
    assert "could not run (no wheel)" in cfg.diagnostics[0].message
    assert "it was not run (HTCondor's reader could not run)" in cfg.diagnostics[1].message


def test_include_command_into_a_file_reads_the_file_when_it_exists(tmp_path):
    """Parse_macros / Copy_macro_source_into: `include command into FILE : cmd` reads FILE if it
    exists, without running cmd; otherwise HTCondor runs cmd and keeps its output in FILE."""
    marker = tmp_path / "ran"
    cmd = script(tmp_path / "cmd.sh", f"#!/bin/sh\ntouch {marker}\necho 'FROM_CMD = fresh'\n")
    cache = tmp_path / "cache.conf"
    root = tmp_path / "condor_config"
    root.write_text(f"include command into {cache} : {cmd}\nA = 1\n")
    alone = CondorConfig.load(root)
    assert alone.raw("FROM_CMD") is None and [d.line for d in alone.diagnostics] == [1]
    first = load(root, environ=env())
    assert marker.exists() and first.raw("FROM_CMD") == "fresh" and cache.read_text() == "FROM_CMD = fresh\n"
    assert first.origin("FROM_CMD") == Origin(str(root), 1)  # the first time, the command's output
    assert "of the output of" in first.origin("FROM_CMD").via
    marker.unlink()
    cache.write_text("FROM_CMD = cached\n")
    for cfg in (CondorConfig.load(root), load(root, environ=env())):
        assert cfg.raw("FROM_CMD") == "cached" and not cfg.diagnostics
        assert cfg.origin("FROM_CMD") == Origin(str(cache), 1)
    assert not marker.exists()


def test_the_root_configuration_may_itself_be_a_command(tmp_path):
    """condor_config.cpp find_file: CONDOR_CONFIG = "cmd |" is accepted (a pipe command ending in '|')."""
    cmd = script(tmp_path / "root.sh", "#!/bin/sh\necho 'FROM_ROOT = 1'\n")
    cfg = CondorConfig.load(f"{cmd} |", run_commands=True, environ=env())
    assert cfg.read_by_htcondor and cfg.raw("FROM_ROOT") == "1"
    assert cfg.origin("FROM_ROOT") == Origin("<CONDOR_CONFIG>", 0)
    alone = CondorConfig.load(f"{cmd} |")
    assert alone.raw("FROM_ROOT") is None and [d.file for d in alone.diagnostics] == ["<CONDOR_CONFIG>"]


def test_each_command_runs_exactly_once_and_sees_condor_config(tmp_path):
    """The router runs a configuration command once per (re)configuration; so does ce-k8s (importing
    htcondor2 would read the configuration a first time: the child imports it without one)."""
    count = tmp_path / "count"
    cmd = script(tmp_path / "count.sh", f'#!/bin/sh\necho x >> {count}\necho "SEEN_CONFIG = $CONDOR_CONFIG"\n')
    root = tmp_path / "condor_config"
    root.write_text(f"LOCAL_CONFIG_FILE = {cmd} |\n")
    cfg = load(root, environ=env())
    assert count.read_text() == "x\n"
    assert cfg.raw("SEEN_CONFIG") == str(root)


def test_a_command_that_hangs_ends_in_an_error_not_a_hang(tmp_path, monkeypatch):
    """The router would hang too; ce-k8s gives up after READER_TIMEOUT and ends the command with it
    (reader and commands share a process group, so nothing is left holding the output pipes)."""
    monkeypatch.setattr(htconfig, "READER_TIMEOUT", 2.0)
    pidfile = tmp_path / "pid"
    cmd = script(tmp_path / "hang.sh", f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 300\n")
    root = tmp_path / "condor_config"
    root.write_text(f"A = 1\nLOCAL_CONFIG_FILE = {cmd} |\n")
    started = time.monotonic()
    cfg = load(root, environ=env())
    assert time.monotonic() - started < 60  # not the command's 300 s
    [error] = [d for d in cfg.diagnostics if d.severity == Severity.ERROR]
    assert "did not finish in 2 s" in error.message and cfg.raw("A") == "1"
    assert_ends(int(pidfile.read_text()))


def test_an_interrupted_load_leaves_no_command_running(tmp_path):
    """Ctrl-C while HTCondor's reader runs (here: raised by while_reading) ends the reader and its commands."""
    pidfile = tmp_path / "pid"
    cmd = script(tmp_path / "hang.sh", f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 300\n")
    root = tmp_path / "condor_config"
    root.write_text(f"LOCAL_CONFIG_FILE = {cmd} |\n")

    def interrupt() -> None:
        deadline = time.monotonic() + 60
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline, "the command never started"
            os.sched_yield()  # the command has started once it wrote its pid
        raise KeyboardInterrupt

    started = time.monotonic()
    try:
        CondorConfig.load(root, run_commands=True, environ=env(), while_reading=interrupt)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt was swallowed")
    assert time.monotonic() - started < 60
    assert_ends(int(pidfile.read_text()))
