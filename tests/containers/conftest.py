"""Fixtures for the container and manifest tests: the repository and its rendered kustomizations."""

from __future__ import annotations

from pathlib import Path

import pytest
from containers_helpers import KUSTOMIZATIONS, REPO, kustomize


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    """kustomization dir (relative to containers/k8s) → its rendered objects."""
    return {rel: kustomize(rel) for rel in KUSTOMIZATIONS}


@pytest.fixture(scope="session")
def site(rendered) -> list[dict]:
    """The example site overlay: base + CE with site settings, what an admin applies."""
    return rendered["overlays/example-site"]
