"""50 concurrent scrapes of one daemon registry: shared collection (what the daemon does)
against one collection per scrape taken in turn (what it did before), in the same run.

    python3 bench/bench_scrape_concurrent.py [--clients 50] [--rounds 5] [--work-ms 200]

Each scrape runs the daemon's TimedCollectors over a collector that costs --work-ms of CPU
(a stand-in for a large flight directory's collection), then encodes with client_python's
generate_latest. Prints p50 and p99 latency of each mode and their ratio (baseline / shared).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from rankscope.daemon.registry import TimedCollectors


class Busy:
    """A collector that burns CPU, as a big collection does, and yields 1,000 series."""

    name = "busy"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def collect(self) -> Iterator[Metric]:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        fam = GaugeMetricFamily("busy_series", "stand-in series", labels=["i"])
        for i in range(1000):
            fam.add_metric([str(i)], i)
        yield fam


class Serialized:
    """The baseline: every scrape takes the lock and runs its own collection."""

    def __init__(self, timed: TimedCollectors) -> None:
        self.timed = timed
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            return iter(self.timed._collect_once())


def latencies(collect: Callable[[], Iterator[Metric]], clients: int, rounds: int) -> list[float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(type("R", (), {"collect": staticmethod(collect)})())
    out: list[float] = []
    lock = threading.Lock()

    def scrape(start: threading.Barrier) -> None:
        start.wait()
        t0 = time.perf_counter()
        generate_latest(registry)
        with lock:
            out.append(time.perf_counter() - t0)

    for _ in range(rounds):
        barrier = threading.Barrier(clients)
        threads = [threading.Thread(target=scrape, args=(barrier,)) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work-ms", type=float, default=200.0)
    args = ap.parse_args()
    timed = TimedCollectors([Busy(args.work_ms / 1000)])
    base = latencies(Serialized(timed).collect, args.clients, args.rounds)
    shared = latencies(timed.collect, args.clients, args.rounds)
    for name, q in (("p50", 50), ("p99", 99)):
        b, s = pct(base, q), pct(shared, q)
        print(
            f"{args.clients} concurrent scrapes {name}: one-at-a-time {b * 1000:.0f} ms, "
            f"shared {s * 1000:.0f} ms, ratio {b / s:.1f}x"
        )


if __name__ == "__main__":
    main()
