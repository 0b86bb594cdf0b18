"""The corridor sampler's cost per card per sample, as ratios to the bare reads it makes,
measured in the same run.

    python3 bench/bench_sampler.py [--cards 8] [--samples 2000] [--rounds 7]

- simulated (always): the scripted source, 8 cards. Bare = what one sample must read: one
  stat of the script and one free-bytes lookup per card. Sampler = Sampler.sample(): the
  same reads plus the window minimum, the floor accounting and its own timing.
- nvml (where NVML answers): bare = one nvmlDeviceGetMemoryInfo per card on handles
  resolved once; sampler = Sampler.sample() on NvmlSource. The aim: within 1.5x.
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
  (rankscope.nvml_calls.hold_gil, what the daemon now does) it does not. Printed: the
  published mean per sample against the bare call timed on a quiet thread.
- cadence (always): what a fair bare read is. The sampler makes one read alone every 100 ms,
  after a sleep, so it finds the caches and the driver's path cold; a read in a tight loop,
  or made right after another, finds them warm. A STAND-IN C call into the kernel
  (sysinfo(2), GIL held, not NVML) timed the three ways; then a real `rankscope serve` at
  100 ms on a SIMULATED card, holdings on, scraped every second by another process, against
  its own bare reads (one stat of the script, one lookup) made the three ways in this
  process, and the sampler's code run in this quiet process with its reads timed apart.
- daemon (GPU, --daemon): the published figure itself. A real `rankscope serve` at 100 ms with
  holdings, scraped every second, while another process keeps the GPU busy; its published
  rankscope_sampler_duration_seconds (sum/count over the window) against bare
  nvmlDeviceGetMemoryInfo reads made in this process under the same load in the same
  window, the way the sampler makes its own: alone, one every 100 ms, on the sampler's kind
  of thread, in turn the direct read with the GIL held (the daemon's own read function),
  the same through ctypes.CDLL (GIL released) and pynvml's wrapper; beside them the direct
  read made right after another (what this bench compared against before) and in a loop,
  and the sampler's code in this quiet process. Goal: published within 2x of the direct
  read made alone.

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

import harness
from rankscope.daemon.devices import (
    CardIdentity,
    DeviceSource,
    NvmlSource,
    ScriptedSource,
    free_reader,
    write_script,
)
from rankscope.daemon.flightstate import RankProcess
from rankscope.daemon.holdings import HoldingsReader
from rankscope.daemon.sampler import Periodic, Sampler, parse_floors
from rankscope.nvml_calls import hold_gil
from rankscope.procfs import read_pidns_inode, read_proc_info, read_start_ticks

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
            RankProcess("bench", pid, read_start_ticks(pid), read_pidns_inode(pid),
                        "bench-boot", i)
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

    name = "standin"
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


class TimedReads:
    """A device source whose reads (the change check and each free-memory read) are timed
    (bench only): splits a sample the sampler publishes into its reads and the rest."""

    def __init__(self, inner: DeviceSource) -> None:
        self.inner = inner
        self.name = inner.name
        self.incomplete: str | None = None
        self.spent_ns = 0

    def _timed(self, read: Callable[[], Any]) -> Any:
        started = time.perf_counter_ns()
        try:
            return read()
        finally:
            self.spent_ns += time.perf_counter_ns() - started

    def open(self) -> list[CardIdentity]:
        cards = self.inner.open()
        self.incomplete = self.inner.incomplete
        return cards

    def changed(self) -> bool:
        return bool(self._timed(self.inner.changed))

    def read_free(self, slot: int) -> int:
        started = time.perf_counter_ns()
        try:
            return self.inner.read_free(slot)
        finally:
            self.spent_ns += time.perf_counter_ns() - started

    def read_processes(self, slot: int) -> dict[int, int | None]:
        return self.inner.read_processes(slot)

    def close(self) -> None:
        self.inner.close()


class RecordingSampler(Sampler):
    """A Sampler on a :class:`TimedReads` source that keeps each sample's published
    duration and the time its reads took (bench only)."""

    def __init__(self, source: TimedReads, interval: float) -> None:
        super().__init__(source, interval=interval)
        self.timed = source
        self.durations: list[float] = []  # s
        self.reads: list[int] = []  # ns

    def sample(self, now: float | None = None) -> None:
        before, spent = self.duration_sum, self.timed.spent_ns
        super().sample(now)
        self.durations.append(self.duration_sum - before)
        self.reads.append(self.timed.spent_ns - spent)


class LoneReads:
    """Bare reads at the sampler's cadence, on the sampler's own kind of thread
    (rankscope.daemon.sampler.Periodic): every ``interval`` one read of one kind, the kinds
    taken in turn, timed alone; then ``again`` read at once and timed too ("right after":
    a read the one before it left warm, what the earlier bench compared against)."""

    def __init__(
        self, kinds: dict[str, Callable[[], object]], again: Callable[[], object], interval: float
    ) -> None:
        self.kinds, self.again = kinds, again
        self.lone: dict[str, list[int]] = {k: [] for k in kinds}  # ns
        self.right_after: list[int] = []
        self._order = list(kinds)
        self._n = 0
        self._runner = Periodic("bench-lone-reads", interval, self._tick)

    def _tick(self) -> None:
        name = self._order[self._n % len(self._order)]
        self._n += 1
        read, again, clock = self.kinds[name], self.again, time.perf_counter_ns
        t0 = clock()
        read()
        t1 = clock()
        again()
        t2 = clock()
        self.lone[name].append(t1 - t0)
        self.right_after.append(t2 - t1)

    def start(self) -> None:
        self._runner.start()

    def stop(self) -> None:
        self._runner.stop()

    def clear(self) -> None:
        for v in self.lone.values():
            v.clear()
        self.right_after.clear()


def us(values_ns: list[int] | list[float], scale: float = 1e-3) -> dict[str, float | int]:
    """Mean, p50 and count of timings, in us (``scale`` turns the unit into us)."""
    if not values_ns:
        return {"mean": float("nan"), "p50": float("nan"), "n": 0}
    return {
        "mean": statistics.fmean(values_ns) * scale,
        "p50": statistics.median(values_ns) * scale,
        "n": len(values_ns),
    }


def published_against_bare(
    daemon: Any,
    lone: LoneReads,
    tight: Callable[[], object],
    quiet: RecordingSampler,
    seconds: float,
    rounds: int,
) -> dict[str, Any]:
    """One window: the running daemon's published mean per card per sample; in this
    process, under the same load, the lone bare reads at the sampler's cadence, the read
    right after another, the same sampler code on a quiet process (no HTTP, no holdings
    thread: its whole sample and its read alone), and the read in a tight loop."""
    scraper = harness.start_scraper(daemon.url + "/metrics", 1.0)
    try:
        lone.start()
        time.sleep(0.05)  # half a period apart: the two threads of this process never meet
        quiet.start()
        time.sleep(2)
        c0, s0 = harness.sampler_totals(daemon.metrics())
        lone.clear()
        n_quiet = len(quiet.durations)
        time.sleep(seconds)
        c1, s1 = harness.sampler_totals(daemon.metrics())
    finally:
        quiet.stop()
        lone.stop()
        scraper.kill()
        scraper.wait()
    # A sample of a source that is down is counted too, and reads nothing.
    cards = sum(1 for card in daemon.cards() if card.get("free") is not None)
    if not cards:
        raise RuntimeError(f"the daemon reads no card: {daemon.cards()}")
    tight_ns = per_call(tight, 200, rounds) * 1e9
    return {
        "window_s": seconds,
        "cards": cards,
        "published_samples": c1 - c0,
        "published_us": (s1 - s0) / max(1.0, c1 - c0) / cards * 1e6,
        "lone_us": {k: us(v) for k, v in lone.lone.items()},
        "right_after_us": us(lone.right_after),
        "quiet_sampler_us": us(quiet.durations[n_quiet:], 1e6),
        "quiet_sampler_reads_us": us(quiet.reads[n_quiet:]),
        "tight_loop_us": tight_ns * 1e-3,
    }


def report(result: dict[str, Any], bare: str) -> None:
    """Print one window; the goal ratio is the published figure over the lone ``bare``."""
    pub = result["published_us"]
    print(f"  published by the daemon, per card per sample (mean)  {pub:8.2f} us")
    for k, v in result["lone_us"].items():
        print(
            f"  bare {k:24s} lone, every 100 ms  {v['mean']:8.2f} us (p50 {v['p50']:.2f}, "
            f"n {v['n']})   published / it {pub / v['mean']:5.2f}x"
            + ("   (goal <= 2x)" if k == bare else "")
        )
    ra, qs, qr = (
        result["right_after_us"],
        result["quiet_sampler_us"],
        result["quiet_sampler_reads_us"],
    )
    print(
        f"  bare {bare:24s} right after another {ra['mean']:8.2f} us (p50 {ra['p50']:.2f})"
        f"   published / it {pub / ra['mean']:5.2f}x  (the earlier bench's baseline)"
    )
    print(
        f"  bare {bare:24s} tight loop          {result['tight_loop_us']:8.2f} us"
        f"   published / it {pub / result['tight_loop_us']:5.2f}x"
    )
    print(
        f"  the sampler's code in this quiet process: sample {qs['mean']:8.2f} us "
        f"(p50 {qs['p50']:.2f}), of which its reads {qr['mean']:.2f} us (p50 {qr['p50']:.2f})"
    )


def cadence(seconds: float, rounds: int, out: dict[str, Any]) -> None:
    """Why a read the sampler makes alone every 100 ms costs more than the same read in a
    loop, on this machine: a STAND-IN C call into the kernel (sysinfo(2), not NVML) timed
    lone at the sampler's cadence (with the GIL held and released, in turn), right after
    another, and in a loop; then
    a real `rankscope serve` on the simulated source against its own bare reads (one stat
    of the script, one lookup) made the same three ways in this process."""
    libc = ctypes.CDLL(None)
    buf = ctypes.create_string_buffer(256)  # struct sysinfo is 112 bytes on x86-64
    released = libc.sysinfo  # through ctypes.CDLL: the GIL released during the call
    held = hold_gil(released)
    kinds: dict[str, Callable[[], object]] = {
        "GIL held": lambda: held(buf),
        "GIL released": lambda: released(buf),
    }
    lone = LoneReads(kinds, kinds["GIL held"], 0.1)
    lone.start()
    time.sleep(min(seconds, 6.0))
    lone.stop()
    loop = per_call(kinds["GIL held"], 2000, rounds) * 1e6
    print("cadence: a STAND-IN C call into the kernel (sysinfo(2), not NVML), quiet process:")
    standin: dict[str, Any] = {}
    for name, values in lone.lone.items():
        v = standin[f"lone_{name.split()[1]}_us"] = us(values)
        label = f"lone every 100 ms, {name}"
        print(f"  {label:32s} {v['mean']:8.2f} us (p50 {v['p50']:.2f})")
    after = standin["right_after_us"] = us(lone.right_after)
    one = standin["lone_held_us"]
    label = "right after another, GIL held"
    print(f"  {label:32s} {after['mean']:8.2f} us (p50 {after['p50']:.2f})")
    label = "tight loop, GIL held"
    print(f"  {label:32s} {loop:8.2f} us   lone / loop {one['mean'] / loop:5.1f}x")
    standin["tight_loop_us"] = loop
    out["cadence_standin"] = standin
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cards.json"
        holder = subprocess.Popen(["sleep", "600"])
        daemon = None
        try:
            write_script(
                path,
                [{"index": 0, "uuid": "GPU-sim-0", "total": 80 * GiB, "free": 40 * GiB,
                  "processes": {str(holder.pid): GiB}}],
            )  # fmt: skip
            daemon = harness.Daemon(
                100, extra=["--device.source=script", f"--device.script={path}"]
            )
            bare_source = ScriptedSource(path)
            bare_source.open()

            def bare() -> None:  # what one sample of one simulated card reads
                bare_source.changed()
                bare_source.read_free(0)

            result = published_against_bare(
                daemon,
                LoneReads({"simulated card": bare}, bare, 0.1),
                bare,
                RecordingSampler(TimedReads(ScriptedSource(path)), 0.1),
                seconds,
                rounds,
            )
        finally:
            if daemon is not None:
                daemon.stop()
            holder.kill()
            holder.wait()
    print(
        f"cadence, daemon: `rankscope serve` at 100 ms on a SIMULATED card, holdings on, "
        f"scraped every 1 s, {seconds:.0f} s, {result['published_samples']:.0f} samples:"
    )
    report(result, "simulated card")
    out["cadence_daemon"] = result


def gpu_daemon(seconds: float, rounds: int, out: dict[str, Any]) -> None:
    """The running daemon's published figure against bare reads under the same GPU load,
    made the way the sampler makes its own: alone, once every 100 ms."""
    try:
        import pynvml
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        pynvml.nvmlInit()
    except Exception as exc:
        print(f"daemon: skipped, needs a GPU ({exc})")
        return
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    held = free_reader(pynvml)  # the daemon's own read: GIL held, a per-thread struct
    released = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo")  # ctypes.CDLL's
    memory = pynvml.c_nvmlMemory_t()
    wrapper = pynvml.nvmlDeviceGetMemoryInfo
    kinds: dict[str, Callable[[], object]] = {
        "direct, GIL held": lambda: held(handle),
        "direct, GIL released": lambda: released(handle, ctypes.byref(memory)),
        "pynvml wrapper": lambda: wrapper(handle),
    }
    load = harness.start_gpu_load(seconds * 2 + 60)
    daemon = None
    try:
        daemon = harness.Daemon(100)
        result = published_against_bare(
            daemon,
            LoneReads(kinds, kinds["direct, GIL held"], 0.1),
            kinds["direct, GIL held"],
            RecordingSampler(TimedReads(NvmlSource()), 0.1),
            seconds,
            rounds,
        )
    finally:
        if daemon is not None:
            daemon.stop()
        load.kill()
        load.wait()
        pynvml.nvmlShutdown()
    print(
        f"daemon, GPU busy (bf16 matmuls in another process), {seconds:.0f} s, "
        f"{result['published_samples']:.0f} samples at 100 ms, holdings on, scraped every 1 s "
        f"({result['cards']} card(s)):"
    )
    report(result, "direct, GIL held")
    result["ratio_to_lone_direct_mean"] = (
        result["published_us"] / result["lone_us"]["direct, GIL held"]["mean"]
    )
    out["daemon"] = result


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
    p.add_argument(
        "--cadence-seconds", type=float, default=20.0, help="window of the cadence part's daemon"
    )
    p.add_argument("--out", type=Path, help="directory for sampler.json")
    args = p.parse_args()
    out: dict[str, Any] = {}
    simulated(args.cards, args.samples, args.rounds)
    nvml(args.samples, args.rounds)
    holdings(args.cards, args.processes, args.rounds)
    out["gil"] = gil(args.gil_seconds, args.rounds)
    cadence(args.cadence_seconds, args.rounds, out)
    if args.daemon:
        gpu_daemon(args.daemon_seconds, args.rounds, out)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sampler.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
