"""The pod summary read through the typed schema (ce_k8s.agent.podschema) and the timestamp reader.

Why: the relist decodes the API server's JSON straight into `podschema` structs (docs/performance.md
"Fast relist"); every field the status mapping reads must come through that path exactly as the
API writes it, and a field the schema omits by mistake would silently read as empty.
"""

from __future__ import annotations

import calendar
import json
import time

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ce_k8s.agent import podschema
from ce_k8s.agent.podinfo import PodInfo, parse_time

POD = {
    "kind": "Pod", "apiVersion": "v1",
    "metadata": {
        "name": "ce-k8s-abc-0", "namespace": "pilots", "uid": "u-1", "resourceVersion": "42",
        "creationTimestamp": "2025-10-09T08:53:20Z", "deletionTimestamp": "2025-10-09T09:10:00Z",
        "labels": {"ce-k8s.htcondor.org/route": "cms", "ce-k8s.htcondor.org/job": "7.0",
                   "ce-k8s.htcondor.org/attempt": "2", "ce-k8s.htcondor.org/owner": "cms-pilot"},
        "annotations": {"ce-k8s.htcondor.org/owner": "cms.pilot", "ce-k8s.htcondor.org/routed-from": "6.0",
                        "ce-k8s.htcondor.org/global-job-id": "ce#7.0#1"},
        "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
    },
    "spec": {
        "nodeName": "node-3", "activeDeadlineSeconds": 3600,
        "volumes": [{"name": "sandbox", "secret": {"secretName": "s"}}],
        "containers": [
            {"name": "pilot", "image": "example.org/pilot:1",
             "resources": {"limits": {"memory": "2Gi"}, "requests": {"cpu": "500m", "memory": "1Gi"}},
             "env": [{"name": "A", "value": "1"}]},
            {"name": "sidecar", "image": "example.org/side:1", "resources": {"requests": {"cpu": 1}}},
        ],
    },
    "status": {
        "phase": "Failed", "reason": "Evicted", "message": "node pressure", "startTime": "2025-10-09T08:55:00Z",
        "conditions": [{"type": "PodScheduled", "status": "True"},
                       {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}],
        "containerStatuses": [
            {"name": "sidecar", "state": {"running": {"startedAt": "2025-10-09T08:55:01Z"}}},
            {"name": "pilot", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                                       "startedAt": "2025-10-09T08:55:00Z",
                                                       "finishedAt": "2025-10-09T09:05:00Z"}}},
        ],
    },
}


def test_every_field_comes_through_the_typed_schema():
    info = PodInfo.from_dict(POD)
    assert (info.name, info.namespace, info.uid, info.resource_version) == ("ce-k8s-abc-0", "pilots", "u-1", "42")
    assert (info.owner, info.global_job_id, info.source_job, info.route, info.attempt) == \
        ("cms.pilot", "ce#7.0#1", "6.0", "cms", 2)
    assert info.created == 1_760_000_000 and info.deleting and info.deadline == 3600
    assert (info.phase, info.reason, info.message, info.node) == ("Failed", "Evicted", "node pressure", "node-3")
    assert info.start_time == 1_760_000_100 and info.disruption == "TerminationByKubelet"
    assert info.unscheduled is None and info.image == "example.org/pilot:1"
    # the main container is the first one of the spec, found by name among the statuses
    assert (info.exit_code, info.term_reason, info.started_at, info.finished_at) == \
        (137, "OOMKilled", 1_760_000_100, 1_760_000_700)
    assert info.memory_limit == "2Gi" and info.cpu_request == 1.5 and info.memory_request == 2 ** 30


def test_a_list_page_and_a_watch_line_give_the_same_summary_as_the_dict():
    page = json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "50", "continue": "tok"},
                       "items": [POD]}).encode()
    decoded = podschema.POD_LIST.decode(page)
    assert decoded.metadata.continue_ == "tok" and decoded.metadata.resource_version == "50"
    assert podschema.LIST_META.decode(page).metadata.continue_ == "tok"
    event = podschema.EVENT.decode(json.dumps({"type": "MODIFIED", "object": POD}).encode())
    assert event.type == "MODIFIED"
    assert PodInfo.from_pod(decoded.items[0]) == PodInfo.from_pod(podschema.POD.decode(event.object)) \
        == PodInfo.from_dict(POD)


def test_an_empty_pod_reads_as_pending_with_nothing_known():
    info = PodInfo.from_dict({})
    assert (info.name, info.phase, info.exit_code, info.started_at, info.memory_limit) == \
        ("", "Pending", None, None, "?")


def test_strings_most_pods_share_are_one_object():
    one = PodInfo.from_dict(POD)
    other = PodInfo.from_pod(podschema.POD.decode(json.dumps(POD).encode()))
    for field in ("namespace", "phase", "node", "image", "owner", "route", "memory_limit"):
        assert getattr(one, field) is getattr(other, field), field


def test_a_field_of_the_wrong_type_is_refused():
    bad = json.loads(json.dumps(POD))
    bad["status"]["containerStatuses"][1]["state"]["terminated"]["exitCode"] = "137"
    with pytest.raises(msgspec.ValidationError):
        podschema.POD.decode(json.dumps(bad).encode())


def _strptime(value: str) -> int:
    return calendar.timegm(time.strptime(value[:19], "%Y-%m-%dT%H:%M:%S"))


@given(st.integers(min_value=0, max_value=253_402_300_799))
def test_fast_timestamps_read_as_strptime_reads_them(epoch):
    text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    assert parse_time(text) == _strptime(text) == epoch


@pytest.mark.parametrize("value", [None, "", "2025-10-09", "2025-1x-09T08:53:20Z", "2025-10-09T08:5 :20Z",
                                   "2025-13-09T08:53:20Z", "2025-10-09T25:53:20Z", "+025-10-09T08:53:20Z",
                                   "２０２５-10-09T08:53:20Z", 1760000000])
def test_what_is_not_a_timestamp_reads_as_none(value):
    assert parse_time(value) is None


def test_other_layouts_fall_back_to_strptime():
    assert parse_time("2025-10-09 08:53:20Z") is None          # strptime refuses it too
    assert parse_time("2025-10-09T08:53:20.123456Z") == 1_760_000_000
    assert parse_time("2025-10-09T08:53:20+00:00") == 1_760_000_000
