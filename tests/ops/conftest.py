"""Fixtures for the operations tests (tests/ops): an emulated CE host, see ops_helpers.py."""

from __future__ import annotations

import pytest
from ops_helpers import ce_host


@pytest.fixture
def host():
    """A CE host with a running agent."""
    with ce_host() as h:
        h.start_agent()
        yield h


@pytest.fixture
def bare_host():
    """A CE host whose agent is not running (doctor tests start it when they need it)."""
    with ce_host() as h:
        yield h
