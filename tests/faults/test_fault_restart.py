"""A daemon restart seen through a real Prometheus (Debian's package): the breach counter
starts again from 0, process_start_time_seconds says so, and increase() over the restart
equals the breach seconds both daemons really counted (within a scrape interval each side).
The card is the SIMULATED scripted source, held below its floor the whole time."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from fault_daemon import Daemon, daemon

from support.services import Prometheus, free_port, prometheus

COUNTER = "rankscope_corridor_breach_seconds_total"


def breach(d: Daemon) -> float:
    (value,) = [v for _, v in d.samples(COUNTER)]
    return value


def test_increase_over_a_restart_equals_the_true_breach_seconds(
    flight_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "cards.json"

    def set_free(gib: int) -> None:
        card = {"index": 0, "uuid": "GPU-sim-0", "total": "80GiB", "free": f"{gib}GiB"}
        tmp = tmp_path / "cards.tmp"
        tmp.write_text(json.dumps({"cards": [card]}))
        os.replace(tmp, script)

    def prom_value(prom: Prometheus) -> float | None:
        got = prom.query(COUNTER)
        return float(got[0]["value"][1]) if got else None

    set_free(10)  # above the floor until Prometheus has seen the daemon
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
                # Scraped, and this daemon's figures, not the previous one's.
                fresh = f"{COUNTER} and on() (process_start_time_seconds > {started})"
                wait_until(lambda q=fresh: prom.query(q), "Prometheus never scraped the daemon")
                set_free(1)  # below the floor: breach seconds accrue
                time.sleep(4)
                set_free(10)
                # What this daemon counted, once Prometheus has scraped its final figure.
                wait_until(lambda: prom_value(prom) == breach(d), "the final figure unscraped")
                final = breach(d)
                true_seconds += final
                started = max(v for _, v in d.samples("process_start_time_seconds"))
        window = f"{int(time.time() - t0) + 2}s"
        (increase,) = prom.query(f"increase({COUNTER}[{window}])")
        (changes,) = prom.query(f"changes(process_start_time_seconds[{window}])")
    assert float(changes["value"][1]) == 1  # one restart, visible
    assert true_seconds > 6
    # Exact but for increase()'s extrapolation at the window's end (the series is flat there).
    measured = float(increase["value"][1])
    assert true_seconds - 0.2 <= measured <= true_seconds * 1.1, (measured, true_seconds)


def wait_until(check: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)
