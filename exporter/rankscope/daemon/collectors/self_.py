"""The instrument itself: build info, source health, flight lines skipped or nulled."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector

from rankscope import __version__
from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import Collector, add, counter, gauge, info
from rankscope.daemon.sources import Sources

NAME = "self"
HELP = "build info, source health, skipped flight lines"
DEFAULT = None  # always on


def build(config: DaemonConfig, sources: Sources) -> Collector:
    started = process_start_time()
    return Collector(NAME, lambda: collect(sources.flight, sources.up(), started))


def collect(
    state: FlightState, sources_up: dict[str, bool], start_time: float | None
) -> Iterator[Metric]:
    build_info = info("rankscope_build_info")
    build_info.add_metric([__version__], {})
    started = gauge("process_start_time_seconds")
    add(started, (), start_time)
    up = gauge("rankscope_up")
    add(up, ("flight",), 1.0 if state.up else 0.0)
    for source, ok in sorted(sources_up.items()):
        add(up, (source,), 1.0 if ok else 0.0)
    skipped = counter("rankscope_flight_lines_skipped_total")
    view = state.view()
    for reason, n in view.skipped.items():
        add(skipped, (reason,), n)
    invalid = counter("rankscope_flight_fields_invalid_total")
    for name, n in sorted(view.invalid.items()):
        add(invalid, (name,), n)
    health = state.health()
    files = gauge("rankscope_flight_files")
    add(files, (), health.files)
    unreadable = gauge("rankscope_flight_files_unreadable")
    add(unreadable, (), health.unreadable)
    yield from (build_info, started, up, skipped, invalid, files, unreadable)


def process_start_time() -> float | None:
    """This process's start time as client_python's process collector computes it (from
    /proc), None where it cannot tell."""
    samples = (s for fam in ProcessCollector(registry=None).collect() for s in fam.samples)
    return next((float(s.value) for s in samples if s.name == "process_start_time_seconds"), None)
