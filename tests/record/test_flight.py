"""The flight reader: parsing, boot scoping, the incremental tail, and what crashes leave.

Fixture files are written as the recorder writes them; the crash and multi-process cases run
real probe processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rankscope.record import (
    SCHEMA_VERSION,
    Census,
    Header,
    Mark,
    MarkArena,
    MarkDriver,
    MarkNvml,
    MarkTorch,
    UnknownKind,
    of_kind,
)
from rankscope.record.reader import (
    BootNotFoundError,
    FlightReader,
    parse_line,
    read_flight,
    summarize_boots,
)


def line(boot: Any = "b1", pid: Any = 100, wall: float = 1000.0, **fields: Any) -> bytes:
    """A mark line built from the writer's types; ``fields`` overwrite what it holds (to
    write what a broken or newer writer would)."""
    header = Header(v=SCHEMA_VERSION, kind="mark", boot="b1", host="h", pid=0, wall=0.0)
    rec = {**header.to_json(), **Mark("p").to_json(), "start_ticks": 7}
    rec.update(boot=boot, pid=pid, wall=wall, **fields)
    return json.dumps(rec).encode() + b"\n"


def write(path: Path, *lines: bytes) -> None:
    with open(path, "ab") as f:
        for data in lines:
            f.write(data)


# --- parse_line -----------------------------------------------------------------------------


def test_parse_line_sorts_what_it_cannot_read_into_reasons() -> None:
    good = line().rstrip(b"\n")
    parsed = parse_line(good)
    assert not isinstance(parsed, str) and parsed is not None
    assert isinstance(parsed.body, Mark) and parsed.body.phase == "p"
    assert parse_line(b"") is None
    assert parse_line(b"   ") is None
    assert parse_line(good[:40]) == "torn"
    assert parse_line(b"not json") == "malformed"
    assert parse_line(b"[1, 2]") == "malformed"
    assert parse_line(b'{"kind": "mark"}') == "malformed"  # no schema version
    assert parse_line(line(v=True).rstrip()) == "malformed"
    assert parse_line(line(pid="100").rstrip()) == "malformed"
    assert parse_line(line(boot=None).rstrip()) == "malformed"
    assert parse_line(line(wall=float("nan")).rstrip()) == "malformed"  # a line needs a time
    assert parse_line(line(phase=3).rstrip()) == "malformed"  # a mark needs its phase
    assert parse_line(line(v=SCHEMA_VERSION + 1).rstrip()) == "newer_schema"
    # A newer schema is reported even when its header no longer looks like ours.
    assert parse_line(json.dumps({"v": SCHEMA_VERSION + 1}).encode()) == "newer_schema"


def test_impossible_values_become_null_and_are_counted_per_field() -> None:
    bad: list[str] = []
    raw = line(
        mono=float("inf"),
        rank=True,
        torch=MarkTorch(reserved=-1, allocated=True, peak_allocated=5).to_json(),  # type: ignore[arg-type]
        driver=MarkDriver(free=2**50, total=80 << 30).to_json(),
        nvml={**MarkNvml(self_bytes=10).to_json(), "procs": {"12": 1e40, "x": 3, "13": 7}},
        arenas={"kv": {**MarkArena(backed=4).to_json(), "reserved": float("nan")}},
        derived={"non_torch": -(1 << 30), "non_torch_measured": True},
    )
    parsed = parse_line(raw.rstrip(), "f.jsonl", bad)
    assert parsed is not None and not isinstance(parsed, str)
    mark = parsed.body
    assert isinstance(mark, Mark)
    assert (parsed.header.mono, parsed.header.rank, parsed.header.file) == (None, None, "f.jsonl")
    assert (mark.torch.reserved, mark.torch.allocated, mark.torch.peak_allocated) == (None, None, 5)
    assert (mark.driver.free, mark.driver.total) == (None, 80 << 30)
    assert mark.nvml.self_bytes == 10 and mark.nvml.procs == {12: None, 13: 7}
    assert (mark.arenas["kv"].reserved, mark.arenas["kv"].backed) == (None, 4)
    assert mark.derived.non_torch == -(1 << 30)  # a residual is signed, never floored
    assert sorted(bad) == [
        "header.mono",
        "header.rank",
        "mark.arenas.reserved",
        "mark.driver.free",
        "mark.nvml.procs",
        "mark.nvml.procs",
        "mark.torch.allocated",
        "mark.torch.reserved",
    ]


def test_census_counts_that_do_not_read_are_null_not_zero() -> None:
    bad: list[str] = []
    good = Census(round=5, every=10, counts={("tp:0-1", "all_reduce"): 4})
    header = Header(v=SCHEMA_VERSION, kind="census", boot="b", host="h", pid=1, wall=1.0)
    parsed = parse_line(json.dumps({**header.to_json(), **good.to_json()}).encode(), "", bad)
    assert parsed is not None and not isinstance(parsed, str) and parsed.body == good
    rows = [["tp:0-1", "all_reduce", -4]]
    broken = {**header.to_json(), **good.to_json(), "counts": rows, "round": 1.5}
    parsed = parse_line(json.dumps(broken).encode(), "", bad)
    assert parsed is not None and not isinstance(parsed, str)
    assert isinstance(parsed.body, Census)
    assert (parsed.body.counts, parsed.body.round, parsed.body.every) == (None, None, 10)
    assert bad == ["census.round", "census.counts"]


# --- one-shot reads -------------------------------------------------------------------------


def test_read_flight_scopes_to_the_latest_boot_by_default(flight_dir: Path) -> None:
    write(
        flight_dir / "marks-h-100-7.jsonl", line("old", 100, 10.0), line("old", 100, 11.0, rank=0)
    )
    write(flight_dir / "marks-h-200-9.jsonl", line("new", 200, 20.0, rank=1, start_ticks=9))
    write(flight_dir / "marks-h-201-9.jsonl", line("new", 201, 21.0, rank=0, start_ticks=9))
    write(flight_dir / "notes.txt", b"not a flight file\n")

    flight = read_flight(flight_dir)
    assert flight.boot == "new"
    assert sorted(r.header.pid for r in flight.records) == [200, 201]
    assert [b.boot for b in flight.boots] == ["old", "new"]
    old, new = flight.boots
    assert (old.first_wall, old.last_wall, old.processes, old.ranks, old.latest) == (
        10.0,
        11.0,
        1,
        [0],
        False,
    )
    assert (new.processes, new.ranks, new.latest) == (2, [0, 1], True)
    assert all(r.header.file.startswith("marks-h-") for r in flight.records)

    named = read_flight(flight_dir, boot="old")
    assert named.boot == "old" and [r.header.wall for r in named.records] == [10.0, 11.0]

    every = read_flight(flight_dir, all_boots=True)
    assert every.boot is None and len(every.records) == 4

    with pytest.raises(BootNotFoundError, match=r"'gone'.*old, new"):
        read_flight(flight_dir, boot="gone")


def test_the_latest_boot_is_the_one_whose_first_record_is_newest(flight_dir: Path) -> None:
    # "long" started first and is still writing; "short" started later: short is the latest.
    write(flight_dir / "a.jsonl", line("long", 1, 10.0), line("long", 1, 99.0))
    write(flight_dir / "b.jsonl", line("short", 2, 50.0))
    assert read_flight(flight_dir).boot == "short"


def test_read_flight_on_bad_directories_says_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_flight(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        read_flight(tmp_path / "file")
    empty = read_flight(tmp_path)
    assert (empty.records, empty.boots, empty.boot) == ([], [], None)


def test_skips_are_counted_and_nothing_else_is_lost(flight_dir: Path) -> None:
    path = flight_dir / "marks-h-100-7.jsonl"
    write(
        path,
        line(wall=1.0),
        b"garbage\n",
        line(wall=2.0)[:30] + b"\n",  # a write that failed part-way, then the recovery newline
        line(wall=3.0),
        line(wall=4.0, v=SCHEMA_VERSION + 1),
        line(wall=5.0),
        line(wall=6.0)[:25],  # torn last line: no newline
    )
    flight = read_flight(flight_dir)
    assert [r.header.wall for r in flight.records] == [1.0, 3.0, 5.0]
    assert flight.skipped == {"torn": 2, "malformed": 1, "newer_schema": 1}


def test_an_unterminated_last_line_is_torn_even_if_it_parses(flight_dir: Path) -> None:
    write(flight_dir / "a.jsonl", line(wall=1.0), line(wall=2.0).rstrip(b"\n"))
    flight = read_flight(flight_dir)
    assert [r.header.wall for r in flight.records] == [1.0]
    assert flight.skipped["torn"] == 1


# --- the incremental tail -------------------------------------------------------------------


def test_reader_returns_only_what_was_appended_and_holds_back_partial_lines(
    flight_dir: Path,
) -> None:
    a = flight_dir / "marks-h-1-1.jsonl"
    write(a, line(wall=1.0))
    reader = FlightReader(flight_dir)
    assert [r.header.wall for r in reader.poll()] == [1.0]
    assert reader.poll() == []

    second = line(wall=2.0)
    write(a, second[:20])
    assert reader.poll() == []  # held back, not counted
    write(a, second[20:], line(wall=3.0))
    assert [r.header.wall for r in reader.poll()] == [2.0, 3.0]

    b = flight_dir / "census-h-2-1.jsonl"  # a file that appears later
    write(b, line(pid=2, wall=4.0, kind="census"), b"junk\n")
    got = reader.poll()
    assert [(r.header.wall, r.header.file) for r in got] == [(4.0, b.name)]
    assert reader.skipped == {"malformed": 1}
    assert sum(reader.skipped.values()) == 1


def test_reader_rereads_a_file_replaced_in_place(flight_dir: Path) -> None:
    a = flight_dir / "a.jsonl"
    write(a, line(wall=1.0), line(wall=2.0))
    reader = FlightReader(flight_dir)
    assert len(reader.poll()) == 2
    a.unlink()
    assert reader.poll() == []
    write(a, line(wall=9.0))
    assert [r.header.wall for r in reader.poll()] == [9.0]
    # Truncated to shorter than what was read: start again.
    a.write_bytes(b"")
    reader.poll()
    write(a, line(wall=10.0))
    assert [r.header.wall for r in reader.poll()] == [10.0]


def test_a_budgeted_poll_reads_at_most_its_budget_and_loses_nothing(flight_dir: Path) -> None:
    for name in ("a", "b", "c"):
        write(flight_dir / f"{name}.jsonl", *(line(wall=float(i)) for i in range(10)))
    total = sum(p.stat().st_size for p in flight_dir.iterdir())
    reader = FlightReader(flight_dir)
    budget = len(line()) * 4 + 17  # a budget that cuts lines
    walls: list[float] = []
    backlogs = []
    for _ in range(100):
        walls += [r.header.wall for r in reader.poll(budget)]
        backlogs.append(reader.backlog)
        if not reader.backlog:
            break
    assert backlogs[0] == total - budget
    assert backlogs == sorted(backlogs, reverse=True) and backlogs[-1] == 0
    assert len(backlogs) == -(-total // budget)  # ceil: every poll read its whole budget
    assert sorted(walls) == sorted(float(i) for i in range(10) for _ in range(3))
    assert reader.skipped.total() == 0


def test_reader_of_a_missing_directory_returns_nothing(tmp_path: Path) -> None:
    reader = FlightReader(tmp_path / "not-yet")
    assert reader.poll() == []
    (tmp_path / "not-yet").mkdir()
    write(tmp_path / "not-yet" / "a.jsonl", line())
    assert len(reader.poll()) == 1


# --- real processes -------------------------------------------------------------------------


def run_probe(code: str, flight: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "TORCHELASTIC"))
    }
    full_env.update(RANKSCOPE_DIR=str(flight), **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_three_processes_claiming_tp_rank_0_are_three_processes(flight_dir: Path) -> None:
    # Pipeline parallelism with TP=1: every stage is TP rank 0; the pid + start time tells
    # them apart. Three launches from this test process share its boot id.
    code = """
        from rankscope.rank import probe
        probe.configure(tp_rank=0, pp_rank=int(__import__("os").environ["STAGE"]))
        probe.mark("pre_weight_load")
        probe.mark("weights_loaded")
    """
    for stage in range(3):
        run_probe(code, flight_dir, RANK=str(stage), STAGE=str(stage))
    flight = read_flight(flight_dir)
    keys = {r.header.process_key for r in flight.records}
    assert len(keys) == 3
    assert {r.header.tp_rank for r in flight.records} == {0}
    assert sorted({r.header.pp_rank for r in flight.records}) == [0, 1, 2]
    (boot,) = summarize_boots(flight.records)
    assert (boot.processes, boot.ranks) == (3, [0, 1, 2])


def ends_mid_line(directory: Path) -> bool:
    files = list(directory.iterdir())
    if not files:
        return False
    with open(files[0], "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return False
        f.seek(size - 1)
        return f.read(1) != b"\n"


def test_sigkill_mid_append_costs_at_most_the_line_being_written(flight_dir: Path) -> None:
    # A regular file grows page by page during one write(2) of a 1 MiB line: kill the writer
    # the moment its file ends mid-line, so the kill lands inside an append.
    code = """
        from rankscope.rank import probe
        blob = "x" * (1 << 20)
        i = 0
        while True:
            probe.mark("loop", seq=i, blob=blob)
            if i == 3:
                print("ready", flush=True)
            i += 1
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    env["RANKSCOPE_DIR"] = str(flight_dir)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while not ends_mid_line(flight_dir) and time.monotonic() < deadline:
            pass
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    flight = read_flight(flight_dir)
    seqs = [r.body.extra["seq"] for r in of_kind(flight.records, Mark)]
    assert len(seqs) >= 4
    assert seqs == list(range(len(seqs)))  # every complete line, none lost or reordered
    assert flight.skipped == {"torn": 1}  # the line the kill interrupted, and nothing else
    (path,) = flight_dir.iterdir()
    assert not path.read_bytes().endswith(b"\n")

    # The tail holds the torn line back instead of counting it: it may yet be completed.
    reader = FlightReader(flight_dir)
    assert [r.body.extra["seq"] for r in of_kind(reader.poll(), Mark)] == seqs
    assert sum(reader.skipped.values()) == 0


def test_a_kind_this_reader_does_not_know_keeps_its_header(flight_dir: Path) -> None:
    # A newer writer of the same schema version may add a kind (rankscope.record.lines says how).
    write(flight_dir / "oom-h-7-7.jsonl", line(kind="from_the_future", boot="b9", pid=7))
    flight = read_flight(flight_dir)
    (rec,) = flight.records
    assert isinstance(rec.body, UnknownKind) and rec.body.kind == "from_the_future"
    assert (flight.boot, rec.header.pid, flight.skipped) == ("b9", 7, {})
