"""What zero-touch arming costs, as ratios against baselines measured in the same run.

    python3 bench/bench_startup.py [--starts N] [--iterations N] [--out DIR]

- unarmed start-up: ``python -c pass`` (and ``python -c "import torch"``) in a venv whose
  site-packages holds rankscope-auto.pth, nothing armed, against the same venv without it;
  the starts alternate between the two so drift on a shared machine hits both alike.
  Goal: <= 1.02x.
- armed start-up: the same with RANKSCOPE_AUTO=1 and RANKSCOPE_DIR (what an armed process
  pays once: importing rankscope, the process_start mark), for the record.
- armed cost per generic mark, in process, against the raw reads a mark makes (on the CPU:
  torch.cuda.is_initialized() and the write(2) of an equal line; on a GPU: the allocator's
  stats call, NVML's memory info and process list, and the write) as bench_mark.py does:
  process_start (a mark with one extra), nccl_init_end (a mark with the group's fields
  read from torch.distributed) and, on a GPU, capture_end (a mark with the graph pool's
  bytes from the allocator's snapshot). Goal: within 1.2x of the raw reads.
- the automatic census cadence: a world all_reduce on a one-rank gloo group, counted with
  auto_tick against counted without it.

Each figure is the median of repeats. ``--out DIR`` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PTH = ROOT / "exporter" / "rankscope-auto.pth"


def make_venv(where: Path, with_pth: bool) -> str:
    """A venv seeing this interpreter's packages (torch); with or without the .pth."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    (site,) = where.glob("lib/python*/site-packages")
    (site / "host-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    if with_pth:
        (site / PTH.name).write_bytes(PTH.read_bytes())
    return str(where / "bin" / "python")


def start_seconds(python: str, code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [python, "-c", code],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def startup_ratio(
    plain: str, hooked: str, code: str, env: dict[str, str], hooked_env: dict[str, str], starts: int
) -> dict[str, float]:
    """Start-ups of each, alternating: medians and minima (noise on a shared machine only
    adds time, so the minima are the steadier estimate) and their ratios."""
    a: list[float] = []
    b: list[float] = []
    for i in range(starts):
        order = [(plain, env, a), (hooked, hooked_env, b)]
        for python, e, out in order if i % 2 == 0 else reversed(order):
            out.append(start_seconds(python, code, e))
    return {
        "plain_median_ms": statistics.median(a) * 1e3,
        "hooked_median_ms": statistics.median(b) * 1e3,
        "median_ratio": statistics.median(b) / statistics.median(a),
        "plain_min_ms": min(a) * 1e3,
        "hooked_min_ms": min(b) * 1e3,
        "min_ratio": min(b) / min(a),
        "starts": starts,
    }


def pth_line_ns(iterations: int) -> float:
    """What site.py spends on the .pth's line in an unarmed process: executing it."""
    code = compile(PTH.read_text(), str(PTH), "exec")
    namespace: dict[str, Any] = {}
    return per_call_ns(lambda: exec(code, namespace), iterations)


def per_call_ns(fn: Callable[[], Any], iterations: int, repeats: int = 7) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(iterations):
            fn()
        samples.append((time.perf_counter_ns() - start) / iterations)
    return statistics.median(samples)


def in_process(iterations: int, results: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from rankscope import auto, census, probe
    from rankscope.census import snapshots
    from rankscope.record import RECORDER

    with tempfile.TemporaryDirectory() as tmp:
        RECORDER.configure(flight_dir=tmp)
        sample = probe.mark("sample")
        assert sample is not None
        data = (
            json.dumps({**RECORDER.header("mark"), **sample.to_json()}, separators=(",", ":"))
            + "\n"
        )
        fd = os.open(os.path.join(tmp, "bare.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        raw_line = data.encode()

        def write() -> None:
            os.write(fd, raw_line)

        gpu = torch.cuda.is_available()
        if gpu:
            import pynvml

            torch.cuda.set_device(0)
            hold = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            mark = probe.mark("gpu")
            assert mark is not None
            handle = pynvml.nvmlDeviceGetHandleByUUID(mark.device.uuid)
            index = torch.cuda.current_device()
            stats = torch._C._cuda_memoryStats

            def raw_reads() -> None:
                stats(index)
                pynvml.nvmlDeviceGetMemoryInfo(handle)
                pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        else:
            cuda = torch.cuda

            def raw_reads() -> None:
                cuda.is_initialized()

        reads = per_call_ns(raw_reads, iterations) + per_call_ns(write, iterations)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=0, world_size=1)
        marks: dict[str, Callable[[], Any]] = {
            "process_start": lambda: probe.mark("process_start", python="3"),
            "nccl_init_end": lambda: probe.mark(
                "nccl_init_end", seconds=0.1, **auto._group_fields(dist, None)
            ),
        }
        if gpu:
            graph = torch.cuda.CUDAGraph()
            x = torch.zeros(1024, device="cuda")
            with torch.cuda.graph(graph):
                x.add_(1)
            marks["capture_end"] = lambda: probe.mark(
                "capture_end", **auto.pool_fields(torch, graph)
            )
        where = "GPU" if gpu else "CPU (CUDA never initialised)"
        plain_mark = per_call_ns(lambda: probe.mark("weights_loaded"), iterations)
        print(
            f"armed generic marks on the {where}; raw reads + write(2): {reads / 1000:.2f} us, "
            f"a plain mark: {plain_mark / 1000:.2f} us"
        )
        results["raw_reads_and_write_us"] = reads / 1000
        results["plain_mark_us"] = plain_mark / 1000
        for name, fn in marks.items():
            ns = per_call_ns(fn, iterations)
            results[f"mark_{name}_us"] = ns / 1000
            print(
                f"  {name:<16} {ns / 1000:9.2f} us  {ns / reads:.2f}x the raw reads + write, "
                f"{ns / plain_mark:.2f}x a plain mark"
            )
        if gpu:
            del hold

        # The automatic cadence on the hot path: what auto_tick adds to a counted world
        # collective (snapshots off: every is huge), against the collective itself.
        census.configure(auto_every=10**9)
        tick = per_call_ns(snapshots.auto_tick, iterations * 50)
        t = torch.ones(4)
        collective = min(per_call_ns(lambda: dist.all_reduce(t), iterations) for _ in range(3))
        results["auto_tick_ns"] = tick
        results["all_reduce_us"] = collective / 1000
        print(
            f"auto_tick per world collective: {tick:.0f} ns ({tick / collective:.2%} of a "
            f"1-rank gloo all_reduce, {collective / 1000:.1f} us)"
        )
        dist.destroy_process_group()
        os.close(fd)
        RECORDER.configure()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=60, help="start-ups of each kind")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    env["PYTHONPATH"] = str(ROOT / "exporter")
    with tempfile.TemporaryDirectory() as tmp:
        plain = make_venv(Path(tmp) / "plain", with_pth=False)
        hooked = make_venv(Path(tmp) / "hooked", with_pth=True)
        armed_env = {**env, "RANKSCOPE_AUTO": "1", "RANKSCOPE_DIR": str(Path(tmp) / "flight")}
        for label, code, starts in (
            ("python -c pass", "pass", args.starts),
            ("python -c 'import torch'", "import torch", max(args.starts // 10, 3)),
        ):
            unarmed = startup_ratio(plain, hooked, code, env, env, starts)
            armed = startup_ratio(plain, hooked, code, env, armed_env, starts)
            key = "startup_" + ("pass" if code == "pass" else "torch")
            results[key] = {"unarmed": unarmed, "armed": armed}
            print(
                f"{label:<26} [{starts} starts each] without the .pth "
                f"{unarmed['plain_median_ms']:.1f} ms (min {unarmed['plain_min_ms']:.1f}); "
                f"with it, unarmed: {unarmed['median_ratio']:.3f}x median, "
                f"{unarmed['min_ratio']:.3f}x min; armed: {armed['median_ratio']:.2f}x median"
            )
    line = pth_line_ns(args.iterations * 50)
    results["pth_line_unarmed_ns"] = line
    base = results["startup_pass"]["unarmed"]["plain_min_ms"] * 1e6
    print(
        f"the .pth line, unarmed, in process: {line:.0f} ns ({line / base:.6f} of the "
        "fastest bare start-up)"
    )
    in_process(args.iterations, results)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_startup.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
