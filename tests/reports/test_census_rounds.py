"""One rule for a group's latest common round (rankscope.reports.rounds): the daemon's census
collector and `rankscope census` read the same snapshots, written by the census's own
writer (count, tick, the snapshot line), and name the same round, diverging ops and lagging
ranks, edge cases included."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.daemon.test_daemon_collectors import scrape
from tests.daemon.test_daemon_flightstate import rank_recorder

from rankscope.daemon.collectors import census as census_collector
from rankscope.daemon.flightstate import FlightState
from rankscope.rank import census
from rankscope.rank.census import counts, graphs, snapshots
from rankscope.record import Census
from rankscope.record.reader import read_flight
from rankscope.reports.census import census_document

BOOT = "boot-rounds"
EVERY = 10


@pytest.fixture(autouse=True)
def fresh_census(monkeypatch: pytest.MonkeyPatch) -> Any:
    # Signal handlers are tested elsewhere, in child processes, never in pytest's own.
    monkeypatch.setattr(snapshots.STATE, "handlers_installed", True)
    monkeypatch.setattr(snapshots.STATE, "every", EVERY)
    yield
    counts.reset()
    graphs.reset()
    snapshots.reset()


def run_rank(
    flight_dir: Path,
    rank: int,
    ticks: int,
    issue: Callable[[int, int], None],
    monkeypatch: pytest.MonkeyPatch,
    lost: int | None = None,
) -> None:
    """One rank's process, in turn: its collectives of each tick, then tick(); the census
    writes a snapshot every EVERY ticks through the rank's own recorder (not at tick
    ``lost``: the recorder is unarmed then, as when the flight directory cannot be written)."""
    counts.reset()
    graphs.reset()
    snapshots.reset()
    recorder = rank_recorder(flight_dir, BOOT, rank, pid=100 + rank)
    monkeypatch.setattr(snapshots, "RECORDER", recorder)
    for t in range(1, ticks + 1):
        issue(rank, t)
        recorder.armed = t != lost
        census.tick()


def issue(rank: int, t: int) -> None:
    """Ranks 0-3 of this host (rank 3 is far behind: it stops at tick 20).

    - world:0-3: rank 1 skips the all_reduce of tick 15;
    - tp:0-1: rank 0 issues one all_gather (tick 95) that rank 1 never does;
    - pp:0,2: rank 2 misses the receive of tick 99;
    - ep:0-2: ranks 0 and 1 join it at tick 50, rank 2 never does;
    - moe:0-3: created at tick 50, after the far-behind rank 3 stopped;
    - dp:3,7: a lone member here (rank 7 is on another host);
    - shared: a name without a rank list, counted by ranks 0 and 1.
    """
    if not (rank == 1 and t == 15):
        census.count("world:0-3", "all_reduce")
    if rank in (0, 1):
        census.count("tp:0-1", "all_reduce")
        census.count("shared", "barrier")
        if t >= 50:
            census.count("ep:0-2", "all_to_all")
    if rank == 0 and t == 95:
        census.count("tp:0-1", "all_gather")
    if rank == 0:
        census.count("pp:0,2", census.p2p_name("send", 2))
    if rank == 2 and t != 99:
        census.count("pp:0,2", census.p2p_name("recv", 0))
    if rank < 3 and t >= 50:
        census.count("moe:0-3", "all_reduce")
    if rank == 3:
        census.count("dp:3,7", "all_reduce")


def daemon_view(flight_dir: Path) -> tuple[dict[str, int], dict[tuple[str, str], dict[int, int]]]:
    """The collector's {group: latest common round} and {(group, op): {rank: deficit}}."""
    state = FlightState(flight_dir)
    state.refresh()
    s = scrape(lambda: census_collector.collect(state))
    rounds = {lb["group"]: int(v) for lb, v in s.get("rankscope_census_group_round", [])}
    lagging: dict[tuple[str, str], dict[int, int]] = {}
    for lb, v in s.get("rankscope_census_rank_deficit", []):
        lagging.setdefault((lb["group"], lb["op"]), {})[int(lb["rank"])] = int(v)
    return rounds, lagging


def report_view(flight_dir: Path) -> tuple[dict[str, int], dict[tuple[str, str], dict[int, int]]]:
    """The same from `rankscope census --json`: the groups' rounds and the divergent entries
    (a deficit: the highest count less the rank's)."""
    report = census_document(read_flight(flight_dir))
    rounds = {g["group"]: g["round"] for g in report["groups"] if g["round"] is not None}
    lagging: dict[tuple[str, str], dict[int, int]] = {}
    for e in report["entries"]:
        if e["divergent"]:
            top = max(e["counts"].values())
            lagging[(e["group"], e["op"])] = {r: top - e["counts"][str(r)] for r in e["lagging"]}
    return rounds, lagging


def test_the_daemon_and_the_report_name_the_same_round_ops_and_ranks(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for rank in range(4):
        run_rank(flight_dir, rank, 20 if rank == 3 else 100, issue, monkeypatch)
    want_rounds = {
        "world:0-3": 20,  # rank 3 far behind: compared at its last snapshot, not flagged
        "moe:0-3": 20,  # a member that never got to it: compared where all of them stand
        "dp:3,7": 20,  # a lone member: its own latest round, compared with nobody
        "tp:0-1": 100,
        "pp:0,2": 100,
        "ep:0-2": 100,
        "shared": 100,
    }
    want_lagging = {
        ("world:0-3", "all_reduce"): {1: 1},
        ("tp:0-1", "all_gather"): {1: 1},  # an op a member never issued counts as zero
        ("pp:0,2", "p2p 0>2"): {2: 1},
        ("ep:0-2", "all_to_all"): {2: 51},  # rank 2 never joined
    }
    daemon = daemon_view(flight_dir)
    report = report_view(flight_dir)
    assert daemon == (want_rounds, want_lagging)
    assert report == daemon
    doc = census_document(read_flight(flight_dir))
    lone = next(g for g in doc["groups"] if g["group"] == "dp:3,7")
    assert (lone["members"], lone["round"], lone["rounds_compared"]) == ([3], 20, 0)
    assert not [e for e in doc["entries"] if e["group"] in ("dp:3,7", "moe:0-3")]


def pairs(rank: int, t: int) -> None:
    census.count("world:0-1", "all_reduce")


def test_a_latest_snapshot_that_does_not_read_leaves_the_rank_at_its_last_readable_one(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1's line of round 40 has a count that does not read (negative): both readers
    skip it and compare rank 1 at round 30; the daemon does not drop it from the group."""
    run_rank(flight_dir, 0, 40, pairs, monkeypatch)
    run_rank(flight_dir, 1, 30, pairs, monkeypatch)
    unreadable = Census(round=40, every=EVERY, counts={("world:0-1", "all_reduce"): -1})
    assert snapshots.RECORDER.write_record(unreadable)
    want: tuple[dict[str, int], dict[tuple[str, str], dict[int, int]]] = ({"world:0-1": 30}, {})
    assert daemon_view(flight_dir) == want
    assert report_view(flight_dir) == want


def test_a_snapshot_lost_while_another_rank_is_behind_sends_both_to_an_older_round(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 stands at round 90; rank 2 lost its snapshot of round 90: the latest round all
    three have is 80, before the rounds the daemon reads first."""
    run_rank(flight_dir, 0, 100, world3, monkeypatch)
    run_rank(flight_dir, 1, 90, world3, monkeypatch)
    run_rank(flight_dir, 2, 100, world3, monkeypatch, lost=90)
    want: tuple[dict[str, int], dict[tuple[str, str], dict[int, int]]] = (
        {"world:0-2": 80},
        {("world:0-2", "all_reduce"): {2: 1}},
    )
    assert daemon_view(flight_dir) == want
    assert report_view(flight_dir) == want


def world3(rank: int, t: int) -> None:
    if not (rank == 2 and t == 42):  # rank 2 skips one
        census.count("world:0-2", "all_reduce")
