"""The metric catalog: the one list of every metric rankscope exposes, which the Prometheus
collectors, the OTLP instruments, the docs table (docs/metrics.md), the dashboards' query check
and the tests are made from; a metric exposed without an entry here, or an entry never exposed,
fails the tests. Names follow Prometheus conventions: a rankscope_ prefix, base units in the
name (_bytes, _seconds), _total on counters, no timestamps in samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "summary", "info"]

PHASE_LABELS = ("boot", "rank", "tp_rank", "pp_rank", "runner", "pid", "phase", "gpu", "uuid")
POST_LABELS = ("boot", "rank", "tp_rank", "pp_rank", "runner", "pid", "post", "view", "gpu", "uuid")
ARENA_LABELS = ("boot", "rank", "pid", "arena")
CARD_LABELS = ("gpu", "uuid")
HOLDING_LABELS = ("gpu", "uuid", "pid", "comm", "role", "boot", "rank")
CENSUS_RANK_LABELS = ("boot", "rank")
CENSUS_OP_LABELS = ("boot", "rank", "group", "op")
CENSUS_GROUP_LABELS = ("boot", "group")
CENSUS_STATE_LABELS = ("boot", "rank", "state")
DIVERGENCE_LABELS = ("boot", "group", "op")
OOM_LABELS = ("gpu", "uuid", "boot", "rank", "pid")
NCCL_COMM_LABELS = ("endpoint", "comm", "comm_secondary", "boot")
NCCL_RANK_LABELS = (*NCCL_COMM_LABELS, "nccl_rank", "rank", "host", "pid")


@dataclass(frozen=True)
class Metric:
    name: str  # the name as exposed (counters end in _total)
    type: MetricType
    unit: str  # base unit: "bytes", "seconds", "" for dimensionless
    help: str
    labels: tuple[str, ...]
    collector: str  # the daemon collector that exposes it

    @property
    def family(self) -> str:
        """The family name prometheus_client wants (counters and info without suffix)."""
        return self.name.removesuffix({"counter": "_total", "info": "_info"}.get(self.type, ""))


# The one summary; every other type follows from the name (see _collector).
SUMMARIES = frozenset({"rankscope_sampler_duration_seconds"})


def _collector(collector: str, entries: dict[tuple[str, tuple[str, ...]], str]) -> list[Metric]:
    """One collector's metrics, (name, labels) -> help: the type and the unit follow from the
    name's Prometheus suffixes (_total a counter, _info an info, _bytes or _seconds the unit)."""
    metrics = []
    for (name, labels), help_text in entries.items():
        kind: MetricType = "counter" if name.endswith("_total") else "gauge"
        if name.endswith("_info"):
            kind = "info"
        elif name in SUMMARIES:
            kind = "summary"
        unit = "bytes" if name.endswith("_bytes") else "seconds" if "_seconds" in name else ""
        metrics.append(Metric(name, kind, unit, help_text, labels, collector))
    return metrics


CATALOG: tuple[Metric, ...] = (
    *_collector(
        "phases",
        {
            ("rankscope_phase_reserved_bytes", PHASE_LABELS): "Torch caching-allocator reserved "
            "bytes at the mark.",
            ("rankscope_phase_allocated_bytes", PHASE_LABELS): "Torch caching-allocator allocated "
            "bytes at the mark.",
            ("rankscope_phase_process_bytes", PHASE_LABELS): "Device memory NVML attributes to "
            "this process at the mark.",
            ("rankscope_phase_non_torch_bytes", PHASE_LABELS): "Signed residue: NVML bytes of "
            "this process minus allocator reserved bytes; absent where not measured.",
            ("rankscope_phase_device_free_bytes", PHASE_LABELS): "Driver-reported free device "
            "memory at the mark.",
            ("rankscope_phase_timestamp_seconds", PHASE_LABELS): "Wall-clock time the mark was "
            "taken, as Unix seconds.",
            ("rankscope_post_bytes", POST_LABELS): "Signed change between consecutive marks of "
            "one process and runner, per view (allocator = reserved, allocated, driver = card "
            "used, process = NVML bytes of the process, non_torch); absent where either mark did "
            "not measure it.",
        },
    ),
    *_collector(
        "arenas",
        {
            ("rankscope_arena_reserved_bytes", ARENA_LABELS): "Address space a registered arena "
            "has reserved.",
            ("rankscope_arena_backed_bytes", ARENA_LABELS): "Bytes of a registered arena backed "
            "by committed device pages.",
            ("rankscope_arena_retained_bytes", ARENA_LABELS): "Bytes a registered arena keeps in "
            "parked handles.",
        },
    ),
    *_collector(
        "cards",
        {
            ("rankscope_gpu_info", ("gpu", "uuid", "model", "source")): "Card identity; source is "
            "nvml, or simulated for the scripted device source.",
            ("rankscope_gpu_total_bytes", CARD_LABELS): "Total device memory of the card.",
            ("rankscope_gpu_free_bytes", CARD_LABELS): "Free device memory at the latest sample.",
            ("rankscope_gpu_free_min_bytes", CARD_LABELS): "Minimum free device memory over the "
            "trailing window.",
            ("rankscope_corridor_floor_bytes", CARD_LABELS): "Configured free-memory floor of the "
            "card.",
            ("rankscope_corridor_breach_seconds_total", CARD_LABELS): "Seconds the card's free "
            "memory spent below its floor.",
            ("rankscope_corridor_breaches_total", CARD_LABELS): "Times the card's free memory "
            "crossed below its floor.",
            ("rankscope_device_errors_total", ("source", "gpu", "uuid")): "Failed reads of the "
            "device source (NVML, or the simulated script); gpu and uuid are empty for failures "
            "of the source as a whole (init, enumeration).",
            ("rankscope_gpu_rank_resident_bytes", CARD_LABELS): "Device memory held by processes "
            "matched to a rank of a boot.",
            ("rankscope_gpu_foreign_bytes", CARD_LABELS): "Device memory held by processes that "
            "are no rank of any boot.",
            ("rankscope_gpu_unattributed_bytes", CARD_LABELS): "Signed: total minus free minus "
            "every process's bytes (context, driver, sampling skew).",
        },
    ),
    *_collector(
        "holdings",
        {
            ("rankscope_gpu_process_bytes", HOLDING_LABELS): "Device memory held by one process "
            "on the card; role is rank or foreign (overflow when the per-card cap is reached).",
            ("rankscope_gpu_largest_foreign_bytes", ("gpu", "uuid", "pid", "comm")): "Device "
            "memory held by the card's largest foreign process (no rank of any boot), named by "
            "pid and comm; absent while no foreign process holds memory there. One series per "
            "card, which RankscopeForeignHolder reads instead of every process.",
        },
    ),
    *_collector(
        "oom",
        {
            ("rankscope_oom_events_total", OOM_LABELS): "Out-of-memory instants on the card: "
            "those a rank's probe recorded (boot, rank and the failing pid set), and those the "
            "sampler saw as free memory at or below --oom.free-below (boot, rank and pid empty: "
            "no allocator reported them).",
            ("rankscope_oom_holder_bytes", HOLDING_LABELS): "Device memory each process held on "
            "the card at the card's latest OOM instant; role is rank or foreign (overflow past "
            "the per-card cap).",
        },
    ),
    *_collector(
        "census",
        {
            ("rankscope_collectives_total", CENSUS_OP_LABELS): "Collectives a rank issued, per "
            "group instance and op, as of its latest record.",
            ("rankscope_census_round", CENSUS_RANK_LABELS): "Round (census tick count) of the "
            "rank's latest snapshot.",
            ("rankscope_census_round_collectives", CENSUS_OP_LABELS): "Collectives a rank had "
            "issued as of its latest snapshot round.",
            ("rankscope_census_divergence", DIVERGENCE_LABELS): "1 where the in-process "
            "comparison found ranks of one group instance disagree on an op's count.",
            ("rankscope_census_snapshot_timestamp_seconds", CENSUS_RANK_LABELS): "Wall-clock time "
            "of the rank's latest census snapshot, as Unix seconds.",
            ("rankscope_census_group_round", CENSUS_GROUP_LABELS): "Latest census round that "
            "every rank of the group instance on this host has a snapshot of: the round "
            "rankscope_census_group_digest and rankscope_census_rank_deficit compare.",
            ("rankscope_census_group_digest", CENSUS_GROUP_LABELS): "Digest of the group "
            "instance's collective counts on this host at rankscope_census_group_round: an "
            "integer below 2^53 (exact in a float64) hashing each op's count at its most advanced "
            "rank here, point-to-point channels left out. Hosts at the same round with different "
            "digests disagree on some count.",
            ("rankscope_census_rank_deficit", CENSUS_OP_LABELS): "Collectives a rank is behind "
            "the most advanced rank of its group instance on this host at "
            "rankscope_census_group_round; published only for a rank behind.",
            ("rankscope_census_rank_state", CENSUS_STATE_LABELS): "1 for the rank's census state "
            "(running, stalled: no collective counted for the stall time, exited: it wrote its "
            "exit line, dead: its process is gone without one), 0 for the other states.",
            ("rankscope_census_since_progress_seconds", CENSUS_RANK_LABELS): "Seconds since the "
            "rank's collective counts last moved, as its census lines say.",
            ("rankscope_census_blocked_collective", CENSUS_OP_LABELS): "Sequence number (its "
            "count on the group instance) of the collective a stalled or dead rank counted last, "
            "the one it is blocked in; published only for such a rank.",
            ("rankscope_census_latest_deficit", CENSUS_OP_LABELS): "Collectives a rank is behind "
            "the most advanced member of its group instance at their latest counts, while no "
            "member is moving (each stalled, exited or dead); published only for a rank behind.",
        },
    ),
    *_collector(
        "nccl-ras",
        {
            ("rankscope_nccl_communicators", ("endpoint",)): "Communicators the RAS endpoint "
            "reported (kept while seen within the forget window).",
            ("rankscope_nccl_communicator_size", NCCL_COMM_LABELS): "Ranks in the communicator, "
            "as NCCL reports it.",
            ("rankscope_nccl_communicator_ranks_reporting", NCCL_COMM_LABELS): "Ranks of the "
            "communicator that answered RAS (JSON report only).",
            ("rankscope_nccl_communicator_ranks_missing", NCCL_COMM_LABELS): "Ranks of the "
            "communicator that did not answer RAS (JSON report only).",
            ("rankscope_nccl_collectives_total", (*NCCL_RANK_LABELS, "op")): "Collectives "
            "a rank launched on the communicator, per op, as NCCL counts them (JSON report only; "
            "no Send/Recv; a one-rank communicator counts none).",
            ("rankscope_nccl_count_mismatch", (*NCCL_COMM_LABELS, "op")): "1 "
            "where the ranks of a communicator disagreed on an op's count with the lowest count "
            "unchanged over the persistence polls (or NCCL's text report flagged it).",
            ("rankscope_nccl_status_mismatch", NCCL_COMM_LABELS): "1 where the ranks of a "
            "communicator reported different status over the persistence polls.",
            ("rankscope_nccl_rank_missing", (*NCCL_RANK_LABELS, "state")): "1 for a rank RAS "
            "could not reach, by state (unresponsive, dead).",
            ("rankscope_nccl_dead_processes", ("endpoint",)): "Job processes RAS considers dead "
            "(the text report's DEAD count; in JSON the distinct missing ranks marked "
            "considered_dead).",
            (
                "rankscope_nccl_info",
                ("endpoint", "version", "cuda_runtime", "cuda_driver", "format"),
            ): "NCCL version and CUDA versions of the job behind a RAS endpoint, and the report "
            "format it answered in.",
            ("rankscope_nccl_ras_up", ("endpoint",)): "1 when the last poll of the RAS endpoint "
            "returned a report that parsed.",
            ("rankscope_nccl_ras_poll_duration_seconds", ("endpoint",)): "Time the last poll of "
            "the RAS endpoint took (connect, report, parse).",
            ("rankscope_nccl_ras_last_error", ("endpoint", "reason")): "1 for the reason the last "
            "poll failed (refused, timeout, truncated, malformed, too_large, unknown_version), 0 "
            "for the others; all 0 after a success.",
            ("rankscope_nccl_ras_poll_errors_total", ("endpoint", "reason")): "Failed polls of "
            "the RAS endpoint, by reason.",
            ("rankscope_nccl_ras_polls_total", ("endpoint",)): "Polls of the RAS endpoint, failed "
            "or not.",
        },
    ),
    *_collector(
        "self",
        {
            ("rankscope_build_info", ("version",)): "rankscope version.",
            ("process_start_time_seconds", ()): "Start time of the daemon since the Unix epoch "
            "(client_python's process metric): a restart, after which every counter starts again "
            "from 0, is visible.",
            ("rankscope_up", ("source",)): "1 when a source answers, 0 when it is down: flight "
            "(the flight directory), and nvml or simulated (the device source).",
            ("rankscope_collector_success", ("collector",)): "1 when the collector's last scrape "
            "succeeded.",
            ("rankscope_collector_duration_seconds", ("collector",)): "Time the collector's last "
            "scrape took.",
        },
    ),
    *_collector(
        "cards",
        {
            ("rankscope_sampler_duration_seconds", ()): "The sampler's own cost per sample, all "
            "cards together.",
            ("rankscope_sampler_overruns_total", ()): "Samples that started late because the "
            "previous one outran the interval.",
        },
    ),
    *_collector(
        "self",
        {
            ("rankscope_flight_lines_skipped_total", ("reason",)): "Flight-record lines skipped "
            "by the reader, by reason (torn, malformed, newer_schema, oversized, too_deep: nested "
            "past the parse's depth limit).",
            ("rankscope_flight_fields_invalid_total", ("field",)): "Flight-record values the "
            "reader nulled as impossible (a negative or absurd byte count, a non-finite time), by "
            "field; the line itself was kept.",
            ("rankscope_flight_files", ()): "Flight files the daemon tracks in the flight "
            "directory.",
            ("rankscope_flight_files_unreadable", ()): "Flight files the daemon's last try could "
            "not read (a permission, an I/O error); each is retried when it changes, and the "
            "other files are read meanwhile.",
        },
    ),
)


BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOG}


def exposed_names(metric: Metric) -> tuple[str, ...]:
    """Every sample name a metric may show in the text exposition."""
    if metric.type == "summary":
        return (metric.name + "_count", metric.name + "_sum", metric.name)
    if metric.type == "counter":
        return (metric.name, metric.family + "_created")
    return (metric.name,)


# Every sample (or PromQL metric) name -> the catalog entry it belongs to.
BY_SAMPLE: dict[str, Metric] = {name: m for m in CATALOG for name in exposed_names(m)}


# --- the docs table (docs/metrics.md is this function's output) ------------------------------

DOCS_HEADER = """# Metrics

Every metric `rankscope serve` exposes, generated from `rankscope.catalog` (the one list the
Prometheus collectors, the OTLP instruments and the tests are made from):
`python3 -m rankscope.catalog > docs/metrics.md`. A test fails when this file, the catalog
or the exposition disagree.

Labels with an unknown value are empty, which PromQL treats as absent. Over OTLP, counters
are pushed without the `_total` suffix, units in UCUM (`By`, `s`), and a summary as its
`_count` and `_sum` counters.
"""


def metrics_markdown() -> str:
    rows = [
        "| name | type | unit | labels | collector | help |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in CATALOG:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "none"
        help_text = m.help.replace("|", "\\|")
        rows.append(
            f"| `{m.name}` | {m.type} | {m.unit or '-'} | {labels} | {m.collector} | {help_text} |"
        )
    return DOCS_HEADER + "\n" + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(metrics_markdown(), end="")
