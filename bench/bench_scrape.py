"""Scrape latency and exposition size of `rankscope serve` at a big host's scale: 8 cards,
64 processes per card, 8 ranks with 50 census series each (plus their phase, post and arena
series), against prometheus_client's own exposition of the same series.

    python3 bench/bench_scrape.py [--scrapes 200]

Two figures, each as p50/p99 and as a ratio to the baseline measured in the same run:

- collect+encode: the daemon's registry (every collector runs, the flight tail included)
  encoded by generate_latest, vs a prometheus_client registry of plain Gauges holding the
  same series (what prometheus_client costs with no collection work at all);
- HTTP scrape: GET /metrics of the daemon (uvicorn and FastAPI), vs prometheus_client's own
  start_http_server serving that baseline registry.

Cards come from the SIMULATED device source (there is no GPU here); the 64 processes are
real `sleep` processes, so the holdings read their /proc entries as they would on a host.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from rankscope.daemon import cli
from rankscope.rank.writer import ProcessIdentity, RankIdentity, Recorder
from rankscope.record import (
    Census,
    Mark,
    MarkArena,
    MarkDerived,
    MarkDevice,
    MarkDriver,
    MarkNvml,
    MarkTorch,
)

CARDS, PROCS_PER_CARD, RANKS, CENSUS_SERIES = 8, 64, 8, 50
PHASES = (
    "pre_weight_load", "weights_loaded", "kv_pool_sized", "capture_begin",
    "capture_end", "nccl_init_end", "first_forward", "boot_complete",
)  # fmt: skip
GiB = 1 << 30


def write_flight(flight_dir: Path) -> None:
    for rank in range(RANKS):
        rec = Recorder(
            flight_dir=flight_dir,
            rank=RankIdentity(
                rank=rank,
                local_rank=rank,
                world_size=RANKS,
                tp_rank=rank,
                pp_rank=0,
                runner="target",
            ),
            process=ProcessIdentity(
                host="bench", pid=10_000 + rank, start_ticks=1, nspid=None, pidns=None
            ),
            boot="bench-boot",
        )
        for i, phase in enumerate(PHASES):
            rec.write_record(
                Mark(
                    phase,
                    device=MarkDevice(0, f"GPU-bench-{rank}", rank),
                    torch=MarkTorch(i * GiB, i * GiB, i * GiB, 0, 0),
                    driver=MarkDriver(80 * GiB - i * GiB, 80 * GiB),
                    nvml=MarkNvml(i * GiB + 512, {}),
                    arenas={"kv": MarkArena(40 * GiB, i * GiB, 0)},
                    derived=MarkDerived(512, True, None),
                )
            )
        counts = {(f"tp:0-{RANKS - 1}", f"op{k}"): 1000 + k for k in range(CENSUS_SERIES)}
        rec.write_record(Census(round=100, every=None, counts=counts))


def host_flags(root: Path, sleepers: list[subprocess.Popen[bytes]]) -> list[str]:
    """The flags of a daemon over a big host's flight directory and SIMULATED cards, each
    held by every one of ``sleepers``, written under ``root``."""
    flight_dir = root / "flight"
    write_flight(flight_dir)
    script = root / "cards.json"
    per_card = {str(p.pid): (1 + i) * (64 << 20) for i, p in enumerate(sleepers)}
    script.write_text(json.dumps({"cards": [
        {"index": c, "uuid": f"GPU-bench-{c}", "total": 80 * GiB, "free": 20 * GiB, "processes": per_card}
        for c in range(CARDS)
    ]}))  # fmt: skip
    return [
        f"--flight-dir={flight_dir}", f"--device.script={script}", "--corridor.floor=1GiB",
        f"--holdings.max-per-card={len(sleepers) + 1}",  # the default cadences otherwise
    ]  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def baseline_registry(text: str) -> CollectorRegistry:
    """A prometheus_client registry of plain Gauges holding exactly the series of ``text``."""
    registry = CollectorRegistry(auto_describe=False)
    gauges: dict[str, Gauge] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            gauge = gauges.get(sample.name)
            if gauge is None:
                gauge = gauges[sample.name] = Gauge(
                    sample.name, fam.documentation, sorted(sample.labels), registry=registry
                )
            (gauge.labels(**sample.labels) if sample.labels else gauge).set(sample.value)
    return registry


def time_pairs(
    ours: Callable[[], object], theirs: Callable[[], object], n: int
) -> tuple[list[float], list[float]]:
    """Alternate the two calls, so load from elsewhere on the machine hits both alike."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(n):
        for fn, out in ((ours, a), (theirs, b)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return a, b


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return bytes(resp.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def report(
    label: str,
    ours: list[float],
    base: list[float],
    names: tuple[str, str] = ("rankscope", "prometheus_client"),
    goal: str = "",
) -> None:
    """p50 and p99 of two samples of seconds, and their ratios."""
    p50, p99 = percentile(ours, 0.5), percentile(ours, 0.99)
    b50, b99 = percentile(base, 0.5), percentile(base, 0.99)
    print(
        f"{label:<16} {names[0]} p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms | "
        f"{names[1]} p50 {b50 * 1e3:7.2f} ms  p99 {b99 * 1e3:7.2f} ms | "
        f"ratio p50 {p50 / b50:5.2f}x  p99 {p99 / b99:5.2f}x{goal}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=200)
    opts = parser.parse_args()

    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(PROCS_PER_CARD)]
    server_proc: subprocess.Popen[bytes] | None = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            flags = host_flags(Path(tmp), sleepers)
            parser_ = argparse.ArgumentParser()
            cli.configure_parser(parser_, "serve")
            daemon = cli.build(parser_.parse_args(flags))
            daemon.sources.start()  # the card sampler, the holdings and the flight refresher
            registry = daemon.collectors.registry()
            deadline = time.monotonic() + 30
            while (
                generate_latest(registry).count(b"rankscope_gpu_process_bytes{")
                < CARDS * PROCS_PER_CARD
            ):
                if time.monotonic() > deadline:
                    raise SystemExit("the holdings never listed every process")
                time.sleep(0.1)
            text = generate_latest(registry).decode()
            series = sum(len(f.samples) for f in text_string_to_metric_families(text))
            base = baseline_registry(text)
            base_text = generate_latest(base)
            print(
                f"series: {series} (cards {CARDS} x {PROCS_PER_CARD} processes, {RANKS} ranks x {CENSUS_SERIES} census series, phases, posts, arenas, self)"
            )
            print(
                f"exposition: {len(text.encode())} bytes, gzip {len(gzip.compress(text.encode()))} | "
                f"prometheus_client: {len(base_text)} bytes | size ratio {len(text.encode()) / len(base_text):.2f}x"
            )
            ours, theirs = time_pairs(
                lambda: generate_latest(registry), lambda: generate_latest(base), opts.scrapes
            )
            report("collect+encode", ours, theirs)
            daemon.sources.stop()

            port, base_port = free_port(), free_port()
            server_proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rankscope",
                    "serve",
                    *flags,
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warning",
                ]
            )
            base_server, base_thread = start_http_server(base_port, addr="127.0.0.1", registry=base)
            url = f"http://127.0.0.1:{port}/metrics"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if (
                        http_get(url).count(b"rankscope_gpu_process_bytes{")
                        >= CARDS * PROCS_PER_CARD
                    ):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the daemon never served every process")
                time.sleep(0.2)
            base_url = f"http://127.0.0.1:{base_port}/metrics"
            ours, theirs = time_pairs(
                lambda: http_get(url), lambda: http_get(base_url), opts.scrapes
            )
            report("HTTP scrape", ours, theirs)
            base_server.shutdown()
            base_thread.join()
            server_proc.terminate()  # before its script and flight directory are removed
            server_proc.wait()
    finally:
        if server_proc is not None:
            server_proc.terminate()
            server_proc.wait()
        for p in sleepers:
            p.kill()
            p.wait()
    print(
        f"machine: {os.cpu_count()} cores; the sampler's cost per card is bench/bench_sampler.py's"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
