"""The parse's depth limit: a line nested past it is skipped and counted as ``too_deep``
before the JSON parser recurses into it; the lines around it are kept."""

from __future__ import annotations

import json
from pathlib import Path

from tests.daemon.test_daemon_flightstate import mark, rank_recorder

from rankscope.record.codec import MAX_DEPTH, nested_deeper_than
from rankscope.record.reader import parse_line, read_flight


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_the_limit_is_exact_and_strings_do_not_count() -> None:
    assert not nested_deeper_than(nested(MAX_DEPTH))
    assert nested_deeper_than(nested(MAX_DEPTH + 1))
    assert not nested_deeper_than(json.dumps({"a": "[" * 1000, "b": [[1], [2]] * 500}).encode())
    assert not nested_deeper_than(b'{"k": "\\"[[[[", "l": [' + b"[1]," * 1000 + b"[]]}")
    # Openers never closed (a torn line) are levels too.
    assert nested_deeper_than(b"[" * (MAX_DEPTH + 1))
    assert nested_deeper_than(b"{" + nested(MAX_DEPTH) + b"[")
    assert not nested_deeper_than(b"{" + nested(MAX_DEPTH - 2) + b"[")


def test_a_deep_line_is_skipped_and_counted_and_its_neighbours_kept(flight_dir: Path) -> None:
    assert parse_line(nested(400_000)) == "too_deep"
    rec = rank_recorder(flight_dir, "boot-1", 0)
    rec.write_record(mark("before"))
    path = rec.path_for("marks")
    assert path is not None
    with open(path, "ab") as f:
        f.write(b'{"v": 1, "kind": "mark", "extra": ' + nested(200_000) + b"}\n")
    rec.write_record(mark("after"))
    flight = read_flight(flight_dir)
    assert [r.body.phase for r in flight.records] == ["before", "after"]  # type: ignore[union-attr]
    assert flight.skipped["too_deep"] == 1
