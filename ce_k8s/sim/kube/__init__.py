"""The emulated Kubernetes: the API server emulator and the kubelet simulator it runs."""
