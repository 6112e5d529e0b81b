"""The demos (`ce-k8s demo`, `ce-k8s demo htcjob`), on the emulated or the real beds; no bed imports them."""
