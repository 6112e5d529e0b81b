"""`ratelimit.backoff`: exponential back-off with equal jitter (its docstring says why not full).

Equal jitter ("Exponential Backoff And Jitter", AWS architecture blog) waits `t/2 + uniform(0, t/2)`
for the step's ceiling `t = min(cap, base * 2**(n - 1))`: never below half the ceiling, where full
jitter's `uniform(0, t)` falls below it half the time and comes near 0. The callers count on the
floor (docs/agent.md, "What the agent does" and "Credential refresh"): the agent's five output
tries must span an outage of at least 7.5 s before a completion is reported without output.
"""

from __future__ import annotations

import random

import pytest

from ce_k8s import ratelimit
from ce_k8s.agent import outputsave

SAMPLES = 4000


@pytest.fixture
def seeded(monkeypatch):
    """`backoff` draws from a seeded generator, so every run sees the same samples."""
    monkeypatch.setattr(ratelimit, "random", random.Random(20250917))


@pytest.mark.parametrize(("base", "cap"), [(0.5, 60.0), (0.2, 10.0), (1.0, 300.0), (2.0, 300.0), (1.0, 30.0)])
def test_every_wait_lies_between_half_the_ceiling_and_the_ceiling(seeded, base, cap):
    """The (base, cap) pairs are the default and the callers' own (cache, creator, credentials, output)."""
    for failures in range(1, 16):
        ceiling = min(cap, base * 2 ** (failures - 1))
        waits = [ratelimit.backoff(failures, base=base, cap=cap) for _ in range(SAMPLES)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), (failures, min(waits), max(waits))
        # The whole upper half is used (jittered, not a constant): both ends are reached within 2 %.
        assert min(waits) < ceiling * 0.52 and max(waits) > ceiling * 0.98, (failures, min(waits), max(waits))


def test_equal_not_full_jitter(seeded):
    """Full jitter would put about half the waits below t/2 and some near 0; equal jitter none."""
    ceiling = 8.0                                           # base 1, fourth failure
    waits = [ratelimit.backoff(4, base=1.0, cap=60.0) for _ in range(SAMPLES)]
    assert sum(w < ceiling / 2 for w in waits) == 0
    assert min(waits) >= ceiling / 2 > ceiling * 0.01       # nowhere near 0
    full = random.Random(20250917)                         # the same draws as full jitter would make them
    full_waits = [full.uniform(0, ceiling) for _ in range(SAMPLES)]
    assert 0.45 < sum(w < ceiling / 2 for w in full_waits) / SAMPLES < 0.55
    assert min(full_waits) < ceiling * 0.01


def test_first_failure_and_the_cap(seeded):
    """failures < 1 counts as the first; far past the cap the ceiling stays at the cap."""
    for failures in (0, 1):
        assert all(0.25 <= ratelimit.backoff(failures) <= 0.5 for _ in range(100))
    assert all(30.0 <= ratelimit.backoff(10_000) <= 60.0 for _ in range(100))


def test_output_tries_span_at_least_seven_and_a_half_seconds(seeded):
    """outputsave.py's log saving: OUTPUT_TRIES tries with backoff(n, base=1, cap=30) between them."""
    spans = [sum(ratelimit.backoff(n, base=1.0, cap=30.0) for n in range(1, outputsave.OUTPUT_TRIES))
             for _ in range(SAMPLES)]
    floor = sum(min(30.0, 2.0 ** (n - 1)) / 2 for n in range(1, outputsave.OUTPUT_TRIES))
    assert outputsave.OUTPUT_TRIES == 5 and floor == 7.5
    assert min(spans) >= floor
