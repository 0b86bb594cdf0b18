"""What the reader commands share: DIR, reading the flight, and text (MiB; --json says bytes)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from rankscope.record import ENV_DIR
from rankscope.record.reader import BootNotFoundError, Flight, read_flight
from rankscope.reports.ledger import MiB

NA = "n/a"


def add_flight_dir(parser: argparse.ArgumentParser, name: str, boot: str | None = None) -> None:
    """DIR, or $RANKSCOPE_DIR when it is left out; with ``boot`` (a verb), --boot ID too."""
    parser.add_argument(
        "flight_dir",
        metavar="DIR",
        nargs="?",
        default=os.environ.get(ENV_DIR),
        help=f"the flight directory the probes write (default ${ENV_DIR})",
    )
    if boot is not None:
        parser.add_argument(
            "--boot", metavar="ID", help=f"the boot to {boot} (default: the latest)"
        )
    parser.set_defaults(_command=name, _printable_output=True)


def open_flight(args: argparse.Namespace, **scope: Any) -> Flight | None:
    """The flight in DIR (``scope`` as read_flight takes it), or None once stderr says why not.
    A file that cannot be read is named on stderr and left out."""
    command = f"rankscope {args._command}"
    if not args.flight_dir:
        print(f"{command}: give DIR or set {ENV_DIR}", file=sys.stderr)
        return None
    try:
        flight = read_flight(args.flight_dir, **scope)
    except (OSError, BootNotFoundError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None
    for name, why in sorted(flight.unreadable.items()):
        print(f"{command}: cannot read {name} ({why}); its records are left out", file=sys.stderr)
    return flight


def no_boots_hint(flight_dir: str) -> str:
    """What to try when a directory holds no boots: its flight/ subdirectory, if it has one."""
    nested = Path(flight_dir) / "flight"
    if nested.is_dir():
        return f"no boots recorded in {flight_dir}; it holds {nested}: try that directory\n"
    return f"no boots recorded in {flight_dir} (the directory the probes write, {ENV_DIR})\n"


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=2))


def mib(value: int | None, *, signed: bool = False) -> str:
    if value is None:
        return NA
    return f"{value / MiB:+.1f}" if signed else f"{value / MiB:.1f}"


def when(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(wall))


# C0 and C1 control characters (ESC, CR, BEL, CSI...) in a phase name or boot id would
# drive the terminal; newline and tab are the output's own layout.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with each control character written as its escape (ESC as ``\\x1b``)."""
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class PrintableStream(io.TextIOBase):
    """A text stream that writes through to ``raw`` with control characters escaped."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(printable(text))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """stdout and stderr escaping control characters, for printing what a record holds."""
    out, err = PrintableStream(sys.stdout), PrintableStream(sys.stderr)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield


def table(
    rows: Sequence[Sequence[str]], *, numbers_right: bool = True, indent: str = ""
) -> list[str]:
    """The rows in columns two spaces apart: the first left-aligned, the others right-aligned
    (numbers) unless ``numbers_right`` is false."""
    rows = [[printable(str(c)) for c in row] for row in rows]
    widths = [max(len(c) for c in col) for col in zip(*rows, strict=True)]
    return [
        indent
        + "  ".join(
            c.rjust(w) if i and numbers_right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def skipped_note(skipped: dict[str, int]) -> str | None:
    parts = [f"{n} {reason.replace('_', ' ')}" for reason, n in skipped.items() if n]
    if not parts:
        return None
    note = "skipped lines: " + ", ".join(parts)
    if skipped.get("newer_schema"):
        note += " (written by a newer rankscope: upgrade to read them)"
    return note
