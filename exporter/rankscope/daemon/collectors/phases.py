"""Phase marks: the allocator, driver and NVML views at each named boot boundary, and the
posts between consecutive marks (as rankscope.ledger computes them), for the newest boot(s)
only (``--phases.boots``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric

from rankscope.daemon.flightstate import FlightState, StreamState
from rankscope.daemon.registry import add, gauge
from rankscope.flight import Record
from rankscope.ledger import posts

# catalog name -> where the mark holds the value (section, field)
PHASE_VALUES: dict[str, tuple[str, str]] = {
    "rankscope_phase_reserved_bytes": ("torch", "reserved"),
    "rankscope_phase_allocated_bytes": ("torch", "allocated"),
    "rankscope_phase_process_bytes": ("nvml", "self_bytes"),
    "rankscope_phase_device_free_bytes": ("driver", "free"),
}


def number(value: Any) -> float | None:
    """A measured number, or None for anything else (null, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def section(rec: Record, name: str) -> dict[str, Any]:
    value = rec.get(name)
    return value if isinstance(value, dict) else {}


def mark_device(rec: Record) -> tuple[Any, Any]:
    """(gpu, uuid) of a mark. gpu is the card's NVML index, the host-wide index the card
    series use, not the process's CUDA ordinal (which CUDA_VISIBLE_DEVICES renumbers)."""
    device = section(rec, "device")
    return device.get("nvml_index"), device.get("uuid")


def phase_labels(st: StreamState, rec: Record) -> tuple[Any, ...]:
    gpu, uuid = mark_device(rec)
    runner = rec.get("runner")
    return (
        st.boot,
        rec.get("rank"),
        rec.get("tp_rank"),
        rec.get("pp_rank"),
        runner,
        st.process.pid,
        rec.get("phase"),
        gpu,
        uuid,
    )


def non_torch(rec: Record) -> float | None:
    derived = section(rec, "derived")
    if derived.get("non_torch_measured") is not True:
        return None  # a subtraction with an unmeasured side is no measurement
    return number(derived.get("non_torch"))


class PhasesCollector:
    name = "phases"

    def __init__(self, state: FlightState, boots: int = 1) -> None:
        self.state = state
        self.boots = boots

    def collect(self) -> Iterator[Metric]:
        view = self.state.view()
        wanted = view.recent_boots(self.boots)
        families = {
            name: gauge(name)
            for name in (
                *PHASE_VALUES,
                "rankscope_phase_non_torch_bytes",
                "rankscope_phase_timestamp_seconds",
            )
        }
        # The latest mark of each phase wins when a process marks a phase twice.
        latest: dict[tuple[Any, ...], Record] = {}
        for st in view.streams:
            if st.boot not in wanted:
                continue
            for rec in st.marks:
                if isinstance(rec.get("phase"), str):
                    latest[phase_labels(st, rec)] = rec
        for labels, rec in latest.items():
            for name, (sec, fld) in PHASE_VALUES.items():
                add(families[name], labels, number(section(rec, sec).get(fld)))
            add(families["rankscope_phase_non_torch_bytes"], labels, non_torch(rec))
            add(families["rankscope_phase_timestamp_seconds"], labels, number(rec.get("wall")))
        post_bytes = gauge("rankscope_post_bytes")
        latest_posts: dict[tuple[Any, ...], float | None] = {}
        for row in posts(rec for st in view.streams if st.boot in wanted for rec in st.marks):
            for view_name, value in row["views"].items():
                labels = (
                    row["boot"],
                    row["rank"],
                    row["tp_rank"],
                    row["pp_rank"],
                    row["runner"],
                    row["pid"],
                    row["post"],
                    view_name,
                    row["gpu"],
                    row["uuid"],
                )
                latest_posts[labels] = number(value)
        for labels, value in latest_posts.items():
            add(post_bytes, labels, value)
        yield from families.values()
        yield post_bytes
