"""The flight record's kinds, typed once: the writers build lines from these types and
:mod:`rankscope.flight` parses every line once into them (docs/architecture.md, "The record").

A line is a :class:`Line`: the common :class:`Header` (version, kind, boot, rank and process
identity, times) and a typed ``body``, one class per kind:

    mark         Mark        (stream marks)  phase, extra and the views device / torch /
                                             driver / nvml / arenas / derived
    census       Census      (stream census) round, every, counts, graphs
    census_dump  CensusDump  (stream census) the same, plus the reason of the dump
    divergence   Divergence  (stream census) the in-process comparison's finding

A body knows its own JSON: ``to_json()`` builds the object the writer appends (a plain dict
built field by field: the mark is on a benchmarked hot path, so no ``dataclasses.asdict``),
and ``parse(obj, bad)`` reads it back. Parsing validates every value: a byte count is a
non-negative integer below :data:`MAX_BYTES` (signed where the quantity is a residual), a
count an integer that is not a bool, a time finite. A bad value becomes None and its field
name (``mark.torch.reserved``) is appended to ``bad``; the line itself is kept. Only a bad
header (no kind, boot, host, pid or finite wall) makes a line ``malformed``.

Readers narrow with ``isinstance(line.body, Mark)`` or :func:`of_kind`, and never index a
raw dict by string. Bodies are plain slotted dataclasses, not frozen ones: a frozen
dataclass costs six times as much to build, and a mark builds seven of them. Treat a parsed
line as read-only all the same (the header and the line are frozen).

Adding a kind (one place, this module):

1. write a frozen dataclass with ``KIND`` (its ``kind`` string), ``STREAM`` (the file it goes
   to), its fields, ``to_json(self) -> dict`` and ``parse(cls, obj, bad) -> Self`` (use the
   ``_int`` / ``_bytes`` / ``_str`` / ``_section`` helpers so values are validated alike);
2. add the class to the :data:`Body` union (one line; :data:`KINDS`, the parse table, is
   derived from it).

Writers then call ``RECORDER.write_record(MyKind(...))``; readers get ``Line[MyKind]``
through :func:`of_kind`. A kind this reader does not know (written by a newer writer of the
same schema version) parses into :class:`UnknownKind`, which keeps its header, so the boot
and process it belongs to still count. Changing what an existing field means, or removing
one, needs SCHEMA_VERSION to move, with the old version still read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, Union, get_args

SCHEMA_VERSION = 1

# No card holds a pebibyte: a byte count at or past 2**50 is a corrupted value, not a reading.
MAX_BYTES = 1 << 50

Json = dict[str, Any]
Bad = list[str]  # names of the fields a parse rejected, e.g. "mark.torch.reserved"
Counts = dict[tuple[str, str], int]  # (group instance, op) -> collectives issued


# --- validated reads of one JSON object ------------------------------------------------------


def _checked(value: Any, bad: Bad, name: str, *, signed: bool) -> int | None:
    """An integer (not a bool) of magnitude below MAX_BYTES, non-negative unless ``signed``;
    None stays None, anything else is None and named in ``bad``."""
    if value is None:
        return None
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and abs(value) < MAX_BYTES
        and (signed or value >= 0)
    ):
        return value
    bad.append(name)
    return None


def _int(obj: Mapping[str, Any], key: str, bad: Bad, where: str) -> int | None:
    """A signed integer (an index, a rank) or None."""
    return _checked(obj.get(key), bad, f"{where}.{key}", signed=True)


def _count(obj: Mapping[str, Any], key: str, bad: Bad, where: str) -> int | None:
    """A non-negative integer (a number of events) or None."""
    return _checked(obj.get(key), bad, f"{where}.{key}", signed=False)


def _bytes(obj: Mapping[str, Any], key: str, bad: Bad, where: str) -> int | None:
    """A byte count: a non-negative integer below MAX_BYTES, or None."""
    return _count(obj, key, bad, where)


def _signed_bytes(obj: Mapping[str, Any], key: str, bad: Bad, where: str) -> int | None:
    """A signed byte residual (never floored): an integer of magnitude below MAX_BYTES."""
    return _int(obj, key, bad, where)


def _time(obj: Mapping[str, Any], key: str, bad: Bad, where: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    bad.append(f"{where}.{key}")
    return None


def _str(obj: Mapping[str, Any], key: str, bad: Bad, where: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    bad.append(f"{where}.{key}")
    return None


def _section(obj: Mapping[str, Any], key: str, bad: Bad, where: str) -> Mapping[str, Any]:
    """A nested object; an absent one reads as empty (every field null)."""
    value = obj.get(key)
    if isinstance(value, dict):
        return value
    if value is not None:
        bad.append(f"{where}.{key}")
    return {}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- the header ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Header:
    """What every line carries. ``file`` is where the reader found it (not on disk)."""

    v: int
    kind: str
    boot: str
    host: str
    pid: int
    wall: float
    mono: float | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    tp_rank: int | None = None
    pp_rank: int | None = None
    runner: str | None = None
    start_ticks: int | None = None
    nspid: tuple[int, ...] | None = None
    pidns: int | None = None
    file: str = ""

    @property
    def process_key(self) -> tuple[str, int, int | None]:
        """The identity of the writing process: (host, pid, start_ticks), never the rank."""
        return (self.host, self.pid, self.start_ticks)

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad, file: str = "") -> Header | None:
        """The header of a decoded line, or None when a required field is missing or wrong
        (the line is then malformed). Optional fields that are wrong become None."""
        version, kind, boot, host = obj.get("v"), obj.get("kind"), obj.get("boot"), obj.get("host")
        pid, wall = _int_or_none(obj.get("pid")), obj.get("wall")
        version = _int_or_none(version)
        if (
            version is None
            or not isinstance(kind, str)
            or not isinstance(boot, str)
            or not isinstance(host, str)
            or pid is None
            or not isinstance(wall, (int, float))
            or isinstance(wall, bool)
            or not math.isfinite(wall)
        ):
            return None
        nspid_raw = obj.get("nspid")
        nspid: tuple[int, ...] | None = None
        if isinstance(nspid_raw, list) and all(_int_or_none(x) is not None for x in nspid_raw):
            nspid = tuple(nspid_raw)
        elif nspid_raw is not None:
            bad.append("header.nspid")
        return cls(
            v=version,
            kind=kind,
            boot=boot,
            host=host,
            pid=pid,
            wall=float(wall),
            mono=_time(obj, "mono", bad, "header"),
            rank=_int(obj, "rank", bad, "header"),
            local_rank=_int(obj, "local_rank", bad, "header"),
            world_size=_int(obj, "world_size", bad, "header"),
            tp_rank=_int(obj, "tp_rank", bad, "header"),
            pp_rank=_int(obj, "pp_rank", bad, "header"),
            runner=_str(obj, "runner", bad, "header"),
            start_ticks=_int(obj, "start_ticks", bad, "header"),
            nspid=nspid,
            pidns=_int(obj, "pidns", bad, "header"),
            file=file,
        )

    def to_json(self) -> Json:
        """The header as a line carries it (tests and tools that write whole lines)."""
        return {
            "v": self.v,
            "kind": self.kind,
            "boot": self.boot,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "tp_rank": self.tp_rank,
            "pp_rank": self.pp_rank,
            "runner": self.runner,
            "host": self.host,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "nspid": list(self.nspid) if self.nspid is not None else None,
            "pidns": self.pidns,
            "mono": self.mono,
            "wall": self.wall,
        }


# --- kind mark -------------------------------------------------------------------------------


@dataclass(slots=True)
class MarkDevice:
    """The card the process works on: CUDA index, NVML uuid and NVML index."""

    index: int | None = None
    uuid: str | None = None
    nvml_index: int | None = None
    why: str | None = None

    def to_json(self) -> Json:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "nvml_index": self.nvml_index,
            "why": self.why,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> MarkDevice:
        w = "mark.device"
        return cls(
            index=_int(obj, "index", bad, w),
            uuid=_str(obj, "uuid", bad, w),
            nvml_index=_int(obj, "nvml_index", bad, w),
            why=_str(obj, "why", bad, w),
        )


@dataclass(slots=True)
class MarkTorch:
    """The allocator's view: reserved and allocated bytes, peak, retries, OOMs."""

    reserved: int | None = None
    allocated: int | None = None
    peak_allocated: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    why: str | None = None

    def to_json(self) -> Json:
        return {
            "reserved": self.reserved,
            "allocated": self.allocated,
            "peak_allocated": self.peak_allocated,
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
            "why": self.why,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> MarkTorch:
        w = "mark.torch"
        return cls(
            reserved=_bytes(obj, "reserved", bad, w),
            allocated=_bytes(obj, "allocated", bad, w),
            peak_allocated=_bytes(obj, "peak_allocated", bad, w),
            num_alloc_retries=_count(obj, "num_alloc_retries", bad, w),
            num_ooms=_count(obj, "num_ooms", bad, w),
            why=_str(obj, "why", bad, w),
        )


@dataclass(slots=True)
class MarkDriver:
    """The card's free and total bytes (NVML memory info)."""

    free: int | None = None
    total: int | None = None
    why: str | None = None

    @property
    def used(self) -> int | None:
        return self.total - self.free if self.free is not None and self.total is not None else None

    def to_json(self) -> Json:
        return {"free": self.free, "total": self.total, "why": self.why}

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> MarkDriver:
        w = "mark.driver"
        return cls(
            free=_bytes(obj, "free", bad, w),
            total=_bytes(obj, "total", bad, w),
            why=_str(obj, "why", bad, w),
        )


@dataclass(slots=True)
class MarkNvml:
    """This process's NVML bytes and the card's host pid -> bytes map (None: not listed
    per process on this card)."""

    self_bytes: int | None = None
    procs: dict[int, int | None] | None = None
    why: str | None = None

    def to_json(self) -> Json:
        procs = self.procs
        return {
            "self_bytes": self.self_bytes,
            "procs": {str(p): used for p, used in procs.items()} if procs is not None else None,
            "why": self.why,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> MarkNvml:
        w = "mark.nvml"
        raw = obj.get("procs")
        procs: dict[int, int | None] | None = None
        if isinstance(raw, dict):
            procs = {}
            for pid_text, used in raw.items():
                try:
                    pid = int(pid_text)
                except ValueError:
                    bad.append(f"{w}.procs")
                    continue
                procs[pid] = _checked(used, bad, f"{w}.procs", signed=False)
        elif raw is not None:
            bad.append(f"{w}.procs")
        return cls(
            self_bytes=_bytes(obj, "self_bytes", bad, w), procs=procs, why=_str(obj, "why", bad, w)
        )


@dataclass(slots=True)
class MarkArena:
    """One registered arena's bytes: reserved address space, backed, retained."""

    reserved: int | None = None
    backed: int | None = None
    retained: int | None = None
    why: str | None = None

    def to_json(self) -> Json:
        return {
            "reserved": self.reserved,
            "backed": self.backed,
            "retained": self.retained,
            "why": self.why,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> MarkArena:
        w = "mark.arenas"
        return cls(
            reserved=_bytes(obj, "reserved", bad, w),
            backed=_bytes(obj, "backed", bad, w),
            retained=_bytes(obj, "retained", bad, w),
            why=_str(obj, "why", bad, w),
        )


@dataclass(slots=True)
class MarkDerived:
    """Signed residues, null where a side is unmeasured."""

    non_torch: int | None = None
    non_torch_measured: bool = False
    unbacked_reservation: int | None = None

    def to_json(self) -> Json:
        return {
            "non_torch": self.non_torch,
            "non_torch_measured": self.non_torch_measured,
            "unbacked_reservation": self.unbacked_reservation,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> MarkDerived:
        w = "mark.derived"
        non_torch = _signed_bytes(obj, "non_torch", bad, w)
        return cls(
            non_torch=non_torch,
            non_torch_measured=obj.get("non_torch_measured") is True and non_torch is not None,
            unbacked_reservation=_signed_bytes(obj, "unbacked_reservation", bad, w),
        )


@dataclass(slots=True)
class Mark:
    """A boot-phase mark (docs/probe.md). A per-mark runner goes in the header
    (``Recorder.write_record(mark, runner=...)``)."""

    KIND: ClassVar[str] = "mark"
    STREAM: ClassVar[str] = "marks"

    phase: str
    extra: dict[str, Any] = field(default_factory=dict)
    device: MarkDevice = field(default_factory=MarkDevice)
    torch: MarkTorch = field(default_factory=MarkTorch)
    driver: MarkDriver = field(default_factory=MarkDriver)
    nvml: MarkNvml = field(default_factory=MarkNvml)
    arenas: dict[str, MarkArena] = field(default_factory=dict)
    derived: MarkDerived = field(default_factory=MarkDerived)

    def to_json(self) -> Json:
        return {
            "phase": self.phase,
            "extra": self.extra,
            "device": self.device.to_json(),
            "torch": self.torch.to_json(),
            "driver": self.driver.to_json(),
            "nvml": self.nvml.to_json(),
            "arenas": {name: arena.to_json() for name, arena in self.arenas.items()},
            "derived": self.derived.to_json(),
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> Mark | None:
        phase = obj.get("phase")
        if not isinstance(phase, str):
            return None  # a mark of no phase is no mark: the line is malformed
        w = "mark"
        extra = obj.get("extra")
        arenas_raw = _section(obj, "arenas", bad, w)
        arenas: dict[str, MarkArena] = {}
        for name, raw in arenas_raw.items():
            if isinstance(raw, dict):
                arenas[name] = MarkArena.parse(raw, bad)
            else:
                bad.append(f"{w}.arenas")
        return cls(
            phase=phase,
            extra=extra if isinstance(extra, dict) else {},
            device=MarkDevice.parse(_section(obj, "device", bad, w), bad),
            torch=MarkTorch.parse(_section(obj, "torch", bad, w), bad),
            driver=MarkDriver.parse(_section(obj, "driver", bad, w), bad),
            nvml=MarkNvml.parse(_section(obj, "nvml", bad, w), bad),
            arenas=arenas,
            derived=MarkDerived.parse(_section(obj, "derived", bad, w), bad),
        )


# --- kinds census and census_dump ------------------------------------------------------------


def encode_counts(counts: Mapping[tuple[str, str], int]) -> list[list[Any]]:
    """Counts as the record stores them: sorted [group, op, n] rows. Keys that are not two
    strings (a caller's mistake) are left out here, off the hot path."""
    rows = [
        [g, op, n]
        for (g, op), n in counts.items()
        if isinstance(g, str) and isinstance(op, str) and isinstance(n, int)
    ]
    rows.sort(key=lambda row: (row[0], row[1]))
    return rows


def decode_counts(rows: Any, bad: Bad, where: str) -> Counts | None:
    """[group, op, n] rows -> counts; None (and counted) when any row is not one."""
    if rows is None:
        return None
    out: Counts = {}
    if isinstance(rows, list):
        for row in rows:
            if (
                not isinstance(row, list)
                or len(row) != 3
                or not isinstance(row[0], str)
                or not isinstance(row[1], str)
                or _int_or_none(row[2]) is None
                or row[2] < 0
            ):
                break
            out[row[0], row[1]] = row[2]
        else:
            return out
    bad.append(where)
    return None


@dataclass(slots=True)
class GraphCounts:
    """A captured CUDA graph: what one replay issues, and how many replays there were."""

    counts: Counts
    replays: int | None

    def to_json(self) -> Json:
        return {"counts": encode_counts(self.counts), "replays": self.replays}


def _parse_graphs(obj: Mapping[str, Any], bad: Bad, where: str) -> dict[str, GraphCounts]:
    out: dict[str, GraphCounts] = {}
    for name, raw in _section(obj, "graphs", bad, where).items():
        if not isinstance(raw, dict):
            bad.append(f"{where}.graphs")
            continue
        counts = decode_counts(raw.get("counts"), bad, f"{where}.graphs.counts")
        out[name] = GraphCounts(counts or {}, _count(raw, "replays", bad, f"{where}.graphs"))
    return out


@dataclass(slots=True)
class Census:
    """A snapshot of a rank's counts at a replicated round (docs/census.md)."""

    KIND: ClassVar[str] = "census"
    STREAM: ClassVar[str] = "census"

    round: int | None
    every: int | None
    counts: Counts | None  # None: the line's counts were unreadable
    graphs: dict[str, GraphCounts] = field(default_factory=dict)

    def to_json(self) -> Json:
        return {
            "round": self.round,
            "every": self.every,
            "counts": encode_counts(self.counts or {}),
            "graphs": {name: g.to_json() for name, g in self.graphs.items()},
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> Census:
        w = cls.KIND
        return cls(
            round=_count(obj, "round", bad, w),
            every=_count(obj, "every", bad, w),
            counts=decode_counts(obj.get("counts"), bad, f"{w}.counts"),
            graphs=_parse_graphs(obj, bad, w),
        )


@dataclass(slots=True)
class CensusDump:
    """A rank's local counts at abort or exit (no collective, not at a common round)."""

    KIND: ClassVar[str] = "census_dump"
    STREAM: ClassVar[str] = "census"

    reason: str | None
    round: int | None
    every: int | None
    counts: Counts | None
    graphs: dict[str, GraphCounts] = field(default_factory=dict)

    def to_json(self) -> Json:
        return {
            "round": self.round,
            "every": self.every,
            "counts": encode_counts(self.counts or {}),
            "graphs": {name: g.to_json() for name, g in self.graphs.items()},
            "reason": self.reason,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> CensusDump:
        w = cls.KIND
        return cls(
            reason=_str(obj, "reason", bad, w),
            round=_count(obj, "round", bad, w),
            every=_count(obj, "every", bad, w),
            counts=decode_counts(obj.get("counts"), bad, f"{w}.counts"),
            graphs=_parse_graphs(obj, bad, w),
        )


@dataclass(slots=True)
class Divergence:
    """The in-process comparison's finding for one (group, op) at one round; ``lagging``
    empty says the counts agree again."""

    KIND: ClassVar[str] = "divergence"
    STREAM: ClassVar[str] = "census"

    round: int | None
    group: str
    op: str
    counts: dict[int, int]  # rank -> count
    lagging: tuple[int, ...]

    def to_json(self) -> Json:
        return {
            "round": self.round,
            "group": self.group,
            "op": self.op,
            "counts": {str(r): n for r, n in self.counts.items()},
            "lagging": list(self.lagging),
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> Divergence | None:
        w = cls.KIND
        group, op = obj.get("group"), obj.get("op")
        if not isinstance(group, str) or not isinstance(op, str):
            return None  # a divergence of no (group, op) says nothing
        counts: dict[int, int] = {}
        for rank_text, n in _section(obj, "counts", bad, w).items():
            try:
                rank = int(rank_text)
            except ValueError:
                bad.append(f"{w}.counts")
                continue
            value = _checked(n, bad, f"{w}.counts", signed=False)
            if value is not None:
                counts[rank] = value
        lagging_raw = obj.get("lagging")
        lagging: tuple[int, ...] = ()
        if isinstance(lagging_raw, list) and all(_int_or_none(r) is not None for r in lagging_raw):
            lagging = tuple(lagging_raw)
        elif lagging_raw is not None:
            bad.append(f"{w}.lagging")
        return cls(
            round=_count(obj, "round", bad, w), group=group, op=op, counts=counts, lagging=lagging
        )


@dataclass(slots=True)
class UnknownKind:
    """A line of a kind this reader does not know; its header still counts."""

    KIND: ClassVar[str] = ""
    STREAM: ClassVar[str] = ""

    kind: str

    def to_json(self) -> Json:
        return {}


# --- the tagged union ------------------------------------------------------------------------

# Every kind this version reads: add a new kind's class here, on a line of its own (one line
# per kind, so branches that each add a kind merge cleanly). KINDS follows from it.
Body = Union[  # noqa: UP007 (the trailing comma keeps one kind per line)
    Mark,
    Census,
    CensusDump,
    Divergence,
    UnknownKind,
]

KINDS: dict[str, Any] = {k.KIND: k for k in get_args(Body) if k is not UnknownKind}

B = TypeVar("B", bound=Body, covariant=True)


@dataclass(frozen=True, slots=True)
class Line(Generic[B]):
    """One parsed line: the header and the typed body of its kind."""

    header: Header
    body: B


AnyLine = Line[Body]

K = TypeVar("K", bound=Body)


def of_kind(lines: Iterable[AnyLine], kind: type[K]) -> list[Line[K]]:
    """The lines whose body is a ``kind``, typed as such."""
    return [line for line in lines if isinstance(line.body, kind)]  # type: ignore[misc]


def parse_object(obj: Mapping[str, Any], bad: Bad, file: str = "") -> AnyLine | None:
    """A decoded JSON object of this schema version or older -> its typed line; None when
    it is malformed (bad header, or a body that cannot stand). Bad fields go to ``bad``."""
    header = Header.parse(obj, bad, file)
    if header is None:
        return None
    cls = KINDS.get(header.kind)
    if cls is None:
        return Line(header, UnknownKind(header.kind))
    body = cls.parse(obj, bad)
    if body is None:
        return None
    return Line(header, body)
