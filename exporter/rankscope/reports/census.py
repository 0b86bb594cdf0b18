"""The census report (``rankscope census --json``, /api/v1/census): each rank's state, each
group instance compared at its latest common round and at its latest counts, past divergences,
skews and local dumps apart. Counts in flux say nothing, so latest counts are compared only
while no member moves (each stalled, exited or dead); a skew is a (group, op) whose counts
differ then, and replaying the ranks' live lines in time gives the skews that came and went
(docs/census.md, "States and skews")."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rankscope.procfs import Alive, local_alive
from rankscope.record import AnyLine, BlockedIn, Census, CensusDump, CensusLive, Divergence, Line
from rankscope.record.census import split_by_group
from rankscope.record.compare import Entry, compare_group, compare_ranks, compare_split, instances
from rankscope.record.naming import Key, parse_p2p, report_op_name
from rankscope.reports.rounds import GroupRound, SnapshotsByRank, group_rounds

if TYPE_CHECKING:
    from rankscope.record import Header
    from rankscope.record.reader import Flight

RUNNING, STALLED, EXITED, DEAD = "running", "stalled", "exited", "dead"
STATES = (RUNNING, STALLED, EXITED, DEAD)

CENSUS_KINDS = (Census, CensusDump, CensusLive, Divergence)
# A census_dump of these reasons is the rank's exit line: the process ended on its own terms.
EXIT_REASONS = frozenset({"exit", "SIGTERM", "SIGABRT"})


@dataclass(frozen=True)
class RankMoment:
    """One line of a rank: the counts it changed, and whether the rank stands still since."""

    wall: float
    changed: dict[Key, int]
    settled: bool


@dataclass
class _Rank:
    """What one rank's newest process recorded."""

    rank: int
    header: Header  # of its newest line: the process's identity
    snapshots: dict[int, Census] = field(default_factory=dict)  # by round
    snapshot_wall: dict[int, float] = field(default_factory=dict)
    every: int | None = None
    dump: dict[str, Any] | None = None
    dump_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    latest: dict[Key, int] = field(default_factory=dict)  # per key, the highest count read
    live_wall: float | None = None  # the newest census_live line's time
    blocked_in: BlockedIn | None = None  # the newest census_live line's, when it is a stall
    moments: list[RankMoment] = field(default_factory=list)  # the live lines, replayed

    @property
    def exited(self) -> bool:
        return self.dump is not None and self.dump["reason"] in EXIT_REASONS

    def absorb(self, counts: Mapping[Key, int]) -> None:
        """Counts only grow within a process: the latest is each key's highest."""
        for key, n in counts.items():
            self.latest[key] = max(n, self.latest.get(key, n))


def _newest_processes(
    records: Iterable[AnyLine], skipped: collections.Counter[str]
) -> dict[int, list[AnyLine]]:
    """Census records per rank, of its newest process (a restarted rank counts anew)."""
    by_process: dict[tuple[Any, ...], list[AnyLine]] = collections.defaultdict(list)
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
    per_rank_records: dict[int, list[AnyLine]], skipped: collections.Counter[str]
) -> tuple[dict[int, _Rank], list[Line[Divergence]]]:
    ranks: dict[int, _Rank] = {}
    divergences: list[Line[Divergence]] = []
    for rank, recs in per_rank_records.items():
        state = ranks[rank] = _Rank(rank, recs[-1].header)
        for rec in recs:
            h, body = rec.header, rec.body
            if isinstance(body, Divergence):
                divergences.append(Line(h, body))
            elif isinstance(body, CensusLive):
                state.absorb(body.changed)
                state.live_wall, state.blocked_in = h.wall, body.blocked_in
                settled = body.blocked_in is not None
                state.moments.append(RankMoment(h.wall, dict(body.changed), settled))
            elif isinstance(body, (Census, CensusDump)):
                state.absorb(body.counts or {})
                if body.counts is None or body.round is None:
                    skipped["bad_census_line"] += 1
                elif isinstance(body, Census):
                    state.snapshots[body.round] = body
                    state.snapshot_wall[body.round] = h.wall
                    state.every = body.every if body.every is not None else state.every
                elif state.dump is None or h.wall >= state.dump["wall"]:
                    state.dump = {"reason": str(body.reason), "round": body.round, "wall": h.wall}
                    state.dump_counts = split_by_group(body.counts)
                    if state.exited:
                        state.moments.append(RankMoment(h.wall, dict(body.counts), True))
    return ranks, divergences


def _divergent_runs(
    steps: Iterable[tuple[Any, Iterable[Entry]]],
) -> list[tuple[Entry, Any, Any, Any]]:
    """Each run of steps over which a (group, op) diverged with the same lagging ranks: (its
    entry at the first step, the first step, the last, the step that ended it or None)."""
    runs: list[tuple[Entry, Any, Any, Any]] = []
    open_runs: dict[tuple[str, str], list[Any]] = {}
    for at, entries in steps:
        current = {(e["group"], e["op"]): e for e in entries if e["divergent"]}
        for key, run in list(open_runs.items()):
            entry = current.get(key)
            if entry is None or entry["lagging"] != run[0]["lagging"]:
                runs.append((run[0], run[1], run[2], at))
                del open_runs[key]
            else:
                run[2] = at
        for key, entry in current.items():
            open_runs.setdefault(key, [entry, at, at])
    runs.extend((entry, first, last, None) for entry, first, last in open_runs.values())
    return runs


def _skew_spans(moments: Mapping[int, list[RankMoment]]) -> list[dict[str, Any]]:
    """Every skew the ranks' lines show, in time; ``until`` is null for one still standing."""
    counts: dict[int, dict[Key, int]] = {rank: {} for rank in moments}
    settled: set[int] = set()

    def replayed() -> Iterable[tuple[float, list[Entry]]]:
        for wall, rank, _, moment in sorted(
            (m.wall, rank, i, m) for rank, ms in moments.items() for i, m in enumerate(ms)
        ):
            counts[rank].update(moment.changed)
            if moment.settled:
                settled.add(rank)
            else:
                settled.discard(rank)
            yield wall, compare_ranks(counts, settled) if len(settled) > 1 else []

    spans = [
        {**entry, "since": since, "until": until, "resolved": until is not None}
        for entry, since, _, until in _divergent_runs(replayed())
    ]
    return sorted(spans, key=lambda s: (s["since"], s["group"], s["op"]))


@dataclass(frozen=True)
class States:
    """Each rank's summary and state, and the comparison of each settled group instance."""

    ranks: list[dict[str, Any]]
    latest: list[Entry]
    dead_in_group: list[int]


def rank_states(ranks: dict[int, _Rank], alive: Alive) -> States:
    summaries = [_rank_summary(ranks[r], alive) for r in sorted(ranks)]
    states = {r["rank"]: r["state"] for r in summaries}
    settled = {rank for rank, state in states.items() if state != RUNNING}
    latest = compare_ranks({r: s.latest for r, s in ranks.items()}, settled)
    return States(summaries, latest, _dead_in_group(ranks, states))


def states_of(records: Iterable[AnyLine], alive: Alive = local_alive) -> States:
    """:class:`States` alone, for a reader that needs no history (the daemon's scrape)."""
    skips: collections.Counter[str] = collections.Counter()
    ranks, _ = _load(_newest_processes(records, skips), skips)
    return rank_states(ranks, alive)


def build_report(
    records: Iterable[AnyLine],
    *,
    boot: str | None = None,
    skipped: Mapping[str, int] | None = None,
    alive: Alive = local_alive,
) -> dict[str, Any]:
    """The census of one boot's records, with the reader's own ``skipped`` counts."""
    skips: collections.Counter[str] = collections.Counter(skipped or {})
    ranks, divergences = _load(_newest_processes(records, skips), skips)
    groups, entries, history = _snapshot_sections(ranks)
    everies = sorted({s.every for s in ranks.values() if s.every is not None})
    states = rank_states(ranks, alive)
    dumped = {r: s for r, s in ranks.items() if s.dump is not None}
    # The in-process comparison's latest line per (group, op).
    in_order = sorted(divergences, key=lambda d: (d.body.round or 0, d.header.wall))
    in_process = {(d.body.group, d.body.op): d for d in in_order}
    return {
        "boot": boot,
        "ranks": states.ranks,
        "states": {s: [r["rank"] for r in states.ranks if r["state"] == s] for s in STATES},
        "every": everies[0] if len(everies) == 1 else everies or None,
        "groups": groups,
        "entries": entries,
        "latest": states.latest,
        "divergent": any(e["divergent"] for e in (*entries, *states.latest))
        or bool(states.dead_in_group),
        "dead_in_group": states.dead_in_group,
        "first_divergent_round": min((e["rounds"][0] for e in history), default=None),
        "history": history,
        "skews": _skew_spans({r: s.moments for r, s in ranks.items()}),
        "dumps": {
            "ranks": [{"rank": r, **(dumped[r].dump or {})} for r in sorted(dumped)],
            "entries": compare_split({r: s.dump_counts for r, s in dumped.items()}),
        },
        "in_process": [{**d.body.to_json(), "rank": d.header.rank} for d in in_process.values()],
        "in_process_lines": len(divergences),
        "skipped": dict(sorted(skips.items())),
    }


def _dead_in_group(ranks: dict[int, _Rank], states: dict[int, str]) -> list[int]:
    """The dead ranks that share a group instance with another rank of the record."""
    split = {r: split_by_group(s.latest) for r, s in ranks.items()}
    shared = {group for group, members in instances(split) if len(members) > 1}
    return sorted(r for r, state in states.items() if state == DEAD and shared & split[r].keys())


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
        runs = _divergent_runs(_entries_by_round(found, snapshots))
        history.extend(
            dict(entry, round=first, rounds=[first, last], resolved=last != compared[-1])
            for entry, first, last, _ in runs
        )
    history.sort(key=lambda e: (e["rounds"][0], e["group"], e["op"]))
    return groups, entries, history


def _entries_by_round(
    found: GroupRound, snapshots: SnapshotsByRank
) -> Iterator[tuple[int, list[Entry]]]:
    """Per common round of ``found``, in order, its members' comparison."""
    for r in found.rounds[:-1]:
        at = [snapshots.groups_at(m, r).get(found.group, {}) for m in found.members]
        if all(ops == at[0] for ops in at[1:]) and all(parse_p2p(op) is None for op in at[0]):
            yield r, []  # every member agrees on every op: nothing to list
        else:
            yield r, compare_group(found.group, dict(zip(found.members, at, strict=True)))
    yield found.rounds[-1], found.entries


def census_document(flight: Flight) -> dict[str, Any]:
    """The census, judging which processes run as the reader (the daemon) does where it can."""
    known: Mapping[tuple[Any, ...], bool] = flight.alive or {}

    def alive(host: str | None, pid: int | None, start: int | None, ns: int | None) -> bool | None:
        judged = known.get((host, pid, start))  # no host or no pid: never a known process
        return judged if judged is not None else local_alive(host, pid, start, ns)

    return build_report(flight.records, boot=flight.boot, skipped=flight.skipped, alive=alive)


def rank_state(state: _Rank, alive: bool | None) -> str:
    """Exited on its exit line, dead when gone without one, stalled while its stall stands."""
    if state.exited:
        return EXITED
    if alive is False:
        return DEAD
    return STALLED if state.blocked_in is not None else RUNNING


def _rank_summary(state: _Rank, alive_of: Alive) -> dict[str, Any]:
    last_round = max(state.snapshots, default=None)
    h = state.header
    alive = alive_of(h.host, h.pid, h.start_ticks, h.pidns)
    status = rank_state(state, alive)
    latest = state.snapshots[last_round].counts if last_round is not None else None
    blocked_in: dict[str, Any] | None = None
    if (blocked := state.blocked_in) is not None and status in (STALLED, DEAD):
        op = None if blocked.op is None else report_op_name(state.rank, blocked.op)
        blocked_in = {"group": blocked.group, "op": op, "seq": blocked.seq, "since": blocked.since}
    return {
        "rank": state.rank,
        "host": h.host,
        "pid": h.pid,
        "start_ticks": h.start_ticks,
        "state": status,
        "alive": alive,
        "blocked_in": blocked_in,
        "last_progress_wall": _progress_wall(state),
        "snapshots": len(state.snapshots),
        "last_round": last_round,
        "last_snapshot_wall": None if last_round is None else state.snapshot_wall.get(last_round),
        "counts": _rows(state.rank, latest or {}),
        "latest_counts": _rows(state.rank, state.latest),
        "dump": state.dump,
    }


def _progress_wall(state: _Rank) -> float | None:
    """When the counts last moved: the stall's start, else the newest line with counts."""
    if state.blocked_in is not None:
        return state.blocked_in.since
    walls = [w for w in (state.live_wall, *state.snapshot_wall.values()) if w is not None]
    return max(walls, default=None)


def _rows(rank: int, counts: Mapping[Key, int]) -> list[list[Any]]:
    return [
        [g, op, n]
        for g, ops in sorted(split_by_group(counts).items())
        for op, n in sorted((report_op_name(rank, op), n) for op, n in ops.items())
    ]
