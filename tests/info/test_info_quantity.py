"""Kubernetes quantities are parsed exactly (issue 6: "parse every Kubernetes quantity form exactly").

The grammar is k8s.io/apimachinery/pkg/api/resource/quantity.go: <signedNumber><suffix> with a
binary-SI, decimal-SI or decimal-exponent suffix; the scheduler compares MilliValue() for CPU and
Value() (rounded up) for everything else.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ce_k8s.info.quantity import QuantityError, parse_quantity, parse_resource_list, resource_units, to_units


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("100m", Fraction(1, 10)),
        ("1.5", Fraction(3, 2)),
        ("64Gi", 64 * 2**30),
        ("1e3", 1000),
        ("1E3", 1000),
        ("2e-3", Fraction(2, 1000)),
        ("500M", 500 * 10**6),
        ("1k", 1000),
        ("1Ki", 1024),
        ("3E", 3 * 10**18),  # "E" alone is exa, not an exponent
        ("0.5Mi", 512 * 1024),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("+7", 7),
        ("-1", -1),
        ("250u", Fraction(250, 10**6)),
        ("10n", Fraction(10, 10**9)),
        ("31850m", Fraction(31850, 1000)),
    ],
)
def test_quantity_forms(text, value):
    """Every suffix family of the quantity grammar parses to the exact rational value."""
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1x", "Gi", "1 Gi", "1.2.3", "1ki", "1e", "--1", "1Gib", "e3", "1e3k"])
def test_malformed_quantities_are_typed_errors(text):
    """Anything outside the grammar is a QuantityError naming the text, never a silent 0."""
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    assert repr(text) in str(info.value)


def test_floats_are_not_binary_approximations():
    """0.1 + 0.2 CPUs is exactly 300 millicores: a JSON float is read by its decimal text."""
    assert resource_units("cpu", 0.1) + resource_units("cpu", 0.2) == 300
    assert parse_quantity(0.1) == Fraction(1, 10)


def test_scheduler_units_round_up():
    """MilliValue for cpu and Value for the rest round up, as the scheduler's Quantity does."""
    assert to_units("cpu", Fraction(1, 3000)) == 1  # 0.33m -> 1m
    assert to_units("memory", Fraction(1, 2)) == 1
    assert resource_units("cpu", "2") == 2000
    assert resource_units("memory", "1Mi") == 1024 * 1024
    assert resource_units("nvidia.com/gpu", "1") == 1


def test_resource_list_error_names_the_field():
    """A bad quantity inside a ResourceList says where it is."""
    with pytest.raises(QuantityError) as info:
        parse_resource_list({"cpu": "2", "memory": "lots"}, "items[3].status.allocatable")
    assert "items[3].status.allocatable.memory" in str(info.value)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["m", "", "k", "Ki", "Mi", "Gi", "M", "G"]))
def test_integer_quantities_roundtrip(n, suffix):
    """n<suffix> equals n times the suffix's multiplier, for every suffix."""
    mult = {"m": Fraction(1, 1000), "": 1, "k": 1000, "Ki": 1024, "Mi": 2**20, "Gi": 2**30, "M": 10**6,
            "G": 10**9}[suffix]
    assert parse_quantity(f"{n}{suffix}") == n * mult
