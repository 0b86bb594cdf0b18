"""What one mark costs, as ratios to what it cannot avoid, measured in the same run.

    python3 bench/bench_mark.py [--iterations N] [--holders N]

- disarmed: mark() with no flight directory, in ns, against a bare call of a function with
  the same signature;
- armed, on the CPU (torch imported, CUDA never initialised): against its one read
  (torch.cuda.is_initialized) and against that read plus the write(2) of an equal line;
- armed, on a GPU when there is one: against the raw reads a mark must make (the
  allocator's stats call, one NVML memory-info call, one NVML process-list call through
  pynvml), and against those reads plus the write(2). Goal: within 1.2x of the raw reads.
  The mark lists processes with one NVML call into a reused buffer, cheaper than pynvml's
  wrapper (two calls and a Python object per process); that leaner read is printed too.

With ``--holders N`` (GPU only), N other processes hold a CUDA context on the card while it
measures, as on a serving card where the process list a mark reads is a dozen long.

Each figure is the median of several repeats of a timed loop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from rankscope import probe
from rankscope.record import RECORDER, Recorder


def per_call_ns(fn: Callable[[], Any], iterations: int, repeats: int = 7) -> float:
    fn()  # warm caches and lazy initialisation
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(iterations):
            fn()
        samples.append((time.perf_counter_ns() - start) / iterations)
    return statistics.median(samples)


def line_writer(directory: str, sample: dict[str, Any]) -> Callable[[], None]:
    """The bare durable write a mark ends with: one write(2) of an equally long line."""
    data = (json.dumps(sample, separators=(",", ":")) + "\n").encode()
    fd = os.open(os.path.join(directory, "bare.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def write() -> None:
        os.write(fd, data)

    return write


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


def report(name: str, ns: float, baselines: dict[str, float]) -> None:
    ratios = "  ".join(f"{ns / base:.2f}x {label}" for label, base in baselines.items())
    print(f"{name:<44} {ns / 1000:9.2f} us  {ratios}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--holders", type=int, default=0, help="other processes on the card")
    args = parser.parse_args()
    n = args.iterations
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cpus")
    recorder = Recorder(flight_dir=None, boot="bench")
    probe.RECORDER = recorder

    def bare(phase: str, *, runner: str | None = None, **extra: Any) -> None:
        return None

    disarmed = per_call_ns(lambda: probe.mark("weights_loaded"), n * 50)
    bare_call = per_call_ns(lambda: bare("weights_loaded"), n * 50)
    print(
        f"{'disarmed mark':<44} {disarmed:9.1f} ns  {disarmed / bare_call:.2f}x the bare call ({bare_call:.1f} ns)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        recorder.configure(flight_dir=tmp)
        sample = probe.mark("sample")
        assert sample is not None
        write = line_writer(tmp, {**recorder.header("mark"), **sample.to_json()})
        write_ns = per_call_ns(write, n)

        holders = start_holders(args.holders) if torch.cuda.is_available() else []
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
            hold = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            mark = probe.mark("gpu")
            assert mark is not None and mark.nvml.procs is not None, mark
            import pynvml

            handle = pynvml.nvmlDeviceGetHandleByUUID(mark.device.uuid)
            index = torch.cuda.current_device()
            stats = torch._C._cuda_memoryStats

            def raw_reads() -> None:
                stats(index)
                pynvml.nvmlDeviceGetMemoryInfo(handle)
                pynvml.nvmlDeviceGetComputeRunningProcesses(handle)

            reads = per_call_ns(raw_reads, n)
            from rankscope.probe.nvml_view import _fast_process_lister

            one_call = _fast_process_lister(pynvml)
            if one_call is not None:

                def lean_reads() -> None:
                    stats(index)
                    pynvml.nvmlDeviceGetMemoryInfo(handle)
                    one_call(handle)

                lean = per_call_ns(lean_reads, n)
                print(f"{'raw reads, one-call process list (used)':<44} {lean / 1000:9.2f} us")
            where = f"GPU ({torch.cuda.get_device_name()}, {len(mark.nvml.procs)} processes)"
            flattened = per_call_ns(lambda: torch.cuda.memory_stats(index), n)
            nested = per_call_ns(lambda: stats(index), n)
            print(f"{'torch.cuda.memory_stats (flattened)':<44} {flattened / 1000:9.2f} us")
            print(f"{'torch._C._cuda_memoryStats (nested, used)':<44} {nested / 1000:9.2f} us")
            del hold
        else:
            cuda = torch.cuda

            def raw_reads() -> None:
                cuda.is_initialized()

            reads = per_call_ns(raw_reads, n)
            where = "CPU (torch imported, CUDA not initialised)"
        armed = per_call_ns(lambda: probe.mark("weights_loaded"), n)
        print(f"armed mark on {where}")
        print(f"{'raw reads':<44} {reads / 1000:9.2f} us")
        print(f"{'raw reads + write(2) of the line':<44} {(reads + write_ns) / 1000:9.2f} us")
        report("armed mark", armed, {"raw reads": reads, "reads+write": reads + write_ns})
        for holder in holders:
            holder.kill()
            holder.wait()
    RECORDER.configure()  # the global recorder was never armed by this bench
    return 0


if __name__ == "__main__":
    sys.exit(main())
