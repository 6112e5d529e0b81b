"""The real Kubernetes bed's real nodes: the kubelet on containerd and runc, their runtime, the node CA."""
