"""A real Prometheus (Debian's package) scrapes a real `rankscope serve` driven by the
simulated device source: a 300 ms trough between two scrapes reaches PromQL through
rankscope_gpu_free_min_bytes and the breach counter, and a real foreign process is named."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.services import free_port, prometheus

from rankscope.daemon.devices import write_script
from rankscope.demo.services import daemon

GiB = 1 << 30


def card(free: int, procs: dict[str, int]) -> list[dict[str, Any]]:
    return [{"index": 0, "uuid": "GPU-sim-0", "model": "Simulated H200", "total": 80 * GiB,
             "free": free, "processes": procs}]  # fmt: skip


def poll(fn: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not seen within {timeout}s")


def test_prometheus_sees_a_trough_between_two_scrapes(tmp_path: Path, flight_dir: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "120"])
    script = tmp_path / "cards.json"
    procs = {str(sleeper.pid): 2 * GiB}
    write_script(script, card(40 * GiB, procs))
    port = free_port()
    flags = [f"--device.script={script}", "--corridor.floor=10GiB", "--sampler.interval=100ms",
             "--holdings.interval=200ms"]  # fmt: skip
    try:
        with (
            daemon(tmp_path, flight_dir, port, flags),
            prometheus(tmp_path / "prom", scrape_targets=[f"127.0.0.1:{port}"]) as prom,
        ):

            def value(expr: str) -> float | None:
                result = prom.query(expr)
                return float(result[0]["value"][1]) if result else None

            poll(lambda: value("rankscope_gpu_free_bytes") == 40 * GiB)
            assert value("rankscope_corridor_breaches_total") == 0

            write_script(script, card(4 * GiB, procs))
            time.sleep(0.3)
            write_script(script, card(40 * GiB, procs))

            poll(lambda: value("rankscope_corridor_breaches_total") == 1)
            assert value("rankscope_gpu_free_min_bytes") == 4 * GiB
            assert value("rankscope_gpu_free_bytes") == 40 * GiB
            assert value('rankscope_gpu_info{source="simulated"}') == 1
            assert value('rankscope_up{source="simulated"}') == 1
            [held] = prom.query('rankscope_gpu_process_bytes{role="foreign"}')
            assert (held["metric"]["pid"], held["metric"]["comm"]) == (str(sleeper.pid), "sleep")
            assert float(held["value"][1]) == 2 * GiB
    finally:
        sleeper.kill()
        sleeper.wait()
