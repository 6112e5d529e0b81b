"""HTCondor argument/environment quoting (condor_arglist.cpp split_args, env.cpp; condor_submit docs)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ce_k8s.condor.args import (
    ArgsError,
    job_args,
    job_env,
    join_v2_raw,
    parse_env_v1_raw,
    parse_env_v2_raw,
    parse_submit_env,
    split_submit_args,
    split_v1_raw,
    split_v2_raw,
    v1_wacked_to_raw,
    v2_quoted_to_raw,
)


def test_v2_raw_single_quotes_group_and_double_to_escape():
    """V2 raw (job ad `Arguments`): whitespace splits, '...' groups, '' inside is one quote."""
    assert split_v2_raw("a 'b c' 'it''s' '' d") == ["a", "b c", "it's", "", "d"]
    assert split_v2_raw("  x\ty\n z\r ") == ["x", "y", "z"]
    assert split_v2_raw("pre'fix mid'post") == ["prefix midpost"]
    assert split_v2_raw('say "hi"') == ["say", '"hi"']  # double quotes are ordinary in V2 raw


def test_v2_raw_unbalanced_quote_is_an_error():
    """split_args returns false on an unterminated single quote ('Unbalanced quote')."""
    with pytest.raises(ArgsError, match="unbalanced"):
        split_v2_raw("a 'b c")


def test_v2_quoted_submit_examples():
    """condor_submit `arguments` examples: double-quoted whole string, "" is a literal quote."""
    assert split_submit_args('"3 simple arguments"') == ["3", "simple", "arguments"]
    assert split_submit_args('"one ""two"" \'spacey \'\'quoted\'\' argument\'"') == [
        "one", '"two"', "spacey 'quoted' argument",
    ]
    assert v2_quoted_to_raw('  "a ""b"""  ') == 'a "b"'
    with pytest.raises(ArgsError, match="unterminated"):
        v2_quoted_to_raw('"abc')
    with pytest.raises(ArgsError, match="after the closing"):
        v2_quoted_to_raw('"abc" def')


def test_v1_args_split_on_whitespace_only_and_wacked_quotes():
    """Old `Args`: whitespace-separated, no quoting; submit-file V1 escapes " as \\"."""
    assert split_v1_raw("-a  'b c'\t-d") == ["-a", "'b", "c'", "-d"]
    assert split_v1_raw("x\u00a0y") == ["x\u00a0y"]  # only space/tab/CR/LF separate (Unix V1)
    assert split_submit_args('-p \\"x\\"') == ["-p", '"x"']
    with pytest.raises(ArgsError, match="unescaped double quote"):
        v1_wacked_to_raw('a "b')


def test_arguments_win_over_args():
    """AppendArgsFromClassAd: `Arguments` (V2) when present, else `Args` (V1)."""
    assert job_args("'a b'", "c d") == ["a b"]
    assert job_args(None, "c d") == ["c", "d"]
    assert job_args(None, None) == []


def test_environment_v2_and_v1():
    """Environment: V2 words of NAME=VALUE; Env: ';'- or newline-separated, leading blanks dropped."""
    assert parse_env_v2_raw("A=1 'B=x y' C= D=e=f") == {"A": "1", "B": "x y", "C": "", "D": "e=f"}
    assert parse_env_v1_raw("A=1; B=2;\nC=x y;;") == {"A": "1", "B": "2", "C": "x y"}
    assert job_env("A=1", "B=2") == {"A": "1"}
    assert job_env(None, "B=2|C=3", "|") == {"B": "2", "C": "3"}
    assert parse_submit_env('"A=1 B=\'two words\'"') == {"A": "1", "B": "two words"}
    assert parse_submit_env("A=1;B=2") == {"A": "1", "B": "2"}


def test_environment_errors_and_macros():
    """SetEnvWithErrorMessage: missing '=' or empty name is an error; unexpanded $$() entries are kept out."""
    with pytest.raises(ArgsError, match="missing '='"):
        parse_env_v2_raw("NOEQUALS")
    with pytest.raises(ArgsError, match="missing variable name"):
        parse_env_v1_raw("=value")
    assert parse_env_v2_raw("$$(FOO) A=1") == {"A": "1"}


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12), max_size=8))
def test_v2_join_split_round_trip(words):
    """append_arg and split_args are inverses for every word list (condor_arglist.cpp)."""
    assert split_v2_raw(join_v2_raw(words)) == words
