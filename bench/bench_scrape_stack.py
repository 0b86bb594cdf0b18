"""Scrape latency of this checkout's `rankscope serve` against an older checkout's (the code
before the daemon moved onto uvicorn and FastAPI), at a big host's scale (bench_scrape.py's
flight directory, 8 SIMULATED cards each held by 64 real `sleep` processes).

    git worktree add /tmp/base29 398695f
    python3 bench/bench_scrape_stack.py [--baseline /tmp/base29] [--scrapes 300]

Both daemons run at once from the same interpreter (each with its checkout's exporter/ first
on PYTHONPATH), over the same flight directory and cards; scrapes alternate between them, a
new connection each, so load from elsewhere on the machine hits both alike. Two kinds of
scrape, each p50 and p99 and their ratio (goal: 1.2x or under):

- plain: no Accept header and no gzip (curl's scrape: the text format 0.0.4);
- prometheus: Prometheus 2.42's Accept header (OpenMetrics preferred) and Accept-Encoding
  gzip, as every Prometheus scrape asks.

Then where a scrape's time goes in each checkout, in-process (bench_scrape_split.py, a
process per checkout over the same directory and cards, twice each, alternated): collect (every collector and the flight tail), the text and
OpenMetrics encoders, and gzip.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_scrape import (
    CARDS,
    PROCS_PER_CARD,
    free_port,
    host_flags,
    http_get,
    report,
    time_pairs,
)

HERE = Path(__file__).resolve().parent.parent
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)  # Prometheus 2.42's scrape_manager


def prometheus_get(url: str) -> bytes:
    headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        body = bytes(r.read())
    return gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body


def start(checkout: Path, flags: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(checkout / "exporter")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "serve", *flags,
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warning"],
        env=env,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}/metrics"


def wait_full(url: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if http_get(url).count(b"rankscope_gpu_process_bytes{") >= CARDS * PROCS_PER_CARD:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} never served every process")
        time.sleep(0.2)


def split(checkout: Path, flags: list[str], scrapes: int) -> None:
    """Where one checkout's scrape goes, measured in a process of its own."""
    env = {**os.environ, "PYTHONPATH": f"{checkout / 'exporter'}{os.pathsep}{HERE / 'bench'}"}
    subprocess.run(
        [sys.executable, "-c", "import sys, bench_scrape_split as s; s.main(sys.argv[1:])",
         str(checkout), str(scrapes), *flags],
        env=env, check=True,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=Path("/tmp/base29"))
    parser.add_argument("--scrapes", type=int, default=300)
    opts = parser.parse_args()
    if not (opts.baseline / "exporter" / "rankscope").is_dir():
        raise SystemExit(f"no checkout at {opts.baseline}: git worktree add {opts.baseline} REV")
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(PROCS_PER_CARD)]
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            flags = host_flags(Path(tmp), sleepers)
            ours, url = start(HERE, flags)
            base, base_url = start(opts.baseline, flags)
            daemons += [ours, base]
            wait_full(url)
            wait_full(base_url)
            for _ in range(20):  # warm-up, both alike
                http_get(url), http_get(base_url)
            print(
                f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {opts.scrapes} scrapes each"
            )
            for kind, get in (("plain", http_get), ("prometheus", prometheus_get)):
                now, before = time_pairs(
                    lambda g=get: g(url), lambda g=get: g(base_url), opts.scrapes
                )
                report(kind, now, before, ("this checkout", "before"), " (goal <= 1.2x)")
            for proc in daemons:  # before the cards and flight directory are removed
                proc.terminate()
                proc.wait()
            for checkout in (HERE, opts.baseline) * 2:  # alternated, as the scrapes are
                split(checkout, flags, opts.scrapes // 8)
    finally:
        for proc in [*daemons, *sleepers]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
