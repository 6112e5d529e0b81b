"""`ce-k8s accounting --history-dir DIR [--json]`: what the per-job history files account for.

    ce-k8s accounting --history-dir DIR [--json] [--by owner,route,day]

Reads the files the agent writes into `CE_K8S_PER_JOB_HISTORY_DIR` (one per pilot attempt,
docs/accounting.md) and sums them per owner, route and day (UTC, of `CompletionDate`): attempts,
wall hours, core-hours (wall × `RequestCpus`), CPU hours and CPU efficiency (CPU time over
core-hours). Efficiency counts only attempts whose CPU time is known (`K8sCpuUsageKnown`): an
attempt without it is counted in `cpu_unknown`, never as zero CPU.

It also checks each file the way HTCondor-CE's APEL script reads it (`apel_fields`: the
`condor_q -job FILE -format` projections of contrib/apelscripts/condor_batch_blah.py, evaluated
with classad2): a file whose batch record would miss a field is counted in `incomplete` (APEL would
write a broken record), and exit code 1 says so. Exit code 2: the directory cannot be read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import classad2

from ce_k8s.condor.wire import evaluate_ad, parse_old_ads

# The batch record's projections (condor_batch_blah.py): format, expression, in order.
BATCH_FORMATS: tuple[tuple[str, str], ...] = (
    ("%s|", "GlobalJobId"), ("%s|", "Owner"), ("%lld|", "RemoteWallClockTime"), ("%lld|", "RemoteUserCpu"),
    ("%lld|", "RemoteSysCpu"), ("%lld|", "JobStartDate"), ("%lld|", "EnteredCurrentStatus"),
    ("%lld|", "ResidentSetSize_RAW"), ("%lld|", "ImageSize_RAW"), ("%lld|", "RequestCpus"),
)
# The blah record's (userDN and userFQAN may be absent: HTCondor's own jobs may lack them too).
ACCOUNTING_USER = "ifThenElse(!isUndefined(x509userproxysubject), x509userproxysubject, orig_AuthTokenSubject)"
BLAH_FORMATS: tuple[tuple[str, str], ...] = (
    ('"timestamp=%s" ', 'formatTime(EnteredCurrentStatus, "%Y-%m-%d %H:%M:%S")'),
    ('"userDN=%s" ', ACCOUNTING_USER),
    ('"jobID=%v_ce" ', "RoutedFromJobId"),
    ('"lrmsID=%s" ', "GlobalJobId"),
    ('"localUser=%s"\n', "Owner"),
)
BLAH_REQUIRED = ("timestamp", "jobID", "lrmsID", "localUser")


def apel_scaling_expr(specs: dict[str, float] | None = None, default: str = "1.0",
                      scaling_attr: str = "MachineAttrApelScaling0",
                      spec_attr: str = "MachineAttrApelSpecs0") -> str:
    """The scaling expression condor_batch_blah.py builds (format_apel_scaling): the CE's specs
    (apel client.cfg `manual_spec*`), then the scaling attribute, then `APEL_SCALE_DEFAULT`."""
    expr = f"({scaling_attr} ?: {default})"
    for name, value in reversed(list((specs or {}).items())):
        expr = f"(({spec_attr}.'{name}' / {value}) ?: {expr})"
    return expr


def format_field(ad: classad2.ClassAd, fmt: str, expr: str) -> str | None:
    """One `condor_q -format FMT EXPR` on one ad: None when the value is undefined or an error, or
    does not fit the conversion (condor_q then prints nothing for it, not even the literal text)."""
    try:
        value = classad2.ExprTree(expr).eval(ad)
    except Exception:
        return None
    if value is None or isinstance(value, classad2.Value):   # Undefined / Error
        return None
    conv = next((c for c in ("%lld", "%d", "%f", "%s", "%v") if c in fmt), None)
    if conv is None:
        return fmt
    if conv in ("%lld", "%d"):
        if isinstance(value, bool):
            text = str(int(value))
        elif isinstance(value, int | float):
            text = str(int(value))
        else:
            return None
    elif conv == "%f":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        text = f"{float(value):f}"
    elif isinstance(value, classad2.ClassAd):
        text = repr(value)
    else:
        text = str(value) if not isinstance(value, bool) else str(value).lower()
    return fmt.replace(conv, text, 1)


def apel_fields(ad: dict | classad2.ClassAd, scaling_expr: str | None = None) -> dict[str, str] | None:
    """The batch and blah record fields APEL's script would write for this ad, or None if the batch
    record is incomplete (a field missing) or the file would be quarantined (no GlobalJobId, or a
    scaling factor that is not a number)."""
    if isinstance(ad, dict):
        ad = _classad(ad)
    scaling_expr = scaling_expr or apel_scaling_expr()
    if not format_field(ad, "%s", "GlobalJobId") or format_field(ad, "%f", scaling_expr) is None:
        return None
    out: dict[str, str] = {}
    for fmt, expr in (*BATCH_FORMATS, ("%v|\n", scaling_expr)):
        text = format_field(ad, fmt, expr)
        if text is None:
            return None
        out[expr] = text.rstrip("|\n")
    for fmt, expr in BLAH_FORMATS:
        text = format_field(ad, fmt, expr)
        key = fmt.split("=")[0].strip('"')
        if text is None:
            if key in BLAH_REQUIRED:
                return None
            continue
        out["blah:" + key] = text.strip().strip('"').split("=", 1)[1]
    return out


def _classad(values: dict) -> classad2.ClassAd:
    ad = classad2.ClassAd()
    for k, v in values.items():
        if isinstance(v, dict):
            v = _classad(v)
        ad[k] = v
    return ad


@dataclass(frozen=True)
class HistoryRecord:
    path: Path
    ad: dict[str, object]          # evaluated attributes (case as written)
    raw: classad2.ClassAd


def read_history(directory: Path) -> list[HistoryRecord]:
    """Every regular file in `directory` (as the APEL script takes them) that holds one ClassAd."""
    records = []
    for path in sorted(directory.iterdir()):
        if not path.is_file():
            continue
        try:
            ads = parse_old_ads(path.read_text(encoding="utf-8", errors="replace"))
        except (OSError, ValueError):
            continue
        if len(ads) == 1:
            records.append(HistoryRecord(path, evaluate_ad(ads[0]), ads[0]))
    return records


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def summarise(records: list[HistoryRecord], by: tuple[str, ...] = ("owner", "route", "day")) -> dict[str, object]:
    """Totals per group (see the module docstring)."""
    groups: dict[tuple[str, ...], dict[str, float]] = {}
    incomplete = 0
    for rec in records:
        ad = rec.ad
        if apel_fields(rec.raw) is None:
            incomplete += 1
        end = int(_num(ad.get("CompletionDate") or ad.get("EnteredCurrentStatus")))
        keys = {"owner": str(ad.get("Owner") or "?"), "route": str(ad.get("RouteName") or "?"),
                "day": dt.datetime.fromtimestamp(end, dt.UTC).strftime("%Y-%m-%d") if end else "?"}
        g = groups.setdefault(tuple(keys[k] for k in by), {
            "pilots": 0, "wall_hours": 0.0, "core_hours": 0.0, "cpu_hours": 0.0, "known_core_hours": 0.0,
            "cpu_unknown": 0, "evicted": 0, "failed": 0})
        wall = _num(ad.get("RemoteWallClockTime"))
        cores = max(_num(ad.get("RequestCpus")), 1.0)
        g["pilots"] += 1
        g["wall_hours"] += wall / 3600
        g["core_hours"] += wall * cores / 3600
        if ad.get("K8sCpuUsageKnown") is False:
            g["cpu_unknown"] += 1
        else:
            g["cpu_hours"] += (_num(ad.get("RemoteUserCpu")) + _num(ad.get("RemoteSysCpu"))) / 3600
            g["known_core_hours"] += wall * cores / 3600
        outcome = ad.get("K8sAttemptOutcome")
        if outcome in ("evicted", "failed"):
            g[str(outcome)] += 1
    rows = []
    for key, g in sorted(groups.items()):
        known = g.pop("known_core_hours")
        row: dict[str, object] = dict(zip(by, key, strict=True))
        row.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in g.items()})
        row["cpu_efficiency"] = round(g["cpu_hours"] / known, 4) if known else None
        rows.append(row)
    total_core = sum(float(r["core_hours"]) for r in rows)   # type: ignore[arg-type]
    return {"records": len(records), "incomplete": incomplete, "groups": rows,
            "total": {"pilots": sum(int(r["pilots"]) for r in rows), "core_hours": round(total_core, 4),  # type: ignore[call-overload]
                      "cpu_hours": round(sum(float(r["cpu_hours"]) for r in rows), 4)}}  # type: ignore[arg-type]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history-dir", required=True, metavar="DIR",
                        help="the per-job history directory (CE_K8S_PER_JOB_HISTORY_DIR)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--by", default="owner,route,day", metavar="KEYS",
                        help="group by these of owner, route, day (comma-separated; default all three)")


def run(args: argparse.Namespace) -> int:
    directory = Path(args.history_dir)
    by = tuple(k.strip() for k in str(args.by).split(",") if k.strip())
    if not by or any(k not in ("owner", "route", "day") for k in by):
        print("ce-k8s accounting: --by takes owner, route and/or day", file=sys.stderr)
        return 2
    try:
        records = read_history(directory)
    except OSError as exc:
        print(f"ce-k8s accounting: {directory}: {exc.strerror}", file=sys.stderr)
        return 2
    summary = summarise(records, by)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        head = (*[k.upper() for k in by], "PILOTS", "CORE-H", "CPU-H", "EFFICIENCY", "CPU-UNKNOWN", "EVICTED")
        lines = [head]
        for r in summary["groups"]:   # type: ignore[union-attr]
            eff = r["cpu_efficiency"]
            lines.append((*[str(r[k]) for k in by], str(r["pilots"]), f"{r['core_hours']:.2f}", f"{r['cpu_hours']:.2f}",
                          "-" if eff is None else f"{eff:.0%}", str(r["cpu_unknown"]), str(r["evicted"])))
        widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
        for row in lines:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        total = summary["total"]
        print(f"\n{summary['records']} records, {total['pilots']} pilots, {total['core_hours']:.2f} core-hours, "  # type: ignore[index]
              f"{summary['incomplete']} incomplete for APEL")
    return 1 if summary["incomplete"] else 0
