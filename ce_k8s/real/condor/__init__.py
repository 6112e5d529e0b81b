"""The real HTCondor bed: Debian's HTCondor in a chroot, HTCondor-CE's own configuration, its token issuer."""
