"""Phase marks of the newest boot(s): the allocator, driver and NVML views at each, and the
posts between them (as rankscope.reports.ledger computes them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric

from rankscope.catalog import POST_LABELS
from rankscope.daemon.flightstate import FlightState, StreamState
from rankscope.daemon.registry import Collector, add, gauge
from rankscope.reports.ledger import MarkLine, posts

if TYPE_CHECKING:
    import argparse

    from rankscope.daemon.config import DaemonConfig
    from rankscope.daemon.sources import Sources

NAME = "phases"
HELP = "phase marks and the posts between them"
DEFAULT = True


@dataclass(frozen=True)
class Options:
    phase_boots: int = 1

    def __post_init__(self) -> None:
        if self.phase_boots < 0:
            raise ValueError("--phases.boots must be 0 (every boot) or more")


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--phases.boots",
        dest="phase_boots",
        type=int,
        default=Options.phase_boots,
        metavar="N",
        help="publish phase series of the N newest boots (default 1; 0 for every boot)",
    )


def build(config: DaemonConfig, sources: Sources) -> Collector:
    boots = config.options_of(Options).phase_boots
    return Collector(NAME, lambda: collect(sources.flight, boots))


# catalog name -> how to read the value from a mark line
PHASE_VALUES: dict[str, Callable[[MarkLine], float | None]] = {
    "rankscope_phase_reserved_bytes": lambda line: line.body.torch.reserved,
    "rankscope_phase_allocated_bytes": lambda line: line.body.torch.allocated,
    "rankscope_phase_process_bytes": lambda line: line.body.nvml.self_bytes,
    "rankscope_phase_device_free_bytes": lambda line: line.body.driver.free,
    # A subtraction with an unmeasured side is no measurement.
    "rankscope_phase_non_torch_bytes": lambda line: (
        line.body.derived.non_torch if line.body.derived.non_torch_measured else None
    ),
    "rankscope_phase_timestamp_seconds": lambda line: line.header.wall,
}


def phase_labels(st: StreamState, line: MarkLine) -> tuple[Any, ...]:
    """The labels of a mark's series. gpu is the card's NVML index, the host-wide index the
    card series use, not the process's CUDA ordinal (which CUDA_VISIBLE_DEVICES renumbers)."""
    h, mark = line.header, line.body
    process = (st.boot, h.rank, h.tp_rank, h.pp_rank, h.runner, st.process.pid)
    return (*process, mark.phase, mark.device.nvml_index, mark.device.uuid)


def collect(state: FlightState, boots: int = 1) -> Iterator[Metric]:
    view = state.view()
    wanted = view.recent_boots(boots)
    marks = [(st, line) for st in view.streams if st.boot in wanted for line in st.marks]
    families = {name: gauge(name) for name in PHASE_VALUES}
    # The latest mark of each phase wins when a process marks a phase twice; likewise
    # the latest post of each view.
    for labels, line in {phase_labels(st, line): line for st, line in marks}.items():
        for name, read in PHASE_VALUES.items():
            add(families[name], labels, read(line))
    post_bytes = gauge("rankscope_post_bytes")
    latest_posts = {
        tuple(view_name if k == "view" else row[k] for k in POST_LABELS): value
        for row in posts(line for _, line in marks)
        for view_name, value in row["views"].items()
    }
    for labels, value in latest_posts.items():
        add(post_bytes, labels, value)
    yield from (*families.values(), post_bytes)
