"""KV arenas: reserved, backed and retained bytes of every registered arena, from the
latest mark or census line that carried them, for the newest boot."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric

from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.flightstate import FlightState, newest
from rankscope.daemon.registry import Collector, add, gauge
from rankscope.daemon.sources import Sources
from rankscope.record import MarkArena

NAME = "arenas"
HELP = "KV arena bytes"
DEFAULT = True


def build(config: DaemonConfig, sources: Sources) -> Collector:
    return Collector(NAME, lambda: collect(sources.flight))


ARENA_VALUES: dict[str, Callable[[MarkArena], int | None]] = {
    "rankscope_arena_reserved_bytes": lambda a: a.reserved,
    "rankscope_arena_backed_bytes": lambda a: a.backed,
    "rankscope_arena_retained_bytes": lambda a: a.retained,
}


def collect(state: FlightState) -> Iterator[Metric]:
    view = state.view()
    families = {name: gauge(name) for name in ARENA_VALUES}
    streams = (st for st in view.streams if st.boot == view.latest_boot)
    # Each process's latest mark carries its arenas; the later line wins.
    latest = {
        (st.boot, st.process.rank, st.process.pid, arena): figures
        for st, mark in newest(streams, lambda st: st.arenas)
        for arena, figures in mark.body.arenas.items()
    }
    for labels, figures in latest.items():
        for name, read in ARENA_VALUES.items():
            add(families[name], labels, read(figures))
    yield from families.values()
