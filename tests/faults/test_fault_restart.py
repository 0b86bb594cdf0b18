"""A daemon restart seen through a real Prometheus (Debian's package): the breach counter
starts again from 0, process_start_time_seconds says so, and increase() over the restart
equals the breach seconds both daemons really counted (within a scrape interval each side).
The card is the SIMULATED scripted source, held below its floor the whole time."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fault_daemon import Daemon, daemon
from support.services import free_port, prometheus

COUNTER = "rankscope_corridor_breach_seconds_total"


def breach(d: Daemon) -> float:
    (value,) = [v for _, v in d.samples(COUNTER)]
    return value


def test_increase_over_a_restart_equals_the_true_breach_seconds(
    flight_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "cards.json"
    script.write_text(
        json.dumps({"cards": [{"index": 0, "uuid": "GPU-sim-0", "total": "80GiB", "free": "1GiB"}]})
    )
    port = free_port()
    args = (
        f"--web.listen-address=127.0.0.1:{port}",
        "--collector.cards",
        f"--device.script={script}",
        "--corridor.floor=2GiB",
        "--sampler.interval=100ms",
    )
    true_seconds = 0.0
    with prometheus(tmp_path / "prom", scrape_targets=[f"127.0.0.1:{port}"]) as prom:
        t0 = time.time()
        started = 0.0  # the start time of the daemon before
        for run in ("a", "b"):
            (tmp_path / run).mkdir()
            with daemon(flight_dir, tmp_path / run, *args, port=port) as d:
                deadline = time.monotonic() + 30
                # Scraped, and this daemon's figures, not the previous one's.
                fresh = f"{COUNTER} > 0 and on() (process_start_time_seconds > {started})"
                while not prom.query(fresh):
                    assert time.monotonic() < deadline, "Prometheus never scraped the daemon"
                    time.sleep(0.5)
                time.sleep(5)
                true_seconds += breach(d)  # what this daemon counted, read just before it stops
                started = max(v for _, v in d.samples("process_start_time_seconds"))
        time.sleep(2.5)  # the last scrapes are in
        window = f"{int(time.time() - t0) + 2}s"
        (increase,) = prom.query(f"increase({COUNTER}[{window}])")
        (changes,) = prom.query(f"changes(process_start_time_seconds[{window}])")
    assert float(changes["value"][1]) == 1  # one restart, visible
    measured = float(increase["value"][1])
    # Each daemon's last second before its stop may fall between scrapes.
    assert abs(measured - true_seconds) <= 2.5, (measured, true_seconds)
