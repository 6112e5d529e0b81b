"""The batch pool's configuration (`RealCondor(batch=True)`, ce_k8s.real.condor.condor.batch_config), without root.

The daemons' side is tests/real/condor/test_real_batch_pool.py; these pin what must hold before any daemon
starts (docs/real-condor.md, "The batch pool"): the pool is opt-in and leaves the default bed's
configuration as it was, the startd's START takes the batch schedd's jobs and no other schedd's,
the bed's own accounts keep their FS/CLAIMTOBE client list, and the stock-CE mode refuses it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ce_k8s.real.condor import cli_realcondor
from ce_k8s.real.condor import condor as realcondor
from ce_k8s.real.condor.condor import BATCH_START, RealCondor, RealCondorError
from ce_k8s.real.condor.stockce import real_condor

STATE = Path("/var/tmp/s")   # written into the text, never created


def _knobs(text: str) -> dict[str, str]:
    """The last assignment of each knob (what a reader keeps), ignoring comments and `use` lines."""
    knobs = {}
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if eq and not line.lstrip().startswith(("#", "use ")) and " " not in name.strip():
            knobs[name.strip()] = value.strip()
    return knobs


def test_the_pool_is_opt_in_and_leaves_the_default_bed_alone():
    plain = realcondor.testbed_config(STATE, 2, "/opt/py")
    batch = realcondor.testbed_config(STATE, 2, "/opt/py", batch=True)
    assert batch.startswith(plain)                          # only appended: the default bed is unchanged
    for word in ("NEGOTIATOR_INTERVAL", "STARTD", "\nSTART =", "IDTOKENS", "BATCH_SCHEDD"):
        assert word not in plain
    knobs = _knobs(batch)
    assert knobs["DAEMON_LIST"] == "$(DAEMON_LIST), BATCH_SCHEDD, NEGOTIATOR, STARTD"
    assert knobs["DC_DAEMON_LIST"] == "$(DC_DAEMON_LIST), BATCH_SCHEDD"   # the factory schedd stays in it
    assert knobs["batch.SPOOL"] == f"{STATE}/batch-spool"
    assert knobs["START"] == BATCH_START
    assert knobs["PROTECTED_JOB_ATTRS"] == "GlobalJobId"
    assert knobs["NEGOTIATOR_CYCLE_DELAY"] == "1"
    assert knobs["MOUNT_UNDER_SCRATCH"] == ""
    assert knobs["SEC_DEFAULT_AUTHENTICATION"] == knobs["SEC_READ_AUTHENTICATION"] == "REQUIRED"
    assert knobs["SEC_DEFAULT_AUTHENTICATION_METHODS"].split(", ")[0] == "IDTOKENS"
    assert knobs["SEC_CLIENT_AUTHENTICATION_METHODS"] == "FS, CLAIMTOBE"     # the bed's accounts, as before


@pytest.mark.parametrize("global_job_id,runs", [
    ("batch@vm#12.0#1795766676", True),
    ("batch@host.example.org#1.2#1", True),
    ("ce@vm#1.0#1795766802", False),              # a CE source job: the router's, never a slot's
    ("factory@vm#3.0#1795766802", False),
    ("xbatch@vm#1.0#1", False),
    ("ce@vm#1.0#1 batch@vm#2.0#1", False),
    (None, False),
])
def test_start_takes_the_batch_schedds_jobs_only(global_job_id, runs):
    """BATCH_START evaluated by HTCondor's own ClassAd library with the job as TARGET, as the startd does."""
    import classad2

    slot = classad2.ClassAd()
    slot["Start"] = classad2.ExprTree(BATCH_START)
    job = classad2.ClassAd({"GlobalJobId": global_job_id} if global_job_id else {})
    assert (classad2.ExprTree("MY.Start").eval(slot, job) is True) is runs


def test_the_batch_pool_is_the_default_beds_only(tmp_path):
    assert real_condor(tmp_path / "a", batch=True).batch is True
    assert real_condor(tmp_path / "b").batch is False
    with pytest.raises(RealCondorError, match="default bed"):
        real_condor(tmp_path / "c", ce_config="stock", batch=True)
    parser = argparse.ArgumentParser()
    cli_realcondor.add_arguments(parser)
    assert parser.parse_args(["up", "--batch"]).batch is True
    assert parser.parse_args(["up"]).batch is False


def test_a_token_needs_the_batch_pool(tmp_path):
    with pytest.raises(RealCondorError, match="batch=True"):
        RealCondor(tmp_path).batch_token()
