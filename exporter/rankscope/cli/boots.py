"""`rankscope boots DIR [--json]`: the boots recorded in a flight directory."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from rankscope.cli import common
from rankscope.record.reader import Flight


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    common.add_flight_dir(parser, name)
    parser.add_argument("--json", action="store_true", help="print JSON (bytes) instead of a table")


def main(args: argparse.Namespace) -> int:
    flight = common.open_flight(args, all_boots=True)
    if flight is None:
        return 2
    if args.json:
        common.print_json({"boots": [b.as_json() for b in flight.boots]}, sys.stdout)
    else:
        print_boots(flight, sys.stdout, empty=common.no_boots_hint(args.flight_dir))
    return 0


def print_boots(flight: Flight, out: TextIO, empty: str) -> None:
    if not flight.boots:
        out.write(empty)
    else:
        rows = [
            [
                b.boot,
                common.when(b.first_wall),
                common.when(b.last_wall),
                str(b.processes),
                ",".join(str(r) for r in b.ranks) or "-",
                "latest" if b.latest else "",
            ]
            for b in flight.boots
        ]
        header = ["boot", "first (UTC)", "last (UTC)", "processes", "ranks", ""]
        out.writelines(line + "\n" for line in common.table([header, *rows]))
    note = common.skipped_note(dict(flight.skipped))
    if note:
        out.write(note + "\n")
