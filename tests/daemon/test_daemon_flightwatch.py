"""The flight state's refresh costs what changed: with inotify, an idle refresh opens no
file and lists no directory; a file that changed is the only one read; without inotify a
full pass by stat finds the same lines. Files created, appended, removed and replaced are
seen either way."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from tests.daemon.test_daemon_flightstate import mark, rank_recorder

from rankscope.daemon.dirwatch import DirWatch
from rankscope.daemon.flightstate import FlightState
from rankscope.procfs import HOST_PIDNS_INODE
from rankscope.record import reader


def phases(state: FlightState, boot: str) -> list[str]:
    return sorted(m.body.phase for st in state.view().streams if st.boot == boot for m in st.marks)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The flight files the reader opens, by name (a spy on the real open)."""
    names: list[str] = []
    real = reader._open_regular

    def spy(path: Path) -> int | None:
        names.append(path.name)
        return real(path)

    monkeypatch.setattr(reader, "_open_regular", spy)
    return names


def test_an_idle_refresh_opens_nothing_and_a_change_opens_one_file(
    flight_dir: Path, opened: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    recs = [rank_recorder(flight_dir, "boot-1", r) for r in range(20)]
    for rec in recs:
        rec.write_record(mark("start"))
    state = FlightState(flight_dir)
    assert state._watch.inotify
    state.refresh()
    assert len(opened) == 20
    listings: list[Path] = []
    real_listing = reader._flight_files
    monkeypatch.setattr(reader, "_flight_files", lambda d: listings.append(d) or real_listing(d))
    opened.clear()
    for _ in range(3):
        state.refresh()
    assert opened == [] and listings == []
    recs[7].write_record(mark("loaded"))
    state.refresh()
    path = recs[7].path_for("marks")
    assert path is not None
    assert opened == [path.name] and listings == []
    assert phases(state, "boot-1").count("loaded") == 1


def test_without_inotify_a_refresh_opens_only_what_grew(
    flight_dir: Path, opened: list[str]
) -> None:
    recs = [rank_recorder(flight_dir, "boot-1", r) for r in range(20)]
    for rec in recs:
        rec.write_record(mark("start"))
    state = FlightState(flight_dir, use_inotify=False)
    state.refresh()
    opened.clear()
    state.refresh()
    assert opened == []  # every file stat'ed, none opened
    recs[3].write_record(mark("loaded"))
    state.refresh()
    path = recs[3].path_for("marks")
    assert path is not None and opened == [path.name]


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "stat"])
def test_created_removed_and_replaced_files_are_seen(flight_dir: Path, inotify: bool) -> None:
    state = FlightState(flight_dir, use_inotify=inotify)
    assert state._watch.inotify is inotify
    state.refresh()
    first = rank_recorder(flight_dir, "boot-1", 0)
    first.write_record(mark("a"))
    state.refresh()
    assert phases(state, "boot-1") == ["a"]
    second = rank_recorder(flight_dir, "boot-1", 1)
    second.write_record(mark("b"))
    first.write_record(mark("c"))
    state.refresh()
    assert phases(state, "boot-1") == ["a", "b", "c"]
    assert state.health().files == 2
    path = first.path_for("marks")
    assert path is not None
    data = path.read_bytes()
    path.unlink()
    state.refresh()
    assert phases(state, "boot-1") == ["b"]
    path.write_bytes(data)  # back, as a new inode
    state.refresh()
    assert phases(state, "boot-1") == ["a", "b", "c"]


def test_a_watch_on_a_missing_directory_starts_once_it_exists(tmp_path: Path) -> None:
    directory = tmp_path / "later"
    watch = DirWatch(directory)
    assert watch.changes() is None  # no watch: look at everything (nothing there)
    directory.mkdir()
    assert watch.changes() is None  # the watch starts: what came before is unknown
    (directory / "x.jsonl").write_bytes(b"{}\n")
    assert watch.changes() == {"x.jsonl"}
    assert watch.changes() == set()
    directory.rename(tmp_path / "moved")
    assert watch.changes() is None  # the watched directory moved: watch anew


def test_a_process_gone_before_the_daemon_looked_is_gone_since_its_last_record(
    flight_dir: Path,
) -> None:
    """Old restarts of this host publish nothing; one that just ended keeps its grace."""
    host = socket.gethostname()
    for pid, age in ((999_990, 86400.0), (999_991, 5.0)):
        line = {"v": 1, "kind": "mark", "boot": "b", "host": host, "pid": pid, "start_ticks": 1,
                "pidns": HOST_PIDNS_INODE, "mono": 1.0, "wall": time.time() - age, "phase": "p"}  # fmt: skip
        (flight_dir / f"marks-{host}-{pid}-1.jsonl").write_text(json.dumps(line) + "\n")
    state = FlightState(flight_dir)
    state.refresh()
    assert [st.process.pid for st in state.view().streams] == [999_991]
    assert [b.processes for b in state.boots()] == [2]  # the API still lists both
