"""Why eager decoding is unreadable in bench_interference.py: the same eager decoder alone,
under one process schedule at a time, its p50 step time over each 5 s, with the process's
RSS and the collector's generation-0 count (a leak under GC off would show in both).

    python3 bench/bench_eager_schedules.py                  # every schedule, one process each
    python3 bench/bench_eager_schedules.py --schedule pin,gc-off --seconds 25

GPU only. Schedules: pinned to one CPU or not, the collector on or off, torch's CPU
threads left or set to one. A schedule whose 5 s medians stay within a percent would make
eager blocks comparable; on the lent H200 none did (docs/performance.md).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness

SCHEDULES = ("pin,gc-off", "pin,gc-on", "no-pin,gc-on", "no-pin,gc-off", "pin,gc-on,threads-1")


def run_one(schedule: str, seconds: float) -> str:
    import torch

    from bench_interference import build_decoder

    flags = set(schedule.split(","))
    if "threads-1" in flags:
        torch.set_num_threads(1)
    step = build_decoder(batch=8, cache_len=512, graph=False)
    if "pin" in flags:
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    if "gc-off" in flags:
        gc.collect()
        gc.freeze()
        gc.disable()
    warm_until = time.monotonic() + 5
    while time.monotonic() < warm_until:
        step()
    started, window, medians = time.monotonic(), [], []
    while time.monotonic() < started + seconds:
        t = time.perf_counter()
        step()
        window.append((time.perf_counter() - t) * 1e3)
        if time.monotonic() - started >= 5 * (len(medians) + 1):
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGESIZE")
            medians.append(
                f"{statistics.median(window):.1f} ms/{rss / 2**20:.0f} MiB/gen0 {gc.get_count()[0]}"
            )
            window = []
    return f"{schedule:22s} torch threads {torch.get_num_threads():2d}: " + ", ".join(medians)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--schedule", help=f"one of {', '.join(SCHEDULES)} (default: each, in turn)")
    p.add_argument("--seconds", type=float, default=25.0, help="timed seconds a schedule")
    args = p.parse_args()
    harness.require_cuda("bench_eager_schedules")
    if args.schedule:
        print(run_one(args.schedule, args.seconds), flush=True)
        return
    print("eager decode step, p50 of each 5 s / RSS / collector generation-0 count")
    for schedule in SCHEDULES:  # one process each: affinity, threads and GC are per process
        cmd = [sys.executable, __file__, "--schedule", schedule, "--seconds", str(args.seconds)]
        subprocess.run(cmd, check=False)


if __name__ == "__main__":
    main()
