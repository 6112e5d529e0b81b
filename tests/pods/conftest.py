"""Fixtures for the pod-builder tests; the ads themselves live in podads.py (importable by name)."""

from podads import pilot, settings  # noqa: F401  (re-exported as fixtures)
