"""The real environments of the test bed: a real HTCondor and a real Kubernetes control plane.

Nothing here is emulated: `kube.kubebuild` builds kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl, etcd and kwok from the Go module proxy into a cache, and `kube.kube` runs
them on loopback (with real kubelets from `node/`); `condor/` runs Debian's HTCondor in a chroot.
The emulators (`ce_k8s/sim/`) stay for what these cannot do here (faults, millisecond timing,
50,000 pods in seconds) and answer to them (docs/real-kubernetes.md).
"""
