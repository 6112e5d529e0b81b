"""GlideinWMS-shaped routed ads for the pod-builder tests (htcondor-ce.md §6.3), and their fixtures."""

from __future__ import annotations

import pytest

from ce_k8s.settings import Settings

SPOOL = "/var/lib/condor-ce/spool"
SPOOL_DIR = f"{SPOOL}/4567/3/cluster1234567.proc3.subproc0"
GJID = "ce.example.edu#1234567.3#1760000000"


def routed_pilot(**overrides: object) -> dict[str, object]:
    """The routed job of htcondor-ce.md §6.3 as `wire.evaluate_ad` would hand it to the builder."""
    ad: dict[str, object] = {
        "RoutedJob": True,
        "RoutedBy": "htcondor-ce",
        "RouteName": "K8s_Pilots",
        "RoutedFromJobId": "1234567.3",
        "K8sSourceGlobalJobId": GJID,
        "GlobalJobId": "ce.example.edu#1234568.0#1760000100",
        "JobUniverse": 9,
        "GridResource": "batch k8s",
        "Owner": "osg01",
        "Iwd": SPOOL_DIR,
        "Cmd": "glidein_startup.sh",
        "Arguments": "-v std -name gfactory_instance -entry OSG_US_EXAMPLE_CE1_cpu8 -clientname OSG_flock.main "
        "-schedd schedd_glideins3@gfactory-2.example.org -proxy OSG -factory OSG "
        "-web https://gfactory-2.example.org/factory/stage -signtype sha1 -dir OSG "
        "-param_GLIDEIN_Client OSG_flock.main -submitcredid 1234 -slotslayout partitionable",
        "Environment": "IDTOKENS_FILE=idtoken.tok LOG_RECIPIENTS='https://a.example.org/log https://b.example.org/log' "
        "CONDORCE_COLLECTOR_HOST=ce.example.edu:9619",
        "TransferInput": "idtoken.tok,url_dirs.desc",
        "x509userproxy": f"{SPOOL_DIR}/x509up_u1234",
        "x509userproxysubject": "/DC=org/DC=example/CN=pilot",
        "ScitokensFile": "/var/lib/gwms-factory/client/credential_OSG_1234.scitoken",
        "orig_AuthTokenIssuer": "https://scitokens.org/osg-connect",
        "orig_AuthTokenSubject": "pilot-subject",
        "xcount": 8,
        "maxMemory": 16000,
        "maxWallTime": 2880,
        "RequestCpus": 8,
        "RequestMemory": 16000,
        "RequestDisk": 1048576,
        "BatchRuntime": 172800,
        "K8sImage": "hub.example.org/osg/pilot:24-el9",
    }
    ad.update(overrides)
    return {k: v for k, v in ad.items() if v is not None}


@pytest.fixture
def settings() -> Settings:
    return Settings(spool=SPOOL, ce_name="ce.example.edu", collector_host="ce.example.edu:9619")


@pytest.fixture
def pilot() -> dict[str, object]:
    return routed_pilot()


def pilot_files() -> dict[str, bytes]:
    return {
        "glidein_startup.sh": b"#!/bin/sh\necho pilot\n",
        "x509up_u1234": b"-----BEGIN CERTIFICATE-----\n...\n",
        "idtoken.tok": b"eyJhbGciOi...",
        "url_dirs.desc": b"https://example.org/a\n",
    }
