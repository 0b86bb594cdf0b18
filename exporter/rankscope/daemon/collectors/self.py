"""The instrument itself: build info, whether each source answers, and the flight lines
the reader had to skip. Registered first, it also refreshes the flight state, so its
duration is the cost of tailing the flight directory."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from rankscope import __version__
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import add, counter, gauge, info


class SelfCollector:
    name = "self"

    def __init__(
        self, state: FlightState, sources_up: Callable[[], dict[str, bool]] | None = None
    ) -> None:
        self.state = state
        self.sources_up = sources_up

    def collect(self) -> Iterator[Metric]:
        self.state.refresh()
        build = info("rankscope_build_info")
        build.add_metric([__version__], {})
        up = gauge("rankscope_up")
        add(up, ("flight",), 1.0 if self.state.up else 0.0)
        if self.sources_up is not None:
            for source, ok in sorted(self.sources_up().items()):
                add(up, (source,), 1.0 if ok else 0.0)
        skipped = counter("rankscope_flight_lines_skipped_total")
        view = self.state.view()
        for reason, n in view.skipped.items():
            add(skipped, (reason,), n)
        invalid = counter("rankscope_flight_fields_invalid_total")
        for name, n in sorted(view.invalid.items()):
            add(invalid, (name,), n)
        yield from (build, up, skipped, invalid)
