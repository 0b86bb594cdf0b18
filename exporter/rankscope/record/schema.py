"""The flight record's kinds, typed once: the writers build lines from these types and
:mod:`rankscope.record.reader` parses every line once into them (docs/architecture.md, "The record").

A line is a :class:`Line`: the common :class:`Header` (version, kind, boot, rank and process
identity, times) and a typed ``body``, one class per kind:

    mark         Mark        (stream marks)  phase, extra and the views device / torch /
                                             driver / nvml / arenas / derived
    census       Census      (stream census) round, every, counts, graphs
    census_dump  CensusDump  (stream census) the same, plus the reason of the dump
    divergence   Divergence  (stream census) the in-process comparison's finding
    adapter      AdapterStatus (stream marks) what a framework adapter attached, or why not
    oom          Oom         (stream oom)    the OOM instant: what torch asked, the allocator,
                                             the card's holders (rankscope.rank.probe.oom)
    sample       Sample      (stream samples) a mark's views with no phase, at a bounded rate

A body knows its own JSON: ``to_json()`` builds the object the writer appends (a plain dict
built field by field, no ``dataclasses.asdict``; the mark formats its text directly, see
``encode_line`` below), and ``parse(obj, bad)`` reads it back. Parsing validates every
value: a byte count is a non-negative integer below :data:`MAX_BYTES` (signed where the
quantity is a residual), a count an integer that is not a bool, a time finite. A bad value
becomes None and its field name (``mark.torch.reserved``) is appended to ``bad``; the line
itself is kept. Only a bad header (no kind, boot, host, pid or finite wall) makes a line
``malformed``.

Readers narrow with ``isinstance(line.body, Mark)`` or :func:`of_kind`, and never index a
raw dict by string. Bodies are plain slotted dataclasses, not frozen ones: a frozen
dataclass costs six times as much to build, and a mark builds six of them. Treat a parsed
line as read-only all the same (the header and the line are frozen).

Adding a kind (one place, this module):

1. write a frozen dataclass with ``KIND`` (its ``kind`` string), ``STREAM`` (the file it goes
   to), its fields, ``to_json(self) -> dict`` and ``parse(cls, obj, bad) -> Self`` (use the
   ``_int`` / ``_bytes`` / ``_str`` / ``_section`` helpers so values are validated alike);
2. add the class to the :data:`Body` union (one line; :data:`KINDS`, the parse table, is
   derived from it).

A kind on a benchmarked hot path (the mark) may also define
``encode_line(self, prefix: str) -> bytes``: its whole line from the header's fixed members,
which the writer encoded once (``prefix``), with no dict in between: byte for byte what the
dict path writes but for the times (tests/record/test_mark_encoder.py holds Mark to that). The
mark's is in C where the install built rankscope._markline, with a Python reference. A generic mark's extra is a
:class:`MarkFields` kind (its fields typed, ``encode()`` the dict's JSON byte for byte).

Writers then call ``RECORDER.write_record(MyKind(...))``; readers get ``Line[MyKind]``
through :func:`of_kind`. A kind this reader does not know (written by a newer writer of the
same schema version) parses into :class:`UnknownKind`, which keeps its header, so the boot
and process it belongs to still count. Changing what an existing field means, or removing
one, needs SCHEMA_VERSION to move, with the old version still read.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, Union, get_args

SCHEMA_VERSION = 1

# The environment a writer reads (docs/probe.md).
ENV_DIR = "RANKSCOPE_DIR"
ENV_BOOT_ID = "RANKSCOPE_BOOT_ID"
ENV_TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"

# No card holds a pebibyte: a byte count at or past 2**50 is a corrupted value, not a reading.
MAX_BYTES = 1 << 50

Json = dict[str, Any]
Bad = list[str]  # names of the fields a parse rejected, e.g. "mark.torch.reserved"
Counts = dict[tuple[str, str], int]  # (group instance, op) -> collectives issued


# --- encoding -------------------------------------------------------------------------------


def json_default(obj: Any) -> Any:
    """What an unencodable value records as: numpy and torch scalars their item, sets and
    tuples a list, anything else its text; never a failed line."""
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:  # a tensor of many elements has no single item
            return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


# One compact encoder built once: json.dumps constructs a new one on every call. CPython's C
# encoder where its signature is the known one; no circular check (a cyclic value ends in
# RecursionError, which the writer counts as a dropped line).
def _c_encoder() -> Any:
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        return make(
            None,
            json_default,
            json.encoder.encode_basestring_ascii,
            None,
            ":",
            ",",
            False,
            False,
            True,
        )
    except TypeError:
        return None


_C_ENCODER = _c_encoder()
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=json_default)
_quote = json.encoder.encode_basestring_ascii
_int_text = int.__repr__
_NUM = frozenset([int, type(None)])
_STR = frozenset([str])


def dumps(obj: Any) -> str:
    """``obj`` as compact JSON text, the one encoding every line uses."""
    if _C_ENCODER is not None:
        return "".join(_C_ENCODER(obj, 0))
    return _ENCODER.encode(obj)


def times_text() -> str:
    """A line's mono and wall members, in seconds to the microsecond: fixed-point formatting
    costs half what the shortest float repr does, and a mark formats two."""
    return f',"mono":{time.monotonic():.6f},"wall":{time.time():.6f}'


# The hot-path encoders below format fields whose type is already known; each falls back to
# dumps() for any other value, so their text is always dumps()'s, byte for byte.


def _num(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is int:
        return _int_text(value)
    return dumps(value)


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is str:
        return _quote(value)
    return dumps(value)


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


def _ints(obj: Mapping[str, Any], key: str, bad: Bad, where: str) -> list[int] | None:
    """A list of plain ints (a group's ranks, a pool id); anything else is null and bad."""
    value = obj.get(key)
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value
    if value is not None:
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


def _device_text(index: int | None, uuid: Any, nvml_index: int | None, why: Any) -> str:
    """A mark's device section as JSON, its numbers known to be exact ints or None."""
    return (
        f'{{"index":{"null" if index is None else index},'
        f'"uuid":{"null" if uuid is None else _text(uuid)},'
        f'"nvml_index":{"null" if nvml_index is None else nvml_index},'
        f'"why":{"null" if why is None else _text(why)}}}'
    )


def _extra_text(extra: Any) -> str:
    """A mark's extra as JSON text: a user's dict, or a generic mark's typed fields."""
    if type(extra) is dict:
        # dumps() inline: a user mark's fields, one call less
        return "{}" if not extra else "".join(_C_ENCODER(extra, 0)) if _C_ENCODER else dumps(extra)
    if isinstance(extra, MarkFields):
        return extra.encode()
    return dumps(extra)


# A card's device section by (index, uuid, nvml_index): a process marks on one or a few.
_DEVICE_TEXT: dict[tuple[int | None, str, int | None], str] = {}


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


class MarkFields:
    """A generic mark's extra as typed fields (rankscope.rank.auto's hooks), each kind defined once
    here. It is written as the JSON object a dict of the same fields makes (``encode()`` is
    ``dumps(self.to_json())`` byte for byte, formatted directly: the C encoder costs about
    3,500 instructions a field), and a reader gets it back from a parsed mark's ``extra``
    with the kind's ``parse(extra, bad)``."""

    __slots__ = ()

    def to_json(self) -> Json:
        raise NotImplementedError

    def encode(self) -> str:
        return dumps(self.to_json())


@dataclass(slots=True)
class ProcessStartFields(MarkFields):
    """process_start's extra: the interpreter's version, or ``forked`` in a forked child."""

    python: str | None = None
    forked: bool = False

    def to_json(self) -> Json:
        return {"forked": True} if self.forked else {"python": self.python}

    def encode(self) -> str:
        python = self.python
        if self.forked is False and type(python) is str:
            return f'{{"python":{_quote(python)}}}'
        return dumps(self.to_json())

    @classmethod
    def parse(cls, extra: Mapping[str, Any], bad: Bad) -> ProcessStartFields:
        return cls(
            python=_str(extra, "python", bad, "mark.extra"), forked=extra.get("forked") is True
        )


@dataclass(slots=True)
class GroupFields(MarkFields):
    """nccl_init_end's extra: the group creation's seconds, the group's instance name (as the
    census names it), its ranks and backend, each null where unreadable; ``member`` is
    written only when set (False: this rank is no member, torch returned a placeholder)."""

    seconds: float | None
    group: str | None
    ranks: list[int] | None
    backend: str | None
    member: bool | None = None

    def to_json(self) -> Json:
        obj: Json = {
            "seconds": self.seconds,
            "group": self.group,
            "ranks": self.ranks,
            "backend": self.backend,
        }
        if self.member is not None:
            obj["member"] = self.member
        return obj

    def encode(self) -> str:
        seconds, ranks = self.seconds, self.ranks
        # a finite float's JSON is its repr (NaN and infinities are not: the generic path)
        if not (type(seconds) is float and seconds - seconds == 0.0 and self.member is None):
            return dumps(self.to_json())
        if ranks is not None:
            if type(ranks) is not list:
                return dumps(self.to_json())
            for rank in ranks:  # a loop: map() costs more for the few ranks of a group
                if type(rank) is not int:
                    return dumps(self.to_json())
        group, backend = self.group, self.backend
        # a list of ints prints as its JSON but for the spaces
        return (
            f'{{"seconds":{seconds!r},"group":{"null" if group is None else _text(group)},'
            f'"ranks":{"null" if ranks is None else str(ranks).replace(" ", "")},'
            f'"backend":{"null" if backend is None else _text(backend)}}}'
        )

    @classmethod
    def parse(cls, extra: Mapping[str, Any], bad: Bad) -> GroupFields:
        w = "mark.extra"
        member = extra.get("member")
        return cls(
            seconds=_time(extra, "seconds", bad, w),
            group=_str(extra, "group", bad, w),
            ranks=_ints(extra, "ranks", bad, w),
            backend=_str(extra, "backend", bad, w),
            member=member if isinstance(member, bool) else None,
        )


# capture_end's text of each pool id (torch's (a, b)): '{"pool":[a,b],"pool_bytes":'
_POOL_PREFIX: dict[Any, str] = {}


@dataclass(slots=True)
class PoolFields(MarkFields):
    """capture_end's extra: the captured graph's memory pool id, the bytes the allocator holds
    in that pool (shared by every graph captured into it), and why they are null or were
    read from the whole allocator's snapshot."""

    pool: tuple[int, ...] | None
    pool_bytes: int | None
    pool_why: str | None

    def to_json(self) -> Json:
        pool = self.pool
        return {
            # numbers as ints (an int subclass's own text, a bool's "true", is no pool id's)
            "pool": None if pool is None else [int(n) for n in pool],
            "pool_bytes": self.pool_bytes,
            "pool_why": self.pool_why,
        }

    def encode(self) -> str:
        pool, held = self.pool, self.pool_bytes
        if type(held) is int and self.pool_why is None:  # a capture's usual fields
            # Graphs share pools (frameworks capture every batch size into one): the pool
            # id's text is made once per pool (formatting a number costs ~1,000 instructions).
            try:
                prefix = _POOL_PREFIX.get(pool)
            except TypeError:  # an unhashable pool: the generic encoding below
                prefix = None
            if prefix is None and type(pool) is tuple and len(pool) == 2:
                first, second = pool
                if type(first) is int and type(second) is int:
                    prefix = f'{{"pool":[{first},{second}],"pool_bytes":'
                    if len(_POOL_PREFIX) < 64:
                        _POOL_PREFIX[pool] = prefix
            if prefix is not None:
                return f'{prefix}{held},"pool_why":null}}'
        return dumps(self.to_json())

    @classmethod
    def parse(cls, extra: Mapping[str, Any], bad: Bad) -> PoolFields:
        w = "mark.extra"
        pool = _ints(extra, "pool", bad, w)
        return cls(
            pool=None if pool is None else tuple(pool),
            pool_bytes=_bytes(extra, "pool_bytes", bad, w),
            pool_why=_str(extra, "pool_why", bad, w),
        )


@dataclass(slots=True)
class Mark:
    """A boot-phase mark (docs/probe.md). A per-mark runner goes in the header
    (``Recorder.write_record(mark, runner=...)``)."""

    KIND: ClassVar[str] = "mark"
    STREAM: ClassVar[str] = "marks"

    phase: str
    # a user's fields, or a generic mark's typed ones (written alike; parsed as a dict)
    extra: dict[str, Any] | MarkFields = field(default_factory=dict)
    device: MarkDevice = field(default_factory=MarkDevice)
    torch: MarkTorch = field(default_factory=MarkTorch)
    driver: MarkDriver = field(default_factory=MarkDriver)
    nvml: MarkNvml = field(default_factory=MarkNvml)
    arenas: dict[str, MarkArena] = field(default_factory=dict)
    derived: MarkDerived = field(default_factory=MarkDerived)

    def to_json(self) -> Json:
        return {
            "phase": self.phase,
            "extra": self.extra.to_json() if isinstance(self.extra, MarkFields) else self.extra,
            "device": self.device.to_json(),
            "torch": self.torch.to_json(),
            "driver": self.driver.to_json(),
            "nvml": self.nvml.to_json(),
            "arenas": {name: arena.to_json() for name, arena in self.arenas.items()},
            "derived": self.derived.to_json(),
        }

    def encode_line(self, prefix: str) -> bytes:
        """The mark's whole line: ``prefix`` (the header's fixed members as the writer caches
        them, rankscope.rank.writer), the times, this mark's members. The C encoder where it was
        built (rankscope._markline), else and for any value it declines the Python one below:
        the same bytes but for the times (tests/record/test_mark_encoder.py)."""
        extra = _extra_text(self.extra)
        if _C_LINE is not None:
            line: bytes | None = _C_LINE(prefix, self, extra)
            if line is not None:
                return line
        return (prefix + times_text() + "," + self._members(extra) + "}\n").encode()

    def json_members(self) -> str:
        """The members of ``to_json()``'s object as JSON text, no braces: byte for byte what
        ``dumps(self.to_json())`` holds between its braces (the Python encoder, the C
        encoder's reference)."""
        return self._members(_extra_text(self.extra))

    def _members(self, extra_text: str) -> str:
        # Formatted from the typed fields in one pass, with no intermediate dicts and no call
        # a section: where the C encoder is not built, this is the mark's hot path.
        device, torch, driver, nvml, derived = (
            self.device,
            self.torch,
            self.driver,
            self.nvml,
            self.derived,
        )
        index, nvml_index = device.index, device.nvml_index
        reserved, allocated, peak = torch.reserved, torch.allocated, torch.peak_allocated
        retries, ooms = torch.num_alloc_retries, torch.num_ooms
        free, total, self_bytes, procs = driver.free, driver.total, nvml.self_bytes, nvml.procs
        non_torch, unbacked = derived.non_torch, derived.unbacked_reservation
        measured, phase = derived.non_torch_measured, self.phase
        # One check for every number: an int subclass's or a bool's text is not its JSON.
        # Any unexpected type takes the generic encoder for the whole mark. (A set display
        # and explicit loops: map() and comprehensions cost twice as much on Python 3.11.)
        types = {
            type(index),
            type(nvml_index),
            type(reserved),
            type(allocated),
            type(peak),
            type(retries),
            type(ooms),
            type(free),
            type(total),
            type(self_bytes),
            type(non_torch),
            type(unbacked),
        }
        if not (types <= _NUM and type(measured) is bool and type(phase) is str):
            return dumps(self.to_json())[1:-1]
        if procs is None:
            listed = "null"
        else:
            parts = []
            for pid, used in procs.items():
                if type(pid) is not int or (used is not None and type(used) is not int):
                    return dumps(self.to_json())[1:-1]
                parts.append(f'"{pid}":{"null" if used is None else used}')
            listed = "{" + ",".join(parts) + "}"
        arenas = self.arenas
        if not arenas:
            arena_text = "{}"
        elif _STR.issuperset(map(type, arenas)):
            arena_text = ",".join(
                [
                    f'{_quote(n)}:{{"reserved":{_num(a.reserved)},"backed":{_num(a.backed)},'
                    f'"retained":{_num(a.retained)},"why":{_text(a.why)}}}'
                    for n, a in arenas.items()
                ]
            )
            arena_text = "{" + arena_text + "}"
        else:
            return dumps(self.to_json())[1:-1]
        uuid, why = device.uuid, device.why
        if type(uuid) is str and why is None:  # a card: the same text at every mark
            key = (index, uuid, nvml_index)
            device_text = _DEVICE_TEXT.get(key)
            if device_text is None:
                device_text = _device_text(index, uuid, nvml_index, why)
                if len(_DEVICE_TEXT) < 64:
                    _DEVICE_TEXT[key] = device_text
        else:
            device_text = _device_text(index, uuid, nvml_index, why)
        t_why, d_why, n_why = torch.why, driver.why, nvml.why
        return (
            f'"phase":{_quote(phase)},"extra":{extra_text},"device":{device_text},'
            f'"torch":{{"reserved":{"null" if reserved is None else reserved},'
            f'"allocated":{"null" if allocated is None else allocated},'
            f'"peak_allocated":{"null" if peak is None else peak},'
            f'"num_alloc_retries":{"null" if retries is None else retries},'
            f'"num_ooms":{"null" if ooms is None else ooms},'
            f'"why":{"null" if t_why is None else _text(t_why)}}},'
            f'"driver":{{"free":{"null" if free is None else free},'
            f'"total":{"null" if total is None else total},'
            f'"why":{"null" if d_why is None else _text(d_why)}}},'
            f'"nvml":{{"self_bytes":{"null" if self_bytes is None else self_bytes},'
            f'"procs":{listed},"why":{"null" if n_why is None else _text(n_why)}}},'
            f'"arenas":{arena_text},'
            f'"derived":{{"non_torch":{"null" if non_torch is None else non_torch},'
            f'"non_torch_measured":{"true" if measured else "false"},'
            f'"unbacked_reservation":{"null" if unbacked is None else unbacked}}}'
        )

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


def _c_line() -> Any:
    """The mark's line in C (rankscope/_markline.c, ``line(prefix, mark, extra)``) where the
    install could build it, bound to the classes above (it reads their slots directly, a
    view of any other class through getattr); else None, and marks take the Python encoder
    (Mark._members), its reference. Not on a free-threaded Python: importing a module that
    does not declare it would turn the host's GIL back on."""
    if not getattr(sys, "_is_gil_enabled", lambda: True)():
        return None
    try:
        encoder = importlib.import_module("rankscope._markline")
        return encoder.bind(
            Mark, MarkDevice, MarkTorch, MarkDriver, MarkNvml, MarkArena, MarkDerived
        )
    except Exception:  # not built, built for another Python, or a stale build
        return None


_C_LINE: Any = _c_line()


@dataclass(slots=True)
class Sample:
    """A serving sample (docs/probe.md, "Serving samples"): what a mark measures, with no
    phase, written at a bounded rate while the process serves, so arena and process bytes
    are a time series."""

    KIND: ClassVar[str] = "sample"
    STREAM: ClassVar[str] = "samples"

    device: MarkDevice = field(default_factory=MarkDevice)
    torch: MarkTorch = field(default_factory=MarkTorch)
    driver: MarkDriver = field(default_factory=MarkDriver)
    nvml: MarkNvml = field(default_factory=MarkNvml)
    arenas: dict[str, MarkArena] = field(default_factory=dict)
    derived: MarkDerived = field(default_factory=MarkDerived)

    @classmethod
    def of(cls, mark: Mark) -> Sample:
        """The views of a measured mark, as a sample."""
        return cls(mark.device, mark.torch, mark.driver, mark.nvml, mark.arenas, mark.derived)

    def to_json(self) -> Json:
        return {
            "device": self.device.to_json(),
            "torch": self.torch.to_json(),
            "driver": self.driver.to_json(),
            "nvml": self.nvml.to_json(),
            "arenas": {name: arena.to_json() for name, arena in self.arenas.items()},
            "derived": self.derived.to_json(),
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> Sample:
        # The views are a mark's, validated the same way (bad fields named mark.*).
        mark = Mark.parse({**obj, "phase": ""}, bad)
        return cls() if mark is None else cls.of(mark)


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


def _counts_json(
    round_: int | None, every: int | None, counts: Counts | None, graphs: dict[str, GraphCounts]
) -> Json:
    return {
        "round": round_,
        "every": every,
        "counts": encode_counts(counts or {}),
        "graphs": {name: g.to_json() for name, g in graphs.items()},
    }


def _parse_counts(
    obj: Mapping[str, Any], bad: Bad, w: str
) -> tuple[int | None, int | None, Counts | None, dict[str, GraphCounts]]:
    """(round, every, counts, graphs) of a census or census_dump line."""
    return (
        _count(obj, "round", bad, w),
        _count(obj, "every", bad, w),
        decode_counts(obj.get("counts"), bad, f"{w}.counts"),
        _parse_graphs(obj, bad, w),
    )


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
        return _counts_json(self.round, self.every, self.counts, self.graphs)

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> Census:
        return cls(*_parse_counts(obj, bad, cls.KIND))


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
        out = _counts_json(self.round, self.every, self.counts, self.graphs)
        out["reason"] = self.reason
        return out

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> CensusDump:
        return cls(_str(obj, "reason", bad, cls.KIND), *_parse_counts(obj, bad, cls.KIND))


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


# --- kind oom --------------------------------------------------------------------------------


@dataclass(slots=True)
class OomAllocator:
    """The caching allocator's own counters at the OOM."""

    reserved: int | None = None
    allocated: int | None = None
    num_ooms: int | None = None
    segments: int | None = None
    why: str | None = None

    def to_json(self) -> Json:
        return {
            "reserved": self.reserved,
            "allocated": self.allocated,
            "num_ooms": self.num_ooms,
            "segments": self.segments,
            "why": self.why,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> OomAllocator:
        w = "oom.allocator"
        return cls(
            reserved=_bytes(obj, "reserved", bad, w),
            allocated=_bytes(obj, "allocated", bad, w),
            num_ooms=_count(obj, "num_ooms", bad, w),
            segments=_count(obj, "segments", bad, w),
            why=_str(obj, "why", bad, w),
        )


@dataclass(slots=True)
class OomPool:
    """One allocator pool's segments at the OOM: ``large``, ``small``, or ``private:A,B``
    (a CUDA graph's or MemPool's private pool)."""

    segments: int | None = None
    reserved: int | None = None
    allocated: int | None = None

    def to_json(self) -> Json:
        return {"segments": self.segments, "reserved": self.reserved, "allocated": self.allocated}

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> OomPool:
        w = "oom.pools"
        return cls(
            segments=_count(obj, "segments", bad, w),
            reserved=_bytes(obj, "reserved", bad, w),
            allocated=_bytes(obj, "allocated", bad, w),
        )


@dataclass(slots=True)
class OomHolder:
    """One process on the card at the OOM: NVML's pid and bytes, with the comm and start
    ticks /proc gave right then (null where this process's /proc cannot see the pid)."""

    pid: int
    bytes: int | None = None
    comm: str | None = None
    start_ticks: int | None = None

    def to_json(self) -> Json:
        return {
            "pid": self.pid,
            "bytes": self.bytes,
            "comm": self.comm,
            "start_ticks": self.start_ticks,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> OomHolder | None:
        w = "oom.holders"
        pid = _int_or_none(obj.get("pid"))
        if pid is None:
            bad.append(f"{w}.pid")
            return None
        return cls(
            pid=pid,
            bytes=_bytes(obj, "bytes", bad, w),
            comm=_str(obj, "comm", bad, w),
            start_ticks=_int(obj, "start_ticks", bad, w),
        )


@dataclass(slots=True)
class Oom:
    """The OOM instant torch's caching allocator reported (docs/probe.md). ``requested``,
    ``torch_free`` and ``torch_limit`` are what torch handed the observer; every other field
    is a read of the probe's, null with a why where it failed."""

    KIND: ClassVar[str] = "oom"
    STREAM: ClassVar[str] = "oom"

    requested: int | None = None  # the segment size the allocator failed to get
    torch_free: int | None = None  # cudaMemGetInfo's free at the instant
    torch_limit: int | None = None  # the card's total, or the allowed maximum
    device: MarkDevice = field(default_factory=MarkDevice)
    allocator: OomAllocator = field(default_factory=OomAllocator)
    pools: dict[str, OomPool] | None = None
    largest_free_block: int | None = None
    pools_why: str | None = None
    driver: MarkDriver = field(default_factory=MarkDriver)
    nvml: MarkNvml = field(default_factory=MarkNvml)
    holders: list[OomHolder] | None = None
    phase: str | None = None  # the last mark's
    phase_wall: float | None = None
    phase_why: str | None = None
    capturing: bool | None = None  # the current stream was capturing a CUDA graph
    why: str | None = None  # the measurement itself failed

    def to_json(self) -> Json:
        return {
            "requested": self.requested,
            "torch_free": self.torch_free,
            "torch_limit": self.torch_limit,
            "device": self.device.to_json(),
            "allocator": self.allocator.to_json(),
            "pools": None
            if self.pools is None
            else {name: p.to_json() for name, p in self.pools.items()},
            "largest_free_block": self.largest_free_block,
            "pools_why": self.pools_why,
            "driver": self.driver.to_json(),
            "nvml": self.nvml.to_json(),
            "holders": None if self.holders is None else [h.to_json() for h in self.holders],
            "phase": self.phase,
            "phase_wall": self.phase_wall,
            "phase_why": self.phase_why,
            "capturing": self.capturing,
            "why": self.why,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> Oom:
        w = cls.KIND
        pools: dict[str, OomPool] | None = None
        raw_pools = obj.get("pools")
        if isinstance(raw_pools, dict):
            pools = {
                str(name): OomPool.parse(raw if isinstance(raw, dict) else {}, bad)
                for name, raw in raw_pools.items()
            }
        elif raw_pools is not None:
            bad.append(f"{w}.pools")
        holders: list[OomHolder] | None = None
        raw_holders = obj.get("holders")
        if isinstance(raw_holders, list):
            parsed = (OomHolder.parse(h, bad) if isinstance(h, dict) else None for h in raw_holders)
            holders = [h for h in parsed if h is not None]
        elif raw_holders is not None:
            bad.append(f"{w}.holders")
        capturing = obj.get("capturing")
        if capturing is not None and not isinstance(capturing, bool):
            bad.append(f"{w}.capturing")
            capturing = None
        return cls(
            requested=_bytes(obj, "requested", bad, w),
            torch_free=_bytes(obj, "torch_free", bad, w),
            torch_limit=_bytes(obj, "torch_limit", bad, w),
            device=MarkDevice.parse(_section(obj, "device", bad, w), bad),
            allocator=OomAllocator.parse(_section(obj, "allocator", bad, w), bad),
            pools=pools,
            largest_free_block=_bytes(obj, "largest_free_block", bad, w),
            pools_why=_str(obj, "pools_why", bad, w),
            driver=MarkDriver.parse(_section(obj, "driver", bad, w), bad),
            nvml=MarkNvml.parse(_section(obj, "nvml", bad, w), bad),
            holders=holders,
            phase=_str(obj, "phase", bad, w),
            phase_wall=_time(obj, "phase_wall", bad, w),
            phase_why=_str(obj, "phase_why", bad, w),
            capturing=capturing,
            why=_str(obj, "why", bad, w),
        )


@dataclass(slots=True)
class AdapterStatus:
    """What a framework adapter (rankscope.rank.adapters) did in this process: ``attached`` with
    the methods it wrapped and the modules still to come, or ``not_attached`` / ``detached``
    with the hook point that could not attach and why. One line a process and adapter."""

    KIND: ClassVar[str] = "adapter"
    STREAM: ClassVar[str] = "marks"

    framework: str
    status: str  # attached | not_attached | detached
    version: str | None = None
    checked_versions: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    failed_hook: str | None = None
    failed_why: str | None = None

    def to_json(self) -> Json:
        failed = (
            {"hook": self.failed_hook, "why": self.failed_why}
            if self.failed_hook is not None
            else None
        )
        return {
            "framework": self.framework,
            "version": self.version,
            "checked_versions": list(self.checked_versions),
            "status": self.status,
            "hooks": list(self.hooks),
            "pending": list(self.pending),
            "failed": failed,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> AdapterStatus | None:
        w = cls.KIND
        framework, status = obj.get("framework"), obj.get("status")
        if not isinstance(framework, str) or not isinstance(status, str):
            return None  # an adapter line of no framework or status says nothing
        failed = _section(obj, "failed", bad, w)
        return cls(
            framework=framework,
            status=status,
            version=_str(obj, "version", bad, w),
            checked_versions=_strings(obj, "checked_versions", bad, w),
            hooks=_strings(obj, "hooks", bad, w),
            pending=_strings(obj, "pending", bad, w),
            failed_hook=_str(failed, "hook", bad, f"{w}.failed"),
            failed_why=_str(failed, "why", bad, f"{w}.failed"),
        )


def _strings(obj: Mapping[str, Any], key: str, bad: Bad, where: str) -> tuple[str, ...]:
    value = obj.get(key)
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    bad.append(f"{where}.{key}")
    return ()


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
    AdapterStatus,
    Oom,
    Sample,
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
