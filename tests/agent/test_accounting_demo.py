"""The issue's "done when" on a small scale: `ce-k8s demo --history-dir D` leaves one history file per
pod attempt (evictions included), and the `condor_q -job FILE -format` projections of HTCondor-CE's
contrib/apelscripts/condor_batch_blah.py, evaluated here with classad2 directly (not through
ce-k8s's own reader), give a complete batch and blah record for each."""

from __future__ import annotations

import json
from pathlib import Path

import classad2

from ce_k8s.cli import main

# condor_batch_blah.py, in its order: the batch record (every field needed) ...
BATCH = ["GlobalJobId", "Owner", "RemoteWallClockTime", "RemoteUserCpu", "RemoteSysCpu", "JobStartDate",
         "EnteredCurrentStatus", "ResidentSetSize_RAW", "ImageSize_RAW", "RequestCpus"]
INTEGER = {"%lld": BATCH[2:]}
# ... the scaling expression with the CE's defaults (APEL_SCALE_DEFAULT = 1.0, APEL_SCALING_ATTR) ...
SCALING = "(MachineAttrApelScaling0 ?: 1.0)"
# ... and the blah record's identity and links.
BLAH = ['formatTime(EnteredCurrentStatus, "%Y-%m-%d %H:%M:%S")', "RoutedFromJobId", "GlobalJobId", "Owner"]
USER = "ifThenElse(!isUndefined(x509userproxysubject), x509userproxysubject, orig_AuthTokenSubject)"


def value(ad: classad2.ClassAd, expr: str):
    v = classad2.ExprTree(expr).eval(ad)
    return None if isinstance(v, classad2.Value) else v


def test_demo_history_files_give_complete_apel_records(tmp_path, capsys):
    d = tmp_path / "history"
    rc = main(["demo", "--pilots", "8", "--evict-fraction", "0.25", "--history-dir", str(d), "--json",
               "--timeout", "240"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0, summary
    h = summary["history"]
    assert h["ok"] and h["missing"] == 0 and h["duplicates"] == 0 and h["wall_mismatch"] == 0
    assert h["cpu_over_reported"] == 0 and h["cpu_unknown"] == 0
    files = sorted(p for p in Path(d).iterdir() if p.is_file())
    assert len(files) == h["attempts_ran"] == summary["pods_created"] >= 8 + 2   # two evicted first pods
    ids = set()
    outcomes = []
    for path in files:
        ads = list(classad2.parseAds(path.read_text(), classad2.ParserType.Old))
        assert len(ads) == 1, path
        ad = ads[0]
        for attr in BATCH:
            v = value(ad, attr)
            assert v is not None, (path.name, attr)
            if attr in INTEGER["%lld"]:
                assert isinstance(v, int | float) and not isinstance(v, bool) and v >= 0, (path.name, attr, v)
        assert isinstance(value(ad, SCALING), float)
        for expr in BLAH:
            assert value(ad, expr) is not None, (path.name, expr)
        if value(ad, "Owner") == "cmspilot":                  # the demo's CMS pilots come with a token
            assert value(ad, USER)
        assert value(ad, "JobStartDate") <= value(ad, "EnteredCurrentStatus")
        assert value(ad, "RemoteUserCpu") > 0 and value(ad, "K8sCpuUsageKnown") is True
        ids.add(value(ad, "GlobalJobId"))
        outcomes.append(value(ad, "K8sAttemptOutcome"))
    assert len(ids) == len(files)                             # GlobalJobId is unique per attempt
    assert outcomes.count("evicted") == 2
