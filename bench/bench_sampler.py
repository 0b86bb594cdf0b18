"""The corridor sampler's cost per card per sample, as ratios to the bare reads it makes,
measured in the same run.

    python3 bench/bench_sampler.py [--cards 8] [--samples 2000] [--rounds 7]

- simulated (always): the scripted source, 8 cards. Bare = what one sample must read: one
  stat of the script and one free-bytes lookup per card. Sampler = Sampler.sample(): the
  same reads plus the window minimum, the floor accounting and its own timing.
- nvml (where NVML answers): bare = one nvmlDeviceGetMemoryInfo per card on handles
  resolved once; sampler = Sampler.sample() on NvmlSource. The issue's aim: within 1.5x.
  Also the anti-pattern the sampler avoids (nvmlInit, handle, read, nvmlShutdown per read).

- holdings (always): one read of the per-card process lists as the holdings thread makes
  it every second, 8 cards x 64 real processes (`sleep`, 512 in all, 8 of them matched to
  rank records), against the bare reads it rests on: the source's process lists and the
  four /proc files of every pid, uncached.

Figures are medians over rounds; each round times a block of samples.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rankscope.daemon.devices import NvmlSource, ScriptedSource, write_script
from rankscope.daemon.flightstate import RankProcess
from rankscope.daemon.holdings import HoldingsReader
from rankscope.daemon.sampler import Sampler, parse_floors
from rankscope.procfs import read_nspid, read_pidns_inode, read_proc_info, read_start_ticks

GiB = 1 << 30


def per_call(fn: Callable[[], object], n: int, rounds: int) -> float:
    """Median seconds per call of fn over ``rounds`` blocks of ``n`` calls."""
    fn()  # warm
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n)
    return statistics.median(times)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:8.2f} us"


def simulated(cards: int, samples: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cards.json"
        write_script(
            path,
            [{"index": i, "uuid": f"GPU-sim-{i}", "total": 80 * GiB, "free": 40 * GiB}
             for i in range(cards)],
        )  # fmt: skip
        source = ScriptedSource(path)
        sampler = Sampler(source, floors=parse_floors("10GiB"), interval=0.1)
        sampler.sample()
        slots = list(range(cards))
        read = source.read_free

        def bare() -> None:
            source.changed()
            for slot in slots:
                read(slot)

        clock = iter(range(10**9))
        step = sampler.interval

        def sample() -> None:
            sampler.sample(next(clock) * step)

        b = per_call(bare, samples, rounds) / cards
        s = per_call(sample, samples, rounds) / cards
        print(f"simulated, {cards} cards, per card per sample:")
        print(f"  bare reads (1 stat + {cards} lookups) {fmt(b)}")
        print(f"  sampler                          {fmt(s)}   ratio {s / b:5.2f}x")
        print(f"  sampler bookkeeping              {fmt(s - b)}   (what NVML's reads pay on top)")


def nvml(samples: int, rounds: int) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        print(f"nvml: skipped ({exc}); run this on a GPU machine for the 1.5x aim")
        return
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        meminfo = pynvml.nvmlDeviceGetMemoryInfo

        def bare() -> None:
            for h in handles:
                meminfo(h)

        sampler = Sampler(NvmlSource(), floors=parse_floors("1GiB"), interval=0.1)
        sampler.sample()
        clock = iter(range(10**9))

        def sample() -> None:
            sampler.sample(next(clock) * 0.1)

        def uncached() -> None:
            for i in range(count):
                pynvml.nvmlInit()
                pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
                pynvml.nvmlShutdown()

        b = per_call(bare, samples, rounds) / count
        s = per_call(sample, samples, rounds) / count
        u = per_call(uncached, max(3, samples // 200), 3) / count
        print(f"nvml, {count} cards, per card per sample:")
        print(f"  bare nvmlDeviceGetMemoryInfo     {fmt(b)}")
        print(f"  sampler                          {fmt(s)}   ratio {s / b:5.2f}x  (aim <= 1.50x)")
        print(f"  init/read/shutdown per read      {fmt(u)}   ratio {u / b:5.0f}x")
        sampler.stop()
    finally:
        pynvml.nvmlShutdown()


def holdings(cards: int, per_card: int, rounds: int) -> None:
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(cards * per_card)]
    try:
        pids = [p.pid for p in sleepers]
        ranks = [
            RankProcess("bench", pid, read_start_ticks(pid), read_nspid(pid),
                        read_pidns_inode(pid), "bench-boot", i, i)
            for i, pid in enumerate(pids[::per_card])
        ]  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cards.json"
            write_script(
                path,
                [{"index": c, "uuid": f"GPU-sim-{c}", "total": 80 * GiB, "free": 10 * GiB,
                  "processes": {str(pid): GiB for pid in pids[c * per_card : (c + 1) * per_card]}}
                 for c in range(cards)],
            )  # fmt: skip
            sampler = Sampler(ScriptedSource(path))
            sampler.sample()
            reader = HoldingsReader(sampler, lambda: ranks)
            source = sampler.source

            def bare() -> None:
                for slot in range(cards):
                    source.read_processes(slot)
                    source.read_free(slot)
                for pid in pids:
                    read_proc_info(pid)

            n = 20
            b = per_call(bare, n, rounds)
            r = per_call(reader.read, n, rounds)
            [view] = sampler.views()[:1]
            assert view.holdings is not None
            roles = sorted({h.role for h in view.holdings.processes})
            print(
                f"holdings, {cards} cards x {per_card} processes (roles seen: {roles}), per read:"
            )
            print(f"  bare reads (lists + 4 /proc files a pid) {b * 1e3:7.2f} ms")
            print(
                f"  holdings read (cached, attributed)       {r * 1e3:7.2f} ms   ratio {r / b:5.2f}x"
            )
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cards", type=int, default=8)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--processes", type=int, default=64, help="per card, for the holdings")
    args = p.parse_args()
    simulated(args.cards, args.samples, args.rounds)
    nvml(args.samples, args.rounds)
    holdings(args.cards, args.processes, args.rounds)


if __name__ == "__main__":
    main()
