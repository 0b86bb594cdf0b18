"""The corridor sampler's cost per card per sample, as ratios to the bare reads it makes,
measured in the same run.

    python3 bench/bench_sampler.py [--cards 8] [--samples 2000] [--rounds 7]

- simulated (always): the scripted source, 8 cards. Bare = what one sample must read: one
  stat of the script and one free-bytes lookup per card. Sampler = Sampler.sample(): the
  same reads plus the window minimum, the floor accounting and its own timing.
- nvml (where NVML answers): bare = one nvmlDeviceGetMemoryInfo per card on handles
  resolved once; sampler = Sampler.sample() on NvmlSource. The issue's aim: within 1.5x.
  Also the anti-pattern the sampler avoids (nvmlInit, handle, read, nvmlShutdown per read).

Figures are medians over rounds; each round times a block of samples.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rankscope.daemon.devices import NvmlSource, ScriptedSource, write_script
from rankscope.daemon.sampler import Sampler, parse_floors

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cards", type=int, default=8)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    simulated(args.cards, args.samples, args.rounds)
    nvml(args.samples, args.rounds)


if __name__ == "__main__":
    main()
