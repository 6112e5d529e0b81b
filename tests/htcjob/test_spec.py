"""The operator's own reading of an HTCJob spec: the same refusals as the CRD's schema (for
resources the schema did not check), named by field, and the values the submit description uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ce_k8s.htcjob.spec import RESERVED_SUBMIT_KEYS, SpecError, parse_spec

CRD = Path(__file__).resolve().parents[2] / "containers" / "k8s" / "htcjob" / "crd.yaml"


def test_the_reserved_submit_keys_are_the_crds():
    spec = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rule = spec["properties"]["submit"]["x-kubernetes-validations"][0]["rule"]
    assert set(re.findall(r"'([a-z_]+)'", rule)) == RESERVED_SUBMIT_KEYS


@pytest.mark.parametrize(("spec", "field"), [
    ({"queue": 1}, "exactly one of command or script"),
    ({"command": [], "queue": 1}, "spec.command"),
    ({"script": {"source": "echo"}}, "spec.script.source"),
    ({"command": ["/bin/true"], "queue": 0}, "spec.queue"),
    ({"command": ["/bin/true"], "queue": True}, "spec.queue"),
    ({"command": ["/bin/true"], "resources": {"memory": "lots"}}, "spec.resources.memory"),
    ({"command": ["/bin/true"], "resources": {"memory": "2K"}}, "unknown suffix 'K'"),   # the CRD's isQuantity
    ({"command": ["/bin/true"], "resources": {"disk": " 2Gi"}}, "spec.resources.disk"),   # refuses both
    ({"command": ["/bin/true"], "env": [{"name": "1A", "value": "x"}]}, "spec.env[0].name"),
    ({"command": ["/bin/true"], "submit": {"Request_Memory": "1"}}, "Request_Memory"),
    ({"command": ["/bin/true"], "submit": {"MY.HTCJobUid": "1"}}, "MY.HTCJobUid"),
    ({"command": ["/bin/true"], "submit": {"a b": "1"}}, "submit command name"),
    ({"command": ["/bin/true"], "submit": {"rank": "a\nqueue 100"}}, "newline"),
    ({"command": ["/bin/true"], "input": [{"configMap": "a", "secret": "b"}]}, "spec.input[0]"),
    ({"command": ["/bin/true"], "output": {"pvc": {"claimName": "c", "path": "../x"}}}, "spec.output.pvc.path"),
    ({"command": ["/bin/true"], "target": {"collector": "cm"}}, "spec.target"),
])
def test_bad_specs_name_their_field(spec, field):
    with pytest.raises(SpecError, match=re.escape(field)):
        parse_spec(spec)


def test_quantities_become_htcondor_units_rounded_up():
    spec = parse_spec({"command": ["/bin/true"], "queue": 3,
                       "resources": {"cpus": 2, "memory": "1.5Gi", "disk": "1000", "gpus": 1}, "wallTimeSeconds": 60})
    assert (spec.queue, spec.cpus, spec.memory_mib, spec.disk_kib, spec.gpus, spec.wall_time) == (3, 2, 1536, 1, 1, 60)
    assert parse_spec({"command": ["/bin/true"]}).wall_time is None
    # A fraction of a byte counts as a byte (Quantity.Value rounds up), so 1Mi and a half byte is 2 MiB.
    assert parse_spec({"command": ["/bin/true"], "resources": {"memory": "1048576.5"}}).memory_mib == 2
