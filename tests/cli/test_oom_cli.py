"""`rankscope oom DIR`: one line per OOM, holders named as ranks (by pid and start ticks against
every process's records) or foreign, largest first. Run as the real command on flight
directories written line by line here."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rankscope.cli import oom as oom_cli
from rankscope.procfs import HOST_PIDNS_INODE, read_start_ticks

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30
MiB = 1 << 20


def header(
    kind: str, boot: str, pid: int, start: int, rank: int | None, wall: float
) -> dict[str, Any]:
    return {
        "v": 1,
        "kind": kind,
        "boot": boot,
        "rank": rank,
        "host": "h1",
        "pid": pid,
        "start_ticks": start,
        "pidns": HOST_PIDNS_INODE,
        "mono": wall,
        "wall": wall,
    }


def write(flight_dir: Path, name: str, *records: dict[str, Any]) -> None:
    with open(flight_dir / name, "a") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")


def oom_line(
    boot: str, pid: int, start: int, rank: int, wall: float, **over: Any
) -> dict[str, Any]:
    rec = header("oom", boot, pid, start, rank, wall)
    rec.update(
        {
            "device": {"index": 0, "uuid": "GPU-aaaa", "nvml_index": 2, "why": None},
            "requested": 20 * GiB,
            "torch_free": 76 * MiB,
            "torch_limit": 80 * GiB,
            "allocator": {"reserved": 6 * GiB, "allocated": 5 * GiB, "num_ooms": 1, "why": None},
            "driver": {"free": 70 * MiB, "total": 80 * GiB, "why": None},
            "nvml": {"self_bytes": 6 * GiB, "procs": {}, "why": None},
            "pools": {"large": {"segments": 2, "reserved": 6 * GiB, "allocated": 5 * GiB}},
            "largest_free_block": 512 * MiB,
            "phase": "kv_pool_sized",
            "capturing": False,
            "holders": [
                {"pid": pid, "bytes": 6 * GiB, "comm": "python3", "start_ticks": start},
                # The same pid number as an old rank of boot b0 but a later start: recycled.
                {"pid": 300, "bytes": 70 * GiB, "comm": "pytest", "start_ticks": 999},
                {"pid": 400, "bytes": 3 * GiB, "comm": "python3", "start_ticks": 40},
            ],
            "why": None,
        }
    )
    rec.update(over)
    return rec


def rank_3_of_b1(flight_dir: Path) -> tuple[int, int]:
    """This test process stands for rank 3 of boot b1 (its pid and start ticks are real): a
    mark of it at wall 100. Its pid and start ticks."""
    me, start = os.getpid(), read_start_ticks()
    assert start is not None
    write(
        flight_dir,
        f"marks-h1-{me}-{start}.jsonl",
        {**header("mark", "b1", me, start, 3, 100.0), "phase": "x"},
    )
    return me, start


def run(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "rankscope", "oom", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def make_flight(flight_dir: Path) -> None:
    # boot b0 (older): rank 0 was pid 300 (start 30) and rank 1 is pid 400 (start 40).
    write(
        flight_dir,
        "marks-h1-300-30.jsonl",
        {**header("mark", "b0", 300, 30, 0, 100.0), "phase": "x"},
    )
    write(
        flight_dir,
        "marks-h1-400-40.jsonl",
        {**header("mark", "b0", 400, 40, 1, 101.0), "phase": "x"},
    )
    # boot b1 (latest): rank 3 is pid 500, and it fails.
    write(
        flight_dir,
        "marks-h1-500-50.jsonl",
        {**header("mark", "b1", 500, 50, 3, 200.0), "phase": "x"},
    )
    write(flight_dir, "oom-h1-500-50.jsonl", oom_line("b1", 500, 50, 3, 1796000000.0))


@contextlib.contextmanager
def serving(page: dict[str, Any]) -> Iterator[int]:
    """A real HTTP server (the standard library's) on loopback answering every GET with
    ``page`` as JSON; its port."""

    class OnePage(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(page).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), OnePage) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.server_address[1]
        finally:
            server.shutdown()


def test_one_line_per_oom_with_every_holder_named_largest_first(flight_dir: Path) -> None:
    make_flight(flight_dir)
    done = run(str(flight_dir))
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert "gpu 2 (GPU-aaaa)  rank 3 pid 500 (kv_pool_sized) asked 20.00 GiB" in line
    assert "free 0.07 GiB of 80.00 GiB" in line
    holders = line.split("holders: ")[1].split("; ")
    assert holders == [
        "300 pytest foreign 70.00 GiB",  # pid 300 of boot b0 had another start time
        "500 python3 rank 3 of boot b1 6.00 GiB",
        "400 python3 rank 1 of boot b0 3.00 GiB",  # a rank of an older boot, named as such
    ]


def test_json_in_bytes_and_boot_selection(flight_dir: Path) -> None:
    make_flight(flight_dir)
    doc = json.loads(run(str(flight_dir), "--json").stdout)
    (event,) = doc["ooms"]
    assert doc["boot"] == "b1" and event["requested"] == 20 * GiB and event["free"] == 76 * MiB
    assert [(h["pid"], h["role"], h["rank"]) for h in event["holders"]] == [
        (300, "foreign", None),
        (500, "rank", 3),
        (400, "rank", 1),
    ]
    older = run(str(flight_dir), "--boot", "b0")
    assert older.returncode == 0 and older.stdout == "no OOM recorded for boot b0\n"
    missing = run(str(flight_dir), "--boot", "nope")
    assert missing.returncode == 2 and "no boot 'nope'" in missing.stderr


def test_an_oom_without_holders_says_why(flight_dir: Path) -> None:
    write(
        flight_dir,
        "oom-h1-500-50.jsonl",
        oom_line(
            "b1",
            500,
            50,
            3,
            1796000000.0,
            holders=None,
            phase=None,
            phase_why="no mark before the OOM",
            nvml={"self_bytes": None, "procs": None, "why": "NVML unavailable: no driver"},
        ),
    )
    (line,) = run(str(flight_dir)).stdout.splitlines()
    assert "(no mark)" in line
    assert "holders: unknown (nvml: NVML unavailable: no driver; phase: no mark" in line


def test_a_daemon_address_that_answers_no_http_is_an_error_after_dir(flight_dir: Path) -> None:
    """--daemon at a port where something else listens (an SSH banner; a real socket) or an
    answer cut short: a `rankscope oom: daemon URL:` line and status 1, DIR still printed."""
    make_flight(flight_dir)
    (alone,) = run(str(flight_dir)).stdout.splitlines()
    answers = [b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n{"]
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)  # a failing run leaves the listener, not the test, waiting
        url = f"http://127.0.0.1:{server.getsockname()[1]}"

        def answer() -> None:
            for banner in answers:
                conn, _ = server.accept()
                with conn:
                    conn.recv(4096)
                    conn.sendall(banner)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        try:
            for _ in answers:
                got = run(str(flight_dir), "--daemon", url)
                assert got.returncode == 1, got.stderr
                assert f"rankscope oom: daemon {url}: not an HTTP answer" in got.stderr
                assert "Traceback" not in got.stderr
                assert got.stdout.splitlines() == [alone]
        finally:
            thread.join(10)


def test_a_daemon_whose_pages_lead_back_is_an_error_not_a_loop(flight_dir: Path) -> None:
    """A server (a real one, the standard library's) whose page.next leads back to a page
    already read: an error after DIR's lines, never an endless walk."""
    make_flight(flight_dir)
    (alone,) = run(str(flight_dir)).stdout.splitlines()
    with serving({"ooms": [], "page": {"next": "/api/v1/oom?offset=0"}}) as port:
        url = f"http://127.0.0.1:{port}"
        got = run(str(flight_dir), "--daemon", url)
    assert got.returncode == 1, got.stderr
    assert f"rankscope oom: daemon {url}: the pages lead back to /api/v1/oom?offset=0" in got.stderr
    assert got.stdout.splitlines() == [alone]


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:19400", True),
        ("http://127.8.9.1:19400/", True),
        ("http://localhost:19400", True),
        ("http://[::1]:19400", True),
        ("https://10.0.0.7:19400", False),
        ("http://daemon.example:19400", False),
        ("http://[fd00::1]:19400", False),
    ],
)
def test_a_daemon_on_this_hosts_loopback_is_reached_without_the_environments_proxy(
    url: str, loopback: bool
) -> None:
    assert oom_cli.on_loopback(url) is loopback


def test_a_daemon_given_as_host_and_port_is_reached_over_http(flight_dir: Path) -> None:
    """--daemon 127.0.0.1:PORT, no scheme, as the daemon's own --web.listen-address spells
    it: taken as http:// (a real server, the standard library's, answers one empty page).
    Before, urllib refused it: `<urlopen error unknown url type: 127.0.0.1>`."""
    make_flight(flight_dir)
    (alone,) = run(str(flight_dir)).stdout.splitlines()
    with serving({"ooms": [], "page": {"next": None}}) as port:
        got = run(str(flight_dir), "--daemon", f"127.0.0.1:{port}")
    assert (got.returncode, got.stderr) == (0, "")
    assert got.stdout.splitlines() == [alone]


def test_an_unreachable_or_unusable_daemon_address_is_said_plainly(flight_dir: Path) -> None:
    make_flight(flight_dir)
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    refused = run(str(flight_dir), "--daemon", f"127.0.0.1:{port}")
    assert refused.returncode == 1
    assert refused.stderr == f"rankscope oom: daemon http://127.0.0.1:{port}: Connection refused\n"
    ftp = run(str(flight_dir), "--daemon", "ftp://127.0.0.1:21")
    assert ftp.returncode == 2
    assert "'ftp://127.0.0.1:21' is not a daemon's address: give http://HOST:PORT" in ftp.stderr
    assert "urlopen" not in refused.stderr + ftp.stderr
