"""What `--ce-config stock` (ce_k8s.real.stockce) writes, checked without root or daemons.

The daemons' side is tests/e2e/test_real_ce_config.py; these pin the choices that make it an OSG
CE and not a test configuration: no FS/CLAIMTOBE trust on the CE, TOKEN only from the factory's
HTCondor-C client, each command run with the configuration of the host it addresses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ce_k8s.real.condor import RealCondor, RealCondorError
from ce_k8s.real.stockce import (
    CE_CONDOR_CONFIG,
    FACTORY_CONDOR_CONFIG,
    StockCE,
    ce_testbed_config,
    factory_config,
    real_condor,
    stock_tree,
)

STOCK = Path(__file__).resolve().parents[1] / "fixtures" / "stock_ce"


def test_the_mode_is_chosen_by_name_and_the_default_is_the_bed(tmp_path):
    assert type(real_condor(tmp_path / "a")) is RealCondor
    assert type(real_condor(tmp_path / "b", ce_config="stock")) is StockCE
    with pytest.raises(RealCondorError, match="choose one of bed, stock"):
        real_condor(tmp_path / "c", ce_config="test")


def test_the_ce_site_file_adds_token_and_trusts_nothing_local():
    text = ce_testbed_config(Path("/var/tmp/s"), 2, "/opt/py")
    assert "CLAIMTOBE" not in text and "ALLOW_" not in text     # HTCondor-CE's authorization stays
    assert "SCHEDD.SEC_WRITE_AUTHENTICATION_METHODS = $(SCHEDD.SEC_WRITE_AUTHENTICATION_METHODS), TOKEN" in text
    assert "CE_K8S_AGENT_ARGS = agent --verbose --config /etc/condor-ce/condor_config" in text
    assert "\nSCHEDD_NAME = ce\n" in text and "SPOOL = /var/tmp/s/spool" in text


def test_the_factory_presents_only_its_token_to_the_ce():
    text = factory_config(Path("/var/tmp/s"))
    assert "C_GAHP.SEC_CLIENT_AUTHENTICATION_METHODS = IDTOKENS" in text
    assert "C_GAHP_WORKER_THREAD.SEC_CLIENT_AUTHENTICATION_METHODS = IDTOKENS" in text
    assert "COLLECTOR_HOST = 127.0.0.1:19618" in text        # the port that makes one bed per machine


def test_each_command_runs_with_the_configuration_of_its_host(tmp_path):
    bed = StockCE(tmp_path, stock_dir=STOCK)
    assert bed.condor_config_for(["condor_q", "-allusers"]) == CE_CONDOR_CONFIG
    assert bed.condor_config_for(["condor_q", "-name", bed.factory_name]) == FACTORY_CONDOR_CONFIG
    assert stock_tree(STOCK) == STOCK
    with pytest.raises(RealCondorError, match="stock layout"):
        stock_tree(tmp_path)
