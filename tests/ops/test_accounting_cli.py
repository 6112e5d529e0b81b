"""`ce-k8s accounting --history-dir DIR [--json]` (issue 15 item 5, docs/accounting.md): per owner,
route and day, attempts, core-hours and CPU efficiency from the per-job history files; CPU that is
unknown is never counted as zero; a file APEL could not turn into a full record is flagged."""

from __future__ import annotations

import json

from ce_k8s.agent.history import HistoryWriter
from ce_k8s.cli import main

DAY1 = 1760000000          # 2025-10-09
DAY2 = DAY1 + 86400


def attempt(n: int, owner: str, route: str, end: int, wall: float, cores: int, cpu: float | None,
            outcome: str = "completed") -> dict[str, object]:
    return {
        "GlobalJobId": f"ce#ce-{n}-0-a0-x#{end}", "Owner": owner, "RouteName": route, "RoutedFromJobId": f"{n}.0",
        "JobStartDate": int(end - wall), "CompletionDate": end, "EnteredCurrentStatus": end,
        "RemoteWallClockTime": wall, "RemoteUserCpu": 0.0 if cpu is None else cpu, "RemoteSysCpu": 0.0,
        "K8sCpuUsageKnown": cpu is not None, "ResidentSetSize_RAW": 1024, "ImageSize_RAW": 2048,
        "RequestCpus": cores, "K8sAttemptOutcome": outcome,
    }


def write_all(d, ads):
    w = HistoryWriter(str(d))
    for i, ad in enumerate(ads):
        w.write(f"uid-{i}", ad)


def run_json(capsys, *argv):
    rc = main(["accounting", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_groups_core_hours_and_efficiency(tmp_path, capsys):
    write_all(tmp_path, [
        attempt(1, "cms", "CMS", DAY1, 3600, 8, 8 * 3600 * 0.9),
        attempt(2, "cms", "CMS", DAY1, 1800, 8, 8 * 1800 * 0.5, outcome="evicted"),
        attempt(3, "cms", "CMS", DAY2, 3600, 4, None),
        attempt(4, "osg", "Pilots", DAY1, 7200, 1, 3600),
    ])
    rc, out = run_json(capsys, "--history-dir", str(tmp_path))
    assert rc == 0 and out["records"] == 4 and out["incomplete"] == 0
    rows = {(r["owner"], r["route"], r["day"]): r for r in out["groups"]}
    cms1 = rows[("cms", "CMS", "2025-10-09")]
    assert cms1["pilots"] == 2 and cms1["evicted"] == 1
    assert cms1["core_hours"] == 12.0                       # 8 cores x 1.5 h
    assert cms1["cpu_efficiency"] == round((8 * 0.9 + 8 * 0.5 * 0.5) / 12.0, 4)
    cms2 = rows[("cms", "CMS", "2025-10-10")]
    assert cms2["cpu_unknown"] == 1 and cms2["cpu_efficiency"] is None    # unknown, not 0 %
    assert cms2["core_hours"] == 4.0                                      # the wall time still counts
    assert rows[("osg", "Pilots", "2025-10-09")]["cpu_efficiency"] == 0.5
    assert out["total"]["pilots"] == 4 and out["total"]["core_hours"] == 18.0


def test_group_by_owner_only(tmp_path, capsys):
    write_all(tmp_path, [attempt(1, "cms", "A", DAY1, 3600, 2, 3600), attempt(2, "cms", "B", DAY2, 3600, 2, 3600)])
    rc, out = run_json(capsys, "--history-dir", str(tmp_path), "--by", "owner")
    assert rc == 0 and [(r["owner"], r["pilots"], r["cpu_efficiency"]) for r in out["groups"]] == [("cms", 2, 0.5)]


def test_a_file_apel_cannot_use_is_flagged_and_fails(tmp_path, capsys):
    bad = attempt(1, "cms", "CMS", DAY1, 60, 1, 30)
    del bad["ImageSize_RAW"]
    write_all(tmp_path, [bad, attempt(2, "cms", "CMS", DAY1, 60, 1, 30)])
    rc, out = run_json(capsys, "--history-dir", str(tmp_path))
    assert rc == 1 and out["incomplete"] == 1 and out["records"] == 2


def test_table_output_and_bad_arguments(tmp_path, capsys):
    write_all(tmp_path, [attempt(1, "cms", "CMS", DAY1, 3600, 2, 3600)])
    assert main(["accounting", "--history-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "OWNER" in text and "cms" in text and "50%" in text and "1 records" in text
    assert main(["accounting", "--history-dir", str(tmp_path), "--by", "site"]) == 2
    assert main(["accounting", "--history-dir", str(tmp_path / "missing")]) == 2
