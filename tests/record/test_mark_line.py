"""A mark's line as the writer appends it: one JSON line, the header's members then the
mark's, that parses back into the mark it came from; odd values a caller passes still make a
line (or a counted drop), never an exception."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from rankscope.rank.writer import ENCODER, Recorder
from rankscope.record import (
    GroupFields,
    Mark,
    MarkArena,
    MarkDerived,
    MarkDevice,
    MarkDriver,
    MarkFields,
    MarkNvml,
    MarkTorch,
    PoolFields,
    ProcessStartFields,
    of_kind,
    parse_object,
)
from rankscope.record.reader import read_flight

MiB = 1 << 20
TIMES = re.compile(rb',"mono":[^,]+,"wall":[^,]+')


class Count(int):
    """An int subclass: a writer must not trust its text (its repr is not JSON)."""

    def __repr__(self) -> str:
        return f"Count({int(self)})"

    __str__ = __repr__


def card_mark(**changes: Any) -> Mark:
    mark = Mark(
        "weights_loaded",
        {"shards": 4, "dtype": "bf16", "ratio": 0.25, "tags": ["a", "b"]},
        MarkDevice(0, "GPU-1234-abcd", 3, None),
        MarkTorch(512 * MiB, 300 * MiB, 450 * MiB, 2, 0, None),
        MarkDriver(70_000 * MiB, 80_000 * MiB, None),
        MarkNvml(1012 * MiB, {4242: 4400 * MiB, 77: None, 123: 1012 * MiB}, None),
        {"kv": MarkArena(100, 40, 7, None), 'odd \u00e9"\n': MarkArena(None, None, None, "x")},
        MarkDerived(-500 * MiB, True, 60),
    )
    for name, value in changes.items():
        setattr(mark, name, value)
    return mark


def cpu_mark() -> Mark:
    why = "CUDA not initialised in this process"
    return Mark(
        "pre_weight_load",
        {},
        MarkDevice(why=why),
        MarkTorch(why=why),
        MarkDriver(why=why),
        MarkNvml(why=why),
        {},
        MarkDerived(),
    )


# Marks whose fields the typed parser reads back unchanged.
VALID = {
    "on a card": card_mark(),
    "cpu": cpu_mark(),
    "unicode phase, no procs": card_mark(phase='\u2603 "quoted" \\ tab\t', nvml=MarkNvml()),
    "empty procs": card_mark(nvml=MarkNvml(0, {}, None)),
    # ASCII that JSON escapes, one kind a string: a backslash, DEL, a quote, a control character
    "ascii escapes": card_mark(
        phase="back\\slash",
        torch=MarkTorch(1, 1, 1, 0, 0, "del\x7f"),
        driver=MarkDriver(1, 2, 'say "hi"'),
        nvml=MarkNvml(None, None, "tab\there"),
    ),
    "nested extra": card_mark(extra={"a": {"b": [1, None, True]}, "n": None}),
    # the generic marks' extras (rankscope.rank.auto), as their hooks pass them
    "process_start": card_mark(phase="process_start", extra={"python": "3.12.0"}),
    "forked process_start": card_mark(phase="process_start", extra={"forked": True}),
    "nccl_init_begin": card_mark(extra={"group": "world", "backend": "nccl"}),
    "nccl_init_end": card_mark(
        extra={"seconds": 0.1234567, "group": "world:0", "ranks": [0, 1, 7], "backend": "nccl"}
    ),
    "nccl_init_end, no member": card_mark(
        extra={"seconds": 3e-07, "group": None, "ranks": [], "backend": None, "member": False}
    ),
    "nccl_init_end, unreadable": card_mark(
        extra={"seconds": 12.0, "group": None, "ranks": None, "backend": None}
    ),
    "capture_end": card_mark(extra={"pool": [1, 2], "pool_bytes": 2 << 20, "pool_why": None}),
    "capture_end, unreadable": card_mark(
        extra={"pool": None, "pool_bytes": None, "pool_why": "pool unreadable: E('\u00e9\"')"}
    ),
    "odd extra keys and values": card_mark(
        extra={'k\u00e9 "\n': -(10**30), "f": -0.0, "tiny": 5e-324, "big": 1e300, "b": False}
    ),
}

# Values of the wrong type in typed fields (a caller's object, an int subclass, a bool).
ODD = {
    "int subclass": card_mark(torch=MarkTorch(Count(5), Count(3), None, None, None, None)),
    "bool in an int field": card_mark(driver=MarkDriver(True, 1, None)),
    "odd device": card_mark(device=MarkDevice(False, "u", Count(2), "w")),
    "odd self bytes": card_mark(nvml=MarkNvml(Count(1), {1: 2}, None)),
    "float in an int field": card_mark(derived=MarkDerived(1.5, 1, float("nan"))),
    "str subclass": card_mark(phase=type("Phase", (str,), {})("p")),
    "odd proc keys": card_mark(nvml=MarkNvml(1, {True: 2, "x": Count(3), 9: 1.0}, None)),
    "odd arena names": card_mark(arenas={1: MarkArena(1, 1, 1, None)}),
    "arena named None": card_mark(arenas={None: MarkArena(1, 1, 1, None)}),
    "pid None": card_mark(nvml=MarkNvml(1, {None: 5}, None)),
    "procs not a dict": card_mark(nvml=MarkNvml(1, MappingProxyType({1: 2}), None)),  # type: ignore[arg-type]
    "arenas not a dict": card_mark(arenas=MappingProxyType({"kv": MarkArena(1, 1, 1, None)})),  # type: ignore[arg-type]
    "int measured": card_mark(derived=MarkDerived(5, 1, None)),  # type: ignore[arg-type]
    "phase None": card_mark(phase=None),  # type: ignore[arg-type]
    "extra not a dict": card_mark(extra=None),
    "a view of None": card_mark(driver=None, derived=None),
    "typed fields of odd values": card_mark(extra=PoolFields((True, 2), Count(7), None)),
    "extra of sets and tuples": card_mark(extra={"s": {3}, "t": (1, 2), "p": Path("/x")}),
}


# The generic marks' typed extras (rankscope.rank.auto's hooks), as the hooks build them, and with
# values of unexpected types.
TYPED: dict[str, MarkFields] = {
    "process_start": ProcessStartFields(python="3.12.0"),
    "forked": ProcessStartFields(forked=True),
    "group": GroupFields(0.1234567, "world:0", [0, 1, 7], "nccl"),
    "group, tiny seconds": GroupFields(3e-07, 'pg:\u00e9"', [], "gloo"),
    "group, unreadable": GroupFields(12.0, None, None, None),
    "group, no member": GroupFields(1e-06, None, [1, 3], None, member=False),
    "group, NaN seconds": GroupFields(float("nan"), None, None, None),
    "group, int seconds": GroupFields(2, None, None, None),  # type: ignore[arg-type]
    "group, odd ranks": GroupFields(0.5, None, [True, Count(2)], None),
    "group, ranks a tuple": GroupFields(0.5, None, (0, 1), None),  # type: ignore[arg-type]
    "pool": PoolFields((1, 2), 2 << 20, None),
    "pool, why": PoolFields((1, 2), 0, "no allocator segment in pool (1, 2); \u00e9"),
    "pool, unreadable": PoolFields(None, None, "pool unreadable: E('\u00e9\"')"),
    "pool of three": PoolFields((1, 2, 3), 5, None),
    "pool, odd numbers": PoolFields((True, Count(2)), Count(5), None),
    "python, odd": ProcessStartFields(python=Count(3)),  # type: ignore[arg-type]
}


@pytest.mark.parametrize(
    "mark",
    [*ODD.values(), *(card_mark(extra=fields) for fields in TYPED.values())],
    ids=[*ODD, *TYPED],
)
def test_odd_values_still_make_one_json_line(mark: Mark, flight_dir: Path) -> None:
    """A caller's odd values (an int subclass, a bool, a NaN, a set, a mapping proxy) are
    written as the JSON encoder writes them: one line, the header's members, then the mark's."""
    rec = Recorder(flight_dir=flight_dir, boot="odd")
    assert rec.write_record(mark)
    (path,) = flight_dir.iterdir()
    text = path.read_bytes()
    expected = {**rec.header("mark"), **mark.to_json()}
    assert TIMES.sub(b"", text) == TIMES.sub(b"", (ENCODER.encode(expected) + "\n").encode())
    json.loads(text)


def test_a_pool_id_is_written_as_ints() -> None:
    assert PoolFields((True, 2), 5, None).to_json()["pool"] == [1, 2]


def test_a_section_that_is_no_view_is_a_counted_drop(flight_dir: Path) -> None:
    rec = Recorder(flight_dir=flight_dir, boot="bad")
    assert rec.write_record(card_mark(driver=object())) is False
    assert rec.lines_dropped == 1 and rec.lines_written == 0


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        (ProcessStartFields, TYPED["process_start"]),
        (ProcessStartFields, TYPED["forked"]),
        (GroupFields, TYPED["group"]),
        (GroupFields, TYPED["group, unreadable"]),
        (GroupFields, TYPED["group, no member"]),
        (PoolFields, TYPED["pool"]),
        (PoolFields, TYPED["pool, unreadable"]),
    ],
)
def test_typed_fields_parse_back_from_a_read_marks_extra(
    kind: Any, fields: MarkFields, flight_dir: Path
) -> None:
    """A reader gets the typed fields back from the line as written (parsed once, no raw
    dict indexed by string)."""
    rec = Recorder(flight_dir=flight_dir, boot="typed")
    assert rec.write_record(card_mark(extra=fields))
    (read,) = of_kind(read_flight(flight_dir).records, Mark)
    assert isinstance(read.body.extra, dict)
    bad: list[str] = []
    assert kind.parse(read.body.extra, bad) == fields
    assert bad == []


def test_typed_fields_name_what_they_reject() -> None:
    bad: list[str] = []
    parsed = GroupFields.parse({"seconds": "x", "group": 3, "ranks": [0, "1"]}, bad)
    assert parsed == GroupFields(None, None, None, None)
    assert bad == ["mark.extra.seconds", "mark.extra.group", "mark.extra.ranks"]
    bad = []
    assert PoolFields.parse({"pool": "p", "pool_bytes": -1}, bad) == PoolFields(None, None, None)
    assert bad == ["mark.extra.pool", "mark.extra.pool_bytes"]


@pytest.mark.parametrize("runner", [None, "draft", 'r\u00e9"x'])
@pytest.mark.parametrize("mark", VALID.values(), ids=list(VALID))
def test_a_written_mark_parses_back_into_itself(
    mark: Mark, runner: str | None, flight_dir: Path
) -> None:
    rec = Recorder(flight_dir=flight_dir, boot="enc-boot")
    rec.configure(rank=1, tp_rank=0, runner="target")
    assert rec.write_record(mark, runner=runner)
    (path,) = flight_dir.iterdir()
    text = path.read_bytes()
    assert text.endswith(b"\n") and text.count(b"\n") == 1
    written = json.loads(text)

    # The header dict updated with the payload: a runner given overrides the header's in place.
    payload = mark.to_json()
    if runner is not None:
        payload["runner"] = runner
    expected = rec.header("mark")
    expected.update(payload)
    assert abs(written["wall"] - time.time()) < 60 and written["mono"] > 0
    assert TIMES.sub(b"", text) == TIMES.sub(b"", (ENCODER.encode(expected) + "\n").encode())

    bad: list[str] = []
    line = parse_object(written, bad)
    assert bad == [] and line is not None
    assert line.body == mark
    assert line.header.runner == (runner or "target")
    assert (line.header.rank, line.header.tp_rank, line.header.boot) == (1, 0, "enc-boot")
    (read,) = of_kind(read_flight(flight_dir).records, Mark)
    assert read.body == mark


def test_the_header_follows_configure(flight_dir: Path) -> None:
    rec = Recorder(flight_dir=flight_dir, boot="b1")
    rec.write_record(cpu_mark())
    rec.configure(boot_id="b2", rank=5)
    rec.write_record(cpu_mark())
    heads = [
        (ln.header.boot, ln.header.rank) for ln in read_flight(flight_dir, all_boots=True).records
    ]
    assert heads == [("b1", None), ("b2", 5)]


def test_the_disarmed_check_follows_the_process_recorder(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mark() reads a module-level copy of RECORDER.armed first; every change of the
    recorder's state must reach it."""
    from rankscope.rank import probe
    from rankscope.rank.writer import RECORDER

    monkeypatch.setattr(RECORDER, "flight_dir", RECORDER.flight_dir)
    saved = RECORDER.armed
    try:
        RECORDER.armed = False
        assert probe.ARMED is False and probe.mark("off") is None
        probe.configure(flight_dir=flight_dir)
        assert probe.ARMED is True
        assert probe.mark("on") is not None
        RECORDER.armed = False
        assert probe.mark("off again") is None
        assert probe.mark_fields("off as fields", {"n": 1}) is None
    finally:
        RECORDER.configure()
        RECORDER.armed = saved
        RECORDER._close_locked()
    phases = [ln.body.phase for ln in of_kind(read_flight(flight_dir).records, Mark)]
    assert phases == ["on"]
