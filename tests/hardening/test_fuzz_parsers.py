"""Fuzzing every parser that reads outside text: each input ends in a result or a typed error.

Issue 9 ("Fuzzing"): job ads in both formats, hook stdout, the config reader, the transform
language, `Arguments`/`Environment`, and the `K8s*` values. The rule checked everywhere: the only
exception that may escape is the parser's own typed error (a `ValueError` subclass or the
documented config/transform error), and its message is non-empty and names the input where it
has a name. Crashes of the C++ ClassAd library cannot be caught in-process, so the inputs known to
crash it are fed to a child process (`test_*_never_crashes_the_process`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import classad2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ce_k8s.condor import args as cargs
from ce_k8s.condor import wire
from ce_k8s.condor.config import CondorConfig, ConfigError
from ce_k8s.condor.transform import MacroSet, Transform, TransformError
from ce_k8s.pods.builder import build_manifests
from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.names import is_dns_label, is_dns_subdomain, is_label_value
from ce_k8s.settings import Settings

settings.load_profile("hardening")

# Text that looks like what the parsers expect, with the characters that break naive parsers.
TOKENS = ["=", " = ", '"', "\\", "\\\"", "'", "[", "]", "{", "}", "(", ")", ";", ",", "\n", "\r", "\t",
          "$(", "$$(", ")", "MY.", "TARGET.", "#", "@=", "@", "...", "***", "-- Schedd:", "------",
          "\x00", "\u2028", "é", "undefined", "error", "true", "1.5e308", "-9223372036854775809", "/Expr(",
          ")/", "X", "Owner", "JobUniverse", "if ", "elif ", "else", "endif", "SET ", "EVALSET ",
          "DEFAULT ", "COPY ", "RENAME ", "DELETE ", "REQUIREMENTS ", "UNIVERSE ", "include : ", "use ",
          "\\\n", "$ENV(", "$RANDOM_CHOICE(", "$INT(", "$SUBSTR(", "$CHOICE("]
adish_text = st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=8)), max_size=40).map("".join)
any_text = st.one_of(st.text(max_size=300), adish_text)


def _check_error(exc: BaseException) -> None:
    assert str(exc).strip(), f"{type(exc).__name__} without a message"


# -- job ads, both formats, and hook stdout (docs/hook-protocol.md §2.1, §2.2, §7) ------------

@given(any_text)
def test_old_ads_result_or_adparseerror(text):
    """condor_q -long form: any text → ads or AdParseError naming the source (and line)."""
    try:
        ads = wire.parse_old_ads(text, "fuzz.ads")
    except wire.AdParseError as exc:
        _check_error(exc)
        assert str(exc).startswith("fuzz.ads:")
        return
    for ad in ads:
        wire.evaluate_ad(ad)           # evaluating what parsed must not raise either


@given(st.one_of(any_text, st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12).map(json.dumps)))
def test_json_ads_result_or_adparseerror(text):
    """condor_q -json form: any text (and any JSON document) → ads or AdParseError."""
    try:
        ads = wire.parse_job_ads(text, "fuzz.json")
    except wire.AdParseError as exc:
        _check_error(exc)
        assert str(exc).startswith("fuzz.json:")
        return
    for ad in ads:
        wire.evaluate_ad(ad)


@given(any_text)
def test_hook_output_result_or_hookoutputerror(text):
    """hook-protocol.md §2.1: any stdout → an ad, or HookOutputError with the 1-based line number of the bad line."""
    try:
        ad = wire.parse_hook_output(text)
    except wire.HookOutputError as exc:
        _check_error(exc)
        lines = text.split("\n")
        assert 1 <= exc.line_no <= len(lines)
        assert lines[exc.line_no - 1] == exc.line
        return
    assert isinstance(ad, classad2.ClassAd)


# Lines shaped like hook output, with the tokens that make a one-call parse and a per-line parse
# disagree if they can: trailing words, unterminated strings running into the next line, comments,
# repeated names in other letter cases.
hook_line = st.one_of(
    st.builds(lambda n, v: f"{n} = {v}", st.sampled_from(["A", "a", "B", "JobStatus", "jobstatus", "X_1"]),
              st.one_of(adish_text, st.sampled_from(['"x', '1 2', 'a =?= b', '"a" "b"', "[ x = 1 ]", "{1,",
                                                     "undefined", '"C:\\new"', "3 trailing words"]))),
    adish_text)


@given(st.lists(hook_line, max_size=8).map("\n".join))
@example("A = undefined\nA = ")          # found by this test: a repeated name hid a bad line
def test_hook_output_fast_parse_matches_the_line_rule(text):
    """The one-call parse of hook stdout gives exactly what the per-line rule (hook-protocol.md §2.1) gives."""
    lines = [(no, line) for no, line in enumerate(text.split("\n"), start=1) if line.strip()]
    try:
        want = wire.sprint_ad(wire.hook_output_by_line(lines, "<t>"))
    except wire.AdParseError as exc:
        want = ("error", exc.line_no)
    try:
        got = wire.sprint_ad(wire.parse_hook_output(text, "<t>"))
    except wire.AdParseError as exc:
        got = ("error", exc.line_no)
    assert got == want


@given(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True),
                       st.one_of(st.integers(-2**62, 2**62), st.booleans(),
                                 # HTCondor strings are C strings (no NUL); raw newlines are the
                                 # documented sPrintAd quirk (hook-protocol.md §2.2) and tested in tests/condor.
                                 st.text(max_size=40).filter(lambda s: not set(s) & {"\n", "\r", "\x00"}
                                                             and not s.endswith("\\"))),
                       max_size=12))
def test_sprint_then_parse_round_trips_single_line_values(values):
    """sPrintAd text (hook-protocol.md §2.2) of any ad without raw newlines reads back to the same values."""
    ad = classad2.ClassAd()
    for k, v in values.items():
        ad[k] = v
    back = wire.parse_hook_output(wire.sprint_ad(ad))
    for k in ad.keys():
        if wire.is_private(k):
            continue
        assert back.eval(k) == ad.eval(k), k


@given(st.dictionaries(
    st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True),
              st.sampled_from(["ClaimId", "Capability", "_condor_privX", "_CONDOR_PRIVy", "ChildClaimIds"])),
    st.one_of(st.integers(-2**62, 2**62), st.booleans(), st.floats(allow_nan=False), st.text(max_size=30),
              st.lists(st.integers(0, 9), max_size=3),
              st.sampled_from(["a + 1", "x =?= undefined", 'strcat("a", b)', "[ y = 1; z = y ]", "{ 1, \"s\" }",
                               "ifThenElse(a, \"x\ny\", 2)"]).map(classad2.ExprTree)),
    max_size=15))
@example({"A": "x\ny", "b": 1})                 # a raw newline: the attribute-by-attribute path
def test_sprint_ad_fast_path_matches_the_attribute_rule(values):
    """sprint_ad (one library print, then filtered and sorted) equals printing each attribute."""
    ad = classad2.ClassAd()
    for k, v in values.items():
        ad[k] = v
    assert wire.sprint_ad(ad) == wire.sprint_ad_by_attribute(ad)


def test_oversized_ad_is_refused_before_parsing():
    """internals.md MAX_AD_BYTES: a 100 MB ad is refused by size, naming the source, not parsed."""
    big = "A = 1\n" * (wire.MAX_AD_BYTES // 6 + 10)
    for parse in (wire.parse_old_ads, wire.parse_json_ads, wire.parse_job_ads, wire.parse_hook_output):
        with pytest.raises(wire.AdParseError, match=r"big\.ad: .*exceeds"):
            parse(big, "big.ad")


CRASHERS = {
    # Left-associative operator chains: classad2's recursive unparser and destructor overflow the C
    # stack (measured: printOld segfaults at 50,000 terms, parse at 200,000; a 400 kB line).
    "sum chain": "X = " + "+".join(["1"] * 200_000) + "\n",
    "and chain": "X = " + " && ".join(["true"] * 200_000) + "\n",
    "select chain": "X = " + "a" + ".b" * 200_000 + "\n",
    "nested parens": "X = " + "(" * 200_000 + "1" + ")" * 200_000 + "\n",
    "nested lists": "X = " + "{" * 200_000 + "}" * 200_000 + "\n",
    "is chain": "X = " + " is ".join(["a"] * 200_000) + "\n",
}
JSON_CRASHERS = {
    # json.loads raises RecursionError (not JSONDecodeError) on deep nesting.
    "deep json": "[" * 100_000 + "]" * 100_000,
    "deep value": '[{"A": ' + "[" * 100_000 + "]" * 100_000 + "}]",
    # classad2's JSON reader raises KeyError / SystemError on some non-ASCII names (found by the
    # fuzzer above).
    "non-ascii name": '{"\\u1080": null}',
    "control name": '{"00000": null, "0000\\u0080": null}',
    "expr chain": json.dumps([{"X": "/Expr(" + "+".join(["1"] * 200_000) + ")/"}]),
}


@pytest.mark.parametrize("name", sorted(JSON_CRASHERS))
def test_hostile_json_ads_end_in_adparseerror(name):
    """condor_q -json input: deep nesting, odd names, huge expressions → AdParseError (issue 9)."""
    for parse in (wire.parse_json_ads, wire.parse_job_ads):
        with pytest.raises(wire.AdParseError, match=r"^hostile\.json:"):
            parse(JSON_CRASHERS[name], "hostile.json")


@pytest.mark.parametrize("name", sorted(CRASHERS))
def test_deep_expressions_never_crash_the_process(name, tmp_path):
    """A hostile routed ad that reaches the agent (the socket is open to every pilot account) must
    end in AdParseError, not in a segfault that kills the agent for everyone (issue 9 "no crash").
    Each parser runs in a child process so a crash is observed instead of killing pytest."""
    path = tmp_path / "ad.txt"
    path.write_text(CRASHERS[name])
    code = textwrap.dedent(f"""
        import sys
        from ce_k8s.condor import wire
        text = open({str(path)!r}).read()
        for parse in (wire.parse_old_ads, wire.parse_hook_output):
            try:
                result = parse(text, "hostile.ad")
                ads = result if isinstance(result, list) else [result]
                for ad in ads:
                    wire.evaluate_ad(ad)
                    wire.sprint_ad(ad)
                print(parse.__name__, "parsed")
            except wire.AdParseError as exc:
                print(parse.__name__, "refused:", str(exc)[:120])
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=False)
    assert res.returncode == 0, f"parser process died with {res.returncode}: {res.stderr[-400:]!r}"


# -- the config reader ------------------------------------------------------------------------

@given(any_text)
def test_config_text_result_or_configerror(text):
    """Any config text → a config whose every knob expands, or ConfigError 'file:line: message'."""
    try:
        cfg = CondorConfig.from_text(text, "fuzz.conf")
        for name in cfg.names():
            cfg.get(name)
            cfg.raw(name)
    except ConfigError as exc:
        _check_error(exc)
        assert str(exc).startswith("fuzz.conf:") or str(exc).startswith("<")
        return


def test_config_include_command_never_runs(tmp_path):
    """ce-k8s's own reader never runs `include command : ...`; it notes each one (only HTCondor's
    reader, asked for with run_commands=True, runs them: docs/routes.md)."""
    marker = tmp_path / "ran"
    cfg = CondorConfig.from_text(f"include command : touch {marker}\nX = 1\ninclude : touch {marker} |\n",
                                 "cmd.conf")
    assert not marker.exists()
    assert cfg.get("X") == "1"
    assert sum("it was not run" in d.message for d in cfg.diagnostics) == 2


# -- the transform language -------------------------------------------------------------------

# a ClassAd integer is 64-bit: classad2 cannot even store a larger Python int (the job ad could
# never carry one), so the generated attributes stay in that range
@given(any_text, st.dictionaries(st.sampled_from(["Owner", "x", "Cmd", "RequestCpus", "y"]),
                                 st.one_of(st.text(max_size=30), st.integers(-(2**63), 2**63 - 1)), max_size=4))
def test_transform_parse_and_apply_result_or_transformerror(text, attrs):
    """A transform body: TransformError (structural, with origin) or it runs; run-time trouble is
    a logged error string, never an exception other than TransformError (hook-protocol.md §4)."""
    try:
        t = Transform.parse("Fuzz", text)
    except TransformError as exc:
        _check_error(exc)
        return
    ad = classad2.ClassAd()
    for k, v in attrs.items():
        ad[k] = v
    try:
        errors = t.apply(ad, MacroSet(None))
    except TransformError as exc:
        _check_error(exc)
        return
    assert all(isinstance(e, str) and e for e in errors)


# -- Arguments / Environment (condor_arglist.cpp, env.cpp) -----------------------------------

@given(any_text)
def test_args_and_env_result_or_argserror(text):
    """Every argument/environment syntax → words/dict or ArgsError; never anything else."""
    for fn in (cargs.split_v2_raw, cargs.split_submit_args, cargs.parse_submit_env, cargs.parse_env_v2_raw,
               lambda t: cargs.job_args(None, t), lambda t: cargs.job_env(None, t, ";"),
               lambda t: cargs.job_env(t, None)):
        try:
            out = fn(text)
        except cargs.ArgsError as exc:
            _check_error(exc)
            continue
        assert isinstance(out, (list, dict))


@given(st.lists(st.text(max_size=12), max_size=8))
def test_v2_join_split_round_trip(words):
    """join_v2_raw is the inverse of split_v2_raw for any words (quotes, spaces, empty words)."""
    assert cargs.split_v2_raw(cargs.join_v2_raw(words)) == words


# -- K8s* values, through the pod builder ----------------------------------------------------

VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=True),
              st.text(max_size=30), st.sampled_from(["", "a", "kube-system", "../x", "A_B", "x" * 70,
                                                     '{"op": "add"}', "[]", "{}", "1.5", "none", "request"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=10), inner, max_size=3)),
    max_leaves=8)
K8S_ATTRS = ["K8sNamespace", "K8sImage", "K8sImagePullPolicy", "K8sServiceAccount", "K8sAutomountToken",
             "K8sPriorityClass", "K8sRuntimeClass", "K8sNodeSelector", "K8sTolerations", "K8sAffinity",
             "K8sLabels", "K8sAnnotations", "K8sGpuResource", "K8sCpuLimit", "K8sEnv", "K8sVolumes",
             "K8sPodPatch", "K8sWholeNodeCpus", "K8sWholeNodeMemory", "K8sWholeNodeGpus", "RequestCpus",
             "RequestMemory", "RequestDisk", "RequestGPUs", "WantWholeNode", "Arguments", "Args", "Environment",
             "Env", "Owner", "GlobalJobId", "K8sSourceGlobalJobId", "BatchRuntime", "maxWallTime"]
HARDENING_SETTINGS = Settings(namespace="pilots", image="pilot:1", ce_name="ce.example.org", spool="/spool")
BASE_AD = {"ClusterId": 7, "ProcId": 0, "RoutedFromJobId": "7.0", "Owner": "osg01", "JobUniverse": 9,
           "GlobalJobId": "ce.example.org#7.0#1760000000", "Cmd": "/spool/7/0/cluster7.proc0.subproc0/run.sh",
           "Iwd": "/spool/7/0/cluster7.proc0.subproc0", "K8sAttempt": 0}


@given(st.dictionaries(st.sampled_from(K8S_ATTRS), VALUE, max_size=6))
def test_k8s_values_build_or_podbuilderror(extra):
    """Any K8s* values → a pod whose names and labels are valid, or PodBuildError with a stable
    code (internals.md "Holds"); the pod never loses the safe defaults (docs/design.md Decision 7)."""
    ad = dict(BASE_AD)
    ad.update(extra)
    try:
        built = build_manifests(ad, HARDENING_SETTINGS)
    except PodBuildError as exc:
        assert exc.code and exc.message
        return
    meta = built.pod["metadata"]
    assert is_dns_label(meta["name"]) and is_dns_label(meta["namespace"])
    for key, value in meta.get("labels", {}).items():
        assert is_label_value(value), (key, value)
        assert is_dns_subdomain(key.rpartition("/")[0]) or "/" not in key
    spec = built.pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    for c in spec["containers"] + spec.get("initContainers", []):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert "command" not in c or c["command"][:1] not in (["sh"], ["/bin/sh"], ["bash"], ["/bin/bash"])


@pytest.mark.parametrize("text", [
    b"\xa14=4".decode("utf-8", "surrogateescape"),     # undecodable byte in a name (the agent decodes
    "\x00\x00=P\x1f.",                                   # hook payloads with surrogateescape); NUL in a name
    "A = 1\n\x00 = 2\n",
])
def test_atheris_findings_end_in_adparseerror(text):
    """Found by fuzz/fuzz_parsers.py (atheris): classad2 raised UnicodeEncodeError / ValueError
    for such names; both readers now refuse them with a line number."""
    for parse in (wire.parse_old_ads, wire.parse_hook_output):
        with pytest.raises(wire.AdParseError, match="not printable ASCII"):
            parse(text, "found.ad")
