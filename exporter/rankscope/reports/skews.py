"""Comparing ranks at their latest counts rather than at a common round. Counts in flux say
nothing, so a group instance is compared only while none of its members moves (each stalled,
exited or dead). A skew is a (group, op) whose counts differ then; replaying the ranks' live
lines in time gives the skews that came and went (docs/census.md, "States and skews")."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from rankscope.record.compare import Entry, compare_split, split_by_group
from rankscope.record.naming import Key


@dataclass(frozen=True)
class RankMoment:
    """One line of a rank: the counts it changed, and whether the rank stands still since."""

    wall: float
    changed: dict[Key, int]
    settled: bool


def latest_entries(
    latest: Mapping[int, Mapping[Key, int]], settled: Collection[int]
) -> list[Entry]:
    """The comparison at the latest counts of each group instance whose members all settled."""
    split = {rank: split_by_group(counts) for rank, counts in latest.items()}
    return compare_split(split, settled)


def skew_spans(moments: Mapping[int, list[RankMoment]]) -> list[dict[str, Any]]:
    """Every skew the ranks' lines show, in time: {group, op, counts, lagging, since, until,
    resolved}; ``until`` is null for a skew that still stands at the last line."""
    events = sorted((m.wall, rank, i, m) for rank, ms in moments.items() for i, m in enumerate(ms))
    counts: dict[int, dict[Key, int]] = {rank: {} for rank in moments}
    settled: set[int] = set()
    open_spans: dict[tuple[str, str], dict[str, Any]] = {}
    spans: list[dict[str, Any]] = []
    for wall, rank, _, moment in events:
        counts[rank].update(moment.changed)
        if moment.settled:
            settled.add(rank)
        else:
            settled.discard(rank)
        entries = latest_entries(counts, settled) if len(settled) > 1 else []
        current = {(e["group"], e["op"]): e for e in entries if e["divergent"]}
        for key in list(open_spans):
            entry = current.get(key)
            if entry is None or entry["lagging"] != open_spans[key]["lagging"]:
                open_spans[key]["until"] = wall
                spans.append(open_spans.pop(key))
        for key, entry in current.items():
            if key not in open_spans:
                open_spans[key] = {**entry, "since": wall, "until": None}
    spans.extend(open_spans.values())
    for span in spans:
        span["resolved"] = span["until"] is not None
    spans.sort(key=lambda s: (s["since"], s["group"], s["op"]))
    return spans
