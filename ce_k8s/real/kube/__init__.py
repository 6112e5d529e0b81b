"""The real Kubernetes bed: the control plane's build and launcher, kwok's Stages, the kubelet stub.

Standard library only at import: `python3 -m ce_k8s.real.kube.kubebuild` runs before the venv exists.
"""
