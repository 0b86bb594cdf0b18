"""`rankscope prune DIR (--keep-boots N | --older-than DURATION) [--dry-run]`: removes the
flight files of old boots. The record belongs to the user, so nothing goes unless a flag
says so. A file goes only when every boot it holds goes. A file stays when its writer still
runs on this host, or when it holds no record this rankscope can read."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rankscope.cli import common
from rankscope.daemon.flags import argtype, parse_duration, positive_int
from rankscope.procfs import local_alive
from rankscope.record.reader import BootSummary, Flight


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    common.add_flight_dir(parser, name)
    parser.add_argument(
        "--keep-boots", type=argtype(positive_int), metavar="N", help="keep the N newest boots"
    )
    parser.add_argument(
        "--older-than",
        type=argtype(parse_duration),
        metavar="DURATION",
        help="remove boots whose last record is older than this (7d, 12h, 1w); with "
        "--keep-boots, a boot goes only when it is past both",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")


@dataclass(frozen=True)
class FlightFile:
    name: str
    boots: frozenset[str]
    writer: int | None  # the pid of its writer while that still runs on this host


def main(args: argparse.Namespace) -> int:
    if args.keep_boots is None and args.older_than is None:
        print(
            "rankscope prune: give --keep-boots N, --older-than DURATION or both", file=sys.stderr
        )
        return 2
    flight = common.open_flight(args, all_boots=True)
    if flight is None:
        return 2
    old = old_boots(flight.boots, args.keep_boots, args.older_than, time.time())
    doomed = [f for f in flight_files(flight) if f.boots <= old]
    verb = "would remove" if args.dry_run else "removed"
    removed = failed = size = 0
    for f in doomed:
        if f.writer is not None:
            print(f"kept {f.name}: its writer (pid {f.writer}) still runs")
            continue
        path = Path(args.flight_dir) / f.name
        try:
            nbytes = path.lstat().st_size
            if not args.dry_run:
                path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            print(f"rankscope prune: cannot remove {path}: {exc.strerror}", file=sys.stderr)
            failed += 1
            continue
        removed, size = removed + 1, size + nbytes
        print(f"{verb} {f.name} (boot {', '.join(sorted(f.boots))}, {common.mib(nbytes)} MiB)")
    kept = len(flight.boots) - len(old)
    print(f"{verb} {removed} files ({common.mib(size)} MiB) of {len(old)} boots; {kept} boots kept")
    return 1 if failed else 0


def old_boots(
    boots: list[BootSummary], keep: int | None, older_than: float | None, now: float
) -> set[str]:
    """The boots past every limit given (of ``boots``, oldest first): outside the ``keep``
    newest, and last written over ``older_than`` seconds ago."""
    limits = []
    if keep is not None:
        limits.append({b.boot for b in boots[: max(len(boots) - keep, 0)]})
    if older_than is not None:
        limits.append({b.boot for b in boots if b.last_wall < now - older_than})
    return set.intersection(*limits) if limits else set()


def flight_files(flight: Flight) -> list[FlightFile]:
    """Each file that holds records, with the boots they name and its writer if it runs."""
    boots: dict[str, set[str]] = {}
    writers: dict[str, int | None] = {}
    for rec in flight.records:
        h = rec.header
        boots.setdefault(h.file, set()).add(h.boot)
        if h.file not in writers:
            running = local_alive(h.host, h.pid, h.start_ticks, h.pidns)
            writers[h.file] = h.pid if running else None
    return [FlightFile(name, frozenset(b), writers[name]) for name, b in sorted(boots.items())]
