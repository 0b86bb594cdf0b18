"""The first scrape of `rankscope serve` against the flight directory's size, with the read
budget (the default, 4 MiB a refresh) and without it (the whole directory in the first
scrape, as the daemon once did), as ratios measured in the same run. CPU only.

    python3 bench/bench_first_scrape.py [--sizes-mb 32,128] [--files 300] [--repeats 2]
        [--out DIR]

Each directory holds ``--files`` files of marks of another host (never judged exited), lines
of about 1.3 kB with nested fields, as probe lines are. For each size and each mode a fresh
daemon starts (cards and holdings off); the time from its port opening to the first
/metrics answer is the first scrape. Goal: with the budget, the first scrape does not grow
with the directory (a ratio near 1.0x between sizes) and stays under Prometheus's 10 s
scrape timeout; without it, it grows with the size. Each first scrape is also set against a
scrape of the same daemon once /readyz says the directory is read (the steady cost of the
series themselves).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = {"budget 4MiB": [], "whole directory": ["--flight.read-budget=1TiB"]}


def mark_line(pid: int, i: int) -> bytes:
    line = {
        "v": 1, "kind": "mark", "boot": "bench", "rank": pid, "local_rank": 0,
        "world_size": 1024, "tp_rank": 0, "pp_rank": 0, "runner": "bench",
        "host": "bench-host", "pid": pid, "start_ticks": 7, "nspid": [pid], "pidns": 1,
        "mono": float(i), "wall": 1.7e9 + i, "phase": f"phase_{i % 64:03d}", "extra": {"i": i},
        "device": {"index": 0, "uuid": "GPU-bench", "nvml_index": 0, "why": None},
        "torch": {"reserved": 1 << 30, "allocated": 1 << 29, "peak_allocated": 1 << 30,
                  "num_alloc_retries": 0, "num_ooms": 0, "why": None},
        "driver": {"free": 40 << 30, "total": 80 << 30, "why": None},
        "nvml": {"self_bytes": 2 << 30,
                 "procs": {str(1000 + k): (k + 1) << 28 for k in range(8)}, "why": None},
        "arenas": {"kv": {"reserved_bytes": 8 << 30, "used_bytes": 1 << 30}},
        "derived": {"non_torch": 1 << 28, "non_torch_measured": True,
                    "unbacked_reservation": 0},
    }  # fmt: skip
    return json.dumps(line).encode() + b"\n"


def generate(flight_dir: Path, total_bytes: int, files: int) -> int:
    per_file = total_bytes // files
    written = 0
    for pid in range(1, files + 1):
        lines, size, i = [], 0, 0
        while size < per_file:
            lines.append(mark_line(pid, i))
            size += len(lines[-1])
            i += 1
        (flight_dir / f"marks-bench-host-{pid}-7.jsonl").write_bytes(b"".join(lines))
        written += size
    return written


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> float:
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=300) as r:
        r.read()
    return time.monotonic() - t0


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=60):
            return True
    except urllib.error.HTTPError:
        return False


def first_scrape(flight_dir: Path, flags: list[str]) -> tuple[float, float]:
    """(the first scrape, a scrape once /readyz says the directory is read) in seconds."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO / "exporter"))
    cmd = [sys.executable, "-m", "rankscope", "serve", f"--flight.dir={flight_dir}",
           f"--web.listen-address=127.0.0.1:{port}", "--no-collector.cards",
           "--no-collector.holdings", *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the daemon did not start") from None
                time.sleep(0.05)
        first = scrape(port)
        while not ready(port):
            time.sleep(0.5)
        return first, scrape(port)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="32,128")
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write results.json here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-first-scrape-") as d:
        first_scrape(Path(d), [])  # warm-up: imports from a cold page cache
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    results: dict[str, dict[int, float]] = {mode: {} for mode in MODES}
    steady: dict[str, dict[int, float]] = {mode: {} for mode in MODES}
    actual: dict[int, int] = {}
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="rankscope-bench-first-scrape-") as d:
            actual[size] = generate(Path(d), size * 1_000_000, args.files)
            for mode, flags in MODES.items():
                # The fastest of --repeats starts: the port opens before the daemon has
                # imported everything, and a busy machine adds noise.
                runs = [first_scrape(Path(d), flags) for _ in range(args.repeats)]
                results[mode][size] = min(first for first, _ in runs)
                steady[mode][size] = min(later for _, later in runs)
                print(f"{actual[size] / 1e6:7.1f} MB  {mode:16s} first scrape "
                      f"{results[mode][size]:6.2f} s, a scrape once read {steady[mode][size]:6.2f} s "
                      f"({results[mode][size] / steady[mode][size]:.2f}x)", flush=True)  # fmt: skip
    small, large = sizes[0], sizes[-1]
    for mode in MODES:
        ratio = results[mode][large] / results[mode][small]
        print(f"{mode}: {large} MB / {small} MB first scrape = {ratio:.2f}x "
              f"(size ratio {actual[large] / actual[small]:.2f}x)")  # fmt: skip
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"bytes": actual, "first_scrape_s": results, "scrape_once_read_s": steady}
        (args.out / "bench_first_scrape.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
