"""The hold table (docs/design.md Decision 8; HTCondor condor_holdcodes.h; htcondor-ce.md §6.4)."""

from __future__ import annotations

import pathlib
import re

from ce_k8s.holds import HOLDS, SUBCODE_BUILD, SUBCODE_RUNTIME, hold_attributes, hold_for_error
from ce_k8s.pods.errors import PodBuildError

ROOT = pathlib.Path(__file__).resolve().parents[2]

# condor_holdcodes.h values the table relies on
HTCONDOR = {"FailedToCreateProcess": 6, "TransferInputError": 13, "StartdHeldJob": 21,
            "MaxTransferInputSizeExceeded": 32, "JobOutOfResources": 34, "InvalidDockerImage": 35,
            "JobDurationExceeded": 46}


def test_every_code_raised_by_the_builder_is_in_the_table():
    """Each PodBuildError code in ce_k8s/pods (and the agent's sandbox reader) has a hold."""
    sources = list((ROOT / "ce_k8s" / "pods").glob("*.py")) + list((ROOT / "ce_k8s" / "agent").glob("*.py"))
    raised = set()
    for path in sources:
        raised |= set(re.findall(r'PodBuildError\(\s*"([a-z0-9-]+)"', path.read_text()))
        raised |= set(re.findall(r'code="([a-z0-9-]+)"', path.read_text()))
    assert raised, "no codes found: the scan is broken"
    assert raised <= set(HOLDS), raised - set(HOLDS)


def test_runtime_outcomes_listed():
    """The agent's outcomes (issue 3 task list) all have entries."""
    for code in ("oom-killed", "deadline-exceeded", "image-pull-failed", "create-container-config-error",
                 "admission-denied", "pod-deleted", "pending-timeout", "evictions-exhausted",
                 "container-cannot-run", "container-crashed"):
        assert code in HOLDS


def test_codes_are_htcondor_values_and_subcodes_unique_in_range():
    """HoldReasonCode reuses condor_holdcodes.h; subcodes are unique, builder 8700-8749, runtime 8750-8799."""
    subcodes = [h.subcode for h in HOLDS.values()]
    assert len(subcodes) == len(set(subcodes))
    assert {h.code for h in HOLDS.values()} <= set(HTCONDOR.values())
    assert HOLDS["oom-killed"].code == HTCONDOR["JobOutOfResources"]
    assert HOLDS["deadline-exceeded"].code == HTCONDOR["JobDurationExceeded"]
    assert HOLDS["image-pull-failed"].code == HTCONDOR["InvalidDockerImage"]
    assert HOLDS["sandbox-too-large"].code == HTCONDOR["MaxTransferInputSizeExceeded"]
    for code, hold in HOLDS.items():
        assert hold.subcode in SUBCODE_BUILD or hold.subcode in SUBCODE_RUNTIME, code


def test_hold_attributes_shape_and_single_line():
    """Every HoldReason starts with 'ce-k8s: ' and is one line (hook-protocol.md §2.2: newlines break ads)."""
    attrs = hold_attributes("oom-killed", pod="ce-1-0-a0-x", limit="2000Mi\nevil = 1")
    assert attrs["HoldReasonCode"] == 34 and attrs["HoldReasonSubCode"] == 8750
    assert attrs["HoldReason"].startswith("ce-k8s: pod ce-1-0-a0-x was OOM-killed")
    assert "\n" not in attrs["HoldReason"]
    assert hold_attributes("pod-deleted")["HoldReason"] == "ce-k8s: pod ? was deleted outside ce-k8s"
    assert len(hold_attributes("admission-denied", pod="p", message="x" * 5000)["HoldReason"]) <= 1024


def test_unknown_code_falls_back_to_internal_error():
    """A typo in a caller must hold the job with internal-error, not crash the agent."""
    attrs = hold_attributes("no-such-code", message="boom")
    assert attrs["HoldReasonSubCode"] == HOLDS["internal-error"].subcode
    assert "no-such-code" in attrs["HoldReason"]


def test_hold_for_pod_build_error():
    """The update hook's path: PodBuildError → hold attributes with its code's numbers."""
    attrs = hold_for_error(PodBuildError("missing-image", "route Pilots sets no K8sImage"))
    assert attrs == {
        "HoldReason": "ce-k8s: no container image: set K8sImage in the route or CE_K8S_IMAGE "
        "(route Pilots sets no K8sImage)",
        "HoldReasonCode": 35,
        "HoldReasonSubCode": 8701,
    }


def test_docs_table_matches_code():
    """docs/holds.md lists every code with its numbers (one table, decision 8)."""
    text = (ROOT / "docs" / "holds.md").read_text()
    for code, hold in HOLDS.items():
        assert re.search(rf"\| `{re.escape(code)}` \| {hold.code} \| {hold.subcode} \|", text), code
    assert "## Pod status → job status" in text


def test_every_k8s_attribute_is_documented_and_read():
    """docs/internals.md's K8s* table: each attribute is in docs/routes.md and read by ce_k8s (issue 3)."""
    internals = (ROOT / "docs" / "internals.md").read_text()
    table = internals.split("## Kubernetes settings on the routed job", 1)[1].split("\n## ", 1)[0]
    attrs = set(re.findall(r"^\| `(K8s\w+)`", table, re.M)) | set(re.findall(r"/ `(K8s\w+)`", table))
    assert len(attrs) >= 20
    routes_doc = (ROOT / "docs" / "routes.md").read_text().split("## Kubernetes attributes", 1)[1]
    code = "".join(p.read_text() for p in (ROOT / "ce_k8s").rglob("*.py"))
    for attr in sorted(attrs):
        assert f"`{attr}`" in routes_doc, attr
        assert f'"{attr}"' in code, attr
