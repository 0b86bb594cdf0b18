"""The flight record: its kinds, typed once, shared by the writers in the rank and every
reader (reports, CLI, daemon); import them from here (docs/architecture.md, "The record").

A :class:`Line` is the :class:`Header` and a typed body, one class per kind (mark.py,
census.py, adapter.py, oom.py). Readers narrow with ``isinstance(line.body, Mark)`` or
:func:`of_kind`, never indexing a raw dict by string, and treat a parsed line as read-only.

Adding a kind: a :class:`rankscope.record.codec.Codec` dataclass, ``class X(Codec, kind=...,
stream=..., where=...)``, with its fields each declared once (``codec.nbytes()``,
``codec.section(MarkDevice)``...), added to :data:`Body` and ``__all__``.
A kind this reader does not know (a newer writer of the same schema version) parses into
:class:`UnknownKind`, keeping its header. Changing what a field means, or removing one,
moves SCHEMA_VERSION (the old still read)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Union, get_args

from rankscope.record.adapter import AdapterFailure, AdapterStatus
from rankscope.record.census import (
    BlockedIn,
    Census,
    CensusDump,
    CensusLive,
    Divergence,
    GraphCounts,
    encode_counts,
)
from rankscope.record.codec import Bad, Codec, parse_fields
from rankscope.record.header import (
    ENV_BOOT_ID,
    ENV_DIR,
    ENV_TORCHELASTIC_RUN_ID,
    SCHEMA_VERSION,
    Header,
    ProcessIdentity,
    RankIdentity,
)
from rankscope.record.mark import (
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
    Sample,
)
from rankscope.record.oom import Oom, OomAllocator, OomHolder, OomPool

__all__ = [
    "ENV_BOOT_ID",
    "ENV_DIR",
    "ENV_TORCHELASTIC_RUN_ID",
    "SCHEMA_VERSION",
    "AdapterFailure",
    "AdapterStatus",
    "AnyLine",
    "Bad",
    "BlockedIn",
    "Body",
    "Census",
    "CensusDump",
    "CensusLive",
    "Divergence",
    "GraphCounts",
    "GroupFields",
    "Header",
    "Line",
    "Mark",
    "MarkArena",
    "MarkDerived",
    "MarkDevice",
    "MarkDriver",
    "MarkFields",
    "MarkNvml",
    "MarkTorch",
    "Oom",
    "OomAllocator",
    "OomHolder",
    "OomPool",
    "PoolFields",
    "ProcessIdentity",
    "ProcessStartFields",
    "RankIdentity",
    "Sample",
    "UnknownKind",
    "encode_counts",
    "of_kind",
    "parse_object",
]


@dataclass(slots=True)
class UnknownKind(Codec):
    """A line of a kind this reader does not know; its header still counts."""

    kind: str


# Every kind this version reads: add a new kind's class here, on a line of its own (one line
# per kind, so branches that each add a kind merge cleanly). KINDS follows from it.
Body = Union[  # noqa: UP007 (the trailing comma keeps one kind per line)
    Mark,
    Census,
    CensusDump,
    CensusLive,
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
    it is malformed (a required field missing or wrong). Bad fields go to ``bad``."""
    values = parse_fields(Header, obj, bad)
    if values is None:
        return None
    header = Header(file=file, **values)
    cls = KINDS.get(header.kind)
    body = UnknownKind(header.kind) if cls is None else cls.parse(obj, bad)
    return None if body is None else Line(header, body)
