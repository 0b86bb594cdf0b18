"""`rankscope boots DIR [--json]`: the boots recorded in a flight directory."""

from __future__ import annotations

import argparse

from rankscope.cli import common

HEADER = ("boot", "first (UTC)", "last (UTC)", "processes", "ranks", "")


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    common.add_flight_dir(parser, name)
    parser.add_argument("--json", action="store_true", help="print JSON (bytes) instead of a table")


def main(args: argparse.Namespace) -> int:
    flight = common.open_flight(args, all_boots=True)
    if flight is None:
        return 2
    if args.json:
        common.print_json({"boots": [b.as_json() for b in flight.boots]})
        return 0
    if not flight.boots:
        print(common.no_boots_hint(args.flight_dir), end="")
    else:
        rows = [HEADER]
        for b in flight.boots:
            first, last = common.when(b.first_wall), common.when(b.last_wall)
            ranks = ",".join(str(r) for r in b.ranks) or "-"
            latest = "latest" if b.latest else ""
            rows.append((b.boot, first, last, str(b.processes), ranks, latest))
        print(*common.table(rows), sep="\n")
    if note := common.skipped_note(dict(flight.skipped)):
        print(note)
    return 0
