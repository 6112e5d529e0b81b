"""JobAd: case-insensitive, read-only view of an evaluated ad (docs/internals.md "Job ads in memory")."""

from __future__ import annotations

import pytest

from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.jobad import JobAd


def test_case_insensitive_and_undefined_is_absent():
    """ClassAd names are case-insensitive; an attribute that evaluated to undefined (None) reads as absent."""
    ad = JobAd({"RequestCpus": 8, "K8sImage": None})
    assert ad["requestcpus"] == 8 and "REQUESTCPUS" in ad
    assert ad.get("k8simage", "dflt") == "dflt"
    assert list(ad) == ["RequestCpus", "K8sImage"] and len(ad) == 2
    with pytest.raises(TypeError):
        ad["x"] = 1  # read-only


def test_typed_reads():
    ad = JobAd({"s": "x", "b": True, "one": 1, "f": 8.0, "half": 0.5, "d": {"k": "v"}, "l": [1], "nan": float("nan")})
    assert ad.get_str("S") == "x" and ad.get_bool("b") is True and ad.get_bool("one") is True
    assert ad.get_int("f") == 8 and ad.get_number("half") == 0.5
    assert ad.get_dict("d") == {"k": "v"} and ad.get_list("l") == [1]
    assert ad.get_int("missing", 3) == 3


@pytest.mark.parametrize(("method", "name"), [
    ("get_str", "one"), ("get_bool", "s"), ("get_number", "s"), ("get_number", "b"), ("get_int", "half"),
    ("get_number", "nan"), ("get_dict", "l"), ("get_list", "d"),
])
def test_wrong_types_raise_with_the_given_code(method, name):
    """A wrong type is a PodBuildError with the caller's stable code, naming the attribute."""
    ad = JobAd({"s": "x", "b": True, "one": 1, "half": 0.5, "d": {}, "l": [], "nan": float("nan")})
    with pytest.raises(PodBuildError) as info:
        getattr(ad, method)(name, code="bad-request-cpus")
    assert info.value.code == "bad-request-cpus" and name in info.value.message
