"""The flight-side collectors (phases, arenas, census, self) on records written by the
probe's own writer: values, labels, boot scoping, and unmeasured values left out."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from tests.daemon.test_daemon_flightstate import GiB, MiB, census, mark, rank_recorder

from rankscope.daemon.collectors import arenas, phases, self_
from rankscope.daemon.collectors import census as census_collector
from rankscope.daemon.collectors.census import host_summaries
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import Collector, TimedCollectors
from rankscope.record import Census, CensusDump, Divergence, MarkArena
from rankscope.record.compare import DIGEST_BITS, digest
from rankscope.reports.rounds import SnapshotsByRank, group_rounds

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(
    collect: Callable[[], Iterable[Metric]], refresh: Callable[[], object] | None = None
) -> Samples:
    timed = TimedCollectors([Collector("tested", collect)], refresh=refresh)
    text = generate_latest(timed.registry()).decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def values(samples: Samples, name: str, **match: str) -> list[float]:
    return [
        v
        for labels, v in samples.get(name, [])
        if all(labels.get(k) == want for k, want in match.items())
    ]


def test_phase_series_carry_the_mark_values_and_signed_posts(flight_dir: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 2, pid=5002, tp_rank=2, pp_rank=1)
    rec.write_record(
        mark(
            "pre_weight_load", gpu=2, reserved=0, allocated=0, self_bytes=500 * MiB, free=79 * GiB
        ),
    )
    rec.write_record(
        mark(
            "weights_loaded",
            gpu=2,
            reserved=20 * GiB,
            allocated=19 * GiB,
            self_bytes=20 * GiB + 400 * MiB,
            free=59 * GiB,
        ),
    )
    state = FlightState(flight_dir)
    state.refresh()
    s = scrape(lambda: phases.collect(state))
    labels = dict(
        boot="boot-1",
        rank="2",
        tp_rank="2",
        pp_rank="1",
        runner="target",
        pid="5002",
        gpu="2",
        uuid="GPU-0002",
    )
    assert values(s, "rankscope_phase_reserved_bytes", phase="weights_loaded", **labels) == [
        20 * GiB
    ]
    assert values(s, "rankscope_phase_allocated_bytes", phase="weights_loaded", **labels) == [
        19 * GiB
    ]
    assert values(s, "rankscope_phase_process_bytes", phase="pre_weight_load", **labels) == [
        500 * MiB
    ]
    assert values(s, "rankscope_phase_device_free_bytes", phase="weights_loaded", **labels) == [
        59 * GiB
    ]
    # NVML holds 400 MiB more than the allocator reserved (context, workspaces).
    assert values(s, "rankscope_phase_non_torch_bytes", phase="weights_loaded", **labels) == [
        400 * MiB
    ]
    (stamp,) = values(s, "rankscope_phase_timestamp_seconds", phase="weights_loaded", **labels)
    assert stamp > 1.7e9
    post = dict(post="pre_weight_load->weights_loaded", **labels)
    assert values(s, "rankscope_post_bytes", view="allocator", **post) == [20 * GiB]
    # The residue shrank by 100 MiB: a negative post, never floored.
    assert values(s, "rankscope_post_bytes", view="non_torch", **post) == [-100 * MiB]
    assert values(s, "rankscope_post_bytes", view="driver", **post) == [20 * GiB]


def test_unmeasured_values_are_absent_never_zero(flight_dir: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 0)
    # A probe without torch: reserved and allocated are null, so is the residue.
    rec.write_record(
        mark("pre_weight_load", reserved=None, allocated=None, self_bytes=None, free=None),
    )
    rec.write_record(mark("weights_loaded", reserved=None, allocated=None, self_bytes=None))
    state = FlightState(flight_dir)
    state.refresh()
    s = scrape(lambda: phases.collect(state))
    for name in (
        "rankscope_phase_reserved_bytes",
        "rankscope_phase_allocated_bytes",
        "rankscope_phase_process_bytes",
        "rankscope_phase_non_torch_bytes",
    ):
        assert values(s, name) == [], name
    assert values(s, "rankscope_phase_device_free_bytes") == [60 * GiB]
    assert len(values(s, "rankscope_phase_timestamp_seconds")) == 2
    # Posts only where both marks measured the view: driver free went from null to 60 GiB.
    assert values(s, "rankscope_post_bytes", view="allocator") == []
    assert values(s, "rankscope_post_bytes", view="driver") == []


def test_phase_series_are_of_the_newest_boot_unless_widened(flight_dir: Path) -> None:
    rank_recorder(flight_dir, "boot-old", 0, pid=10).write_record(mark("pre_weight_load"))
    rank_recorder(flight_dir, "boot-new", 0, pid=20).write_record(mark("pre_weight_load"))
    state = FlightState(flight_dir)
    state.refresh()
    latest = scrape(lambda: phases.collect(state))
    assert {labels["boot"] for labels, _ in latest["rankscope_phase_reserved_bytes"]} == {
        "boot-new"
    }
    both = scrape(lambda: phases.collect(state, boots=2))
    assert {labels["boot"] for labels, _ in both["rankscope_phase_reserved_bytes"]} == {
        "boot-old",
        "boot-new",
    }
    every = scrape(lambda: phases.collect(state, boots=0))
    assert len(every["rankscope_phase_reserved_bytes"]) == 2


def test_a_repeated_phase_shows_its_latest_mark(flight_dir: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 0)
    rec.write_record(mark("checkpoint", reserved=1 * GiB))
    rec.write_record(mark("checkpoint", reserved=3 * GiB))
    state = FlightState(flight_dir)
    state.refresh()
    assert values(scrape(lambda: phases.collect(state)), "rankscope_phase_reserved_bytes") == [
        3 * GiB
    ]


def test_arenas_come_from_the_latest_line_that_carried_them(flight_dir: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 1, pid=7001)
    kv = MarkArena(reserved=40 * GiB, backed=10 * GiB)
    rec.write_record(mark("kv_pool_sized", arenas={"kv": kv}))
    rec.write_record(census(1, []))  # a census line carries no arenas: the mark's stay
    kv2 = MarkArena(reserved=40 * GiB, backed=30 * GiB, retained=2 * GiB)
    rec.write_record(mark("kv_pool_grown", arenas={"kv": kv2}))
    state = FlightState(flight_dir)
    state.refresh()
    s = scrape(lambda: arenas.collect(state))
    labels = dict(boot="boot-1", rank="1", pid="7001", arena="kv")
    assert values(s, "rankscope_arena_reserved_bytes", **labels) == [40 * GiB]
    assert values(s, "rankscope_arena_backed_bytes", **labels) == [30 * GiB]
    assert values(s, "rankscope_arena_retained_bytes", **labels) == [2 * GiB]


def test_census_counts_rounds_and_divergence_of_the_newest_boot(flight_dir: Path) -> None:
    old = rank_recorder(flight_dir, "boot-old", 0, pid=1)
    old.write_record(census(9, [["tp:0-1", "all_reduce", 900]]))
    r0 = rank_recorder(flight_dir, "boot-1", 0, pid=10)
    r1 = rank_recorder(flight_dir, "boot-1", 1, pid=11)
    r0.write_record(census(4, [["tp:0-1", "all_reduce", 40], ["pp:0,1", "send", 4]]))
    r1.write_record(census(4, [["tp:0-1", "all_reduce", 40], ["pp:0,1", "recv", 4]]))
    r0.write_record(census(5, [["tp:0-1", "all_reduce", 50], ["pp:0,1", "send", 5]]))
    # rank 1 hangs and dumps on abort: its total moves on, its snapshot round does not.
    r1.write_record(
        CensusDump(
            reason="abort",
            round=4,
            every=None,
            counts={("tp:0-1", "all_reduce"): 47, ("pp:0,1", "recv"): 4},
        )
    )
    r0.write_record(Divergence(5, "tp:0-1", "all_reduce", {0: 50, 1: 47}, lagging=(1,)))
    r0.write_record(Divergence(5, "pp:0,1", "send", {0: 5, 1: 5}, lagging=()))
    state = FlightState(flight_dir)
    state.refresh()
    s = scrape(lambda: census_collector.collect(state))
    assert values(s, "rankscope_collectives_total", boot="boot-old") == []
    assert values(s, "rankscope_collectives_total", rank="0", group="tp:0-1", op="all_reduce") == [
        50
    ]
    assert values(s, "rankscope_collectives_total", rank="1", group="tp:0-1", op="all_reduce") == [
        47
    ]
    assert values(s, "rankscope_census_round", rank="0") == [5]
    assert values(s, "rankscope_census_round", rank="1") == [4]
    assert values(
        s, "rankscope_census_round_collectives", rank="1", group="tp:0-1", op="all_reduce"
    ) == [40]
    assert values(s, "rankscope_census_round_collectives", rank="0", group="pp:0,1", op="send") == [
        5
    ]
    assert values(
        s, "rankscope_census_divergence", boot="boot-1", group="tp:0-1", op="all_reduce"
    ) == [1]
    assert values(s, "rankscope_census_divergence", boot="boot-1", group="pp:0,1", op="send") == [0]
    assert len(values(s, "rankscope_census_snapshot_timestamp_seconds", boot="boot-1")) == 2


def test_census_host_summary_compares_the_ranks_of_a_group_at_their_common_round(
    flight_dir: Path,
) -> None:
    r0 = rank_recorder(flight_dir, "boot-1", 0, pid=10)
    r1 = rank_recorder(flight_dir, "boot-1", 1, pid=11)
    r2 = rank_recorder(flight_dir, "boot-1", 2, pid=12)
    at5 = [["tp:0-2", "all_reduce", 50], ["tp:0-2", "broadcast", 5]]
    r0.write_record(census(5, [*at5, ["pp:0-1", "send>1", 5]]))
    r1.write_record(census(5, [*at5, ["pp:0-1", "recv<0", 4]]))
    # Rank 2 skipped one all_reduce before round 5.
    r2.write_record(census(5, [["tp:0-2", "all_reduce", 49], ["tp:0-2", "broadcast", 5]]))
    # Rank 0 is a round ahead (a tick in flight): the others are compared at round 5, where
    # its 100 against their 50 is no skew.
    r0.write_record(
        census(
            10,
            [["tp:0-2", "all_reduce", 100], ["tp:0-2", "broadcast", 10], ["pp:0-1", "send>1", 10]],
        )
    )
    state = FlightState(flight_dir)
    state.refresh()
    s = scrape(lambda: census_collector.collect(state))
    assert values(s, "rankscope_census_group_round", boot="boot-1", group="tp:0-2") == [5]
    assert values(s, "rankscope_census_group_digest", boot="boot-1", group="tp:0-2") == [
        digest({"all_reduce": 50, "broadcast": 5})
    ]
    # Point-to-point ops are compared as channels here and left out of the digest.
    assert values(s, "rankscope_census_group_digest", boot="boot-1", group="pp:0-1") == [digest({})]
    deficits = {
        (labels["rank"], labels["group"], labels["op"]): v
        for labels, v in s["rankscope_census_rank_deficit"]
    }
    assert deficits == {("2", "tp:0-2", "all_reduce"): 1, ("1", "pp:0-1", "p2p 0>1"): 1}
    # The others reach round 10 and rank 2's shortfall persists there.
    r1.write_record(
        census(
            10,
            [["tp:0-2", "all_reduce", 100], ["tp:0-2", "broadcast", 10], ["pp:0-1", "recv<0", 10]],
        )
    )
    r2.write_record(census(10, [["tp:0-2", "all_reduce", 99], ["tp:0-2", "broadcast", 10]]))
    state.refresh()
    s = scrape(lambda: census_collector.collect(state))
    assert values(s, "rankscope_census_group_round", group="tp:0-2") == [10]
    assert values(s, "rankscope_census_group_digest", group="tp:0-2") == [
        digest({"all_reduce": 100, "broadcast": 10})
    ]
    assert [(lb["rank"], lb["op"], v) for lb, v in s["rankscope_census_rank_deficit"]] == [
        ("2", "all_reduce", 1)
    ]


def test_census_host_summary_leaves_out_a_group_whose_ranks_share_no_round() -> None:
    a = Census(round=5, every=None, counts={("tp:0-1", "all_reduce"): 5})
    b = Census(round=6, every=None, counts={("tp:0-1", "all_reduce"): 6})
    assert host_summaries(group_rounds(SnapshotsByRank({0: {5: a}, 1: {6: b}}))) == {}
    # One member alone is compared with nobody: a digest, no deficit.
    (only,) = host_summaries(group_rounds(SnapshotsByRank({0: {5: a}}))).values()
    assert (only.round, only.deficits) == (5, {})


def test_census_digest_is_equal_exactly_for_equal_collective_counts() -> None:
    base = digest({"all_reduce": 100, "broadcast": 3})
    assert base == digest({"broadcast": 3, "all_reduce": 100, "barrier": 0, "send>2": 7})
    assert base != digest({"all_reduce": 99, "broadcast": 3})
    assert base != digest({"all_reduce": 100, "broadcast": 3, "barrier": 1})
    assert 0 <= base < 2**DIGEST_BITS and float(base) == base


def test_self_reports_the_flight_source_and_skipped_lines(flight_dir: Path, tmp_path: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 0)
    rec.write_record(mark("pre_weight_load"))
    rec.write_record(mark("weights_loaded", reserved=-5, free=2**60))  # impossible values
    path = rec.path_for("marks")
    assert path is not None
    with open(path, "ab") as f:
        f.write(b"garbage\n")
    state = FlightState(flight_dir)
    s = scrape(lambda: self_.collect(state, {"nvml": False}, None), refresh=state.refresh)
    # The refresh is an explicit step of the scrape, timed apart from the collectors.
    assert values(s, "rankscope_collector_success", collector="refresh") == [1]
    # Each impossible value is nulled and counted by field; the line itself is kept.
    assert values(s, "rankscope_flight_fields_invalid_total", field="mark.torch.reserved") == [1]
    assert values(s, "rankscope_flight_fields_invalid_total", field="mark.driver.free") == [1]
    assert [m.body.phase for st in state.view().streams for m in st.marks] == [
        "pre_weight_load",
        "weights_loaded",
    ]
    assert values(s, "rankscope_up", source="flight") == [1]
    assert values(s, "rankscope_up", source="nvml") == [0]
    assert values(s, "rankscope_flight_lines_skipped_total", reason="malformed") == [1]
    assert values(s, "rankscope_flight_lines_skipped_total", reason="torn") == [0]
    assert len(values(s, "rankscope_build_info")) == 1
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    down_state = FlightState(not_a_dir)
    down = scrape(lambda: self_.collect(down_state, {}, None), refresh=down_state.refresh)
    assert values(down, "rankscope_collector_success", collector="refresh") == [0]
    assert values(down, "rankscope_up", source="flight") == [0]
    assert values(down, "rankscope_up", source="nvml") == []  # no card monitor: not measured
