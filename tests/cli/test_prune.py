"""`rankscope prune`: what goes is the files of the boots past every limit given; a file
that also holds a kept boot, whose writer still runs, or that holds no readable record
stays; --dry-run lists the same files and removes nothing."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from rankscope.cli import main
from rankscope.procfs import read_pidns_inode, read_start_ticks

DAY = 86400.0
NOW = time.time()


def write(flight_dir: Path, boot: str, pid: int, age_days: float, **who: object) -> str:
    """A marks file of ``boot`` whose last line is ``age_days`` old; its name."""
    header = {"host": "other-host", "pid": pid, "start_ticks": 7, "pidns": 1, **who}
    lines = [
        {"v": 1, "kind": "mark", "boot": boot, "rank": 0, "mono": float(i),
         "wall": NOW - age_days * DAY - 10 + i, "phase": f"phase_{i}", **header}
        for i in range(3)
    ]  # fmt: skip
    name = f"marks-{header['host']}-{pid}-{header['start_ticks']}.jsonl"
    with open(flight_dir / name, "a") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    return name


@pytest.fixture
def boots(flight_dir: Path) -> dict[str, str]:
    """Four boots, 30, 10, 3 and 0 days old: boot name -> its file."""
    ages = {"boot-30d": 30, "boot-10d": 10, "boot-3d": 3, "boot-now": 0}
    return {
        boot: write(flight_dir, boot, 100 + i, age) for i, (boot, age) in enumerate(ages.items())
    }


def prune(flight_dir: Path, *flags: str) -> int:
    return main(["prune", str(flight_dir), *flags])


def names(flight_dir: Path) -> set[str]:
    return {p.name for p in flight_dir.iterdir()}


def test_dry_run_lists_what_would_go_and_removes_nothing(
    flight_dir: Path, boots: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.name: p.read_bytes() for p in flight_dir.iterdir()}
    assert prune(flight_dir, "--keep-boots", "1", "--dry-run") == 0
    out = capsys.readouterr().out
    for boot in ("boot-30d", "boot-10d", "boot-3d"):
        assert f"would remove {boots[boot]} (boot {boot}," in out
    assert boots["boot-now"] not in out
    assert "would remove 3 files" in out
    assert {p.name: p.read_bytes() for p in flight_dir.iterdir()} == before


def test_keep_boots_keeps_the_newest(
    flight_dir: Path, boots: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert prune(flight_dir, "--keep-boots", "2") == 0
    assert names(flight_dir) == {boots["boot-3d"], boots["boot-now"]}
    assert "removed 2 files" in capsys.readouterr().out
    assert prune(flight_dir, "--keep-boots", "5") == 0
    assert names(flight_dir) == {boots["boot-3d"], boots["boot-now"]}


def test_older_than_and_both_limits(flight_dir: Path, boots: dict[str, str]) -> None:
    # Both: a boot goes only outside the 3 newest and older than 7 days.
    assert prune(flight_dir, "--keep-boots", "3", "--older-than", "7d") == 0
    assert names(flight_dir) == {boots[b] for b in ("boot-10d", "boot-3d", "boot-now")}
    assert prune(flight_dir, "--older-than", "1w") == 0
    assert names(flight_dir) == {boots["boot-3d"], boots["boot-now"]}


def test_what_stays_a_shared_file_a_running_writer_and_unread_files(
    flight_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = write(flight_dir, "boot-old", 200, 30)
    write(flight_dir, "boot-new", 200, 0)  # the same file, a newer boot appended
    me = {"host": socket.gethostname(), "pidns": read_pidns_inode(),
          "start_ticks": read_start_ticks()}  # fmt: skip
    running = write(flight_dir, "boot-old", os.getpid(), 30, **me)
    (flight_dir / "notes.txt").write_text("mine")
    (flight_dir / "junk.jsonl").write_text("not a record\n")
    before = names(flight_dir)
    assert prune(flight_dir, "--older-than", "1d") == 0
    assert names(flight_dir) == before
    assert f"kept {running}: its writer (pid {os.getpid()}) still runs" in capsys.readouterr().out
    assert shared in before


def test_a_limit_is_required(flight_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert prune(flight_dir) == 2
    assert "give --keep-boots N, --older-than DURATION or both" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prune(flight_dir, "--keep-boots", "0")
    with pytest.raises(SystemExit):
        prune(flight_dir, "--older-than", "soon")
