"""The emulator refuses the Secret keys the real API server refuses (IsConfigMapKey), found on
the real server by tests/real/test_lifecycle.py: `.`, `..` and any key starting with `..`."""

from __future__ import annotations

import base64

import pytest

from ce_k8s.sim.kube.validate import validate_secret


def _secret(key: str) -> dict:
    return {"data": {key: base64.b64encode(b"x").decode()}}


@pytest.mark.parametrize(("key", "rule"), [(".", "must not be '.'"), ("..", "must not be '..'"),
                                           ("..x", "must not start with '..'"),
                                           ("...", "must not start with '..'")])
def test_keys_the_real_server_refuses(key, rule):
    (cause,) = validate_secret(_secret(key))
    assert cause[0] == f"data[{key}]" and cause[2].endswith(rule)


@pytest.mark.parametrize("key", [".x", "_.x", "-x", "a..b", "x.."])
def test_keys_the_real_server_takes(key):
    assert validate_secret(_secret(key)) == []
