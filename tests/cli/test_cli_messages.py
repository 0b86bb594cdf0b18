"""What the reader commands and the parser print for a person: control characters a program
wrote into its record reach the terminal escaped, and a wrong flag gets its subcommand's
usage and the flag it most likely meant. The commands run as real subprocesses, as a user
runs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli.test_oom_cli import oom_line, write
from tests.support.recorders import rank_recorder

from rankscope.cli import COMMANDS
from rankscope.record import Census, Mark

REPO = Path(__file__).resolve().parents[2]
# ESC[2J clears the screen, ESC]0;...BEL retitles the window, CR overwrites the line, and
# 0x9b is the one-byte CSI of C1.
BOOT = "boot\x1b[2J"
PHASE = "\x1b]0;owned\x07weights\rloaded"
GROUP = "tp\x9b31m:0-1"
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def rankscope(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "rankscope", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def hostile_flight(flight_dir: Path) -> None:
    """Two ranks of boot BOOT whose phase, group and holder names hold control characters."""
    for rank in range(2):
        recorder = rank_recorder(flight_dir, rank, boot=BOOT)
        for phase in ("start", PHASE):
            assert recorder.write_record(Mark(phase=phase))
        assert recorder.write_record(Census(round=10, every=10, counts={(GROUP, "send"): rank}))
    oom = oom_line(BOOT, 1000, 7, 0, 1796000000.0, phase=PHASE)
    oom["holders"][1]["comm"] = "py\x1b[8mthon"
    write(flight_dir, "oom-h-1000-7.jsonl", oom)


@pytest.mark.parametrize("command", ["boots", "phases", "census", "oom"])
def test_control_characters_in_a_record_reach_the_terminal_escaped(
    command: str, flight_dir: Path
) -> None:
    hostile_flight(flight_dir)
    done = rankscope(command, str(flight_dir))
    assert done.returncode in (0, 1), done.stderr  # census: 1, the ranks diverge
    assert RAW_CONTROL.findall(done.stdout) == []
    assert "boot\\x1b[2J" in done.stdout
    if command != "boots":
        shown = {"phases": "\\x1b]0;owned\\x07weights\\rloaded", "census": "tp\\x9b31m:0-1"}
        assert shown.get(command, "py\\x1b[8mthon") in done.stdout
    # The JSON document keeps the names as they are (JSON escapes them itself).
    if command != "boots":
        assert RAW_CONTROL.findall(rankscope(command, str(flight_dir), "--json").stdout) == []


def test_a_table_stays_aligned_around_an_escaped_name(flight_dir: Path) -> None:
    hostile_flight(flight_dir)
    lines = rankscope("boots", str(flight_dir)).stdout.splitlines()
    header, row = lines[0], lines[1]
    assert row.startswith("boot\\x1b[2J  ")
    # The escaped name's width sets the first column: the (right-aligned) dates end where
    # their header does.
    first_end = len("boot\\x1b[2J  ") + len("2026-01-01 00:00:00")
    assert header.index("first (UTC)") + len("first (UTC)") == first_end


def test_an_error_naming_a_hostile_boot_is_escaped(flight_dir: Path) -> None:
    hostile_flight(flight_dir)
    done = rankscope("phases", str(flight_dir), "--boot", "x\x1b[2J")
    assert done.returncode == 2
    assert RAW_CONTROL.findall(done.stderr.rstrip("\n")) == [] and "x\\x1b[2J" in done.stderr


def test_oom_takes_rankscope_dir_when_dir_is_left_out(flight_dir: Path) -> None:
    write(flight_dir, "oom-h-1000-7.jsonl", oom_line("b-env", 1000, 7, 0, 1796000000.0))
    done = rankscope("oom", env_extra={"RANKSCOPE_DIR": str(flight_dir)})
    assert done.returncode == 0, done.stderr
    assert "rank 0 pid 1000" in done.stdout
    env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_DIR"}
    bare = subprocess.run(
        [sys.executable, "-m", "rankscope", "oom"],
        env={**env, "PYTHONPATH": str(REPO / "exporter")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (bare.returncode, bare.stderr) == (2, "rankscope oom: give DIR or set RANKSCOPE_DIR\n")


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["serve", "--port", "19400"], "--port: did you mean --web.listen-address?"),
        (["serve", "--port=19400"], "--port: did you mean --web.listen-address?"),
        (["serve", "--floor", "2GiB"], "--floor: did you mean --corridor.floor?"),
        (["serve", "--flight.dri", "/x"], "--flight.dri: did you mean --flight.dir?"),
        (["run", "--flight-dir", "/x", "--", "true"], "--flight-dir: did you mean --dir?"),
        (["census", "/x", "--jsno"], "--jsno: did you mean --json?"),
        (["oom", "/x", "--boto", "b"], "--boto: did you mean --boot?"),
    ],
)
def test_a_wrong_flag_shows_its_subcommands_usage_and_what_it_meant(
    argv: list[str], meant: str
) -> None:
    done = rankscope(*argv)
    assert done.returncode == 2
    usage, error = done.stderr.split(f"rankscope {argv[0]}: error: ", 1)
    assert usage.startswith(f"usage: rankscope {argv[0]} ")
    assert error.startswith("unrecognized arguments: ")
    assert meant in [line.strip() for line in error.splitlines()[1:]]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_reports_an_unknown_flag_with_its_own_usage(command: str) -> None:
    done = rankscope(command, "--no-such-flag-at-all")
    assert done.returncode == 2
    assert done.stderr.startswith(f"usage: rankscope {command} "), done.stderr
    assert "unrecognized arguments: --no-such-flag-at-all" in done.stderr
    assert "did you mean" not in done.stderr  # nothing is close: no guess


def test_phases_counts_one_process_in_the_singular(flight_dir: Path) -> None:
    assert rank_recorder(flight_dir, 0, boot="b1").write_record(Mark(phase="start"))
    assert rankscope("phases", str(flight_dir)).stdout.startswith("boot b1: 1 process\n")
