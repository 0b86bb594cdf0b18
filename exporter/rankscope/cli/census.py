"""`rankscope census DIR [--boot ID] [--json]`: per group instance and op, each rank's count
at the latest common round, the divergence and the lagging ranks, and the first round at
which a divergence appeared."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from rankscope.cli import common
from rankscope.record.compare import Entry
from rankscope.reports.census import census_document


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    parser.epilog = (
        "exit status: 0 when the ranks agree at the latest common round, 1 when they "
        "diverge there, 2 when the directory or boot cannot be read"
    )
    common.add_flight_dir(parser, name)
    common.add_boot(parser, "read")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    flight = common.open_flight(args, boot=args.boot)
    if flight is None:
        return 2
    report = census_document(flight)
    if args.json:
        common.print_json(report, sys.stdout)
    else:
        sys.stdout.write(render_text(report))
    return 1 if report["divergent"] else 0


def _counts_text(counts: Mapping[str, int]) -> str:
    values = set(counts.values())
    if len(values) == 1 and len(counts) > 2:
        return f"all {len(counts)}: {next(iter(values))}"
    return " ".join(f"{r}:{n}" for r, n in counts.items())


def _status(entry: Entry) -> str:
    if not entry["divergent"]:
        return "ok"
    return "DIVERGENT, lagging: " + ",".join(str(r) for r in entry["lagging"])


def render_text(report: Mapping[str, Any]) -> str:
    ranks = report["ranks"]
    if not ranks:
        boot = report["boot"]
        return "no census records" + (f" in boot {boot}" if boot else "") + "\n"
    every = report["every"]
    lines = [
        f"census of boot {report['boot']}: {len(ranks)} rank(s) with census records"
        + (f", a snapshot every {every} ticks" if every else "")
    ]
    if not report["entries"]:
        lines.append("no group instance has two ranks with a snapshot at a common round")
    else:
        rows = [["GROUP", "OP", "ROUND", "COUNTS (rank:n)", "STATUS"]]
        rows += [
            [e["group"], e["op"], str(e["round"]), _counts_text(e["counts"]), _status(e)]
            for e in report["entries"]
        ]
        lines += ["", *common.table(rows, numbers_right=False)]
    lines.append("")
    first = report["first_divergent_round"]
    if first is None:
        lines.append("no divergence at any compared round")
    else:
        lines += [f"first divergence at round {first}", "divergences by the rounds they spanned:"]
        for e in report["history"]:
            span = e["rounds"]
            rounds = f"round {span[0]}" if span[0] == span[1] else f"rounds {span[0]}-{span[1]}"
            state = "resolved since" if e["resolved"] else "still at the latest common round"
            lines.append(
                f"  {e['group']} {e['op']}: {rounds}, first counts {_counts_text(e['counts'])}, "
                f"lagging {','.join(map(str, e['lagging']))} ({state})"
            )
    if report["in_process"]:
        n = report["in_process_lines"]
        lines += ["", f"in-process comparison ({n} divergence line(s)), latest per op:"]
        for d in report["in_process"]:
            counts = d["counts"] if isinstance(d["counts"], dict) else {}
            lagging = d["lagging"] or []
            state = f"lagging {','.join(map(str, lagging))}" if lagging else "agree again"
            lines.append(
                f"  round {d['round']}: {d['group']} {d['op']} {_counts_text(counts)}, {state}"
            )
    dumps = report["dumps"]
    if dumps["ranks"]:
        lines += ["", "local dumps (taken at abort or exit, not at a common round):"]
        for d in dumps["ranks"]:
            lines.append(f"  rank {d['rank']}: {d['reason']} at round {d['round']}")
        if dumps["entries"]:
            rows = [["GROUP", "OP", "COUNTS AT DUMP", "STATUS"]]
            rows += [
                [e["group"], e["op"], _counts_text(e["counts"]), _status(e)]
                for e in dumps["entries"]
            ]
            lines.extend(common.table(rows, numbers_right=False, indent="  "))
    lines += ["", "ranks:"]
    for r in ranks:
        last = r["last_round"]
        lines.append(
            f"  rank {r['rank']}: pid {r['pid']} on {r['host']}, {r['snapshots']} snapshot(s)"
            + (f", last at round {last}" if last is not None else "")
        )
    if report["skipped"]:
        lines += ["", "skipped: " + ", ".join(f"{k} {v}" for k, v in report["skipped"].items())]
    return "\n".join(lines) + "\n"
