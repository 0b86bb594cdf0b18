"""`rankscope census DIR [--boot ID] [--json]`: each rank's state, each group instance's
counts at the latest common round and, once the ranks stand still, at the latest counts, the
lagging ranks, and the divergences and skews that came and went."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import Any

from rankscope.cli import common
from rankscope.record.compare import Entry
from rankscope.reports.census import census_document


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    parser.epilog = (
        "exit status: 0 when the job is healthy, 1 when the ranks diverge or a rank is "
        "stalled or dead, 2 on a usage error or when the directory holds no record"
    )
    common.add_flight_dir(parser, name, boot="read")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    flight = common.open_flight(args, boot=args.boot)
    if flight is None:
        return 2
    report = census_document(flight)
    if report["boot"] is None:  # nothing recorded: a mistyped directory, most likely
        print(f"rankscope census: {common.no_boots_hint(args.flight_dir)}", end="", file=sys.stderr)
        return 2
    if args.json:
        common.print_json(report)
    else:
        sys.stdout.write(render_text(report))
    return 0 if healthy(report) else 1


def healthy(report: Mapping[str, Any]) -> bool:
    return not (report["divergent"] or report["states"]["stalled"] or report["states"]["dead"])


def _counts_text(counts: Mapping[str, int]) -> str:
    values = set(counts.values())
    if len(values) == 1 and len(counts) > 2:
        return f"all {len(counts)}: {next(iter(values))}"
    return " ".join(f"{r}:{n}" for r, n in counts.items())


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


def _clock(wall: float | None) -> str:
    if wall is None:
        return "?"
    return time.strftime("%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 10)} UTC"


def _state_text(rank: Mapping[str, Any]) -> str:
    state = rank["state"]
    if (blocked := rank["blocked_in"]) is not None:
        where = f"{blocked['group']} {blocked['op']} #{blocked['seq']}"
        verb = "was in" if state == "dead" else "in"
        state += f" {verb} {where} since {_clock(blocked['since'])}"
    if rank["alive"] is None and rank["state"] != "exited":
        state += " (process unknown: not on this host)"
    return state


def _entry_table(
    entries: list[Entry], counts: str, extra: tuple[str, ...] = (), indent: str = ""
) -> list[str]:
    """Compared (group, op) entries as a table; ``extra``: more of each entry's fields."""
    rows = [["GROUP", "OP", *(k.upper() for k in extra), counts, "STATUS"]]
    for e in entries:
        status = f"DIVERGENT, lagging: {_ranks(e['lagging'])}" if e["divergent"] else "ok"
        rows.append(
            [e["group"], e["op"], *(str(e[k]) for k in extra), _counts_text(e["counts"]), status]
        )
    return common.table(rows, numbers_right=False, indent=indent)


def render_text(report: Mapping[str, Any]) -> str:
    ranks = report["ranks"]
    if not ranks:
        boot = report["boot"]
        return "no census records" + (f" in boot {boot}" if boot else "") + "\n"
    every = report["every"]
    lines = [
        f"census of boot {report['boot']}: {len(ranks)} rank(s) with census records"
        + (f", a snapshot every {every} ticks" if every else ""),
        "ranks by state: "
        + "; ".join(f"{state} {_ranks(r)}" for state, r in report["states"].items() if r),
    ]
    if report["dead_in_group"]:
        lines.append("DEAD member(s): " + _ranks(report["dead_in_group"]))
    if report["latest"]:
        lines += ["", "at the latest counts (no member moving):"]
        lines += [*_entry_table(report["latest"], "LATEST COUNTS (rank:n)"), ""]
    if not report["entries"]:
        lines.append("no group instance has two ranks with a snapshot at a common round")
    else:
        lines += ["", *_entry_table(report["entries"], "COUNTS (rank:n)", ("round",))]
    first = report["first_divergent_round"]
    if first is None:  # no divergence, so no history
        lines += ["", "no divergence at any compared round"]
    else:
        lines += ["", f"first divergence at round {first}"]
        lines.append("divergences by the rounds they spanned:")
    for e in report["history"]:
        span = e["rounds"]
        rounds = f"round {span[0]}" if span[0] == span[1] else f"rounds {span[0]}-{span[1]}"
        state = "resolved since" if e["resolved"] else "still at the latest common round"
        lines.append(
            f"  {e['group']} {e['op']}: {rounds}, first counts {_counts_text(e['counts'])}, "
            f"lagging {_ranks(e['lagging'])} ({state})"
        )
    if report["in_process"]:
        n = report["in_process_lines"]
        lines += ["", f"in-process comparison ({n} divergence line(s)), latest per op:"]
        for d in report["in_process"]:
            state = f"lagging {_ranks(d['lagging'])}" if d["lagging"] else "agree again"
            lines.append(
                f"  round {d['round']}: {d['group']} {d['op']} {_counts_text(d['counts'])}, {state}"
            )
    dumps = report["dumps"]
    if dumps["ranks"]:
        lines += ["", "local dumps (taken at abort or exit, not at a common round):"]
        lines += [
            f"  rank {d['rank']}: {d['reason']} at round {d['round']}" for d in dumps["ranks"]
        ]
        if dumps["entries"]:
            lines += _entry_table(dumps["entries"], "COUNTS AT DUMP", indent="  ")
    if report["skews"]:
        lines += ["", "skews while the ranks stood still:"]
    for s in report["skews"]:
        until = "still standing" if s["until"] is None else f"made up at {_clock(s['until'])}"
        lines.append(
            f"  {s['group']} {s['op']}: {_counts_text(s['counts'])}, lagging "
            f"{_ranks(s['lagging'])}, from {_clock(s['since'])}, {until}"
        )
    lines += ["", "ranks:"]
    for r in ranks:
        last = r["last_round"]
        lines.append(
            f"  rank {r['rank']}: {_state_text(r)}; pid {r['pid']} on {r['host']}, "
            f"{r['snapshots']} snapshot(s)"
            + (f", last at round {last}" if last is not None else "")
        )
    if report["skipped"]:
        lines += ["", "skipped: " + ", ".join(f"{k} {v}" for k, v in report["skipped"].items())]
    return "\n".join(lines) + "\n"
