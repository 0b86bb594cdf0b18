"""Kinds ``census``, ``census_dump``, ``census_live`` and ``divergence`` (docs/census.md): a
rank's collective counts, stored as sorted ``[group, op, n]`` rows, or for ``census_live``
only the counts that changed, as ``{group: {op: n}}``."""

# ruff: noqa: RUF009 (the codec's field builders return dataclasses.field()s)

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from typing import Any

from rankscope.record import codec
from rankscope.record.codec import Bad, Codec, Json

Counts = dict[tuple[str, str], int]  # (group instance, op) -> collectives issued


def encode_counts(counts: Mapping[tuple[str, str], int] | None) -> list[list[Any]]:
    """Counts as the record stores them: sorted [group, op, n] rows. Keys that are not two
    strings (a caller's mistake) are left out here, off the hot path."""
    return sorted(  # by (group, op): each pair is one key, so n is never compared
        [g, op, n]
        for (g, op), n in (counts or {}).items()
        if isinstance(g, str) and isinstance(op, str) and isinstance(n, int)
    )


def _is_row(row: Any) -> bool:
    # JSON's types exactly: a bool is no count
    return isinstance(row, list) and list(map(type, row)) == [str, str, int] and row[2] >= 0


def decode_counts(rows: Any, bad: Bad, name: str) -> Counts | None:
    """[group, op, n] rows -> counts; None (and named in ``bad``) when any row is not one."""
    if isinstance(rows, list) and all(map(_is_row, rows)):
        return {(group, op): n for group, op, n in rows}
    return codec.reject(rows, bad, name)


@dataclass(slots=True)
class GraphCounts(Codec, where="census.graphs"):
    """A captured CUDA graph: what one replay issues, and how many replays there were."""

    counts: Counts = codec.custom(
        lambda v, bad, name: decode_counts(v, bad, name) or {}, encode_counts, default=MISSING
    )
    replays: int | None = codec.count(default=MISSING)


@dataclass(slots=True)
class _Snapshot(Codec):
    """A rank's counts (None: unreadable on the line) and its graphs', at a census round."""

    round: int | None = codec.count(default=MISSING)
    every: int | None = codec.count(default=MISSING)
    counts: Counts | None = codec.custom(decode_counts, encode_counts, default=MISSING)
    graphs: dict[str, GraphCounts] = codec.sections(GraphCounts)


@dataclass(slots=True)
class Census(_Snapshot, kind="census", stream="census", where="census"):
    """A snapshot of a rank's counts at a replicated round (docs/census.md)."""


@dataclass(slots=True, kw_only=True)
class CensusDump(_Snapshot, kind="census_dump", stream="census", where="census_dump"):
    """A rank's local counts at abort or exit (no collective, not at a common round)."""

    reason: str | None = codec.text(default=MISSING)


def split_by_group(counts: Mapping[tuple[str, str], int] | None) -> dict[str, dict[str, int]]:
    """Counts as ``{group: {op: n}}``, sorted: a live line's shape, and the comparison's."""
    out: dict[str, dict[str, int]] = {}
    for (group, op), n in sorted((counts or {}).items()):
        out.setdefault(group, {})[op] = n
    return out


def decode_changed(value: Any, bad: Bad, name: str) -> Counts:
    """``{group: {op: n}}`` -> counts; an entry that is not a count is named in ``bad``."""
    out: Counts = {}
    for group, ops in codec.as_object(value, bad, name).items():
        for op, n in codec.as_object(ops, bad, name).items():
            count = codec.as_count(n, bad, name)
            if count is not None:
                out[group, op] = count
    return out


@dataclass(slots=True)
class BlockedIn(Codec, where="census_live.blocked_in"):
    """The collective a stalled rank counted last, so the one it is in: group instance, op,
    its sequence number (the count of that op on that group) and when progress stopped."""

    group: str | None = codec.text()
    op: str | None = codec.text()
    seq: int | None = codec.count()
    since: float | None = codec.time()


@dataclass(slots=True)
class CensusLive(Codec, kind="census_live", stream="census", where="census_live"):
    """The census watcher's line, on time rather than at a round: the counts that changed since
    this process's previous ``census`` or ``census_live`` line (its first carries them all),
    and, on a stall, the collective the rank is blocked in. Each key's highest count over a
    process's lines is its latest (counts only grow)."""

    changed: Counts = codec.custom(decode_changed, split_by_group, factory=dict)
    blocked_in: BlockedIn | None = codec.section(BlockedIn, optional=True)

    def to_json(self) -> Json:
        out = codec.encode_fields(self, CensusLive)
        if out["blocked_in"] is None:
            del out["blocked_in"]  # most lines: absent reads as null, and the line stays short
        return out


def _count_by_rank(value: Any, bad: Bad, name: str) -> dict[int, int]:
    counts = codec.as_count_by_int(codec.as_object(value, bad, name), bad, name)
    return {rank: n for rank, n in (counts or {}).items() if n is not None}


@dataclass(slots=True)
class Divergence(Codec, kind="divergence", stream="census", where="divergence"):
    """The in-process comparison's finding for one (group, op) at one round: each rank's
    count; ``lagging`` empty says they agree again. No (group, op): malformed."""

    round: int | None = codec.count(default=MISSING)
    group: str = codec.text(required=True)
    op: str = codec.text(required=True)
    counts: dict[int, int] = codec.custom(_count_by_rank, codec.str_keys, default=MISSING)
    lagging: tuple[int, ...] = codec.custom(
        lambda v, bad, name: codec.as_int_tuple(v, bad, name) or (), codec.as_list, default=MISSING
    )
