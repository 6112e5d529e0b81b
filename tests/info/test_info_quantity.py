"""A pod's quantities in the scheduler's units (issue 6: "parse every Kubernetes quantity form exactly").

Quantities themselves are read by `ce_k8s.quantity` (its grammar and values: tests/test_quantity.py);
here, the information provider's conversion: the scheduler compares MilliValue() for CPU and
Value() (rounded up) for everything else, and a bad quantity in a ResourceList says where it is.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from ce_k8s.info.quantity import QuantityError, parse_resource_list, resource_units, to_units


def test_floats_are_not_binary_approximations():
    """0.1 + 0.2 CPUs is exactly 300 millicores: a JSON float is read by its decimal text."""
    assert resource_units("cpu", 0.1) + resource_units("cpu", 0.2) == 300


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


def test_resource_list_refuses_what_the_api_server_refuses():
    """1K is no quantity (k is 1000, Ki 1024): the error says so and where, rather than a guess."""
    with pytest.raises(QuantityError) as info:
        parse_resource_list({"memory": "1K"}, "items[0].status.allocatable")
    assert "items[0].status.allocatable.memory" in str(info.value) and "unknown suffix 'K'" in str(info.value)
