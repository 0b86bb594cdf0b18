"""`rankscope census DIR [--boot ID] [--json]`: per group instance and op, each rank's count
at the latest common round, the divergence and the lagging ranks, and the first round at
which a divergence appeared.

Exit status: 0 when the ranks agree at the latest common round, 1 when they diverge there,
2 when the directory or boot cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys

from rankscope.cli.phases import add_flight_dir, no_flight_dir
from rankscope.record.reader import BootNotFoundError, read_flight
from rankscope.reports.census import census_document, render_text


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    parser.epilog = (
        "exit status: 0 when the ranks agree at the latest common round, 1 when they "
        "diverge there, 2 when the directory or boot cannot be read"
    )
    add_flight_dir(parser)
    parser.set_defaults(_command=name)
    parser.add_argument("--boot", metavar="ID", help="the boot to read (default: the latest)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    if no_flight_dir(args):
        return 2
    try:
        flight = read_flight(args.flight_dir, boot=args.boot)
    except (OSError, BootNotFoundError) as exc:
        print(f"rankscope census: {exc}", file=sys.stderr)
        return 2
    report = census_document(flight)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report))
    return 1 if report["divergent"] else 0
