"""`rankscope oom DIR [--boot ID] [--json]`: one line per OOM instant the probe recorded.

Each line answers the incident: when, which card, which rank and pid failed, how many bytes
it asked for and how many were free right then, then every holder of the card by pid, comm,
role (rank N of boot B, or foreign) and bytes, largest first.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from rankscope.flight import BootNotFoundError, read_flight
from rankscope.ledger_cli import NA, when
from rankscope.oom import OomEvent, OomHolder, oom_events

GiB = 1 << 30


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("flight_dir", metavar="DIR", help="the flight directory (RANKSCOPE_DIR)")
    parser.add_argument("--boot", metavar="ID", help="the boot to show (default: the latest)")
    parser.add_argument("--json", action="store_true", help="print JSON (bytes) instead of lines")


def main(args: argparse.Namespace) -> int:
    try:
        every = read_flight(args.flight_dir, all_boots=True)
        chosen = read_flight(args.flight_dir, boot=args.boot)
    except (OSError, BootNotFoundError) as exc:
        print(f"rankscope oom: {exc}", file=sys.stderr)
        return 2
    # Holders are named against every boot's records: a rank of an older boot that still
    # holds the card is no stranger.
    events = oom_events(chosen.records, every.records)
    if args.json:
        json.dump(
            {"boot": chosen.boot, "ooms": [e.as_json() for e in events]}, sys.stdout, indent=2
        )
        sys.stdout.write("\n")
    else:
        print_events(events, chosen.boot, sys.stdout)
    return 0


def gib(value: int | None) -> str:
    return NA if value is None else f"{value / GiB:.2f} GiB"


def role(h: OomHolder) -> str:
    if h.role == "rank":
        return f"rank {h.rank if h.rank is not None else '?'} of boot {h.boot}"
    return "foreign"


def line(e: OomEvent) -> str:
    card = f"gpu {e.gpu if e.gpu is not None else NA} ({e.uuid or 'uuid unknown'})"
    who = f"rank {e.rank if e.rank is not None else NA} pid {e.host_pid or e.pid}"
    phase = e.phase or "no mark"
    if e.capturing:
        phase += ", in CUDA graph capture"
    head = (
        f"{when(e.wall)}  {card}  {who} ({phase}) asked {gib(e.requested)}, "
        f"free {gib(e.free)} of {gib(e.total)}"
    )
    if not e.holders:
        return head + "  holders: unknown (" + "; ".join(e.why or ("not recorded",)) + ")"
    held = "; ".join(f"{h.pid} {h.comm or '?'} {role(h)} {gib(h.bytes)}" for h in e.holders)
    return f"{head}  holders: {held}"


def print_events(events: list[OomEvent], boot: str | None, out: TextIO) -> None:
    if not events:
        out.write(f"no OOM recorded for boot {boot}\n" if boot else "no OOM recorded\n")
        return
    for e in events:
        out.write(line(e) + "\n")
