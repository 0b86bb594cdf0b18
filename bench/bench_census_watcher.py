"""The census watcher's cost and the record's growth, as ratios and sizes measured in one run.

1. A counted collective (patched gloo ``all_reduce``, 8 floats, world 1) with the watcher
   thread running against without it, in alternating blocks (drift of the machine hits both
   alike). Goal: 1.05x or under. Also ``count()`` with its last-key store against the same
   increment without it.
2. The flight directory's growth per rank-hour in a steady job of 1,000 collectives/s over 10
   (group, op) series (the world group's all_reduce at 100/s among them, so the automatic
   cadence writes a snapshot every 500 of them), on a simulated clock: the real watcher
   step and the real writer, ten simulated minutes, scaled to an hour. Goal: 2 MB or less.

    python3 bench/bench_census_watcher.py [--calls N] [--blocks N] [--minutes N]
"""

from __future__ import annotations

import argparse
import collections
import os
import socket
import statistics
import tempfile
import time
import timeit
import types
from pathlib import Path
from typing import Any

SERIES = [
    (group, op)
    for group in ("world:0-7", "tp:0-7")
    for op in ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier")
]
RATE = 1000  # collectives per second, over SERIES alike


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_count(number: int) -> None:
    from rankscope.rank.census import counts

    table: collections.defaultdict[tuple[str, str], int] = collections.defaultdict(int)

    def without_last_key(group: str, op: str, n: int = 1) -> None:
        try:  # noqa: SIM105 (the shape of count() itself, less the store)
            table[group, op] += n
        except Exception:
            pass

    env = {"count": counts.count, "plain": without_last_key}
    stored = min(timeit.repeat("count('tp:0-3', 'all_reduce')", globals=env, number=number))
    plain = min(timeit.repeat("plain('tp:0-3', 'all_reduce')", globals=env, number=number))
    print(
        f"count() with its last-key store {stored / number * 1e9:.1f} ns, without "
        f"{plain / number * 1e9:.1f} ns: {stored / plain:.3f}x"
    )


def bench_watcher(calls: int, blocks: int) -> None:
    import torch
    import torch.distributed as dist

    from rankscope.rank import census
    from rankscope.rank.census import snapshots

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    port = _free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    census.instrument_torch_distributed()
    t = torch.ones(8)

    def block() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(t)
        return (time.perf_counter() - start) / calls * 1e6

    block()  # warm-up
    without: list[float] = []
    with_watcher: list[float] = []
    for _ in range(blocks):
        without.append(block())
        snapshots.start_watcher(stall_s=1.0)
        with_watcher.append(block())
        snapshots.stop_watcher()
    ratios = [w / o for w, o in zip(with_watcher, without, strict=True)]
    print(
        f"counted all_reduce, world 1, {blocks} alternating block pairs of {calls} calls: "
        f"without the watcher median {statistics.median(without):.1f} us, with it "
        f"{statistics.median(with_watcher):.1f} us; ratio median {statistics.median(ratios):.3f}x "
        f"(goal 1.05x or under: {'met' if statistics.median(ratios) <= 1.05 else 'MISSED'})"
    )
    dist.destroy_process_group()


def bench_growth(minutes: float) -> None:
    """Drive count(), auto_tick() and the watcher's poll on a simulated clock."""
    from rankscope.rank.census import counts, snapshots
    from rankscope.rank.writer import RECORDER

    with tempfile.TemporaryDirectory() as where:
        RECORDER.configure(flight_dir=where, boot_id="bench-growth", rank=0, world_size=8)
        counts.reset()
        snapshots.reset()
        snapshots.configure(auto_every=500)
        step = snapshots.Watcher(stall_s=snapshots.DEFAULT_STALL_S)
        clock = types.SimpleNamespace(monotonic=lambda: mono + now)
        snapshots.time = clock  # type: ignore[assignment]  # the snapshots' clock simulated too
        per_poll = int(RATE * snapshots.POLL_S)
        polls = int(minutes * 60 / snapshots.POLL_S)
        mono, wall, now = time.monotonic(), time.time(), 0.0
        lines = 0
        for i in range(polls):
            now = (i + 0.5) * snapshots.POLL_S  # the collectives fall between two polls
            for j in range(per_poll):
                group, op = SERIES[j % len(SERIES)]
                counts.count(group, op)
                if (group, op) == ("world:0-7", "all_reduce"):
                    snapshots.auto_tick()
            now = (i + 1) * snapshots.POLL_S
            line = step.poll(mono + now, wall + now)
            if line is not None and RECORDER.write_record(line):
                lines += 1
        size = sum(p.stat().st_size for p in Path(where).glob("census-*.jsonl"))
        snapshots.time = time  # type: ignore[assignment]
        RECORDER.configure(flight_dir=None)
    per_hour = size * 60 / minutes
    print(
        f"growth: {minutes:g} simulated minutes at {RATE} collectives/s over {len(SERIES)} "
        f"series: {size} bytes ({lines} live lines, {snapshots.STATE.round // 500} snapshots) "
        f"-> {per_hour / 1e6:.2f} MB per rank-hour (goal 2 MB or less: "
        f"{'met' if per_hour <= 2e6 else 'MISSED'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--number", type=int, default=200_000)
    args: Any = parser.parse_args()
    print(f"{os.cpu_count()} cpus")
    bench_count(args.number)
    bench_growth(args.minutes)
    bench_watcher(args.calls, args.blocks)


if __name__ == "__main__":
    main()
