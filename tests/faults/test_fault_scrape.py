"""Scrape faults: many scrapes at once share one collection instead of queueing, and a
collection stuck past a scrape timeout shows on /readyz. The latency gain itself is measured
in bench/bench_scrape_concurrent.py, as a ratio; here only the sharing is counted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.core import GaugeMetricFamily, Metric

from rankscope.daemon.app import STUCK_SCRAPE_SECONDS, create_app
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import TimedCollectors


class Gate:
    """A collector that counts its runs and holds each until released."""

    name = "gate"

    def __init__(self) -> None:
        self.runs = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.runs += 1
        self.entered.set()
        self.release.wait(30)
        fam = GaugeMetricFamily("gate_runs", "runs so far")
        fam.add_metric([], self.runs)
        yield fam


def test_concurrent_scrapes_share_one_collection() -> None:
    gate = Gate()
    timed = TimedCollectors([gate])
    results: list[list[str]] = []

    def scrape() -> None:
        results.append([m.name for m in timed.collect()])

    first = threading.Thread(target=scrape)
    first.start()
    assert gate.entered.wait(10)
    others = [threading.Thread(target=scrape) for _ in range(49)]
    for t in others:
        t.start()
    while sum(t.is_alive() for t in others) < 49:  # every one is waiting, none finished
        time.sleep(0.01)
    assert timed.running_for() is not None
    gate.release.set()
    for t in [first, *others]:
        t.join(10)
    assert gate.runs == 1  # 50 scrapes, one collection
    assert len(results) == 50 and all("gate_runs" in names for names in results)
    assert timed.running_for() is None
    list(timed.collect())  # the next scrape collects afresh
    assert gate.runs == 2


def test_readyz_reports_a_stuck_collection(
    flight_dir: Path, serve_app: Callable[[Any], httpx.Client]
) -> None:
    running: list[float | None] = [None]
    app = create_app(
        registry=TimedCollectors().registry(),
        state=FlightState(flight_dir),
        collecting=lambda: running[0],
    )
    client = serve_app(app)
    assert client.get("/readyz").status_code == 200
    running[0] = STUCK_SCRAPE_SECONDS / 2  # slow but within a scrape timeout
    assert client.get("/readyz").status_code == 200
    running[0] = STUCK_SCRAPE_SECONDS + 5
    answer = client.get("/readyz")
    assert answer.status_code == 503
    assert any("collecting for 15s" in p for p in answer.json()["problems"])
