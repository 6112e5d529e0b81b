"""The API server's `Warning` headers on the agent's writes (ce_k8s/agent/apiwarnings.py).

References: RFC 7234 section 5.5 (warning-value grammar), RFC 7230 section 3.2.6 (quoted-string)
and section 7 (lists); docs/agent.md "API server warnings" (the decision table: log and count always, a note in
`K8sPodReason` where the pod will not do what the route meant, never a hold). The texts are the
ones Kubernetes v1.37.2 sends (pkg/api/pod/warnings.go and friends), as the real server sent them
in tests/real/test_api_warnings.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from urllib3 import HTTPHeaderDict

from ce_k8s.agent import apiwarnings
from ce_k8s.agent.apiwarnings import IGNORED, PLACEMENT, RUNS, ApiWarning, classify, of_response, parse, parse_value
from ce_k8s.agent.logfmt import parse as parse_line
from ce_k8s.pods.names import pod_name

from .conftest import GJID, routed_ad
from .fakes import fake_agent, run_effects
from .test_agent import update

NAME = pod_name(GJID, 0)


def go_quoted(text: str) -> str:
    """How the API server quotes a warning's text (apimachinery util/net makeQuotedString)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def header(text: str, agent: str = "-") -> str:
    """One warning-value as kube-apiserver's NewWarningHeader writes it."""
    return f"299 {agent} {go_quoted(text)}"


# -- the grammar ---------------------------------------------------------------------------------

def test_one_warning_value():
    assert parse_value('299 - "spec.nodeSelector[beta.kubernetes.io/arch]: deprecated since v1.14"') == [
        ApiWarning(299, "-", "spec.nodeSelector[beta.kubernetes.io/arch]: deprecated since v1.14")]


def test_comma_separated_values_in_one_field_commas_inside_text_included():
    """RFC 7234 section 5.5 `Warning = 1#warning-value`: a field may hold several, and a comma inside the
    quoted text separates nothing (the PodSecurity texts are full of them)."""
    got = parse_value('299 - "a, b and c", 199 kube-apiserver:6443 "second"  ,299 - "third"')
    assert got == [ApiWarning(299, "-", "a, b and c"), ApiWarning(199, "kube-apiserver:6443", "second"),
                   ApiWarning(299, "-", "third")]


def test_escaped_quotes_and_backslashes_are_unescaped():
    """quoted-pair (RFC 7230 section 3.2.6): `\\"` is a quote and `\\\\` a backslash inside the text."""
    raw = r'299 - "unknown field \"spec.containers[0].foo\"", 299 - "a\\b \\\"c\""'
    assert [w.text for w in parse_value(raw)] == ['unknown field "spec.containers[0].foo"', 'a\\b \\"c"']


def test_a_warn_date_is_skipped_even_with_its_comma():
    raw = '299 - "first" "Wed, 21 Oct 2015 07:28:00 GMT", 299 - "second"'
    assert [w.text for w in parse_value(raw)] == ["first", "second"]


def test_empty_list_elements_are_skipped():
    """RFC 7230 section 7: a recipient accepts and ignores empty list elements."""
    assert [w.text for w in parse_value(' , ,299 - "a",, ')] == ["a"]


@pytest.mark.parametrize(("raw", "kept"), [
    ('not a warning, 299 - "ok"', "not a warning"),
    ('299 - unquoted text, 299 - "ok"', "299 - unquoted text"),
    ('29 - "two-digit code", 299 - "ok"', '29 - "two-digit code"'),
    ('299 - "text" junk "x, y", 299 - "ok"', '299 - "text" junk "x, y"'),
])
def test_an_element_that_does_not_parse_is_kept_whole_and_the_next_still_read(raw, kept):
    """client-go skips the rest of a field it cannot parse; the agent must not lose a warning."""
    assert parse_value(raw) == [ApiWarning(0, "", kept), ApiWarning(299, "-", "ok")]


def test_an_unterminated_quote_keeps_the_rest_as_one_warning():
    assert parse_value('299 - "ok", 299 - "never closed, 299 - "x"') == [
        ApiWarning(299, "-", "ok"), ApiWarning(0, "", '299 - "never closed, 299 - "x"')]


def test_utf8_text_read_as_latin1_by_http_client_is_restored():
    """http.client decodes header bytes as ISO-8859-1; the API server writes UTF-8."""
    as_read = header('volume "café"').encode("utf-8").decode("latin-1")
    assert parse_value(as_read)[0].text == 'volume "café"'


def test_several_fields_in_order_each_text_once():
    assert [w.text for w in parse([header("a"), f'{header("b")}, {header("a")}', header("c")])] == ["a", "b", "c"]


_TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=60).filter(str.strip)


@given(st.lists(_TEXT, min_size=1, max_size=6, unique=True), st.booleans())
def test_any_texts_the_server_can_write_come_back(texts, one_field):
    """Whatever text NewWarningHeader accepts (valid UTF-8, no control characters), joined in one
    field or sent as several, parses back to the same texts in the same order."""
    values = [header(t) for t in texts]
    fields = [", ".join(values)] if one_field else values
    as_read = [v.encode("utf-8").decode("latin-1") for v in fields]
    assert [w.text for w in parse(as_read)] == texts


def test_of_response_reads_every_warning_field_and_nothing_else():
    class Resp:
        headers = HTTPHeaderDict()
    resp = Resp()
    assert of_response(resp) == []
    resp.headers.add("Content-Type", "application/json")
    resp.headers.add("Warning", header("first, with a comma"))
    resp.headers.add("warning", header("second"))
    assert [w.text for w in of_response(resp)] == ["first, with a comma", "second"]
    assert of_response(object()) == []


# -- what each warning means (docs/agent.md "API server warnings") ------------------------------------

@pytest.mark.parametrize(("text", "kind", "effect"), [
    ('would violate PodSecurity "restricted:latest": restricted volume types (volume "cvmfs" uses restricted '
     'volume type "nfs")', "pod-security", RUNS),
    ("Validation failed for ValidatingAdmissionPolicy 'no-nfs' with binding 'b': non-functional nodeSelector",
     "admission-policy", RUNS),
    ('unknown field "spec.containers[0].foo"', "unknown-field", IGNORED),
    ('duplicate field "image"', "duplicate-field", IGNORED),
    ('spec.nodeSelector[beta.kubernetes.io/arch]: deprecated since v1.14; use "kubernetes.io/arch" instead',
     "deprecated-node-label", PLACEMENT),
    ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     '.matchExpressions[0].key: node-role.kubernetes.io/master is use "node-role.kubernetes.io/control-plane" '
     "instead", "deprecated-node-label", PLACEMENT),
    ("spec.topologySpreadConstraints[0].topologyKey: failure-domain.beta.kubernetes.io/zone is deprecated since "
     'v1.17; use "topology.kubernetes.io/zone" instead', "deprecated-node-label", PLACEMENT),
    ("metadata.annotations[scheduler.alpha.kubernetes.io/critical-pod]: non-functional in v1.16+; use the "
     '"priorityClassName" field instead', "non-functional", IGNORED),
    ("metadata.annotations[seccomp.security.alpha.kubernetes.io/pod]: non-functional in v1.27+; use the "
     '"seccompProfile" field instead', "non-functional", IGNORED),
    ("spec.volumes[2].gitRepo: deprecated in v1.11, and disabled by default in v1.33+", "non-functional", IGNORED),
    ("spec.volumes[1].glusterfs: deprecated in v1.25, non-functional in v1.26+", "non-functional", IGNORED),
    ('spec.containers[0].resources.requests[memory]: fractional byte value "1500m" is invalid, must be an integer',
     "invalid-value", IGNORED),
    ("spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector: a null "
     "labelSelector results in matching no pod", "invalid-value", IGNORED),
    ('volume "sandbox" (Secret "s"): overlapping paths: "a" with "a"', "invalid-value", IGNORED),
    ('spec.containers[0].env[1]: hides previous definition of "A", which may be dropped when using apply',
     "duplicate", RUNS),
    ('spec.containers[0].ports[1]: duplicate port name "http" with spec.containers[0].ports[0], services and '
     "probes that select ports by name will use spec.containers[0].ports[0]", "duplicate", RUNS),
    (".metadata.ownerReferences contains duplicate entries; API server dedups owner references in 1.20+",
     "duplicate", RUNS),
    ('metadata.annotations[container.apparmor.security.beta.kubernetes.io/pilot]: deprecated since v1.30; use the '
     '"appArmorProfile" field instead', "deprecated", RUNS),
    ("Use tokens from the TokenRequest API or manually created secret-based tokens instead of auto-generated "
     "secret-based tokens.", "credentials", RUNS),
    ('spec.hostAliases[0].ip: non-standard IP address "010.0.0.1" is invalid: use "10.0.0.1"', "other", RUNS),
    ("tls: failed to find any PEM data in certificate input", "other", RUNS),
    ("a webhook's own words", "other", RUNS),
])
def test_each_kind_and_what_it_means_for_the_pilot(text, kind, effect):
    assert classify(text) == kind and apiwarnings.KINDS[kind] == effect
    assert ApiWarning(299, "-", text).effect == effect


def test_the_note_follows_the_reason_and_is_bounded():
    assert apiwarnings.with_note("Unschedulable: 0/3 nodes", "") == "Unschedulable: 0/3 nodes"
    assert apiwarnings.with_note("", "x") == "Kubernetes API warning: x"
    long = apiwarnings.with_note("waiting", "w" * 1000)
    assert long.startswith("waiting; Kubernetes API warning: www") and long.endswith("...")
    assert len(long) == len("waiting; ") + len(apiwarnings.NOTE_PREFIX) + apiwarnings.NOTE_MAX


# -- through the agent, on the in-memory fakes (fakes.py; a wrapper adds the warnings) ------------------

@pytest.fixture
def agent(settings):
    return fake_agent(settings)


def warned(agent, monkeypatch, *texts):
    """Make the agent's real pod POSTs (not dry runs) come back with these Warning fields."""
    create = agent.calls.create_namespaced_pod

    def call(*args, **kwargs):
        resp = create(*args, **kwargs)
        if kwargs.get("dry_run") is None:
            for text in texts:
                resp.headers.add("Warning", header(text))
        return resp
    monkeypatch.setattr(agent.calls, "create_namespaced_pod", call)


def api_warning_lines(caplog):
    return [parse_line(r.getMessage()) for r in caplog.records if "event=api-warning" in r.getMessage()]


def running(agent):
    agent.api.set_status(NAME, {"phase": "Running", "startTime": "2025-10-09T08:55:00Z", "containerStatuses": [
        {"name": "pilot", "state": {"running": {"startedAt": "2025-10-09T08:55:00Z"}}}]})


PSA = 'would violate PodSecurity "restricted:latest": restricted volume types (volume "cvmfs" uses "nfs")'
UNKNOWN = 'unknown field "spec.containers[0].resource"'
LABEL = 'spec.nodeSelector[node-role.kubernetes.io/master]: use "node-role.kubernetes.io/control-plane" instead'


def test_each_warning_is_logged_once_with_the_job_counted_and_never_holds(agent, settings, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="ce_k8s")
    warned(agent, monkeypatch, PSA, UNKNOWN)
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    run_effects(agent)
    assert agent.cache.get(NAME)
    for _ in range(3):
        update(agent, ad)
    lines = api_warning_lines(caplog)
    assert sorted((e["text"], e["kind"], e["effect"]) for e in lines) == sorted(
        [(PSA, "pod-security", RUNS), (UNKNOWN, "unknown-field", IGNORED)])
    assert {(e["job"], e["pod"], e["resource"]) for e in lines} == {("104711.0", NAME, "pods")}
    assert all(r.levelno == logging.WARNING for r in caplog.records if "event=api-warning" in r.getMessage())
    prom = agent.prom.api_warnings
    assert prom.labels("pods", "pod-security")._value.get() == 1
    assert prom.labels("pods", "unknown-field")._value.get() == 1
    assert ad["JobStatus"] == 1 and "HoldReason" not in ad


def test_a_dropped_field_is_named_while_the_pod_waits_and_while_it_runs(agent, settings, monkeypatch):
    """IGNORED: the pod runs without part of what the route asked for, so condor_ce_q says so for
    the pod's life; a PodSecurity `warn` (RUNS) is never in the job."""
    warned(agent, monkeypatch, PSA, UNKNOWN)
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    run_effects(agent)
    assert agent.cache.get(NAME)
    update(agent, ad)
    assert ad["JobStatus"] == 1 and ad["K8sPodReason"].endswith(f"; Kubernetes API warning: {UNKNOWN}"), dict(ad)
    running(agent)
    assert agent.cache.get(NAME).phase == "Running"
    update(agent, ad)
    assert ad["JobStatus"] == 2 and ad["K8sPodReason"] == f"Kubernetes API warning: {UNKNOWN}"
    assert "PodSecurity" not in ad["K8sPodReason"]


def test_a_deprecated_node_label_is_named_only_while_the_pod_waits(agent, settings, monkeypatch):
    """PLACEMENT: the label may be on no node, which only matters while the pod is pending; once it
    runs, some node carried it and the reason is empty again, as for every running pilot."""
    warned(agent, monkeypatch, LABEL)
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    run_effects(agent)
    assert agent.cache.get(NAME)
    update(agent, ad)
    assert ad["JobStatus"] == 1 and ad["K8sPodReason"] == f"waiting for the scheduler; Kubernetes API warning: {LABEL}"
    running(agent)
    assert agent.cache.get(NAME).phase == "Running"
    update(agent, ad)
    assert ad["JobStatus"] == 2 and ad["K8sPodReason"] == ""


def test_an_answer_without_warnings_changes_nothing(agent, settings, caplog):
    caplog.set_level(logging.INFO, logger="ce_k8s")
    ad = routed_ad(Path(settings.spool))
    update(agent, ad)
    run_effects(agent)
    assert agent.cache.get(NAME)
    update(agent, ad)
    assert api_warning_lines(caplog) == [] and ad["K8sPodReason"] == "waiting for the scheduler"
    assert agent.jobs[NAME].warnings.texts == ()
