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

- gil (always): why the running daemon published 100-132 us a sample on a busy H200 against
  27-30 us for the read. A real Sampler on its own thread reads a stand-in card whose read
  is a C call of a fixed length (libc usleep, 25 us: a STAND-IN for nvmlDeviceGetMemoryInfo;
  on a GPU machine the real NVML function is used too) while another thread runs Python
  in bursts as long as a scrape (16 ms every 250 ms). The C call made through ctypes.CDLL
  releases the GIL and must wait for it on return; made with the GIL held
  (rankscope.daemon.devices.hold_gil, what the daemon now does) it does not. Printed: the
  published mean per sample against the bare call timed on a quiet thread.
- daemon (GPU, --daemon): the issue's figure itself. A real `rankscope serve` at 100 ms with
  holdings, scraped every second, while another process keeps the GPU busy; its published
  rankscope_sampler_duration_seconds (sum/count over the window) against a bare
  nvmlDeviceGetMemoryInfo made by this process under the same load in the same window.
  Goal: within 2x.

Figures are medians over rounds; each round times a block of samples.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankscope.daemon.devices import (
    CardIdentity,
    NvmlSource,
    ScriptedSource,
    free_reader,
    hold_gil,
    write_script,
)
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


class CallSource:
    """A STAND-IN device source of one card whose free-memory read is ``read()``."""

    name = label = "standin"
    incomplete: str | None = None

    def __init__(self, read: Callable[[], object]) -> None:
        self._read = read

    def open(self) -> list[CardIdentity]:
        return [CardIdentity(0, 0, "GPU-standin-0", "stand-in", 80 * GiB)]

    def changed(self) -> bool:
        return False

    def read_free(self, slot: int) -> int:
        self._read()
        return 40 * GiB

    def read_processes(self, slot: int) -> dict[int, int | None]:
        return {}

    def close(self) -> None:
        pass


def busy_python(stop: threading.Event, burst: float, every: float) -> None:
    """Pure-Python work in bursts as long as a scrape's collect and encode."""
    while not stop.wait(every):
        end = time.perf_counter() + burst
        n = 0
        while time.perf_counter() < end:
            n += sum(range(200))


def published_under_contention(read: Callable[[], object], seconds: float) -> float:
    """Mean seconds per sample a real Sampler publishes for one card read by ``read``,
    sampling every 10 ms while another thread runs Python in bursts."""
    sampler = Sampler(CallSource(read), interval=0.01)
    stop = threading.Event()
    other = threading.Thread(target=busy_python, args=(stop, 0.016, 0.25), daemon=True)
    sampler.start()
    other.start()
    time.sleep(0.5)
    n0, s0 = sampler.samples, sampler.duration_sum
    time.sleep(seconds)
    n1, s1 = sampler.samples, sampler.duration_sum
    stop.set()
    other.join()
    sampler.stop()
    return (s1 - s0) / max(1, n1 - n0)


def gil(seconds: float, rounds: int) -> dict[str, float]:
    libc = ctypes.CDLL(None)
    released = libc.usleep
    held = hold_gil(libc.usleep)
    out: dict[str, float] = {}
    print("gil: one stand-in card (libc usleep(25), not NVML), 10 ms samples, a Python thread")
    print("     busy 16 ms every 250 ms (a scrape's length):")
    bare = per_call(lambda: released(25), 200, rounds)
    out["bare_us"] = bare * 1e6
    print(f"  bare call, quiet                 {fmt(bare)}")
    for name, fn in (("released (ctypes.CDLL)", released), ("held (hold_gil)", held)):
        mean = published_under_contention(lambda fn=fn: fn(25), seconds)
        out[name.split()[0] + "_us"] = mean * 1e6
        print(f"  published, GIL {name:23s} {fmt(mean)}   ratio {mean / bare:5.2f}x")
    return out


def gpu_daemon(seconds: float, out: dict[str, Any]) -> None:
    """The running daemon's published figure against bare reads under the same GPU load."""
    try:
        import pynvml
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        pynvml.nvmlInit()
    except Exception as exc:
        print(f"daemon: skipped, needs a GPU ({exc})")
        return
    import harness

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    direct = free_reader(pynvml)
    wrapper = pynvml.nvmlDeviceGetMemoryInfo
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo")
    memory = pynvml.c_nvmlMemory_t()
    load = harness.start_gpu_load(seconds * 2 + 60)
    daemon = None
    try:
        daemon = harness.Daemon(100)
        scraper = harness.Scraper(daemon.url + "/metrics", 1.0)
        time.sleep(2)
        c0, s0 = harness.sampler_totals(daemon.metrics())
        bare: dict[str, list[float]] = {"wrapper": [], "direct": []}
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # one bare read of each kind every 10 ms
            t = time.perf_counter_ns()
            wrapper(handle)
            bare["wrapper"].append(time.perf_counter_ns() - t)
            t = time.perf_counter_ns()
            direct(handle)
            bare["direct"].append(time.perf_counter_ns() - t)
            time.sleep(0.01)
        c1, s1 = harness.sampler_totals(daemon.metrics())
        scraper.stop()
        cards = len(daemon.cards())
        published = (s1 - s0) / max(1.0, c1 - c0) / max(1, cards) * 1e6
        # The cause, on the real read: a Sampler here with NVML's function called through
        # CDLL (GIL released) and held, a Python thread busy as a scrape, the same load.
        contention = {
            name: published_under_contention(lambda f=f: f(handle, ctypes.byref(memory)), 10) * 1e6
            for name, f in (("released", fn), ("held", hold_gil(fn)))
        }
    finally:
        if daemon is not None:
            daemon.stop()
        load.kill()
        load.wait()
        pynvml.nvmlShutdown()
    bare_mean = {k: statistics.fmean(v) / 1e3 for k, v in bare.items()}
    bare_p50 = {k: statistics.median(v) / 1e3 for k, v in bare.items()}
    print(f"daemon, GPU busy (bf16 matmuls in another process), {seconds:.0f} s window,")
    print(f"  {c1 - c0:.0f} samples at 100 ms, holdings on, scraped every 1 s ({cards} card(s)):")
    print(f"  published per card per sample (mean)  {published:8.2f} us")
    for k in bare:
        print(
            f"  bare {k:8s} mean / p50               {bare_mean[k]:8.2f} / {bare_p50[k]:.2f} us"
            f"   published / bare mean {published / bare_mean[k]:5.2f}x (goal <= 2x)"
        )
    for k, v in contention.items():
        print(f"  in-bench sampler, NVML read with the GIL {k:8s}, busy thread: {v:8.2f} us")
    out["daemon"] = {
        "window_s": seconds, "samples": c1 - c0, "cards": cards,
        "published_us": published, "bare_mean_us": bare_mean, "bare_p50_us": bare_p50,
        "ratio_to_direct_mean": published / bare_mean["direct"],
        "ratio_to_wrapper_mean": published / bare_mean["wrapper"],
        "contention_us": contention,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cards", type=int, default=8)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--processes", type=int, default=64, help="per card, for the holdings")
    p.add_argument("--gil-seconds", type=float, default=5.0, help="per case of the gil part")
    p.add_argument(
        "--daemon", action="store_true", help="GPU: the running daemon's figure under load"
    )
    p.add_argument("--daemon-seconds", type=float, default=30.0)
    p.add_argument("--out", type=Path, help="directory for sampler.json")
    args = p.parse_args()
    out: dict[str, Any] = {}
    simulated(args.cards, args.samples, args.rounds)
    nvml(args.samples, args.rounds)
    holdings(args.cards, args.processes, args.rounds)
    out["gil"] = gil(args.gil_seconds, args.rounds)
    if args.daemon:
        gpu_daemon(args.daemon_seconds, out)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sampler.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
