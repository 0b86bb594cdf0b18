"""The daemon's tail of the flight directory, and the record writer the daemon tests share.

Records are written by rankscope.rank.writer.Recorder, the probe's own writer, with the payload
a probe on a GPU host writes (the values are given here, since this machine has no GPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankscope.daemon import flightstate
from rankscope.daemon.flightstate import FlightState, RankProcess
from rankscope.rank.writer import ProcessIdentity, RankIdentity, Recorder
from rankscope.record import (
    Census,
    Mark,
    MarkArena,
    MarkDerived,
    MarkDevice,
    MarkDriver,
    MarkNvml,
    MarkTorch,
)

GiB = 1 << 30
MiB = 1 << 20
HOST_PIDNS = 4026531836


def rank_recorder(
    flight_dir: Path,
    boot: str,
    rank: int,
    *,
    pid: int | None = None,
    start_ticks: int | None = None,
    host: str = "node-a",
    tp_rank: int | None = None,
    pp_rank: int | None = 0,
    runner: str | None = "target",
) -> Recorder:
    pid = 4000 + rank if pid is None else pid
    return Recorder(
        flight_dir=flight_dir,
        rank=RankIdentity(
            rank=rank,
            local_rank=rank,
            world_size=8,
            tp_rank=rank if tp_rank is None else tp_rank,
            pp_rank=pp_rank,
            runner=runner,
        ),
        process=ProcessIdentity(
            host=host,
            pid=pid,
            start_ticks=900_000 + pid if start_ticks is None else start_ticks,
            nspid=(pid,),
            pidns=HOST_PIDNS,
        ),
        boot=boot,
    )


def mark(
    phase: str,
    *,
    gpu: int = 0,
    reserved: int | None = 1 * GiB,
    allocated: int | None = GiB // 2,
    self_bytes: int | None = 1 * GiB + 512 * MiB,
    free: int | None = 60 * GiB,
    total: int = 80 * GiB,
    arenas: dict[str, MarkArena] | None = None,
) -> Mark:
    """A mark as the probe writes it on a GPU host."""
    measured = reserved is not None and self_bytes is not None
    return Mark(
        phase=phase,
        device=MarkDevice(index=0, uuid=f"GPU-{gpu:04d}", nvml_index=gpu),
        torch=MarkTorch(
            reserved=reserved,
            allocated=allocated,
            peak_allocated=allocated,
            num_alloc_retries=0,
            num_ooms=0,
            why=None if reserved is not None else "torch absent",
        ),
        driver=MarkDriver(free=free, total=total),
        nvml=MarkNvml(self_bytes=self_bytes, procs={}),
        arenas=arenas or {},
        derived=MarkDerived(
            non_torch=self_bytes - reserved if measured else None,  # type: ignore[operator]
            non_torch_measured=measured,
        ),
    )


def census(round_: int, counts: list[list[Any]]) -> Census:
    return Census(round=round_, every=None, counts={(g, op): n for g, op, n in counts})


def test_refresh_reads_only_what_was_appended(flight_dir: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 0)
    rec.write_record(mark("pre_weight_load"))
    state = FlightState(flight_dir)
    assert state.refresh() and state.up
    assert [m.body.phase for st in state.view().streams for m in st.marks] == ["pre_weight_load"]
    rec.write_record(mark("weights_loaded"))
    rec.write_record(census(1, [["tp:0-7", "all_reduce", 5]]))
    state.refresh()
    view = state.view()
    phases = [m.body.phase for st in view.streams for m in st.marks]
    assert phases == ["pre_weight_load", "weights_loaded"]
    (census_stream,) = [st for st in view.streams if st.census is not None]
    assert census_stream.snapshot is not None and census_stream.snapshot.body.round == 1


def test_the_latest_boot_is_the_one_whose_first_record_is_newest(flight_dir: Path) -> None:
    old = rank_recorder(flight_dir, "boot-old", 0, pid=100)
    old.write_record(mark("pre_weight_load"))
    new = rank_recorder(flight_dir, "boot-new", 0, pid=200)
    new.write_record(mark("pre_weight_load"))
    old.write_record(mark("weights_loaded"))  # a late line of the old boot
    state = FlightState(flight_dir)
    state.refresh()
    view = state.view()
    assert view.boots == ("boot-old", "boot-new")
    assert view.latest_boot == "boot-new"
    assert view.recent_boots(1) == {"boot-new"}
    assert view.recent_boots(0) == {"boot-old", "boot-new"}


def test_a_removed_file_takes_its_state_with_it(flight_dir: Path) -> None:
    old = rank_recorder(flight_dir, "boot-old", 0, pid=100)
    old.write_record(mark("pre_weight_load"))
    new = rank_recorder(flight_dir, "boot-new", 0, pid=200)
    new.write_record(mark("pre_weight_load"))
    state = FlightState(flight_dir)
    state.refresh()
    assert state.view().boots == ("boot-old", "boot-new")
    path = new.path_for("marks")
    assert path is not None
    path.unlink()
    state.refresh()
    assert state.view().boots == ("boot-old",)


def test_torn_and_newer_lines_are_counted_not_fatal(flight_dir: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 0)
    rec.write_record(mark("pre_weight_load"))
    path = rec.path_for("marks")
    assert path is not None
    with open(path, "ab") as f:
        f.write(b'{"v": 99, "kind": "mark", "boot": "b", "host": "h", "pid": 1, "wall": 1}\n')
        f.write(b"not json at all\n")
        f.write(b'{"v": 1, "kind": "mark", "bo\n')
    state = FlightState(flight_dir)
    state.refresh()
    assert state.view().skipped == {
        "torn": 1,
        "malformed": 1,
        "newer_schema": 1,
        "oversized": 0,
        "too_deep": 0,
    }
    assert len(state.view().streams[0].marks) == 1


def test_an_unreadable_directory_is_a_down_source_not_an_exception(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    state = FlightState(not_a_dir)
    assert state.refresh() is False
    assert state.up is False and state.error
    missing = FlightState(tmp_path / "absent")
    assert missing.refresh() is True  # no job has written yet: empty, and up


def test_rank_processes_carry_the_identity_the_holdings_match_on(flight_dir: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 3, pid=4242, start_ticks=777)
    rec.write_record(mark("pre_weight_load"))
    rec.write_record(census(1, []))
    other = rank_recorder(flight_dir, "boot-0", 0, pid=11)
    other.write_record(mark("pre_weight_load"))
    state = FlightState(flight_dir)
    procs = state.rank_processes()
    me = RankProcess(
        host="node-a", pid=4242, start_ticks=777, pidns=HOST_PIDNS, boot="boot-1", rank=3
    )
    # One entry per process (two streams, one process), the newest boot first.
    assert procs[0].boot == "boot-0" and procs[1] == me
    assert len(procs) == 2


def test_what_the_state_keeps_follows_the_files_present(flight_dir: Path) -> None:
    """Pid churn with files removed (log rotation): nothing per process outlives its file,
    the resolved host pids included."""
    state = FlightState(flight_dir)
    for pid in range(100, 140):
        rec = rank_recorder(flight_dir, "boot-1", 0, pid=pid)
        rec.write_record(mark("pre_weight_load"))
        state.refresh()
        path = rec.path_for("marks")
        assert path is not None
        path.unlink()
    state.refresh()
    assert state.view().streams == ()
    assert state._host_pids == {}  # the one per-process map a view does not show


def test_a_process_marking_in_a_loop_keeps_the_daemon_bounded(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flightstate, "MAX_MARKS_PER_PROCESS", 3)
    rec = rank_recorder(flight_dir, "boot-1", 0)
    for i in range(5):
        rec.write_record(mark(f"step{i}"))
    state = FlightState(flight_dir)
    state.refresh()
    (st,) = state.view().streams
    assert [m.body.phase for m in st.marks] == ["step2", "step3", "step4"]
    assert st.marks_forgotten == 2


def test_readiness_mid_refresh_reports_the_last_finished_polls_backlog(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for rank in (0, 1):
        rank_recorder(flight_dir, "boot-1", rank).write_record(mark("pre_weight_load"))
    state = FlightState(flight_dir, read_budget=1, use_inotify=False)
    state.refresh()
    backlog = state.health().backlog
    assert backlog > 0
    seen: list[int] = []
    poll_name = state._reader._poll_name  # the reader resets its count as a poll starts

    def watched(*args: Any) -> int:
        seen.append(state.health().backlog)
        return poll_name(*args)

    monkeypatch.setattr(state._reader, "_poll_name", watched)
    state.refresh()
    assert seen and set(seen) == {backlog}
