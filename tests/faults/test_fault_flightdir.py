"""One bad file in the flight directory fails alone, against `rankscope serve` as a real
process scraped over loopback: a mode-000 file (the daemon run without CAP_DAC_OVERRIDE,
as the chart's non-root context is), a file that turns unreadable after it was read, a
deeply nested line, a mistyped directory. In each, the other files lose nothing (boots,
lines, read positions), the fault is logged once and counted, /readyz stays 200 with the
unreadable count, the API answers, and nothing is deleted; the CLIs skip and count a deep
line without a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_daemon import Daemon, daemon, phase_stamps
from tests.daemon.test_daemon_flightstate import mark, rank_recorder

from rankscope.rank.writer import Recorder

# Root without the capabilities that read any file: mode 000 is then really unreadable.
NO_DAC = ("setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search")
DEEP = b"[" * 200_000 + b"]" * 200_000  # 400 KB of brackets, valid JSON
GOOD = "boot-good"
EVERY_BOOT = "--phases.boots=0"  # every boot's phase series, not only the newest

needs_setpriv = pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv")


def wait_for(what: str, ok: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not ok():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def marks(rec: Recorder, first: int, count: int) -> None:
    for i in range(first, first + count):
        rec.write_record(mark(f"phase_{i:03d}"))


def phases(count: int) -> list[str]:
    return [f"phase_{i:03d}" for i in range(count)]


def readiness(d: Daemon) -> dict[str, object]:
    status, body = d.get("/readyz")
    assert status == 200, body
    answer: dict[str, object] = json.loads(body)
    return answer


def unreadable_metric(d: Daemon) -> float:
    (value,) = [v for _, v in d.samples("rankscope_flight_files_unreadable")]
    return value


def boots(d: Daemon) -> list[str]:
    status, body = d.get("/api/v1/boots")
    assert status == 200, body
    return sorted(b["boot"] for b in json.loads(body)["boots"])


def unreadable_beside_good(
    flight_dir: Path, *, bad_marks: int, good_marks: int
) -> tuple[Path, Recorder]:
    """Boot "boot-bad" (rank 0, its file sorting first) made unreadable (mode 000) beside
    boot GOOD (rank 1): the bad file's path, and GOOD's recorder."""
    bad = rank_recorder(flight_dir, "boot-bad", 0, pid=1000)
    marks(bad, 0, bad_marks)
    good = rank_recorder(flight_dir, GOOD, 1, pid=4242)
    marks(good, 0, good_marks)
    bad_path = bad.path_for("marks")
    assert bad_path is not None
    bad_path.chmod(0)
    return bad_path, good


@needs_setpriv
def test_a_mode_000_file_fails_alone(flight_dir: Path, tmp_path: Path) -> None:
    bad_path, good = unreadable_beside_good(flight_dir, bad_marks=3, good_marks=5)
    files = sorted(flight_dir.iterdir())
    with daemon(flight_dir, tmp_path, EVERY_BOOT, wrap=NO_DAC) as d:
        wait_for("the good file read", lambda: phase_stamps(d, GOOD) == phases(5))
        assert readiness(d) == {
            "ready": True,
            "problems": [],
            "flight": {"files": 2, "unreadable": 1},
        }
        assert unreadable_metric(d) == 1
        assert boots(d) == [GOOD]
        # Appended lines of the good file are read once each: its position is kept.
        marks(good, 5, 2)
        wait_for("the appended lines", lambda: phase_stamps(d, GOOD) == phases(7))
        log = d.log.read_text()
        assert log.count(f"{bad_path.name} cannot be read (Permission denied)") == 1, log
        bad_path.chmod(0o644)
        wait_for("the file readable again", lambda: boots(d) == ["boot-bad", GOOD])
        assert phase_stamps(d, "boot-bad") == phases(3)
        assert unreadable_metric(d) == 0
        assert "is readable again" in d.log.read_text()
        assert phase_stamps(d, GOOD) == phases(7)
    assert sorted(flight_dir.iterdir()) == files  # the daemon deletes nothing


@needs_setpriv
def test_a_file_that_sorts_first_and_turns_unreadable_after_it_was_read(
    flight_dir: Path, tmp_path: Path
) -> None:
    first = rank_recorder(flight_dir, "boot-first", 0, pid=1000)
    marks(first, 0, 3)
    good = rank_recorder(flight_dir, GOOD, 1, pid=4242)
    marks(good, 0, 3)
    first_path = first.path_for("marks")
    assert first_path is not None
    with daemon(flight_dir, tmp_path, EVERY_BOOT, wrap=NO_DAC) as d:
        wait_for("both read", lambda: boots(d) == ["boot-first", GOOD])
        first_path.chmod(0)
        marks(first, 3, 1)  # its writer still appends
        marks(good, 3, 2)
        wait_for("the good file's new lines", lambda: phase_stamps(d, GOOD) == phases(5))
        wait_for("the failure counted", lambda: unreadable_metric(d) == 1)
        assert phase_stamps(d, "boot-first") == phases(3)  # what was read stays
        assert readiness(d)["flight"] == {"files": 2, "unreadable": 1}
        assert boots(d) == ["boot-first", GOOD]
        status, body = d.get("/api/v1/phases?boot=boot-first")
        assert status == 200, body
        assert f"{first_path.name} cannot be read" in d.log.read_text()
        first_path.chmod(0o644)
        wait_for("the rest of it read", lambda: phase_stamps(d, "boot-first") == phases(4))
        assert phase_stamps(d, GOOD) == phases(5)


def test_a_deeply_nested_line_is_skipped_and_counted(flight_dir: Path, tmp_path: Path) -> None:
    good = rank_recorder(flight_dir, GOOD, 0, pid=1000)
    marks(good, 0, 3)
    last = rank_recorder(flight_dir, "boot-last", 1, pid=9999)  # sorts last
    marks(last, 0, 1)
    last_path = last.path_for("marks")
    assert last_path is not None
    with open(last_path, "ab") as f:
        f.write(DEEP + b"\n")
    marks(last, 1, 1)  # a line after the deep one
    with daemon(flight_dir, tmp_path, EVERY_BOOT) as d:
        wait_for("the directory read", lambda: boots(d) == [GOOD, "boot-last"])
        assert phase_stamps(d, GOOD) == phases(3)
        assert phase_stamps(d, "boot-last") == phases(2)
        skipped = dict((labels["reason"], v) for labels, v in d.samples(SKIPPED))
        assert skipped["too_deep"] == 1
        assert readiness(d)["ready"] is True
        with open(good.path_for("marks") or "", "ab") as f:
            f.write(DEEP + b"\n")
        marks(good, 3, 1)
        wait_for("the line after it", lambda: phase_stamps(d, GOOD) == phases(4))
        assert dict((lb["reason"], v) for lb, v in d.samples(SKIPPED))["too_deep"] == 2
    for command in ("boots", "phases", "census", "oom"):
        run = subprocess.run(
            [sys.executable, "-m", "rankscope", command, str(flight_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Traceback" not in run.stderr, (command, run.stderr)
        assert run.returncode == 0, (command, run.stdout, run.stderr)
    shown = subprocess.run(
        [sys.executable, "-m", "rankscope", "phases", str(flight_dir), "--boot", GOOD],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "phase_003" in shown.stdout
    assert "2 too deep" in shown.stdout + shown.stderr


SKIPPED = "rankscope_flight_lines_skipped_total"


def test_a_mistyped_directory_is_not_ready_and_says_why(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with daemon(missing, tmp_path) as d:
        status, body = d.get("/readyz")
        assert status == 503, body
        assert json.loads(body)["problems"] == [f"flight directory {missing}: no such directory"]
        assert f"flight directory {missing} does not exist" in d.log.read_text()
        assert boots(d) == []
        d.metrics()  # still scraped, and promtool accepts it
        missing.mkdir()
        wait_for("ready once it exists", lambda: d.get("/readyz")[0] == 200)


@needs_setpriv
def test_the_clis_leave_out_an_unreadable_file_and_name_it(flight_dir: Path) -> None:
    bad_path, _ = unreadable_beside_good(flight_dir, bad_marks=2, good_marks=2)
    for command in ("boots", "phases"):
        run = subprocess.run(
            [*NO_DAC, sys.executable, "-m", "rankscope", command, str(flight_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, (command, run.stderr)
        assert "Traceback" not in run.stderr
        assert f"cannot read {bad_path.name} (Permission denied)" in run.stderr
        assert GOOD in run.stdout


FAILING_REFRESHES = """
import logging, sys
from rankscope.daemon.flightstate import FlightState
logging.basicConfig(format="%(message)s")
state = FlightState(sys.argv[1], use_inotify=False)  # every refresh retries every file
for _ in range(3):
    state.refresh()
print(state.health().unreadable)
"""


@needs_setpriv
def test_failing_files_are_logged_once_while_they_fail(flight_dir: Path) -> None:
    for pid in range(1000, 1007):
        rec = rank_recorder(flight_dir, "boot-bad", 0, pid=pid)
        marks(rec, 0, 1)
        path = rec.path_for("marks")
        assert path is not None
        path.chmod(0)
    run = subprocess.run(
        [*NO_DAC, sys.executable, "-c", FAILING_REFRESHES, str(flight_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.stdout.strip() == "7", run.stderr
    assert run.stderr.count("cannot be read (Permission denied)") == 5, run.stderr
    assert run.stderr.count(f"2 more flight files in {flight_dir} cannot be read") == 1
