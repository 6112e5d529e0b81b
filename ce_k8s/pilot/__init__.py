"""The pilot's entry point: what runs inside the pilot image (docs/pilot.md).

Everything here runs on the image's own Python (Debian sid's 3.14, in the image built by
:mod:`ce_k8s.real.node.pilotimage`), copied into the image as plain files: the standard library
only, and nothing else of ce-k8s (the image has no venv and no other module of the package).
"""
