"""The census report (``rankscope census --json``, /api/v1/census): each group instance
compared at its latest common round, earlier divergences in ``history``, local dumps apart."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rankscope.record import AnyLine, Census, CensusDump, Divergence, Line
from rankscope.record.compare import Entry, compare_group, compare_split, split_by_group
from rankscope.record.naming import parse_p2p, report_op_name
from rankscope.reports.rounds import GroupRound, SnapshotsByRank, group_rounds

if TYPE_CHECKING:
    from rankscope.record.reader import Flight

CENSUS_KINDS = (Census, CensusDump, Divergence)

Record = AnyLine


@dataclass
class _Rank:
    """What one rank's newest process recorded."""

    rank: int
    process: tuple[Any, ...] | None = None  # host, pid, start ticks
    snapshots: dict[int, Census] = field(default_factory=dict)  # by round
    snapshot_wall: dict[int, float] = field(default_factory=dict)
    every: int | None = None
    dump: dict[str, Any] | None = None
    dump_counts: dict[str, dict[str, int]] = field(default_factory=dict)


def _newest_processes(
    records: Iterable[Record], skipped: collections.Counter[str]
) -> dict[int, list[Record]]:
    """Census records per rank, of its newest process (a restarted rank counts anew)."""
    by_process: dict[tuple[Any, ...], list[Record]] = collections.defaultdict(list)
    for rec in records:
        if not isinstance(rec.body, CENSUS_KINDS):
            continue
        h = rec.header
        if h.rank is None:
            skipped["no_rank"] += 1
            continue
        by_process[(h.rank, h.host, h.pid, h.start_ticks)].append(rec)
    newest: dict[int, tuple[Any, ...]] = {}
    last_wall = {key: max(r.header.wall for r in recs) for key, recs in by_process.items()}
    for key in sorted(by_process, key=last_wall.__getitem__, reverse=True):
        newest.setdefault(key[0], key)  # the first of equal walls, as read
    if superseded := sum(len(recs) for key, recs in by_process.items() if newest[key[0]] != key):
        skipped["superseded_process"] += superseded
    return {rank: by_process[key] for rank, key in newest.items()}


def _load(
    per_rank_records: dict[int, list[Record]], skipped: collections.Counter[str]
) -> tuple[dict[int, _Rank], list[Line[Divergence]]]:
    ranks: dict[int, _Rank] = {}
    divergences: list[Line[Divergence]] = []
    for rank, recs in per_rank_records.items():
        state = ranks[rank] = _Rank(rank)
        for rec in recs:
            h, body = rec.header, rec.body
            state.process = (h.host, h.pid, h.start_ticks)
            if isinstance(body, Divergence):
                divergences.append(Line(h, body))
            elif not isinstance(body, (Census, CensusDump)):
                continue
            elif body.counts is None or body.round is None:
                skipped["bad_census_line"] += 1
            elif isinstance(body, Census):
                state.snapshots[body.round] = body
                state.snapshot_wall[body.round] = h.wall
                state.every = body.every if body.every is not None else state.every
            elif state.dump is None or h.wall >= state.dump["wall"]:
                state.dump = {"reason": str(body.reason), "round": body.round, "wall": h.wall}
                state.dump_counts = split_by_group(body.counts)
    return ranks, divergences


def _spans(
    rounds: Iterable[int], entries_at: dict[int, dict[str, Entry]], latest: int
) -> list[Entry]:
    """Runs of consecutive common rounds where an op diverged with the same lagging ranks."""
    spans: list[Entry] = []
    open_spans: dict[str, Entry] = {}
    for round_ in rounds:
        current = entries_at[round_]
        for op in list(open_spans):
            entry = current.get(op)
            span = open_spans[op]
            if entry is None or not entry["divergent"] or entry["lagging"] != span["lagging"]:
                spans.append(open_spans.pop(op))
            else:
                span["rounds"][1] = round_
        for op, entry in current.items():
            if entry["divergent"] and op not in open_spans:
                open_spans[op] = dict(entry, round=round_, rounds=[round_, round_])
    spans.extend(open_spans.values())
    for span in spans:
        span["resolved"] = span["rounds"][1] != latest
    return spans


def build_report(
    records: Iterable[Record], *, boot: str | None = None, skipped: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The census of one boot's records; ``skipped``: the reader's own skip counts."""
    skips: collections.Counter[str] = collections.Counter(skipped or {})
    ranks, divergences = _load(_newest_processes(records, skips), skips)
    groups, entries, history = _snapshot_sections(ranks)
    everies = sorted({s.every for s in ranks.values() if s.every is not None})
    return {
        "boot": boot,
        "ranks": [_rank_summary(ranks[r]) for r in sorted(ranks)],
        "every": everies[0] if len(everies) == 1 else everies or None,
        "groups": groups,
        "entries": entries,
        "divergent": any(e["divergent"] for e in entries),
        "first_divergent_round": min((e["rounds"][0] for e in history), default=None),
        "history": history,
        "dumps": _dump_section(ranks),
        "in_process": _in_process_section(divergences),
        "in_process_lines": len(divergences),
        "skipped": dict(sorted(skips.items())),
    }


def _snapshot_sections(
    ranks: dict[int, _Rank],
) -> tuple[list[dict[str, Any]], list[Entry], list[Entry]]:
    """(groups, entries at each group's latest common round, history of divergences)."""
    snapshots = SnapshotsByRank({r: s.snapshots for r, s in ranks.items()})
    groups: list[dict[str, Any]] = []
    entries: list[Entry] = []
    history: list[Entry] = []
    for found in group_rounds(snapshots):
        compared = found.rounds if len(found.members) > 1 else ()
        groups.append(
            {
                "group": found.group,
                "members": list(found.members),
                "round": found.round,
                "rounds_compared": len(compared),
            }
        )
        if not compared:
            continue
        entries.extend(dict(e, round=found.round) for e in found.entries)
        history.extend(_spans(compared, _entries_by_round(found, snapshots), compared[-1]))
    history.sort(key=lambda e: (e["rounds"][0], e["group"], e["op"]))
    return groups, entries, history


def _entries_by_round(found: GroupRound, snapshots: SnapshotsByRank) -> dict[int, dict[str, Entry]]:
    """Per common round of ``found``, its members' comparison by op."""
    entries_at = {found.rounds[-1]: {e["op"]: e for e in found.entries}}
    for r in found.rounds[:-1]:
        at = [snapshots.groups_at(m, r).get(found.group, {}) for m in found.members]
        if all(ops == at[0] for ops in at[1:]) and all(parse_p2p(op) is None for op in at[0]):
            entries_at[r] = {}  # every member agrees on every op: nothing to list
            continue
        per_rank = dict(zip(found.members, at, strict=True))
        entries_at[r] = {e["op"]: e for e in compare_group(found.group, per_rank)}
    return entries_at


def _dump_section(ranks: dict[int, _Rank]) -> dict[str, Any]:
    dumped = {r: s for r, s in ranks.items() if s.dump is not None}
    return {
        "ranks": [{"rank": r, **(dumped[r].dump or {})} for r in sorted(dumped)],
        "entries": compare_split({r: s.dump_counts for r, s in dumped.items()}),
    }


def _in_process_section(divergences: list[Line[Divergence]]) -> list[dict[str, Any]]:
    """The in-process comparison's latest line per (group, op)."""
    latest: dict[tuple[str, str], Line[Divergence]] = {}
    for line in sorted(divergences, key=lambda d: (d.body.round or 0, d.header.wall)):
        latest[(line.body.group, line.body.op)] = line
    return [
        {
            "round": line.body.round,
            "group": line.body.group,
            "op": line.body.op,
            "counts": {str(r): n for r, n in line.body.counts.items()},
            "lagging": list(line.body.lagging),
            "rank": line.header.rank,
        }
        for line in latest.values()
    ]


def census_document(flight: Flight) -> dict[str, Any]:
    """What `rankscope census --json` prints and /api/v1/census returns, for one read."""
    return build_report(flight.records, boot=flight.boot, skipped=flight.skipped)


def _rank_summary(state: _Rank) -> dict[str, Any]:
    last_round = max(state.snapshots) if state.snapshots else None
    host, pid, start_ticks = state.process or (None, None, None)
    latest = state.snapshots[last_round].counts if last_round is not None else None
    return {
        "rank": state.rank,
        "host": host,
        "pid": pid,
        "start_ticks": start_ticks,
        "snapshots": len(state.snapshots),
        "last_round": last_round,
        "last_snapshot_wall": state.snapshot_wall.get(last_round) if last_round else None,
        "counts": [
            [g, op, n]
            for g, ops in sorted(split_by_group(latest or {}).items())
            for op, n in sorted((report_op_name(state.rank, op), n) for op, n in ops.items())
        ],
        "dump": state.dump,
    }
