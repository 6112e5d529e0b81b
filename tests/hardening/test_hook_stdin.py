"""Hook stdin, hostile and huge, with the hooks as real processes (issue 9, docs/hook-protocol.md §2.1).

The router writes the whole stdin buffer and closes it (hook-protocol.md §2.1), never times a hook out, and
treats a signal death as exit 0 (hook-protocol.md §2.1 "Exit status test"). So every hook must: refuse an
oversized stdin early (bounded memory: measured peak RSS of the hook process), survive any bytes,
exit with its own mildest failure code (translate/update/cleanup 1, finalize 0, hook-protocol.md §2.2-§2.5), and
exit by itself when stdin never ends.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ce_k8s.condor import wire
from ce_k8s.hooks._common import MAX_STDIN
from ce_k8s.hooks.translate import TranslateError, translate_ad_text
from ce_k8s.pods.names import is_dns_label

from .conftest import hook_env, run_measured

settings.load_profile("hardening")

# Exit code each hook uses when it cannot do its job (hook-protocol.md §2.2 translate: graceful removal and retry;
# hook-protocol.md §2.3 update: no sync this cycle; §2.4 finalize: always 0, a non-zero exit re-runs the pilot;
# hook-protocol.md §2.5 cleanup: retried next poll).
FAIL_EXIT = {"translate": 1, "update": 1, "finalize": 0, "cleanup": 1}
RSS_LIMIT_KIB = 64 * 1024          # 100 MB offered; the hook may hold its 4 MiB cap, not the input
MEASURED: dict[str, int] = {}


def _chunks(total: int, chunk: bytes):
    sent = 0
    while sent < total:
        yield chunk
        sent += len(chunk)


@pytest.mark.parametrize("hook", sorted(FAIL_EXIT))
def test_100_mb_stdin_is_refused_early_with_bounded_memory(launchers, tmp_root, hook):
    """A 100 MB ad on stdin: the hook stops reading after MAX_STDIN + 1 bytes, exits with its
    failure code, writes nothing to stdout, and its peak RSS stays far below the input size."""
    line = b'Cmd = "' + b"x" * 1000 + b'"\n'
    res = run_measured([str(launchers / f"ce-k8s-{hook}")], _chunks(100 * 1024 * 1024, line * 64),
                       env=hook_env(str(tmp_root / "none.sock")), timeout=60)
    MEASURED[hook] = res.maxrss_kib
    print(f"{hook}: peak RSS {res.maxrss_kib} KiB with 100 MB offered on stdin")
    assert res.returncode == FAIL_EXIT[hook], res.stderr
    assert res.stdout == b""
    assert b"refused" in res.stderr
    assert res.stdin_error is not None            # it closed its stdin: the 100 MB were never read
    assert res.maxrss_kib < RSS_LIMIT_KIB, f"{hook} peak RSS {res.maxrss_kib} KiB"


@pytest.mark.parametrize("hook", sorted(FAIL_EXIT))
def test_one_million_lines_are_refused(launchers, tmp_root, hook):
    """1,000,000 attribute lines (6 MB) exceed the 4 MiB stdin cap: refused, not parsed."""
    res = run_measured([str(launchers / f"ce-k8s-{hook}")], _chunks(1_000_000 * 6, b"A = 1\n" * 10_000),
                       env=hook_env(str(tmp_root / "none.sock")), timeout=60)
    assert res.returncode == FAIL_EXIT[hook]
    assert res.stdout == b""
    assert res.maxrss_kib < RSS_LIMIT_KIB


GARBAGE = {
    "empty": b"",
    "binary": bytes(range(256)) * 64,
    "bad utf-8": b"\xff\xfe\xfa = \xc3\x28\n------\n\x80Owner = \"\xff\"\n",
    "nul bytes": b"[ Name = \"x\" ]\n------\nOwner = \"a\x00b\"\nGlobalJobId = \"\x00\"\n",
    "only separator": b"\n------\n",
    "no newline 3 MB": b"A" * (3 * 1024 * 1024),
    "one million blank lines": b"\n" * 1_000_000,
    "brackets": b"[\n]\n------\n[\n]\n",
    "just under the cap": b"X = " + b"1" * (MAX_STDIN - 5) + b"\n",
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
@pytest.mark.parametrize("hook", sorted(FAIL_EXIT))
def test_garbage_stdin_ends_in_an_exit_code_never_a_traceback(launchers, tmp_root, hook, name):
    """Any bytes: an exit code from the hook's table, no Python traceback, and stdout that the
    router can parse (hook-protocol.md §2.1) — or nothing."""
    res = run_measured([str(launchers / f"ce-k8s-{hook}")], [GARBAGE[name]],
                       env=hook_env(str(tmp_root / "none.sock"), timeout=2.0), timeout=30)
    assert res.returncode in (0, 1), res.stderr
    assert b"Traceback" not in res.stderr, res.stderr[-2000:]
    if res.stdout and hook != "translate":
        # translate echoes its input lines byte for byte (hook-protocol.md §2.2); lines the router itself could
        # never have written (a NUL inside a string) may come back, and the router then removes
        # the job gracefully, which is what exit 1 would have done. Realistic input is fuzzed in
        # test_translate_output_always_parses_and_names_a_valid_pod.
        wire.parse_hook_output(res.stdout.decode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("hook", sorted(FAIL_EXIT))
def test_stdin_that_never_ends_hits_the_hooks_own_deadline(launchers, tmp_root, hook):
    """A writer that never closes stdin: the hook exits by itself (alarm), with its failure code
    and not by a signal (a signal death counts as exit 0 for the router, hook-protocol.md §2.1)."""
    import time

    def forever():
        yield b"Owner = \"x\"\n"
        time.sleep(8)

    res = run_measured([str(launchers / f"ce-k8s-{hook}")], forever(),
                       env=hook_env(str(tmp_root / "none.sock"), timeout=1.0), timeout=20)
    assert res.elapsed < 5
    assert res.returncode == FAIL_EXIT[hook]
    assert b"deadline" in res.stderr


# -- the translate hook's transformation, fuzzed in-process -----------------------------------

ATTR_LINE = st.builds(
    lambda name, value: f"{name} = {value}",
    st.sampled_from(["Owner", "GlobalJobId", "ClusterId", "ProcId", "QDate", "K8sAttempt", "JobUniverse",
                     "Cmd", "K8sPodName", "Managed", "x", "Environment"]),
    # values as sPrintAd writes them (hook-protocol.md §2.2): literals, strings with only `"` escaped; a raw newline
    # inside a string is the documented quirk and becomes a continuation line below.
    st.one_of(st.integers(-5, 10**12).map(str),
              st.text(st.characters(blacklist_characters="\x00\r", blacklist_categories=("Cs",)), max_size=30)
              .filter(lambda t: not t.endswith("\\")).map(lambda t: '"' + t.replace('"', '\\"') + '"'),
              st.sampled_from(["undefined", "-1", "999999", "1000000", '"a#1.0#2"', '"s#x.y#z"', "{ 1 }",
                               '"../../etc"', '"$(HOME)"', '"x\ny"'])))
CONTINUATION = st.text(max_size=20).filter(lambda t: "=" not in t)
AD_TEXT = st.lists(st.one_of(ATTR_LINE, CONTINUATION), max_size=15).map("\n".join)


@given(AD_TEXT)
def test_translate_output_always_parses_and_names_a_valid_pod(text):
    """hook-protocol.md §2.2: translate output replaces the routed ad and one bad line removes the job, and a
    missing JobUniverse aborts the router. So for any input: TranslateError, or output that the
    router's parser accepts, with JobUniverse, Managed = "ScheddDone" (docs/internals.md "Routed jobs")
    and a DNS-1123 K8sPodName."""
    try:
        out = translate_ad_text('[ Name = "K8s"; TargetUniverse = 9 ]', text)
    except TranslateError as exc:
        assert str(exc)
        return
    ad = wire.parse_hook_output(out)
    assert "JobUniverse" in ad
    assert ad.eval("Managed") == "ScheddDone"
    assert is_dns_label(ad.eval("K8sPodName"))

