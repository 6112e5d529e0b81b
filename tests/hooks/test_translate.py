"""The translate hook: full echo, inert routed job, pod identity (jobrouter-protocol.md §2.2, §8)."""

from __future__ import annotations

import classad2

from ce_k8s.condor import wire
from ce_k8s.hooks.translate import TranslateError, translate_ad_text
from ce_k8s.pods.names import pod_name

from .conftest import GJID, run_hook, source_ad

ROUTE = wire.route_info_line("K8s", 9, "batch k8s")


def test_echoes_every_line_and_sets_our_attributes(hook_dir):
    """§2.2: stdout replaces the routed ad, so every input line must come back unchanged."""
    src = source_ad()
    stdin = wire.translate_stdin(ROUTE, src)
    res = run_hook(hook_dir, "translate", stdin)
    assert res.returncode == 0, res.stderr
    assert res.stderr == b""          # §8: keep stderr empty on success (logged at D_ALWAYS)
    out = res.stdout.decode()
    for line in wire.sprint_ad(src).splitlines():
        assert line in out.splitlines()
    ad = wire.parse_hook_output(out)
    assert ad["JobUniverse"] == 5
    assert ad["Managed"] == "External" and ad["ManagedManager"] == "ce-k8s"
    assert ad["K8sAttempt"] == 0
    assert ad["K8sPodName"] == pod_name(GJID, 0)
    assert ad["K8sSourceGlobalJobId"] == GJID


def test_reroute_increments_attempt_and_replaces_old_lines():
    """A rerouted source job carries K8sAttempt (CE_K8S_ATTRS_TO_COPY): the next pod gets a new name."""
    src = source_ad(K8sAttempt=1, K8sPodName=pod_name(GJID, 1), Managed="Schedd")
    text = wire.sprint_ad(src)
    out = translate_ad_text(ROUTE, text)
    ad = wire.parse_hook_output(out)
    assert ad["K8sAttempt"] == 2
    assert ad["K8sPodName"] == pod_name(GJID, 2)
    assert ad["Managed"] == "External"
    assert out.count("K8sAttempt =") == 1 and out.count("Managed =") == 1


def test_is_deterministic():
    """DESIGN decision 5: translating the same job twice names the same pod."""
    text = wire.sprint_ad(source_ad())
    assert translate_ad_text(ROUTE, text) == translate_ad_text(ROUTE, text)


def test_adds_job_universe_when_missing():
    """§2.2: output without JobUniverse makes VanillaToGrid abort the whole router."""
    src = source_ad()
    del src["JobUniverse"]
    ad = wire.parse_hook_output(translate_ad_text(ROUTE, wire.sprint_ad(src)))
    assert ad["JobUniverse"] == 5


def test_raw_newline_attribute_is_dropped_not_echoed_broken():
    """§2.2: sPrintAd writes newlines in strings raw; echoing them would fail the router's parser."""
    text = wire.sprint_ad(source_ad()) + 'Zmessage = "line one\nline two"\nZz = 1\n'
    out = translate_ad_text(ROUTE, text)
    ad = wire.parse_hook_output(out)   # must not raise
    assert "Zmessage" not in ad and ad["Zz"] == 1


def test_no_global_job_id_falls_back_to_cluster_proc_qdate():
    src = source_ad()
    del src["GlobalJobId"]
    ad = wire.parse_hook_output(translate_ad_text(ROUTE, wire.sprint_ad(src)))
    assert ad["K8sPodName"] == pod_name("4711.0#1760000000", 0)


def test_bad_input_exits_nonzero(hook_dir):
    """§2.2: exit != 0 is a graceful removal (retried later); never print a broken ad."""
    res = run_hook(hook_dir, "translate", b"no separator here\n")
    assert res.returncode == 1 and res.stdout == b""
    res = run_hook(hook_dir, "translate", (ROUTE + "\n------\n").encode())
    assert res.returncode == 1 and res.stdout == b""


def test_oversized_stdin_refused(hook_dir):
    """Bounded stdin: more than 4 MiB is refused before parsing."""
    res = run_hook(hook_dir, "translate", b"A = 1\n" * (800 * 1024))
    assert res.returncode == 1 and res.stdout == b""


def test_empty_ad_raises():
    import pytest

    with pytest.raises(TranslateError):
        translate_ad_text(ROUTE, "\n")


def test_classad2_agrees_on_every_value():
    """The echoed lines parse to the same values classad2 has for the source ad."""
    src = source_ad()
    ad = wire.parse_hook_output(translate_ad_text(ROUTE, wire.sprint_ad(src)))
    for k in src.keys():
        assert str(ad.lookup(k)) == str(src.lookup(k)), k
    assert isinstance(ad, classad2.ClassAd)
