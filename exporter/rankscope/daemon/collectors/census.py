"""Census: per-rank collective counts of the newest boot, the snapshot round they were
taken at, and the divergences the in-process comparison found."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import Metric

from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import add, counter, gauge
from rankscope.schema import Census, CensusDump, Divergence, Line


def census_counts(body: Census | CensusDump) -> Iterable[tuple[str, str, float]]:
    """The (group, op, n) rows of a census or census_dump line (none when the line's counts
    were unreadable)."""
    for (group, op), n in (body.counts or {}).items():
        yield group, op, float(n)


def diverges(body: Divergence) -> bool:
    """A divergence line says ranks disagree when it names a lagging rank or its counts
    differ; a line with equal counts and no laggard records agreement restored."""
    return bool(body.lagging) or len(set(body.counts.values())) > 1


class CensusCollector:
    name = "census"

    def __init__(self, state: FlightState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        view = self.state.view()
        boot = view.latest_boot
        total = counter("rankscope_collectives_total")
        round_ = gauge("rankscope_census_round")
        round_counts = gauge("rankscope_census_round_collectives")
        stamp = gauge("rankscope_census_snapshot_timestamp_seconds")
        divergence = gauge("rankscope_census_divergence")
        # Keyed by labels: a rank that restarted within one boot shows its newest process.
        totals: dict[tuple[Any, ...], tuple[float, float]] = {}
        snapshots: dict[tuple[str | None, int | None], Line[Census]] = {}
        for st in view.streams:
            if st.boot != boot:
                continue
            rank = st.process.rank
            if st.census is not None:
                wall = st.census.header.wall
                for group, op, n in census_counts(st.census.body):
                    key = (boot, rank, group, op)
                    if key not in totals or totals[key][0] <= wall:
                        totals[key] = (wall, n)
            if st.snapshot is not None:
                rank_key = (boot, rank)
                held = snapshots.get(rank_key)
                if held is None or held.header.wall <= st.snapshot.header.wall:
                    snapshots[rank_key] = st.snapshot
        for key, (_wall, n) in totals.items():
            add(total, key, n)
        for (b, rank), snap in snapshots.items():
            add(round_, (b, rank), snap.body.round)
            add(stamp, (b, rank), snap.header.wall)
            for group, op, n in census_counts(snap.body):
                add(round_counts, (b, rank, group, op), n)
        if boot is not None:
            for (group, op), line in view.divergences.get(boot, {}).items():
                add(divergence, (boot, group, op), 1.0 if diverges(line.body) else 0.0)
        yield from (total, round_, round_counts, stamp, divergence)
