"""The census watcher: its step on a given clock (what it writes and when), and the real thread
writing real lines through the real recorder."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.waiting import wait_for

from rankscope.rank.census import counts, snapshots
from rankscope.rank.writer import RECORDER
from rankscope.record import CensusLive, of_kind
from rankscope.record.reader import read_flight

AR = ("tp:0-1", "all_reduce")
AG = ("tp:0-1", "all_gather")


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    counts.reset()
    snapshots.reset()
    yield
    snapshots.stop_watcher()
    counts.reset()
    snapshots.reset()


def test_lines_on_time_carry_what_changed_and_one_stall_line_names_the_collective() -> None:
    step = snapshots.Watcher(stall_s=1.0, period_s=1.0)
    assert step.poll(0.0, 100.0) is None  # nothing counted yet: nothing to say, no stall
    assert step.poll(5.0, 105.0) is None
    counts.count(*AR)
    counts.count(*AG)
    first = step.poll(5.2, 105.2)
    assert first is not None and first.changed == {AR: 1, AG: 1} and first.blocked_in is None
    counts.count(*AR)
    assert step.poll(5.4, 105.4) is None  # within the period: the next line waits
    line = step.poll(6.2, 106.2)
    assert line is not None and line.changed == {AR: 2}  # only what changed
    counts.count(*AR)
    assert step.poll(6.4, 106.4) is None
    pending = step.poll(7.2, 107.2)  # a period on: what changed since, though no stall yet
    assert pending is not None and pending.changed == {AR: 3} and pending.blocked_in is None
    stall = step.poll(7.4, 107.4)  # still for 1 s: the stall line, nothing new to count
    assert stall is not None and stall.changed == {}
    assert stall.blocked_in is not None
    blocked = stall.blocked_in
    assert (blocked.group, blocked.op, blocked.seq, blocked.since) == (
        "tp:0-1",
        "all_reduce",
        3,
        106.4,
    )
    assert step.poll(7.6, 107.6) is None  # one stall line per stall
    counts.count(*AG)
    resumed = step.poll(7.8, 107.8)  # progress after a stall is written at once, period or not
    assert resumed is not None and resumed.changed == {AG: 2} and resumed.blocked_in is None


def test_a_snapshot_line_counts_as_written(flight_dir: Path) -> None:
    RECORDER.configure(flight_dir=flight_dir, boot_id="b-watch", rank=0)
    try:
        step = snapshots.Watcher(stall_s=1.0, period_s=1.0)
        counts.count(*AR)
        counts.count(*AG)
        assert step.poll(0.0, 100.0) is not None
        counts.count(*AR)
        snapshots.take_snapshot()  # a census line with every count, written just now
        counts.count(*AR)
        full_at = snapshots.STATE.full_written
        assert full_at is not None
        assert step.poll(full_at[0] + 0.5, 101.0) is None  # a period after the snapshot
        line = step.poll(full_at[0] + 1.1, 101.6)
        assert line is not None and line.changed == {AR: 3}  # what changed since the snapshot
    finally:
        RECORDER.configure(flight_dir=None)


def test_the_thread_writes_a_stall_line_and_stops(flight_dir: Path) -> None:
    RECORDER.configure(flight_dir=flight_dir, boot_id="b-thread", rank=0)
    try:
        counts.count(*AR)
        assert snapshots.start_watcher(stall_s=0.3)
        assert snapshots.start_watcher(stall_s=0.3)  # idempotent: one thread
        names = [t.name for t in threading.enumerate()]
        assert names.count("rankscope-census-watcher") == 1

        def stalled() -> list[CensusLive]:
            lines = of_kind(read_flight(flight_dir).records, CensusLive)
            return [ln.body for ln in lines if ln.body.blocked_in is not None]

        (line,) = wait_for(stalled, timeout=30, what="a stall line")
        assert line.blocked_in is not None and line.blocked_in.op == "all_reduce"
        snapshots.stop_watcher()
        assert "rankscope-census-watcher" not in [t.name for t in threading.enumerate()]
    finally:
        RECORDER.configure(flight_dir=None)


def test_disarmed_the_watcher_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counts, "ARMED", False)
    assert snapshots.start_watcher() is False


def test_the_stall_time_reads_from_the_environment() -> None:
    assert snapshots.stall_from_env({}) == 1.0
    assert snapshots.stall_from_env({snapshots.ENV_STALL: "2.5"}) == 2.5
    assert snapshots.stall_from_env({snapshots.ENV_STALL: "0"}) == 1.0  # below 0.1 s: the default
