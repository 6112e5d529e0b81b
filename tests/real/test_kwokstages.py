"""The kwok Stages of the real-Kubernetes bed as data (ce_k8s/real/kube/kwokstages.yaml), without a bed.

The data file is read as the installed package holds it (importlib.resources) and as kwok reads
what `stages()` makes of it: seven Stages with the fields kwok requires, every placeholder filled,
the time scale only in the scenario's run words, the shared pieces the same wherever they are used.
That the Stages play the pods' lives on kwok is shown by the bed's tests (test_lifecycle.py,
test_findings.py); the file and its filling are checked here, where no bed is needed.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest
import yaml

from ce_k8s.real.kube import kwokstages

NAMES = ["cek8s-node-initialize", "cek8s-node-heartbeat", "cek8s-pod-pull-error", "cek8s-pod-ready",
         "cek8s-pod-finish", "cek8s-pod-deadline", "cek8s-pod-delete"]
NODE_STAGES = {"cek8s-node-initialize", "cek8s-node-heartbeat"}


def _raw() -> str:
    return resources.files("ce_k8s.real.kube").joinpath("kwokstages.yaml").read_text(encoding="utf-8")


def _by_name(text: str) -> dict[str, dict]:
    docs = list(yaml.safe_load_all(text))
    assert [d["metadata"]["name"] for d in docs] == NAMES
    return {d["metadata"]["name"]: d for d in docs}


def _assert_kwok_stage(doc: dict) -> None:
    """The fields kwok requires of a Stage (kwok.x-k8s.io/v1alpha1)."""
    assert doc["apiVersion"] == "kwok.x-k8s.io/v1alpha1"
    assert doc["kind"] == "Stage"
    kind = "Node" if doc["metadata"]["name"] in NODE_STAGES else "Pod"
    assert doc["spec"]["resourceRef"] == {"apiGroup": "v1", "kind": kind}
    expressions = doc["spec"]["selector"]["matchExpressions"]
    assert expressions and all(e["key"] and e["operator"] for e in expressions)
    assert doc["spec"]["next"]


def test_the_data_file_is_the_seven_stages_as_kwok_reads_them():
    raw = _raw()
    for doc in _by_name(raw).values():
        _assert_kwok_stage(doc)
    # A header of comments for the reader, then the Stages with the placeholders stages() fills and
    # no other (a name it lacks would fail at the bed's `up`).
    header, _, documents = raw.partition("\n---\n")
    assert header and all(line.startswith("#") for line in header.splitlines())
    assert set(re.findall(r"\$\{(\w+)\}", documents)) == {"node_status", "pull_error", "run_seconds"}


@pytest.mark.parametrize("time_scale", [0.05, 1.0, 2])
def test_stages_hands_kwok_the_stages_filled_in_without_the_header(time_scale):
    text = kwokstages.stages(time_scale)
    assert text.startswith("apiVersion: kwok.x-k8s.io/v1alpha1\n")    # the reader's header stays behind
    assert "${" not in text
    for doc in _by_name(text).values():
        _assert_kwok_stage(doc)


@pytest.mark.parametrize("time_scale", [0.05, 0.5, 2])
def test_the_time_scale_multiplies_the_scenario_s_run_words_only(time_scale):
    text = kwokstages.stages(time_scale)
    scaled, explicit = f'{{"k": {float(time_scale)!r}}}', '{"k": 1}'
    stages = _by_name(text)
    finish, deadline = stages["cek8s-pod-finish"]["spec"], stages["cek8s-pod-deadline"]["spec"]
    where = [finish["selector"]["matchExpressions"][2]["key"], finish["delay"]["durationFrom"]["expressionFrom"],
             deadline["selector"]["matchExpressions"][2]["key"]]
    for expression in where:
        # run= and oom-after= scaled, the explicit annotation as written
        assert expression.count(scaled) == 1 and expression.count(explicit) == 1
        assert f'$a["{kwokstages.RUN_FOR}"]' in expression
        assert "sim.ce-k8s.io/scenario" in expression
    assert text.count(scaled) == 3 and text.count(explicit) == 3
    assert finish["delay"]["durationFrom"]["expressionFrom"].endswith(' | tostring + "s"')


def test_the_shared_pieces_are_the_same_wherever_they_are_used():
    stages = _by_name(kwokstages.stages())
    pull = [stages[n]["spec"]["selector"]["matchExpressions"] for n in ("cek8s-pod-pull-error", "cek8s-pod-ready")]
    (in_pull,) = [e for e in pull[0] if kwokstages.PULL_ERROR in e["key"]]
    (in_ready,) = [e for e in pull[1] if kwokstages.PULL_ERROR in e["key"]]
    assert in_pull["key"] == in_ready["key"]
    assert (in_pull["operator"], in_pull["values"]) == ("In", ["true"])
    assert (in_ready["operator"], in_ready["values"]) == ("NotIn", ["true"])

    # The node status block lands whole inside both node Stages' templates (its indent kept), the
    # kubelet endpoint read from the annotation the bed writes.
    heartbeat = stages["cek8s-node-heartbeat"]["spec"]["next"]["statusTemplate"]
    initialize = stages["cek8s-node-initialize"]["spec"]["next"]["statusTemplate"]
    assert initialize.startswith(heartbeat)
    assert heartbeat.startswith("{{ $now := Now }}\n")
    assert f'{{{{ with index .metadata.annotations "{kwokstages.KUBELET_PORT}" }}}}\n' in heartbeat
    assert "daemonEndpoints:\n  kubeletEndpoint:\n    Port: {{ . }}\n" in heartbeat
    assert "\nphase: Running\n" in initialize


def test_the_finish_stage_reads_the_exit_code_and_reason_annotations():
    finish = _by_name(kwokstages.stages())["cek8s-pod-finish"]["spec"]["next"]["statusTemplate"]
    assert f'(index $a "{kwokstages.EXIT_CODE}")' in finish
    assert f'(index $a "{kwokstages.REASON}")' in finish
