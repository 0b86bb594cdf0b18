"""Census of the newest boot: per-rank counts, snapshot rounds, divergences, each group
instance's common round, digest and deficits here (docs/alerting.md, "Why this shape"), and
each rank's state, stall and deficit at the latest counts, by the rule of ``rankscope
census`` (rankscope.reports.census)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.flightstate import FlightState, StreamState, newest
from rankscope.daemon.registry import Collector, add, counter, gauge
from rankscope.daemon.sources import Sources
from rankscope.record import Census, Divergence
from rankscope.record.compare import Entry, digest
from rankscope.reports.census import STATES, states_of
from rankscope.reports.rounds import GroupRound, SnapshotsByRank, group_rounds

NAME = "census"
HELP = "collective counts, rounds, divergences"
DEFAULT = True


def build(config: DaemonConfig, sources: Sources) -> Collector:
    return Collector(NAME, lambda: collect(sources.flight))


def diverges(body: Divergence) -> bool:
    """A divergence line says ranks disagree when it names a lagging rank or its counts
    differ; a line with equal counts and no laggard records agreement restored."""
    return bool(body.lagging) or len(set(body.counts.values())) > 1


def behind(entries: Iterable[Entry]) -> Iterator[tuple[int, Entry, int]]:
    """(rank, entry, how far behind the entry's top count) for each lagging rank."""
    for entry in entries:
        top = max(entry["counts"].values())
        for rank in entry["lagging"]:
            yield rank, entry, top - entry["counts"][str(rank)]


@dataclass(frozen=True)
class GroupSummary:
    """The round compared, the digest of each op's top count there, each (rank, op) behind."""

    round: int
    digest: int
    deficits: dict[tuple[int, str], int]


def snapshots_since(st: StreamState, floor: int) -> dict[int, Census]:
    """The snapshots of one stream at round ``floor`` or later, by round (lines are in order)."""
    out: dict[int, Census] = {}
    for line in reversed(st.census_lines):
        body = line.body
        if not isinstance(body, Census) or body.round is None or body.counts is None:
            continue
        if body.round < floor:
            break
        out.setdefault(body.round, body)
    return out


def host_groups(held: Mapping[int | None, StreamState]) -> list[GroupRound]:
    """Each group instance of this host's ranks at its latest common round (the rule of
    ``rankscope census``), read from the snapshots since the oldest latest round; from every
    snapshot only when a group's members share no round there (a snapshot lost)."""

    def since(floor: int) -> list[GroupRound]:
        history = {r: snapshots_since(st, floor) for r, st in held.items() if r is not None}
        return group_rounds(SnapshotsByRank(history))

    rounds = (st.snapshot.body.round for st in held.values() if st.snapshot is not None)
    floor = min((r for r in rounds if r is not None), default=0)
    found = since(floor)
    if floor and any(g.round is None and len(g.members) > 1 for g in found):
        found = since(0)
    return found


def host_summaries(found: Iterable[GroupRound]) -> dict[str, GroupSummary]:
    """Each group instance at its latest common round (none without one); the rules compare
    the hosts' digests (docs/alerting.md)."""
    out: dict[str, GroupSummary] = {}
    for group in found:
        if group.round is None:
            continue
        ops = {op for counts in group.ops.values() for op in counts}
        top = {op: max(counts.get(op, 0) for counts in group.ops.values()) for op in ops}
        deficits = {(rank, entry["op"]): n for rank, entry, n in behind(group.entries)}
        out[group.group] = GroupSummary(group.round, digest(top), deficits)
    return out


def collect(state: FlightState) -> Iterator[Metric]:
    view = state.view()
    boot = view.latest_boot
    total = counter("rankscope_collectives_total")
    round_ = gauge("rankscope_census_round")
    round_counts = gauge("rankscope_census_round_collectives")
    stamp = gauge("rankscope_census_snapshot_timestamp_seconds")
    divergence = gauge("rankscope_census_divergence")
    group_round = gauge("rankscope_census_group_round")
    group_digest = gauge("rankscope_census_group_digest")
    deficit = gauge("rankscope_census_rank_deficit")
    streams = [st for st in view.streams if st.boot == boot]
    totals = {
        (boot, st.process.rank, group, op): n
        for st, line in newest(streams, lambda st: st.census)
        for (group, op), n in (line.body.counts or {}).items()
    }
    for key, n in totals.items():
        add(total, key, n)
    held = {st.process.rank: st for st, _ in newest(streams, lambda st: st.snapshot)}
    for rank, st in held.items():
        snap = st.snapshot
        assert snap is not None
        add(round_, (boot, rank), snap.body.round)
        add(stamp, (boot, rank), snap.header.wall)
        for (group, op), n in (snap.body.counts or {}).items():
            add(round_counts, (boot, rank, group, op), n)
    for group, summary in host_summaries(host_groups(held)).items():
        add(group_round, (boot, group), summary.round)
        add(group_digest, (boot, group), summary.digest)
        for (rank, op), n in summary.deficits.items():
            add(deficit, (boot, rank, group, op), n)
    if boot is not None:
        for (group, op), div in view.divergences.get(boot, {}).items():
            add(divergence, (boot, group, op), 1.0 if diverges(div.body) else 0.0)
    yield from (total, round_, round_counts, stamp, divergence, group_round, group_digest, deficit)
    if boot is not None:
        yield from rank_states(state, streams, boot)


def rank_states(state: FlightState, streams: list[StreamState], boot: str) -> Iterator[Metric]:
    """Each rank's state, its time since progress, the collective it is blocked in and
    its deficit at the latest counts."""
    in_state = gauge("rankscope_census_rank_state")
    since = gauge("rankscope_census_since_progress_seconds")
    blocked = gauge("rankscope_census_blocked_collective")
    latest = gauge("rankscope_census_latest_deficit")
    # Per stream its newest snapshot, its newest census or dump line and its folded live
    # lines hold every latest count and the state (counts only grow): three lines a rank.
    records = [
        line for st in streams for line in (st.snapshot, st.census, st.live) if line is not None
    ]
    alive = state.alive()

    def judged(host: str | None, pid: int | None, start: int | None, ns: int | None) -> bool | None:
        return alive.get((host, pid, start)) if host is not None and pid is not None else None

    found = states_of(records, judged)
    now = time.time()
    for rank in found.ranks:
        labels = (boot, rank["rank"])
        for name in STATES:
            add(in_state, (*labels, name), 1.0 if rank["state"] == name else 0.0)
        progress = rank["last_progress_wall"]
        add(since, labels, None if progress is None else max(0.0, now - progress))
        where = rank["blocked_in"]
        if where is not None and where["group"] is not None:
            add(blocked, (*labels, where["group"], where["op"]), where["seq"])
    for lagging, entry, n in behind(found.latest):
        add(latest, (boot, lagging, entry["group"], entry["op"]), n)
    yield from (in_state, since, blocked, latest)
