"""A group instance's latest common round (docs/census.md, "The latest common round"): the
one rule of the daemon's census collector and of ``rankscope census``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rankscope.record import Census
from rankscope.record.compare import Entry, compare_group, instances, split_by_group

History = Mapping[int, Mapping[int, Census]]  # rank -> round -> that rank's snapshot


class SnapshotsByRank:
    """Each rank's snapshots by round, split by group lazily: a rank far behind keeps every
    other rank's history long, and the daemon reads it at every scrape."""

    def __init__(self, history: History) -> None:
        self.by_rank = {rank: snaps for rank, snaps in history.items() if snaps}
        self._split: dict[tuple[int, int], dict[str, dict[str, int]]] = {}

    def groups_at(self, rank: int, round_: int) -> dict[str, dict[str, int]]:
        """``rank``'s counts at ``round_`` as {group: {op: n}}."""
        key = (rank, round_)
        if key not in self._split:
            self._split[key] = split_by_group(self.by_rank[rank][round_].counts or {})
        return self._split[key]


@dataclass(frozen=True)
class GroupRound:
    """One group instance: its members, their common rounds (ascending), each member's
    {op: n} at the latest, and the comparison there (none for a lone member)."""

    group: str
    members: tuple[int, ...]
    rounds: tuple[int, ...]
    ops: dict[int, dict[str, int]]
    entries: list[Entry]

    @property
    def round(self) -> int | None:
        return self.rounds[-1] if self.rounds else None


def group_rounds(snapshots: SnapshotsByRank) -> list[GroupRound]:
    """Every group instance in some rank's latest snapshot (counts only grow), by name."""
    by_rank = snapshots.by_rank
    latest = {rank: snapshots.groups_at(rank, max(snaps)) for rank, snaps in by_rank.items()}
    out: list[GroupRound] = []
    for group, members in instances(latest):
        common = set.intersection(*(set(by_rank[m]) for m in members)) if members else set()
        rounds = tuple(sorted(common))
        ops = {m: snapshots.groups_at(m, rounds[-1]).get(group, {}) for m in members if rounds}
        entries = compare_group(group, ops) if len(ops) > 1 else []
        out.append(GroupRound(group, tuple(members), rounds, ops, entries))
    return out
