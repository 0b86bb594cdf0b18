"""`rankscope boots DIR` and `rankscope phases DIR [--boot ID] [--json]`.

Tables in MiB for people; --json in bytes, the same document the daemon's API returns.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from rankscope.record import ENV_DIR
from rankscope.record.reader import BootNotFoundError, Flight, read_flight
from rankscope.reports.ledger import MiB, phases_document

NA = "n/a"


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    add_flight_dir(parser)
    if name == "phases":
        parser.add_argument("--boot", metavar="ID", help="the boot to show (default: the latest)")
    parser.add_argument("--json", action="store_true", help="print JSON (bytes) instead of a table")
    parser.set_defaults(_command=name)


def add_flight_dir(parser: argparse.ArgumentParser) -> None:
    """DIR, or $RANKSCOPE_DIR when it is left out."""
    parser.add_argument(
        "flight_dir",
        metavar="DIR",
        nargs="?",
        default=os.environ.get(ENV_DIR),
        help=f"the flight directory the probes write (default ${ENV_DIR})",
    )


def no_flight_dir(args: argparse.Namespace) -> bool:
    if args.flight_dir:
        return False
    print(f"rankscope {args._command}: give DIR or set {ENV_DIR}", file=sys.stderr)
    return True


def no_boots_hint(flight_dir: str) -> str:
    """What to try when a directory holds no boots: its flight/ subdirectory, if it has one."""
    nested = Path(flight_dir) / "flight"
    if nested.is_dir():
        return f"no boots recorded in {flight_dir}; it holds {nested}: try that directory\n"
    return f"no boots recorded in {flight_dir} (the directory the probes write, {ENV_DIR})\n"


def main(args: argparse.Namespace) -> int:
    if no_flight_dir(args):
        return 2
    try:
        if args._command == "boots":
            flight = read_flight(args.flight_dir, all_boots=True)
        else:
            flight = read_flight(args.flight_dir, boot=args.boot)
    except (OSError, BootNotFoundError) as exc:
        print(f"rankscope {args._command}: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout
    if args._command == "boots":
        if args.json:
            json.dump({"boots": [b.as_json() for b in flight.boots]}, out, indent=2)
            out.write("\n")
        else:
            print_boots(flight, out, empty=no_boots_hint(args.flight_dir))
        return 0
    document = phases_document(flight)
    if args.json:
        json.dump(document, out, indent=2)
        out.write("\n")
    else:
        print_phases(document, out, empty=no_boots_hint(args.flight_dir))
    return 0


# --- formatting -----------------------------------------------------------------------------


def mib(value: int | None, *, signed: bool = False) -> str:
    if value is None:
        return NA
    return f"{value / MiB:+.1f}" if signed else f"{value / MiB:.1f}"


def when(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S"
    )


def table(
    header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO, indent: str = ""
) -> None:
    """Left-aligned first column, right-aligned numbers."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        cells = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.write(indent + "  ".join(cells).rstrip() + "\n")


def skipped_note(skipped: dict[str, int]) -> str | None:
    parts = [f"{n} {reason.replace('_', ' ')}" for reason, n in skipped.items() if n]
    if not parts:
        return None
    note = "skipped lines: " + ", ".join(parts)
    if skipped.get("newer_schema"):
        note += " (written by a newer rankscope: upgrade to read them)"
    return note


def print_boots(flight: Flight, out: TextIO, empty: str = "no boots recorded\n") -> None:
    if not flight.boots:
        out.write(empty)
    else:
        rows = [
            [
                b.boot,
                when(b.first_wall),
                when(b.last_wall),
                str(b.processes),
                _ranks(b.ranks),
                "latest" if b.latest else "",
            ]
            for b in flight.boots
        ]
        table(["boot", "first (UTC)", "last (UTC)", "processes", "ranks", ""], rows, out)
    note = skipped_note(dict(flight.skipped))
    if note:
        out.write(note + "\n")


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks) if ranks else "-"


def _who(process: dict[str, Any]) -> str:
    parts = [f"pid {process['pid']}", f"start {process['start_ticks']}"]
    for name in ("rank", "tp_rank", "pp_rank"):
        if process.get(name) is not None:
            parts.append(f"{name.replace('_rank', '')} {process[name]}")
    cards = {(m["gpu"], m["uuid"]) for m in process["marks"] if m["uuid"]}
    for gpu, uuid in sorted(cards, key=lambda c: (c[0] is None, c[0] or 0)):
        parts.append(f"gpu {gpu if gpu is not None else '?'} {uuid}")
    return "  ".join(parts)


def print_phases(document: dict[str, Any], out: TextIO, empty: str = "no boots recorded\n") -> None:
    if document["boot"] is None:
        out.write(empty)
        return
    processes = document["processes"]
    out.write(f"boot {document['boot']}: {len(processes)} processes\n")
    for process in processes:
        out.write(f"\nprocess {_who(process)}\n")
        if not process["posts"]:
            out.write("  no posts (fewer than two marks per runner)\n")
        else:
            rows = [
                [
                    p["post"],
                    p["runner"] or "-",
                    f"{p['seconds']:.2f}",
                    mib(p["views"]["allocator"], signed=True),
                    mib(p["views"]["allocated"], signed=True),
                    mib(p["views"]["driver"], signed=True),
                    mib(p["views"]["process"], signed=True),
                    mib(p["views"]["non_torch"], signed=True),
                ]
                for p in process["posts"]
            ]
            header = [
                "post (MiB)",
                "runner",
                "s",
                "reserved",
                "allocated",
                "driver",
                "process",
                "non-torch",
            ]
            table(header, rows, out, indent="  ")
        unmeasured: dict[str, list[str]] = {}
        for m in process["marks"]:
            for why in dict.fromkeys(m["why"].values()):
                unmeasured.setdefault(why, []).append(m["phase"])
        for why, phases in unmeasured.items():
            out.write(f"  n/a at {', '.join(phases)}: {why}\n")
    for card in document["cards"]:
        gpu = card["gpu"] if card["gpu"] is not None else "?"
        out.write(
            f"\ncard gpu {gpu} {card['uuid']}: total = rank-resident + foreign + free + unattributed\n"
        )
        rows = [
            [
                i["phase"],
                str(i["pid"]),
                mib(i["total"]),
                mib(i["rank_resident"]),
                mib(i["foreign"]),
                mib(i["free"]),
                mib(i["unattributed"], signed=True),
                mib(i["drift"], signed=True),
            ]
            for i in card["identities"]
        ]
        header = [
            "at mark (MiB)",
            "pid",
            "total",
            "rank-resident",
            "foreign",
            "free",
            "unattributed",
            "drift",
        ]
        table(header, rows, out, indent="  ")
        foreign = {pid for i in card["identities"] for pid in i["foreign_pids"]}
        if foreign:
            out.write(f"  foreign pids seen: {', '.join(sorted(foreign, key=int))}\n")
    note = skipped_note(document["skipped"])
    if note:
        out.write("\n" + note + "\n")
