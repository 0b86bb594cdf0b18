"""Faults in the flight directory, against `rankscope serve` as a real process: a FIFO
renamed in, a file truncated or replaced while tailed, giant lines, symlinks out, the
directory lost, a huge query. Each test asserts the daemon keeps serving, promtool accepts
/metrics, the fault is logged clearly, and what was recorded before it is still published."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fault_daemon import Daemon, daemon, phase_stamps, run_rank
from tests.daemon.test_daemon_flightstate import GiB, mark, rank_recorder

BOOT = "boot-fault"


def posts(d: Daemon, boot: str) -> set[str]:
    return {
        labels["post"]
        for labels, _ in d.samples("rankscope_post_bytes")
        if labels.get("boot") == boot and labels.get("view") == "allocator"
    }


def write_marks(flight_dir: Path, phases: list[str], pid: int = 4242) -> Path:
    rec = rank_recorder(flight_dir, BOOT, 0, pid=pid)
    for i, phase in enumerate(phases):
        rec.write_record(mark(phase, reserved=(i + 1) * GiB, self_bytes=(i + 2) * GiB))
    (path,) = [p for p in flight_dir.iterdir() if str(pid) in p.name]
    return path


def test_a_fifo_renamed_into_the_directory_blocks_nothing(flight_dir: Path, tmp_path: Path) -> None:
    run_rank(flight_dir, BOOT, 3)
    with daemon(flight_dir, tmp_path) as d:
        before = phase_stamps(d, BOOT)
        assert before == ["phase_000", "phase_001", "phase_002"]
        fifo = tmp_path / "trap"
        os.mkfifo(fifo)
        os.rename(fifo, flight_dir / "trap.jsonl")  # between one scan and the next open
        for _ in range(3):
            assert phase_stamps(d, BOOT) == before
        assert d.get("/readyz")[0] == 200
        assert d.get("/api/v1/boots")[0] == 200
        assert "trap.jsonl is not a regular file; skipped" in d.log.read_text()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=10) == -signal.SIGTERM  # ends by the signal, as uvicorn did


def test_a_file_replaced_or_truncated_while_tailed_replaces_its_state(
    flight_dir: Path, tmp_path: Path
) -> None:
    phases = [f"phase_{i:03d}" for i in range(10)]
    path = write_marks(flight_dir, phases)
    chain = {f"{a}->{b}" for a, b in itertools.pairwise(phases)}
    with daemon(flight_dir, tmp_path) as d:
        assert phase_stamps(d, BOOT) == phases and posts(d, BOOT) == chain
        inode = path.stat().st_ino
        subprocess.run(["sed", "-i", "s/phase_009/phase_999/", str(path)], check=True)
        assert path.stat().st_ino != inode  # sed -i writes a new file
        renamed = [*phases[:9], "phase_999"]
        assert phase_stamps(d, BOOT) == renamed  # no duplicated marks
        assert posts(d, BOOT) == {f"{a}->{b}" for a, b in itertools.pairwise(renamed)}
        # The API and the CLI agree with /metrics.
        status, body = d.get(f"/api/v1/phases?boot={BOOT}")
        cli = subprocess.run(
            [sys.executable, "-m", "rankscope", "phases", str(flight_dir), "--json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        answer = json.loads(body)
        assert status == 200 and answer.pop("page")["truncated"] is False
        assert answer == json.loads(cli.stdout)
        # Truncated in place and written again: only the new lines count.
        os.truncate(path, 0)
        write_marks(flight_dir, ["restart_a", "restart_b"])
        assert phase_stamps(d, BOOT) == ["restart_a", "restart_b"]
        assert posts(d, BOOT) == {"restart_a->restart_b"}


def test_giant_lines_are_skipped_counted_and_named(flight_dir: Path, tmp_path: Path) -> None:
    path = write_marks(flight_dir, ["before"])
    with daemon(flight_dir, tmp_path) as d:
        assert phase_stamps(d, BOOT) == ["before"]
        with open(path, "ab") as f:
            f.write(b'{"v": 1, "blob": "' + b"x" * (9 << 20) + b'"}\n')  # terminated, 9 MiB
        write_marks(flight_dir, ["after_terminated"])
        # 9 MiB is more than one refresh reads (--flight.read-budget, 4 MiB): a few scrapes.
        assert stamps_within(d, ["after_terminated", "before"], 10.0)
        with open(path, "ab") as f:
            f.write(b"y" * (6 << 20))  # unterminated, and growing
        assert phase_stamps(d, BOOT) == ["after_terminated", "before"]
        with open(path, "ab") as f:
            f.write(b"y" * (1 << 20) + b"\n")
        write_marks(flight_dir, ["after_unterminated"])
        expected = ["after_terminated", "after_unterminated", "before"]
        assert stamps_within(d, expected, 10.0)
        skipped = {
            labels["reason"]: value
            for labels, value in d.samples("rankscope_flight_lines_skipped_total")
        }
        assert skipped["oversized"] == 2
        assert f"flight file {path.name} has oversized lines" in d.log.read_text()


def stamps_within(d: Daemon, expected: list[str], seconds: float) -> bool:
    """Whether the published phases become ``expected`` within ``seconds`` of scrapes."""
    deadline = time.monotonic() + seconds
    while phase_stamps(d, BOOT) != expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_symlinks_out_of_the_directory_are_not_followed(flight_dir: Path, tmp_path: Path) -> None:
    write_marks(flight_dir, ["inside"])
    outside = tmp_path / "outside"
    outside.mkdir()
    rec = rank_recorder(outside, "boot-outside", 0, pid=5151)
    rec.write_record(mark("secret"))
    (target,) = outside.iterdir()
    (flight_dir / "leak.jsonl").symlink_to(target)
    (flight_dir / "shadow.jsonl").symlink_to("/etc/shadow")
    with daemon(flight_dir, tmp_path) as d:
        text = d.metrics()
        assert "boot-outside" not in text and "secret" not in text
        assert phase_stamps(d, BOOT) == ["inside"]
        skipped = {lab["reason"]: v for lab, v in d.samples("rankscope_flight_lines_skipped_total")}
        assert sum(skipped.values()) == 0  # /etc/shadow was not read as malformed lines
        status, body = d.get("/api/v1/boots")
        assert status == 200 and b"boot-outside" not in body
        log = d.log.read_text()
        assert "leak.jsonl is a symlink; not followed" in log
        assert "shadow.jsonl is a symlink; not followed" in log


def test_losing_the_flight_directory_is_logged_and_recovered(
    flight_dir: Path, tmp_path: Path
) -> None:
    write_marks(flight_dir, ["kept"])
    with daemon(flight_dir, tmp_path) as d:
        assert phase_stamps(d, BOOT) == ["kept"]
        away = tmp_path / "away"
        flight_dir.rename(away)
        assert phase_stamps(d, BOOT) == []
        assert f"flight directory {flight_dir} is gone" in d.log.read_text()
        away.rename(flight_dir)
        assert phase_stamps(d, BOOT) == ["kept"]  # nothing recorded was lost
        assert f"flight directory {flight_dir} is back" in d.log.read_text()


def test_a_404_does_not_echo_a_huge_query(flight_dir: Path, tmp_path: Path) -> None:
    write_marks(flight_dir, ["kept"])
    with daemon(flight_dir, tmp_path) as d:
        status, body = d.get("/api/v1/phases?boot=" + "A" * 12_000)
        assert status == 404 and b"AAAA" in body and b"A" * 201 not in body
        # Past the 16 KiB request head: refused before the app, not echoed.
        status, body = d.get("/api/v1/phases?boot=" + "A" * 60_000)
        assert status == 400 and len(body) < 2000 and b"AAAA" not in body
        assert phase_stamps(d, BOOT) == ["kept"]


def test_the_cards_api_says_why_when_nvml_is_down(flight_dir: Path, tmp_path: Path) -> None:
    # No NVML on this machine: the real NVML source fails to open, as on a broken driver.
    write_marks(flight_dir, ["kept"])
    with daemon(flight_dir, tmp_path, "--collector.cards", "--device.source=nvml") as d:
        deadline = time.monotonic() + 20
        while True:
            status, body = d.get("/api/v1/cards")
            doc = json.loads(body)
            if (
                doc.get("why") and "not been tried" not in doc["why"]
            ) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 200 and doc["cards"] == []
        assert doc["why"].startswith("device source nvml is down: ") and "NVML" in doc["why"]
        up = {lab["source"]: v for lab, v in d.samples("rankscope_up")}
        assert up == {"flight": 1.0, "nvml": 0.0}
        assert phase_stamps(d, BOOT) == ["kept"]
