"""An HTCJob's spec as an HTCondor submit description (the dict `htcondor2.Submit` takes).

Why every user string goes through `_literal`: a submit description expands `$(...)` macros in
every value, so a `$` in a user's argument or environment would be read as a macro. `$(DOLLAR)`
is HTCondor's own way to write a literal `$`. Arguments and environment use the V2 quoted
syntax (condor_arglist.cpp), built by `ce_k8s.condor.args.join_v2_raw`, so each word reaches
execve() as the user wrote it and no shell ever sees it.

Layout on the operator's side (the spooled submit records these paths; `retrieve` writes back
into them): `<work>/in/` holds the script and the input files, uploaded with the submit;
`<work>/out/<proc>/` is proc's initial directory, where its stdout, stderr and output files
come back. One directory per proc, so procs' same-named output files do not overwrite each other.
"""

from __future__ import annotations

from pathlib import Path

from ce_k8s.condor.args import join_v2_raw
from ce_k8s.htcjob.spec import HTCJobSpec

#: The job-ad attributes that tie a job to its resource (looked up before any submit).
UID_ATTR = "HTCJobUid"
NAME_ATTR = "HTCJobName"
NAMESPACE_ATTR = "HTCJobNamespace"
#: Set on a cluster the operator gave up on (its input upload was cut): never counted again.
ABANDONED_ATTR = "HTCJobAbandoned"
SCRIPT_NAME = "htcjob.sh"
STDOUT, STDERR = "_condor_stdout", "_condor_stderr"


def _literal(text: str) -> str:
    """A user string as a submit value that macro expansion leaves as it was."""
    return text.replace("$", "$(DOLLAR)")


def _v2_quoted(words: list[str]) -> str:
    return '"' + _literal(join_v2_raw(words)).replace('"', '""') + '"'


def _classad_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def proc_dir(work: Path, proc: int) -> Path:
    return work / "out" / str(proc)


def describe(spec: HTCJobSpec, *, uid: str, name: str, namespace: str, work: Path,
             input_files: list[Path]) -> dict[str, str]:
    """The submit description of `spec`'s jobs (one cluster, `spec.queue` procs).

    `input_files` are the files already written under `<work>/in/` (ConfigMap and Secret keys);
    the script, when there is one, is `<work>/in/htcjob.sh`.
    """
    desc: dict[str, str] = {}
    if spec.script is not None and spec.interpreter:
        # The interpreter is on the execute node (or in the image); the script travels as input.
        desc["executable"] = _literal(spec.interpreter[0])
        desc["transfer_executable"] = "false"
        words = _v2_quoted([*spec.interpreter[1:], SCRIPT_NAME])
        desc["arguments"] = words[:-1] + ' $(ProcId)"'
        input_files = [*input_files, work / "in" / SCRIPT_NAME]
    elif spec.script is not None:
        desc["executable"] = str(work / "in" / SCRIPT_NAME)
        desc["arguments"] = '"$(ProcId)"'
    else:
        desc["executable"] = _literal(spec.command[0])
        # The command lives on the execute node (or in the image): nothing to upload.
        desc["transfer_executable"] = "false"
        if len(spec.command) > 1:
            desc["arguments"] = _v2_quoted(list(spec.command[1:]))
    if spec.image:
        desc["universe"] = "container"
        desc["container_image"] = _literal(spec.image)
    else:
        desc["universe"] = "vanilla"
    # HTCJOB_INDEX's value is the one macro we want expanded: that entry stays outside _literal.
    user_env = _literal(join_v2_raw([f"{k}={v}" for k, v in spec.env])).replace('"', '""')
    desc["environment"] = '"HTCJOB_INDEX=$(ProcId)' + (" " + user_env if user_env else "") + '"'
    desc["initialdir"] = str(work / "out" / "$(ProcId)")
    desc["output"] = STDOUT
    desc["error"] = STDERR
    desc["should_transfer_files"] = "YES"
    desc["when_to_transfer_output"] = "ON_EXIT"
    if input_files:
        desc["transfer_input_files"] = ",".join(str(p) for p in input_files)
    desc["request_cpus"] = str(spec.cpus)
    if spec.memory_mib is not None:
        desc["request_memory"] = str(spec.memory_mib)
    if spec.disk_kib is not None:
        desc["request_disk"] = str(spec.disk_kib)
    if spec.gpus:
        desc["request_gpus"] = str(spec.gpus)
    if spec.wall_time is not None:
        desc["allowed_execute_duration"] = str(spec.wall_time)
    for key, value in spec.submit:
        desc[key] = value            # the user's own submit language, macros and all
    desc[f"MY.{UID_ATTR}"] = _classad_string(uid)
    desc[f"MY.{NAME_ATTR}"] = _classad_string(name)
    desc[f"MY.{NAMESPACE_ATTR}"] = _classad_string(namespace)
    return desc
