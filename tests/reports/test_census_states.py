"""Each rank's census state and the comparison at the latest counts, on flight directories
written by the real recorder (one Recorder per rank process) and read by the real reader."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.recorders import rank_recorder

from rankscope.cli.census import healthy, render_text
from rankscope.procfs import read_pidns_inode, read_start_ticks
from rankscope.rank.writer import Recorder
from rankscope.record import BlockedIn, Census, CensusDump, CensusLive
from rankscope.record.reader import read_flight
from rankscope.reports.census import build_report, census_document

W = "world:0-2"
AR = (W, "all_reduce")
AG = (W, "all_gather")


def recorder(
    flight_dir: Path, rank: int, *, host: str = "h", pid: int = 0, ticks: int = 7
) -> Recorder:
    return rank_recorder(
        flight_dir, rank, host=host, pid=pid, ticks=ticks, pidns=read_pidns_inode()
    )


def live(
    rec: Recorder, counts: dict[tuple[str, str], int], stall: tuple[Any, ...] | None = None
) -> None:
    blocked = None if stall is None else BlockedIn(*stall)
    assert rec.write_record(CensusLive(counts, blocked))


def report(flight_dir: Path, alive: Any = None) -> dict[str, Any]:
    flight = read_flight(flight_dir)
    if alive is None:
        return census_document(flight)
    return build_report(flight.records, boot=flight.boot, alive=alive)


def unknown(*_: Any) -> None:
    return None


def by_op(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["op"]: e for e in entries}


def test_a_hang_names_every_rank_stalled_the_op_each_is_in_and_the_rank_behind(
    flight_dir: Path,
) -> None:
    recs = [recorder(flight_dir, r) for r in range(3)]
    for rec in recs:
        live(rec, {AR: 5})
    live(recs[0], {AR: 6}, (W, "all_reduce", 6, 100.0))
    live(recs[1], {AR: 6}, (W, "all_reduce", 6, 100.5))
    live(recs[2], {AG: 1}, (W, "all_gather", 1, 100.2))
    doc = report(flight_dir, unknown)
    assert doc["states"]["stalled"] == [0, 1, 2]
    assert [r["blocked_in"] for r in doc["ranks"]] == [
        {"group": W, "op": "all_reduce", "seq": 6, "since": 100.0},
        {"group": W, "op": "all_reduce", "seq": 6, "since": 100.5},
        {"group": W, "op": "all_gather", "seq": 1, "since": 100.2},
    ]
    ops = by_op(doc["latest"])
    assert ops["all_reduce"]["counts"] == {"0": 6, "1": 6, "2": 5}
    assert ops["all_reduce"]["lagging"] == [2]
    assert ops["all_gather"]["lagging"] == [0, 1]
    assert doc["divergent"] is True
    assert not healthy(doc)
    assert doc["skews"][0]["until"] is None  # still standing
    text = render_text(doc)
    assert f"rank 2: stalled in {W} all_gather #1" in text
    assert "process unknown: not on this host" in text
    assert f"{W}  all_reduce  0:6 1:6 2:5             DIVERGENT, lagging: 2" in text


def test_running_ranks_are_not_compared_at_counts_in_flux(flight_dir: Path) -> None:
    # Written a moment apart, live counts of running ranks differ without any skew.
    for r in range(3):
        live(recorder(flight_dir, r), {AR: 100 + 10 * r})
    doc = report(flight_dir, unknown)
    assert doc["states"]["running"] == [0, 1, 2]
    assert doc["latest"] == [] and doc["skews"] == []
    assert doc["divergent"] is False and healthy(doc)


def test_a_stall_at_equal_counts_is_stalled_but_not_divergent(flight_dir: Path) -> None:
    for r in range(3):
        live(recorder(flight_dir, r), {AR: 7}, (W, "all_reduce", 7, 50.0))
    doc = report(flight_dir, unknown)
    assert doc["divergent"] is False
    assert all(not e["divergent"] for e in doc["latest"])
    assert not healthy(doc)  # a stalled rank: exit status 1


def test_exited_ranks_are_compared_at_their_exit_counts(flight_dir: Path) -> None:
    for r, n in enumerate((4, 4, 3)):
        rec = recorder(flight_dir, r)
        live(rec, {AR: n})
        assert rec.write_record(CensusDump(reason="exit", round=0, every=50, counts={AR: n}))
    doc = report(flight_dir, unknown)
    assert doc["states"]["exited"] == [0, 1, 2]
    assert by_op(doc["latest"])["all_reduce"]["lagging"] == [2]
    assert doc["divergent"] is True


def test_a_manual_dump_is_no_exit_line(flight_dir: Path) -> None:
    rec = recorder(flight_dir, 0)
    assert rec.write_record(CensusDump(reason="manual", round=0, every=50, counts={AR: 1}))
    assert report(flight_dir, unknown)["ranks"][0]["state"] == "running"


def test_a_process_gone_without_an_exit_line_is_dead_here_and_unknown_elsewhere(
    flight_dir: Path,
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = read_start_ticks(gone.pid)
    gone.wait()
    here = socket.gethostname()
    live(recorder(flight_dir, 0, host=here, pid=gone.pid, ticks=ticks or 1), {AR: 3})
    live(
        recorder(flight_dir, 1, host=here, pid=os.getpid(), ticks=read_start_ticks() or 1), {AR: 3}
    )
    live(recorder(flight_dir, 2, host="another-host"), {AR: 3})
    doc = report(flight_dir)  # the one-shot reader judges from this host's /proc
    assert [r["alive"] for r in doc["ranks"]] == [False, True, None]
    assert [r["state"] for r in doc["ranks"]] == ["dead", "running", "running"]
    assert doc["dead_in_group"] == [0]
    assert doc["divergent"] is True


def test_a_skew_made_up_stays_named_in_the_skews(flight_dir: Path) -> None:
    recs = [recorder(flight_dir, r) for r in range(3)]
    for rec in recs:
        live(rec, {AR: 5})
    live(recs[0], {AR: 6}, (W, "all_reduce", 6, 10.0))
    live(recs[2], {AR: 6}, (W, "all_reduce", 6, 10.0))
    live(recs[1], {}, (W, "all_reduce", 5, 9.9))  # late: not in the collective yet
    for rec in recs:
        live(rec, {AR: 7})  # it caught up: everyone moves again
    doc = report(flight_dir, unknown)
    assert doc["states"]["running"] == [0, 1, 2]
    assert doc["divergent"] is False
    (skew,) = doc["skews"]
    assert (skew["op"], skew["lagging"], skew["counts"]) == (
        "all_reduce",
        [1],
        {"0": 6, "1": 5, "2": 6},
    )
    assert skew["resolved"] is True and skew["until"] >= skew["since"]
    assert "made up at" in render_text(doc)


def test_a_skew_whose_lagging_ranks_change_is_two_skews(flight_dir: Path) -> None:
    recs = [recorder(flight_dir, r) for r in range(3)]
    for rank, n in enumerate((6, 6, 5)):
        live(recs[rank], {AR: n}, (W, "all_reduce", n, 10.0))
    live(recs[2], {AR: 7}, (W, "all_reduce", 7, 11.0))  # past its peers, still standing
    doc = report(flight_dir, unknown)
    assert [(s["lagging"], s["resolved"]) for s in doc["skews"]] == [([2], True), ([0, 1], False)]


def test_live_lines_carry_only_changes_and_a_snapshot_counts_too(flight_dir: Path) -> None:
    rec = recorder(flight_dir, 0)
    live(rec, {AR: 5, AG: 2})
    live(rec, {AR: 9})
    assert rec.write_record(Census(round=10, every=10, counts={AR: 9, AG: 3}))
    (rank,) = report(flight_dir, unknown)["ranks"]
    assert rank["latest_counts"] == [[W, "all_gather", 3], [W, "all_reduce", 9]]


def test_the_latest_counts_are_the_highest_read_whatever_the_line_order(flight_dir: Path) -> None:
    # A snapshot taken before the watcher's live line can land after it, with lower counts.
    rec = recorder(flight_dir, 0)
    live(rec, {AR: 9})
    assert rec.write_record(Census(round=10, every=10, counts={AR: 7, AG: 3}))
    (rank,) = report(flight_dir, unknown)["ranks"]
    assert rank["latest_counts"] == [[W, "all_gather", 3], [W, "all_reduce", 9]]


def test_a_snapshot_at_round_0_keeps_its_wall_time(flight_dir: Path) -> None:
    rec = recorder(flight_dir, 0)
    assert rec.write_record(Census(round=0, every=10, counts={AR: 0}))
    (rank,) = report(flight_dir, unknown)["ranks"]
    assert rank["last_round"] == 0 and rank["last_snapshot_wall"] is not None, rank
