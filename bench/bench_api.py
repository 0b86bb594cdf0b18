"""What /api/v1/phases and /api/v1/census cost with 1 and with 1,000 files in the flight
directory, as ratios measured in the same run.

    python3 bench/bench_api.py [--requests N] [--files N]

The latest boot is the same in both directories: two ranks, each with a marks file (four
marks) and a census file (20 snapshots); the larger directory adds older boots, one file
each, as a flight directory that is never cleaned up holds them. Each request goes to the
daemon's app on its own HTTP server over loopback (one kept-alive connection), which answers
from the tailed FlightState. In the daemon a refresher thread tails the directory once a second, off the
request path; here the state is refreshed once before the requests and the request path is
timed alone, and the refresh's own cost (one listing and one open per file) is printed next
to it. The baseline is the path the API took before: a one-shot read of the whole directory
per request (read_flight + the same document).

Goal: the API's cost with 1,000 files within a few per cent of its cost with 1 (a ratio near
1.0x), where the one-shot read grows with the directory.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.registry import CollectorRegistry

from rankscope.daemon import app as app_module
from rankscope.daemon.app import create_app
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.server import serving
from rankscope.rank.writer import ProcessIdentity, RankIdentity, Recorder
from rankscope.record import Census, Mark, MarkDevice, MarkDriver, MarkNvml, MarkTorch
from rankscope.record.reader import read_flight
from rankscope.reports.census import census_document
from rankscope.reports.ledger import phases_document

GiB = 1 << 30
HOST_PIDNS = 0xEFFFFFFC


def recorder(flight: Path, boot: str, rank: int, pid: int) -> Recorder:
    return Recorder(
        flight_dir=flight,
        boot=boot,
        rank=RankIdentity(rank=rank, world_size=2, tp_rank=rank),
        process=ProcessIdentity("bench", pid, 1000 + pid, (pid,), HOST_PIDNS),
    )


def fill(flight: Path, old_boots: int) -> None:
    """The latest boot (2 ranks, 4 files) and ``old_boots`` older boots of one file each."""
    for i in range(old_boots):
        recorder(flight, f"old-{i:04d}", 0, 10_000 + i).write_record(Mark("pre_weight_load"))
    time.sleep(0.01)  # the latest boot begins last
    for rank in range(2):
        rec = recorder(flight, "latest", rank, 100 + rank)
        for step, phase in enumerate(("pre_weight_load", "weights_loaded", "kv", "ready")):
            rec.write_record(
                Mark(
                    phase,
                    device=MarkDevice(rank, f"GPU-{rank}", rank),
                    torch=MarkTorch(reserved=step * GiB, allocated=step * GiB),
                    driver=MarkDriver(free=(70 - step) * GiB, total=80 * GiB),
                    nvml=MarkNvml(self_bytes=step * GiB + GiB // 2, procs={100 + rank: GiB}),
                )
            )
        for r in range(50, 1001, 50):
            rec.write_record(Census(round=r, every=50, counts={("tp:0-1", "all_reduce"): r}))


def per_request_us(fn: Callable[[], Any], requests: int, repeats: int = 5) -> float:
    fn()  # warm: the first request tails the whole directory once
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(requests):
            fn()
        samples.append((time.perf_counter() - start) / requests * 1e6)
    return statistics.median(samples)


def measure(flight: Path, requests: int) -> dict[str, float]:
    state = FlightState(flight)
    app = create_app(
        registry=CollectorRegistry(),
        state=state,
    )
    stack = contextlib.ExitStack()
    server = stack.enter_context(serving(app))
    host, port = server.address
    client = http.client.HTTPConnection(host, port, timeout=30)
    stack.callback(client.close)
    state.refresh()
    app_module.API_REFRESH_S = float("inf")  # the refresher's job, timed apart below

    def get(path: str) -> Callable[[], Any]:
        def call() -> Any:
            client.request("GET", path)
            response = client.getresponse()
            body = response.read()
            assert response.status == 200, body[:500]
            return body

        return call

    with stack:
        return timed(state, flight, requests, get)


def timed(
    state: FlightState, flight: Path, requests: int, get: Callable[[str], Callable[[], Any]]
) -> dict[str, float]:
    figures = {
        "refresh with nothing new (once a second)": per_request_us(state.refresh, 20),
        "api phases": per_request_us(get("/api/v1/phases"), requests),
        "api census": per_request_us(get("/api/v1/census"), requests),
        "one-shot read + phases (before)": per_request_us(
            lambda: phases_document(read_flight(flight)), max(requests // 10, 5)
        ),
        "one-shot read + census (before)": per_request_us(
            lambda: census_document(read_flight(flight)), max(requests // 10, 5)
        ),
    }
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")
    with tempfile.TemporaryDirectory() as small, tempfile.TemporaryDirectory() as large:
        fill(Path(small), 0)
        fill(Path(large), args.files - 4)
        files = {d: len(os.listdir(d)) for d in (small, large)}
        one = measure(Path(small), args.requests)
        many = measure(Path(large), args.requests)
    print(f"{'per call':<42} {files[small]:>6} files {files[large]:>6} files   ratio")
    for name in one:
        print(
            f"{name:<42} {one[name]:9.0f} us {many[name]:9.0f} us   {many[name] / one[name]:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
