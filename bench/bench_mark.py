"""What one mark costs, as ratios to what it cannot avoid, measured in the same run.

    python3 bench/bench_mark.py [--iterations N] [--rounds N] [--holders N] [--out DIR]

- disarmed: ``mark("weights_loaded")`` with no flight directory against a bare call of a
  function of the same signature, both compiled into the same timeit loop, reached the same
  way (a global name) and called the same way. Goal: within 1.1x.
- armed, on a GPU when there is one: against the raw reads a mark must make (the allocator's
  nested stats call, NVML's memory info and process list through pynvml's wrappers), and
  against those reads plus the write(2) of an equally long line. Budget: an armed mark under
  100 us (the ratios say where its time goes). The mark calls NVML's C functions directly into reused structs (one call for the
  process list where pynvml's wrapper makes two and a Python object per process): the reads
  the mark actually makes ("lean reads") are a third baseline, the strictest.
- armed, on this machine's CPU in every run: the mark with CUDA never initialised (its one
  read is is_initialized()), and the mark on a STAND-IN card (a named fake torch view and
  fake NVML returning fixed numbers at once, so the mark's figure is rankscope's own share:
  views, typed record, encoding, the write).

Every figure is measured in rounds that alternate their order; each round takes the best of
three timed loops (noise on a shared machine only adds time). Printed: the median over
rounds, and each ratio's median with its spread (lowest and highest round). ``--out DIR``
writes every round's numbers to DIR/bench_mark.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from rankscope.rank import probe
from rankscope.rank.probe.nvml_view import NvmlView
from rankscope.rank.probe.torch_view import Device, TorchReading, TorchView, view_from_stats
from rankscope.rank.writer import ENCODER, RECORDER

Timed = Callable[[], Any] | str
BUDGET_US = 100  # an armed mark, whatever the machine


def rounds_of(
    candidates: dict[str, Timed], number: int, rounds: int, namespace: dict[str, Any] | None = None
) -> dict[str, list[float]]:
    """ns per call of each candidate, one figure a round; the order alternates by round. A
    string is compiled into timeit's loop (no call of ours around it)."""
    timers = {
        name: timeit.Timer(stmt, globals=namespace or {}) for name, stmt in candidates.items()
    }
    for timer in timers.values():
        timer.timeit(max(number // 10, 1))  # warm caches and lazy initialisation
    out: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for i in range(rounds):
        for name in names if i % 2 == 0 else reversed(names):
            best = min(timers[name].repeat(repeat=3, number=number))
            out[name].append(best / number * 1e9)
    return out


def ratio_figure(
    per_round: dict[str, list[float]], num: str, den: str | list[str]
) -> dict[str, Any]:
    """The ratio num / den (den: one name, or several summed) per round: median and spread."""
    dens = [den] if isinstance(den, str) else den
    ratios = [n / sum(per_round[d][i] for d in dens) for i, n in enumerate(per_round[num])]
    return {
        "median": statistics.median(ratios),
        "low": min(ratios),
        "high": max(ratios),
        "rounds": ratios,
    }


def median(per_round: dict[str, list[float]], name: str) -> float:
    return statistics.median(per_round[name])


def say_ratio(label: str, figure: dict[str, Any], goal: str = "") -> None:
    print(
        f"  {label:<52} {figure['median']:.3f}x  (rounds {figure['low']:.3f}-"
        f"{figure['high']:.3f}){'  goal ' + goal if goal else ''}"
    )


def say_time(label: str, ns: float) -> None:
    print(f"  {label:<52} {ns / 1000:9.2f} us" if ns >= 1000 else f"  {label:<52} {ns:9.1f} ns")


def line_writer(directory: str, line: bytes) -> Callable[[], None]:
    """The bare durable write a mark ends with: one write(2) of an equally long line."""
    fd = os.open(os.path.join(directory, "bare.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def write() -> None:
        os.write(fd, line)

    return write


def mark_line() -> bytes:
    """A line as long as the mark's, encoded as the writer encodes it, for the bare write."""
    sample = probe.mark("sample")
    assert sample is not None
    return (ENCODER.encode({**RECORDER.header("mark"), **sample.to_json()}) + "\n").encode()


# --- disarmed ---------------------------------------------------------------------------------


def bare(phase: str, /, *, runner: str | None = None, **extra: Any) -> None:
    """A function of the mark's signature that does nothing."""
    return None


def disarmed(number: int, rounds: int, results: dict[str, Any]) -> None:
    assert not RECORDER.armed, "the disarmed figure needs RANKSCOPE_DIR unset"
    namespace = {"mark": probe.mark, "bare": bare}
    per_round = rounds_of(
        {"disarmed_mark": "mark('weights_loaded')", "bare_call": "bare('weights_loaded')"},
        number,
        rounds,
        namespace,
    )
    figure = ratio_figure(per_round, "disarmed_mark", "bare_call")
    results["disarmed"] = {"ns": per_round, "ratio": figure}
    print(f"disarmed mark ({rounds} alternated rounds of {number} calls)")
    say_time("disarmed mark", median(per_round, "disarmed_mark"))
    say_time("bare call of the same signature", median(per_round, "bare_call"))
    say_ratio("disarmed mark / bare call", figure, "1.1x")


# --- armed, stand-in card -------------------------------------------------------------------------

STAND_IN_UUID = "GPU-00000000-stand-in"
MiB = 1 << 20


class StandInTorchView(TorchView):
    """STAND-IN torch view (a fake: no GPU needed): CUDA 'initialised' on card 0, allocator
    stats a fixed nested dict. Costs what building a reading costs, nothing for the read."""

    STATS: ClassVar[dict[str, Any]] = {
        "reserved_bytes": {"all": {"current": 512 * MiB, "peak": 600 * MiB}},
        "allocated_bytes": {"all": {"current": 300 * MiB, "peak": 450 * MiB}},
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }

    DEVICE = Device(0, STAND_IN_UUID)  # one per card, as TorchView caches it

    def read(self, index: int | None = None) -> TorchReading:
        return self.DEVICE, view_from_stats(self.STATS), None


class StandInNvml:
    """STAND-IN NVML binding (a fake): one card, fixed memory info, ``holders`` + 1 processes."""

    class NVMLError(Exception):
        pass

    def __init__(self, holders: int) -> None:
        self.procs = [(os.getpid(), 1012 * MiB)] + [
            (900_000 + i, 500 * MiB) for i in range(holders)
        ]
        self.info = SimpleNamespace(free=70_000 * MiB, total=80_000 * MiB)

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return "stand-in-handle"

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return self.info

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.procs]


def armed_stand_in(number: int, rounds: int, holders: int, results: dict[str, Any]) -> None:
    saved = probe.TORCH, probe.NVML
    probe.TORCH, probe.NVML = StandInTorchView(), NvmlView(StandInNvml(holders))
    try:
        recorded = probe.mark("stand_in")
        assert recorded is not None and recorded.nvml.self_bytes == 1012 * MiB, recorded
        per_round = rounds_of({"mark": lambda: probe.mark("weights_loaded")}, number, rounds)
    finally:
        probe.TORCH, probe.NVML = saved
    results["armed_stand_in"] = {"ns": per_round, "processes": holders + 1}
    print(f"armed mark on a STAND-IN card (fake reads, {holders + 1} processes listed)")
    say_time(
        "mark: rankscope's own share (views, record, encoding, write)", median(per_round, "mark")
    )


# --- armed, CPU and GPU ---------------------------------------------------------------------------

HOLDER = (
    "import sys, torch; torch.cuda.set_device(0); x = torch.ones(1 << 20, device='cuda'); "
    "torch.cuda.synchronize(); print('holding', flush=True); sys.stdin.read()"
)


def start_holders(count: int) -> list[subprocess.Popen[str]]:
    """Other processes with a context on card 0, each waiting on its stdin."""
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    for holder in holders:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    return holders


def gpu_reads() -> tuple[Callable[[], None], Callable[[], None], str]:
    """(raw reads through pynvml's wrappers, the lean reads the mark makes, where)."""
    import pynvml
    import torch

    from rankscope.nvml_calls import memory_reader
    from rankscope.rank.probe.nvml_view import _fast_process_lister

    recorded = probe.mark("gpu")
    assert recorded is not None and recorded.nvml.procs is not None, recorded
    handle = pynvml.nvmlDeviceGetHandleByUUID(recorded.device.uuid)
    index = torch.cuda.current_device()
    stats = torch._C._cuda_memoryStats
    memory_info = pynvml.nvmlDeviceGetMemoryInfo
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses
    one_struct = memory_reader(pynvml, keep_gil=False)
    one_call = _fast_process_lister(pynvml)
    assert one_struct is not None and one_call is not None

    def raw_reads() -> None:
        stats(index)
        memory_info(handle)
        processes(handle)

    def lean_reads() -> None:
        stats(index)
        one_struct(handle)
        one_call(handle)

    where = f"GPU ({torch.cuda.get_device_name()}, {len(recorded.nvml.procs)} processes)"
    return raw_reads, lean_reads, where


def armed(number: int, rounds: int, holders: int, results: dict[str, Any]) -> None:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        RECORDER.configure(flight_dir=tmp)
        try:
            if torch.cuda.is_available():
                running = start_holders(holders)
                torch.cuda.set_device(0)
                hold = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
                raw_reads, lean_reads, where = gpu_reads()
                write = line_writer(tmp, mark_line())  # a line with the card's numbers
                candidates: dict[str, Timed] = {
                    "mark": lambda: probe.mark("weights_loaded"),
                    "raw_reads": raw_reads,
                    "lean_reads": lean_reads,
                    "write": write,
                }
            else:
                running, hold = [], None
                write = line_writer(tmp, mark_line())
                cuda = torch.cuda
                where = "CPU (torch imported, CUDA never initialised)"
                candidates = {
                    "mark": lambda: probe.mark("weights_loaded"),
                    "raw_reads": lambda: cuda.is_initialized(),
                    "write": write,
                }
            per_round = rounds_of(candidates, number, rounds)
            armed_stand_in(number, rounds, holders, results)
            for holder in running:
                holder.kill()
                holder.wait()
            del hold
        finally:
            RECORDER.configure()  # keeps the directory: disarm by hand below
            RECORDER.flight_dir = None
            RECORDER.armed = False
    figures = {
        "mark / raw reads": ratio_figure(per_round, "mark", "raw_reads"),
        "mark / (raw reads + write)": ratio_figure(per_round, "mark", ["raw_reads", "write"]),
    }
    if "lean_reads" in per_round:
        figures["mark / (lean reads + write)"] = ratio_figure(
            per_round, "mark", ["lean_reads", "write"]
        )
    results["armed"] = {"where": where, "ns": per_round, "ratios": figures}
    print(f"armed mark on {where}")
    for name in per_round:
        say_time(name.replace("_", " "), median(per_round, name))
    own = [
        m - r - w
        for m, r, w in zip(
            per_round["mark"],
            per_round.get("lean_reads", per_round["raw_reads"]),
            per_round["write"],
            strict=True,
        )
    ]
    results["armed"]["own_share_ns"] = own
    say_time("mark minus (its reads + write): rankscope's own share", statistics.median(own))
    for label, figure in figures.items():
        say_ratio(label, figure)
    mark_us = median(per_round, "mark") / 1000
    print(
        f"  budget: an armed mark under {BUDGET_US} us: {'met' if mark_us < BUDGET_US else 'MISSED'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000, help="armed marks a timed loop")
    parser.add_argument("--rounds", type=int, default=9, help="alternated rounds a figure")
    parser.add_argument("--holders", type=int, default=0, help="other processes on the card")
    parser.add_argument("--out", type=Path, help="write every round's numbers here as JSON")
    args = parser.parse_args()
    import torch

    results: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "holders": args.holders,
    }
    print(f"python {results['python']}, torch {results['torch']}, {results['cpus']} cpus")
    disarmed(args.iterations * 100, args.rounds, results)
    armed(args.iterations, args.rounds, args.holders, results)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_mark.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
