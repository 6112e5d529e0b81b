"""What `--ce-config stock` (ce_k8s.real.condor.stockce) writes, checked without root or daemons.

The daemons' side is tests/real/condor/test_real_ce_config.py; these pin the choices that make it an OSG
CE and not a test configuration: no FS/CLAIMTOBE trust on the CE, TOKEN only from the factory's
HTCondor-C client, each command run with the configuration of the host it addresses.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ce_k8s.real.condor import cli_realcondor
from ce_k8s.real.condor.condor import RealCondor, RealCondorError, State
from ce_k8s.real.condor.stockce import (
    CE_CONDOR_CONFIG,
    FACTORY_CONDOR_CONFIG,
    StockCE,
    ce_testbed_config,
    factory_config,
    real_condor,
    stock_tree,
)

STOCK = Path(__file__).resolve().parents[1] / "fixtures" / "stock_ce"


def test_the_ces_own_configuration_is_the_default_where_htcondor_ce_runs(tmp_path):
    """Unnamed, the CE runs HTCondor-CE's files on 25 and the bed's on 23.9 or with the batch pool;
    named, either is chosen, and stock on 23.9 is refused with the reason, not started to fail."""
    assert type(real_condor(tmp_path / "a")) is StockCE
    assert type(real_condor(tmp_path / "a", htcondor="25")) is StockCE
    assert type(real_condor(tmp_path / "a", htcondor="23")) is RealCondor
    assert type(real_condor(tmp_path / "a", batch=True)) is RealCondor
    assert type(real_condor(tmp_path / "b", ce_config="bed")) is RealCondor
    assert type(real_condor(tmp_path / "b", ce_config="stock")) is StockCE
    with pytest.raises(RealCondorError, match="choose one of bed, stock"):
        real_condor(tmp_path / "c", ce_config="test")
    with pytest.raises(RealCondorError, match=r"needs HTCondor 25.*security:recommended"):
        real_condor(tmp_path / "c", htcondor="23", ce_config="stock")
    parser = argparse.ArgumentParser()
    cli_realcondor.add_arguments(parser)
    assert parser.parse_args(["up"]).ce_config is None          # resolved by real_condor, as above


@pytest.mark.parametrize("started", ["stock", "bed"])
def test_down_and_status_act_on_the_configuration_up_started(tmp_path, started):
    """A state directory remembers its bed's configuration: `down --htcondor 23` on a stock bed, or
    with no flag on a bed-configured one, gets the class that started it; naming the other is refused."""
    State(str(tmp_path / "root"), str(tmp_path), [], 0, "", 0, 2, 0.0, False, started).save(tmp_path / "state.json")
    expected = StockCE if started == "stock" else RealCondor
    assert type(real_condor(tmp_path)) is expected
    assert type(real_condor(tmp_path, htcondor="23")) is expected
    other = "bed" if started == "stock" else "stock"
    with pytest.raises(RealCondorError, match=rf"has a bed with --ce-config {started}.*down"):
        real_condor(tmp_path, ce_config=other)


def test_the_ce_site_file_adds_token_and_trusts_nothing_local():
    text = ce_testbed_config(Path("/var/tmp/s"), 2, "/opt/py")
    assert "CLAIMTOBE" not in text and "ALLOW_" not in text     # HTCondor-CE's authorization stays
    assert "SCHEDD.SEC_WRITE_AUTHENTICATION_METHODS = $(SCHEDD.SEC_WRITE_AUTHENTICATION_METHODS), TOKEN" in text
    assert "CE_K8S_AGENT_ARGS = agent --verbose --config /etc/condor-ce/condor_config" in text
    assert "\nSCHEDD_NAME = ce\n" in text and "SPOOL = /var/tmp/s/spool" in text
    # SciTokens: the CE's host certificate from the bed's CA, a key cache of this bed's own
    assert "AUTH_SSL_SERVER_CERTFILE = /var/tmp/s/scitokens/ce.crt" in text
    assert "SEC_SCITOKENS_CACHE = /var/tmp/s/scitokens/cache" in text


def test_the_factory_presents_only_its_token_to_the_ce():
    text = factory_config(Path("/var/tmp/s"))
    assert "C_GAHP.SEC_CLIENT_AUTHENTICATION_METHODS = SCITOKENS, IDTOKENS" in text
    assert "C_GAHP_WORKER_THREAD.SEC_CLIENT_AUTHENTICATION_METHODS = SCITOKENS, IDTOKENS" in text
    assert "COLLECTOR_HOST = 127.0.0.1:19618" in text        # the port that makes one bed per machine


def test_each_command_runs_with_the_configuration_of_its_host(tmp_path):
    bed = StockCE(tmp_path, stock_dir=STOCK)
    assert bed.condor_config_for(["condor_q", "-allusers"]) == CE_CONDOR_CONFIG
    assert bed.condor_config_for(["condor_q", "-name", bed.factory_name]) == FACTORY_CONDOR_CONFIG
    assert stock_tree(STOCK) == STOCK
    with pytest.raises(RealCondorError, match="stock layout"):
        stock_tree(tmp_path)
