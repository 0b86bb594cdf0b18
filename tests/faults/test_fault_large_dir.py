"""A large flight directory at start-up, against `rankscope serve` as a real process: the
first scrape answers within a scrape timeout while /readyz says 503 "catching up", and once
the backlog is read every record is published and /readyz is 200."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fault_daemon import daemon

BOOT = "boot-large"
FILES = 300
FILE_BYTES = 100_000  # 300 files of 100 kB: 30 MB, read 4 MiB a refresh (about 8 refreshes)
BUDGET = "4MiB"
PHASES = 12


def mark_line(pid: int, i: int) -> bytes:
    """A mark of another host (never judged exited here), padded to a probe line's size
    with a large NVML process map."""
    line = {
        "v": 1,
        "kind": "mark",
        "boot": BOOT,
        "rank": pid,
        "local_rank": 0,
        "world_size": FILES,
        "host": "generated-host",
        "pid": pid,
        "start_ticks": 7,
        "nspid": [pid],
        "pidns": 1,
        "mono": float(i),
        "wall": 1.7e9 + pid + i,
        "phase": f"phase_{i:03d}",
        "extra": {"pad": "x" * (FILE_BYTES // PHASES - 400)},
    }
    return json.dumps(line).encode() + b"\n"


def generate(flight_dir: Path) -> int:
    total = 0
    for pid in range(1, FILES + 1):
        data = b"".join(mark_line(pid, i) for i in range(PHASES))
        (flight_dir / f"marks-generated-host-{pid}-7.jsonl").write_bytes(data)
        total += len(data)
    return total


def test_a_large_directory_is_read_over_refreshes_and_readiness_says_so(
    flight_dir: Path, tmp_path: Path
) -> None:
    size = generate(flight_dir)
    assert size > 25_000_000
    with daemon(flight_dir, tmp_path, f"--flight.read-budget={BUDGET}") as d:
        status, body = d.get("/readyz")
        assert status == 503, body
        assert "catching up" in json.loads(body)["problems"][0]
        d.metrics()  # answers within the scrape timeout (10 s), promtool accepts it

        deadline = time.monotonic() + 60
        while d.get("/readyz")[0] != 200:
            assert time.monotonic() < deadline, d.log.read_text()[-2000:]
            time.sleep(0.5)
        stamps = [
            labels
            for labels, _ in d.samples("rankscope_phase_timestamp_seconds")
            if labels.get("boot") == BOOT
        ]
        assert len(stamps) == FILES * PHASES  # every mark, once
        assert "caught up on" in d.log.read_text()
