"""The real HTCondor beds end to end: HTCondor 25 and 23.9, HTCondor-CE's own configuration, a batch pool beside."""
