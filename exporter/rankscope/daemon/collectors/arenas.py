"""KV arenas: reserved, backed and retained bytes of every registered arena, from the
latest mark or census line that carried them, for the newest boot."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from rankscope.daemon.collectors.phases import number
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import add, gauge

ARENA_VALUES = {
    "rankscope_arena_reserved_bytes": "reserved",
    "rankscope_arena_backed_bytes": "backed",
    "rankscope_arena_retained_bytes": "retained",
}


class ArenasCollector:
    name = "arenas"

    def __init__(self, state: FlightState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        view = self.state.view()
        families = {name: gauge(name) for name in ARENA_VALUES}
        # Both streams of a process may carry arenas: the later line wins.
        latest: dict[tuple[str, int | None, int, str], tuple[float, dict[str, object]]] = {}
        for st in view.streams:
            if st.boot != view.latest_boot or st.arenas is None:
                continue
            rec = st.arenas
            wall = float(rec["wall"])
            for arena, figures in rec["arenas"].items():
                if not isinstance(figures, dict):
                    continue
                labels = (st.boot, st.process.rank, st.process.pid, str(arena))
                if labels not in latest or latest[labels][0] <= wall:
                    latest[labels] = (wall, figures)
        for labels, (_wall, figures) in latest.items():
            for name, fld in ARENA_VALUES.items():
                add(families[name], labels, number(figures.get(fld)))
        yield from families.values()
