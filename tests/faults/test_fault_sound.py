"""What was already sound, kept so, against one real `rankscope serve`: torn, malformed,
binary and future-schema lines; label injection; path traversal; huge queries and headers;
no command lines in labels; 2,000 scrapes without an fd or memory leak. (Covered elsewhere,
not repeated here: SIGKILL mid-append, tests/record/test_flight.py; unwritable and full disks and
torch absent, tests/rank/test_probe.py; basic-auth refusals and bad web configs,
tests/daemon/test_daemon_webconfig.py; NVML absent, tests/daemon/test_daemon_cards.py and
test_fault_flight.py.)"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_daemon import Daemon, daemon, phase_stamps
from tests.daemon.test_daemon_flightstate import mark, rank_recorder

EVIL = 'q"uo\\te\nnew\u2028line\u00e9\u4e2d}{'
SECRET = "--api-key=SECRET-IN-ARGV"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, int]]:
    root = tmp_path_factory.mktemp("sound")
    flight = root / "flight"
    flight.mkdir()
    holder = subprocess.Popen(["sleep", "600", SECRET])
    rec = rank_recorder(flight, "boot-sound", 0, pid=holder.pid, start_ticks=None)
    rec.write_record(mark("weights_loaded"))
    rec.write_record(mark(EVIL))  # a phase name as hostile as a label value gets
    with open(next(flight.iterdir()), "ab") as f:
        f.write(b'{"v": 1, "kind": "mark", "boot": "boot-sound", "hos\n')  # torn
        f.write(b"\x00\xff\xfe garbage \x80\x81\n")  # binary
        f.write(b'{"v": 99, "kind": "mark", "boot": "x", "host": "h", "pid": 1, "wall": 1}\n')
        f.write(b"[1, 2, 3]\n")  # malformed
    script = root / "cards.json"
    script.write_text(
        json.dumps(
            {"cards": [{"index": 0, "uuid": "GPU-sim-0", "total": "80GiB", "free": "10GiB",
                        "processes": {str(holder.pid): "4GiB"}}]}
        )
    )  # fmt: skip
    try:
        with daemon(
            flight, root, "--collector.cards", "--collector.holdings", f"--device.script={script}"
        ) as d:
            yield d, holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_bad_lines_are_counted_and_good_ones_kept(served: tuple[Daemon, int]) -> None:
    d, _ = served
    assert phase_stamps(d, "boot-sound") == sorted(["weights_loaded", EVIL])
    skipped = {lab["reason"]: v for lab, v in d.samples("rankscope_flight_lines_skipped_total")}
    assert skipped == {"torn": 1, "malformed": 2, "newer_schema": 1, "oversized": 0, "too_deep": 0}


def test_hostile_label_values_round_trip(served: tuple[Daemon, int]) -> None:
    d, _ = served
    d.metrics()  # promtool accepts the escaping
    assert EVIL in phase_stamps(d, "boot-sound")  # and the parser reads the value back whole


def test_no_command_line_reaches_a_label(served: tuple[Daemon, int]) -> None:
    d, pid = served
    held: list[dict[str, str]] = []
    for _ in range(50):  # the holdings scan runs on its own interval
        held = [
            labels for labels, _ in d.samples("rankscope_gpu_process_bytes")
            if labels.get("pid") == str(pid)
        ]  # fmt: skip
        if held:
            break
        time.sleep(0.2)
    assert held and held[0]["comm"] == "sleep"
    assert "SECRET-IN-ARGV" not in d.metrics()
    assert b"SECRET-IN-ARGV" not in d.get("/api/v1/cards")[1]


@pytest.mark.parametrize(
    "path",
    [
        "/static/../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/static/..%2f..%2f..%2fetc/passwd",
        "/api/v1/phases?boot=../../../../etc/passwd",
    ],
)
def test_path_traversal_reads_nothing_outside(served: tuple[Daemon, int], path: str) -> None:
    d, _ = served
    status, body = d.get(path)
    assert status in (400, 404) and b"root:" not in body


def test_huge_headers_and_queries_are_refused_and_serving_goes_on(
    served: tuple[Daemon, int],
) -> None:
    d, _ = served
    host, port = d.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"X-Big": "a" * 200_000})
        status = conn.getresponse().status
    except (ConnectionError, http.client.HTTPException):
        status = 0  # dropped: also a refusal
    finally:
        conn.close()
    assert status != 200
    # A request line past the 16 KiB bound on a request head: refused.
    assert d.get("/api/v1/census?boot=" + "B" * 100_000)[0] == 400
    assert d.get("/healthz")[0] == 200


def test_2000_scrapes_leak_no_fd_and_no_memory(served: tuple[Daemon, int]) -> None:
    d, _ = served
    host, port = d.url.removeprefix("http://").split(":")

    def fds() -> int:
        return len(os.listdir(f"/proc/{d.proc.pid}/fd"))

    def rss() -> int:
        for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def scrapes(n: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        for _ in range(n):
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            assert resp.status == 200
            resp.read()
        conn.close()

    scrapes(200)  # warm: caches and allocator arenas settle
    fd0, rss0 = fds(), rss()
    scrapes(2000)
    assert fds() <= fd0 + 2
    assert rss() - rss0 < 16 << 20, (rss0, rss())
