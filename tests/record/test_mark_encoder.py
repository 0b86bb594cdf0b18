"""The mark's fast encoders (the C one, rankscope._markline, and the Python one,
Mark.json_members, after Recorder's pre-encoded header) against the generic one and the
typed parser: the line a mark writes is the line the dict path writes, byte for byte but for
its two times, and it parses back into the mark it came from."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.c_build import why_no_c_build

from rankscope.rank.writer import Recorder
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
    dumps,
    of_kind,
    parse_object,
    schema,
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

# Values of the wrong type in typed fields (a caller's object, an int subclass, a bool): the
# fast encoder must fall back to exactly what the generic encoder writes.
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
    "typed fields of odd values": card_mark(extra=PoolFields((True, 2), Count(7), None)),
    "extra of sets and tuples": card_mark(extra={"s": {3}, "t": (1, 2), "p": Path("/x")}),
}


@pytest.mark.parametrize("mark", [*VALID.values(), *ODD.values()], ids=[*VALID, *ODD])
def test_the_fast_members_are_the_generic_encoding_byte_for_byte(mark: Mark) -> None:
    assert "{" + mark.json_members() + "}" == dumps(mark.to_json())


# The generic marks' typed extras (rankscope.rank.auto's hooks), as the hooks build them, and with
# values of unexpected types, which must take the generic encoder.
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


@pytest.mark.parametrize("fields", TYPED.values(), ids=list(TYPED))
def test_typed_fields_are_the_generic_encoding_of_their_dict_byte_for_byte(
    fields: MarkFields,
) -> None:
    assert fields.encode() == dumps(fields.to_json())
    mark = card_mark(extra=fields)
    assert "{" + mark.json_members() + "}" == dumps(mark.to_json())


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


def test_the_cached_pool_text_is_the_pools_own() -> None:
    """capture_end's pool id text is cached per pool: another pool, or the same numbers as
    other int types before or after it, gets the text of its own numbers."""
    for fields in [
        PoolFields((True, 2), 5, None),
        PoolFields((1, 2), 5, None),
        PoolFields((1, 2), 7, None),
        PoolFields((2, 1), 7, None),
        PoolFields((Count(1), True), 7, None),
        PoolFields((1, 2), True, None),
        PoolFields((1, 2), 7, "why"),
        PoolFields((True, 2), 5, None),  # after the ints (1, 2), which it equals as a key
        PoolFields([1, 2], 5, None),  # type: ignore[arg-type]  # unhashable: no cache
    ]:
        assert fields.encode() == dumps(fields.to_json()), fields
        assert json.loads(fields.encode())["pool"] == [int(n) for n in fields.pool or ()]


def test_the_cached_device_text_is_the_devices_own() -> None:
    """The device section is cached per card: a card differing in any field, or a device of
    bools where the cache holds ints, gets its own text."""
    for device in [
        MarkDevice(1, "GPU-x", 1, None),
        MarkDevice(1, "GPU-x", 2, None),
        MarkDevice(2, "GPU-x", 1, None),
        MarkDevice(1, "GPU-y", 1, None),
        MarkDevice(True, "GPU-x", True, None),
        MarkDevice(1, "GPU-x", 1, "why"),
        MarkDevice(1, "GPU-x", 1, None),
    ]:
        mark = card_mark(device=device)
        assert "{" + mark.json_members() + "}" == dumps(mark.to_json()), device


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
    mark: Mark, runner: str | None, flight_dir: Path, encoder: str
) -> None:
    rec = Recorder(flight_dir=flight_dir, boot="enc-boot")
    rec.configure(rank=1, tp_rank=0, runner="target")
    assert rec.write_record(mark, runner=runner)
    (path,) = flight_dir.iterdir()
    text = path.read_bytes()
    assert text.endswith(b"\n") and text.count(b"\n") == 1
    written = json.loads(text)

    # The generic path (header dict updated with the payload) gives the same bytes.
    payload = mark.to_json()
    if runner is not None:
        payload["runner"] = runner
    generic = rec.header("mark")
    generic.update(payload)
    # The times are written to the microsecond (fixed point), the generic encoder's floats in
    # their shortest repr: the same numbers, not the same digits.
    assert re.fullmatch(rb'.*,"mono":\d+\.\d{6},"wall":\d+\.\d{6},.*\n', text, re.DOTALL)
    assert abs(written["wall"] - time.time()) < 60 and written["mono"] > 0
    assert TIMES.sub(b"", text) == TIMES.sub(b"", (dumps(generic) + "\n").encode())

    bad: list[str] = []
    line = parse_object(written, bad)
    assert bad == [] and line is not None
    assert line.body == mark
    assert line.header.runner == (runner or "target")
    assert (line.header.rank, line.header.tp_rank, line.header.boot) == (1, 0, "enc-boot")
    (read,) = of_kind(read_flight(flight_dir).records, Mark)
    assert read.body == mark


def test_the_header_prefix_follows_configure(flight_dir: Path) -> None:
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


# --- the C encoder (rankscope._markline) against the Python one --------------------------------

C_BUILT = schema._C_LINE is not None
needs_c = pytest.mark.skipif(not C_BUILT, reason="rankscope._markline is not built here")
PREFIX = '{"v":1,"kind":"mark","boot":"b\\u00e9"'


def python_line(mark: Mark, prefix: str = PREFIX) -> bytes:
    extra = schema._extra_text(mark.extra)
    return (prefix + schema.times_text() + "," + mark._members(extra) + "}\n").encode()


def c_line(mark: Mark, prefix: str = PREFIX) -> bytes | None:
    assert schema._C_LINE is not None
    line: bytes | None = schema._C_LINE(prefix, mark, schema._extra_text(mark.extra))
    return line


@pytest.fixture(params=["c", "python"])
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A test that takes it runs through the C encoder, then through the Python encoder
    alone (as in an install that could not build the C one)."""
    if request.param == "c" and not C_BUILT:
        pytest.skip("rankscope._markline is not built in this install")
    if request.param == "python":
        monkeypatch.setattr(schema, "_C_LINE", None)
    return str(request.param)


def test_the_c_encoder_is_built_where_a_compiler_is() -> None:
    """The install builds the extension optionally: where a C compiler and Python's headers
    are (as in CI), a failed build must not pass unseen behind the Python fallback."""
    why = why_no_c_build()
    if why is not None:
        pytest.skip(f"{why}: this install takes the Python encoder")
    assert C_BUILT, "a C compiler and Python.h are here, but rankscope._markline is not built"


@needs_c
@pytest.mark.parametrize("mark", VALID.values(), ids=list(VALID))
def test_the_c_line_is_the_python_line_byte_for_byte(mark: Mark) -> None:
    """Every usual mark is encoded in C (never declined), to the Python encoder's bytes."""
    line = c_line(mark)
    assert line is not None
    assert TIMES.sub(b"", line) == TIMES.sub(b"", python_line(mark))
    assert re.search(rb'^\{"v":1,.*,"mono":\d+\.\d{6},"wall":\d+\.\d{6},"phase":', line)


# The odd marks the C encoder hands back to the Python one: a typed field of an unexpected
# type. The others' oddity is in the extra, which the Python side encodes for both.
DECLINED_BY_C = {
    "int subclass",
    "bool in an int field",
    "odd device",
    "odd self bytes",
    "float in an int field",
    "str subclass",
    "odd proc keys",
    "odd arena names",
    "arena named None",
    "pid None",
    "procs not a dict",
    "arenas not a dict",
    "int measured",
}


@needs_c
@pytest.mark.parametrize(("name", "mark"), ODD.items(), ids=list(ODD))
def test_the_c_encoder_declines_the_types_it_does_not_know(name: str, mark: Mark) -> None:
    line = c_line(mark)
    if name in DECLINED_BY_C:
        assert line is None
    else:
        assert line is not None and TIMES.sub(b"", line) == TIMES.sub(b"", python_line(mark))
    # either way, the mark's line is the Python encoder's
    assert TIMES.sub(b"", mark.encode_line(PREFIX)) == TIMES.sub(b"", python_line(mark))


@needs_c
def test_the_c_encoder_takes_long_lines_and_long_numbers() -> None:
    """A card of many processes outgrows the encoder's first buffer; numbers past 64 bits
    and negative residues are written as Python writes them."""
    procs: dict[int, int | None] = {pid: pid * MiB for pid in range(1, 3000)}
    procs[7] = None
    mark = card_mark(
        nvml=MarkNvml(10**30, procs, None),
        derived=MarkDerived(-(2**63) - 1, True, -(2**63)),
        arenas={f"arena {i}": MarkArena(i, -i, 2**64, None) for i in range(200)},
    )
    line = c_line(mark)
    assert line is not None and len(line) > 60_000
    assert TIMES.sub(b"", line) == TIMES.sub(b"", python_line(mark))


@needs_c
def test_the_c_encoder_raises_what_an_attribute_read_raises(flight_dir: Path) -> None:
    """A section that is no view fails in C as in Python: the writer drops and counts it."""
    mark = card_mark(driver=object())
    with pytest.raises(AttributeError):
        c_line(mark)
    rec = Recorder(flight_dir=flight_dir, boot="bad")
    assert rec.write_record(mark) is False
    assert rec.lines_dropped == 1 and rec.lines_written == 0


NUMBERS = st.none() | st.integers(-(2**70), 2**70)
TEXTS = st.none() | st.text(max_size=12)


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    phase=st.text(max_size=20),
    numbers=st.lists(NUMBERS, min_size=12, max_size=12),
    texts=st.lists(TEXTS, min_size=5, max_size=5),
    procs=st.none() | st.dictionaries(st.integers(-(2**40), 2**40), NUMBERS, max_size=8),
    arenas=st.dictionaries(st.text(max_size=8), st.tuples(NUMBERS, NUMBERS, NUMBERS, TEXTS)),
    measured=st.booleans(),
)
def test_the_c_line_is_the_python_line_for_any_values(
    phase: str,
    numbers: list[int | None],
    texts: list[str | None],
    procs: dict[int, int | None] | None,
    arenas: dict[str, tuple[Any, Any, Any, Any]],
    measured: bool,
) -> None:
    n = numbers
    mark = Mark(
        phase,
        {},
        MarkDevice(n[0], texts[0], n[1], texts[1]),
        MarkTorch(n[2], n[3], n[4], n[5], n[6], texts[2]),
        MarkDriver(n[7], n[8], texts[3]),
        MarkNvml(n[9], procs, texts[4]),
        {name: MarkArena(*values) for name, values in arenas.items()},
        MarkDerived(n[10], measured, n[11]),
    )
    line = c_line(mark)
    assert line is not None
    assert TIMES.sub(b"", line) == TIMES.sub(b"", python_line(mark))
    assert json.loads(line)["phase"] == phase


class Name(str):
    """A str subclass: its JSON is not for the fast path to decide."""


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    pids=st.dictionaries(st.none() | st.booleans() | st.integers(-9, 9), NUMBERS, max_size=4),
    names=st.lists(st.none() | st.booleans() | st.text(max_size=4).map(Name), max_size=3),
    numbers=st.lists(NUMBERS | st.booleans() | st.floats(), min_size=3, max_size=3),
)
def test_odd_keys_and_values_take_the_python_encoder_or_agree(
    pids: dict[Any, Any], names: list[Any], numbers: list[Any]
) -> None:
    """Keys and values of odd types: the C encoder declines or writes the Python bytes, and
    the line written is JSON either way."""
    mark = card_mark(
        nvml=MarkNvml(numbers[0], pids, None),
        arenas={name: MarkArena(numbers[1], numbers[2], None, None) for name in names},
    )
    line = c_line(mark)
    if line is not None:
        assert TIMES.sub(b"", line) == TIMES.sub(b"", python_line(mark))
    json.loads(mark.encode_line(PREFIX))


def held_objects(mark: Mark) -> list[Any]:
    """Every object the C encoder reads from a mark: the views, their values, the arenas."""
    objects: list[Any] = [mark.phase]
    for view in (mark.device, mark.torch, mark.driver, mark.nvml, mark.derived):
        objects.append(view)
        objects.extend(getattr(view, name) for name in view.__slots__)
    objects.append(mark.arenas)
    for name, arena in mark.arenas.items():
        objects.extend([name, arena, *(getattr(arena, n) for n in arena.__slots__)])
    return objects


@needs_c
@pytest.mark.parametrize("mark", [*VALID.values(), *ODD.values()], ids=[*VALID, *ODD])
def test_the_c_encoder_keeps_every_reference_count(mark: Mark) -> None:
    """No reference taken or lent is kept or dropped, whether the line is made or declined:
    a count that grows is a leak, one that falls a crash to come; nor is a made one kept."""
    # (not the shared singletons, None, the bools and small ints, which other code moves)
    objects = [
        obj
        for obj in held_objects(mark)
        if not (obj is None or type(obj) is bool or (type(obj) is int and -5 <= obj <= 256))
    ]
    before = [sys.getrefcount(obj) for obj in objects]
    extra = schema._extra_text(mark.extra)
    c_line_of = schema._C_LINE
    assert c_line_of is not None
    c_line_of(PREFIX, mark, extra)
    blocks = sys.getallocatedblocks()
    for _ in range(200):
        c_line_of(PREFIX, mark, extra)
    # nor an object it made: a text kept a call would be 200 blocks or more
    assert sys.getallocatedblocks() - blocks < 50
    assert [sys.getrefcount(obj) for obj in objects] == before


@needs_c
def test_the_c_encoder_reads_other_view_classes_as_python_does() -> None:
    """The schema's classes are read through their slots; a view of another class (a
    subclass with its own attribute reads, a duck type) through getattr, as Python reads it."""

    class LoudTorch(MarkTorch):
        __slots__ = ()

        def __getattribute__(self, name: str) -> Any:
            return 42 if name == "reserved" else object.__getattribute__(self, name)

    duck = SimpleNamespace(index=1, uuid="GPU-duck", nvml_index=None, why=None)
    for mark in [
        card_mark(torch=LoudTorch(1, 2, 3, 4, 5, None)),
        card_mark(device=duck),  # type: ignore[arg-type]
    ]:
        line = c_line(mark)
        assert line is not None
        assert TIMES.sub(b"", line) == TIMES.sub(b"", python_line(mark))
    assert b'"reserved":42,' in (c_line(card_mark(torch=LoudTorch(1, 2, 3, 4, 5, None))) or b"")

    class Borrowed:  # another class's slot descriptors, set on a class of no slots
        __slots__ = ()

    for name in ("index", "uuid", "nvml_index", "why"):
        setattr(Borrowed, name, getattr(MarkDevice, name))
    with pytest.raises(TypeError):  # what Python's own read raises, not a foreign slot read
        c_line(card_mark(device=Borrowed()))  # type: ignore[arg-type]


@needs_c
def test_bind_takes_only_classes_of_object_slots_of_their_own() -> None:
    from rankscope import _markline  # type: ignore[attr-defined]

    views = [Mark, MarkDevice, MarkTorch, MarkDriver, MarkNvml, MarkArena, MarkDerived]

    class Sub(MarkTorch):
        __slots__ = ()

    class Loud(MarkTorch):
        def __getattribute__(self, name: str) -> Any:
            return object.__getattribute__(self, name)

    class LoudOwn:  # slots of its own, read its own way
        __slots__ = (
            "allocated",
            "num_alloc_retries",
            "num_ooms",
            "peak_allocated",
            "reserved",
            "why",
        )

        def __getattribute__(self, name: str) -> Any:
            return object.__getattribute__(self, name)

    for odd in (object, Sub, Loud, LoudOwn, "MarkTorch"):
        with pytest.raises(TypeError):
            _markline.bind(*views[:2], odd, *views[3:])
    with pytest.raises(TypeError):
        _markline.bind(*views[:-1])
    # binding the schema's classes again is what the import did
    assert _markline.bind(*views) is schema._C_LINE


@needs_c
def test_the_c_times_are_the_clocks_of_the_python_encoder() -> None:
    for _ in range(200):
        mono_before, wall_before = time.monotonic(), time.time()
        line = c_line(cpu_mark())
        mono_after, wall_after = time.monotonic(), time.time()
        assert line is not None
        times = json.loads(line)
        # written to the microsecond, rounded: half a microsecond either way
        assert mono_before - 5e-7 <= times["mono"] <= mono_after + 5e-7
        assert wall_before - 5e-7 <= times["wall"] <= wall_after + 5e-7


@needs_c
def test_the_c_encoder_keeps_every_reference_count_when_it_fails() -> None:
    mark = card_mark(driver=object(), nvml=MarkNvml(10**30, {4242: 2**70}, None))
    objects = [obj for obj in (mark.phase, mark.device, mark.torch, mark.nvml, mark.nvml.procs)]
    objects += [mark.nvml.self_bytes, mark.driver]
    before = [sys.getrefcount(obj) for obj in objects]
    for _ in range(50):
        with pytest.raises(AttributeError):
            c_line(mark)
    assert [sys.getrefcount(obj) for obj in objects] == before
