"""The daemon's census states: live lines folded per process (a live line carries only what
changed, so none may be forgotten), and the census collector's state, stall and deficit
series, from records written by the real recorder."""

from __future__ import annotations

from pathlib import Path

from tests.daemon.test_daemon_flightstate import rank_recorder
from tests.support.pid_namespace import in_pid_namespace
from tests.support.waiting import wait_for

from rankscope.daemon.collectors import census
from rankscope.daemon.flightstate import FlightState
from rankscope.record import BlockedIn, CensusLive, of_kind
from rankscope.record.reader import read_flight
from rankscope.reports.census import census_document

AR = ("tp:0-1", "all_reduce")
AG = ("tp:0-1", "all_gather")


def test_live_lines_fold_into_one_with_every_count_and_the_newest_stall(flight_dir: Path) -> None:
    rec = rank_recorder(flight_dir, "b1", 0)
    rec.write_record(CensusLive({AR: 5, AG: 1}))
    rec.write_record(CensusLive({AR: 9}))
    rec.write_record(CensusLive({}, BlockedIn("tp:0-1", "all_reduce", 9, 50.0)))
    state = FlightState(flight_dir)
    assert state.refresh()
    (line,) = of_kind(state.flight().records, CensusLive)
    assert line.body.changed == {AR: 9, AG: 1}
    assert line.body.blocked_in == BlockedIn("tp:0-1", "all_reduce", 9, 50.0)


def samples(state: FlightState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in census.collect(state)
        for s in fam.samples
    }


def test_the_collector_names_stalled_ranks_their_collective_and_the_rank_behind(
    flight_dir: Path,
) -> None:
    for rank, n in ((0, 6), (1, 5)):
        rec = rank_recorder(flight_dir, "b1", rank)  # another host: alive unknown
        rec.write_record(CensusLive({AR: n}, BlockedIn("tp:0-1", "all_reduce", n, 10.0)))
    state = FlightState(flight_dir)
    state.refresh()
    got = samples(state)
    for rank in ("0", "1"):
        key = (("boot", "b1"), ("rank", rank))
        assert got["rankscope_census_rank_state", (*key, ("state", "stalled"))] == 1.0
        assert got["rankscope_census_rank_state", (*key, ("state", "running"))] == 0.0
        assert got["rankscope_census_since_progress_seconds", key] > 0
    behind = (("boot", "b1"), ("group", "tp:0-1"), ("op", "all_reduce"), ("rank", "1"))
    assert got["rankscope_census_latest_deficit", behind] == 1.0
    assert got["rankscope_census_blocked_collective", behind] == 5.0
    assert not any(
        name == "rankscope_census_latest_deficit" and ("rank", "0") in labels
        for name, labels in got
    )


INNER = """
import os, sys, time
from rankscope.rank.writer import RECORDER
from rankscope.record import BlockedIn, CensusLive
RECORDER.configure(flight_dir=sys.argv[1], boot_id="b-ns", rank=0, world_size=2)
stall = BlockedIn("world:0-1", "all_reduce", 3, time.time())
RECORDER.write_record(CensusLive({("world:0-1", "all_reduce"): 3}, stall))
print(os.getpid(), flush=True)
time.sleep(120)
"""


def test_a_rank_in_its_own_pid_namespace_is_judged_by_the_daemon_not_by_the_cli(
    flight_dir: Path,
) -> None:
    with in_pid_namespace(INNER, str(flight_dir)) as proc:
        assert proc.stdout is not None
        assert int(proc.stdout.readline()) == 1  # the namespace's first process
        state = FlightState(flight_dir)
        state.refresh()
        (rank,) = census_document(state.flight())["ranks"]
        assert (rank["state"], rank["alive"]) == ("stalled", True)  # its host pid, resolved
        # The CLI runs in another PID namespace: it cannot tell, and says so.
        (rank,) = census_document(read_flight(flight_dir))["ranks"]
        assert (rank["state"], rank["alive"]) == ("stalled", None)

    def dead() -> bool:
        state.refresh()
        (rank,) = census_document(state.flight())["ranks"]
        return bool(rank["state"] == "dead" and rank["alive"] is False)

    wait_for(dead, timeout=30, what="the namespaced rank named dead")
