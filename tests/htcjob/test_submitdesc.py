"""The submit description keeps every user word as written: arguments and environment through
HTCondor's V2 quoting and `$(DOLLAR)`, read back here with the parser that mirrors
condor_arglist.cpp (ce_k8s.condor.args); the real schedd's reading is tests/real/test_htcjob_condor.py."""

from __future__ import annotations

from pathlib import Path

from ce_k8s.condor.args import parse_env_v2_raw, split_v2_raw
from ce_k8s.htcjob.spec import parse_spec
from ce_k8s.htcjob.submitdesc import describe

WORDS = ["plain", "two words", "it's", 'say "hi"', "$(Cluster)", "$HOME", "", "tab\there"]


def _unquote(value: str) -> str:
    assert value.startswith('"') and value.endswith('"')
    return value[1:-1].replace('""', '"').replace("$(DOLLAR)", "$")


def test_arguments_and_environment_survive_quoting_and_macros():
    spec = parse_spec({"command": ["/usr/bin/env", *WORDS],
                       "env": [{"name": "A", "value": "x y 'z' $(ProcId) \"q\""}, {"name": "B", "value": ""}]})
    desc = describe(spec, uid="u-1", name="n", namespace="ns", work=Path("/w"), input_files=[])
    assert split_v2_raw(_unquote(desc["arguments"])) == WORDS
    env = parse_env_v2_raw(_unquote(desc["environment"]))
    assert env == {"HTCJOB_INDEX": "$(ProcId)", "A": "x y 'z' $(ProcId) \"q\"", "B": ""}
    # HTCJOB_INDEX is the one value left for HTCondor to expand (no $(DOLLAR) in it).
    assert desc["environment"].startswith('"HTCJOB_INDEX=$(ProcId) ')
    assert desc["executable"] == "/usr/bin/env" and desc["transfer_executable"] == "false"
    assert desc["MY.HTCJobUid"] == '"u-1"' and desc["initialdir"] == "/w/out/$(ProcId)"


def test_an_interpreter_runs_the_uploaded_script_with_the_index():
    """htc-operator's `script.command` + `script.source`: the interpreter, then the script, then the index."""
    spec = parse_spec({"script": {"source": "echo A\n", "interpreter": ["bash", "-e"]}, "queue": 2})
    desc = describe(spec, uid="u", name="n", namespace="ns", work=Path("/w"), input_files=[Path("/w/in/a")])
    assert desc["executable"] == "bash" and desc["transfer_executable"] == "false"
    assert split_v2_raw(_unquote(desc["arguments"])) == ["-e", "htcjob.sh", "$(ProcId)"]
    assert desc["transfer_input_files"] == "/w/in/a,/w/in/htcjob.sh"


def test_a_script_is_uploaded_and_gets_its_index():
    spec = parse_spec({"script": {"source": "#!/bin/sh\n"}, "queue": 2, "image": "alpine:3",
                       "resources": {"memory": "1Gi"}, "submit": {"+ProjectName": '"physics"'}})
    desc = describe(spec, uid="u", name="n", namespace="ns", work=Path("/w"), input_files=[Path("/w/in/a.txt")])
    assert desc["executable"] == "/w/in/htcjob.sh" and "transfer_executable" not in desc
    assert desc["arguments"] == '"$(ProcId)"' and desc["transfer_input_files"] == "/w/in/a.txt"
    assert (desc["universe"], desc["container_image"], desc["request_memory"]) == ("container", "alpine:3", "1024")
    assert desc["+ProjectName"] == '"physics"'
