"""What rankscope costs a decoding model: inter-token latency (ITL) with and without it.

    python3 bench/bench_interference.py [--seconds 240] [--block 0.5] [--out DIR]
    python3 bench/bench_interference.py --smoke     # no GPU: STAND-INs, the code path only
    python3 bench/bench_interference.py --replay DIR/steps.csv [--block-steps N]

--seconds is the whole run's budget, start-up and model builds included (240 s by default,
about 4.2 minutes with the interpreter's start and the report; --quick: 120 s).

GPU only (exits at once, saying so, without CUDA), except --smoke. A transformers
LLaMA-style model built from a config with random weights (about 1.1 B parameters, bf16),
batch 8, a static KV cache, decodes one token per step; each step's wall time is taken with
a synchronize per step. Two modes: one decode step captured in a CUDA graph and replayed
(most of the time budget), and eager (a short share: it is CPU-bound and noisier).

Conditions, each a set of real processes started once and held stopped (SIGSTOP) except
during their own blocks, so every block runs next to the same idle processes:

    baseline  nothing running
    null      nothing running either, scheduled and estimated exactly as a condition: the
              A/A comparison whose standard error is the noise floor
    serve100  `rankscope serve` at 100 ms, holdings on (1 s), a scraper on /metrics every 1 s
    serve20   the same at 20 ms
    serve10   the same at 10 ms
    nvml25    a bare NVML poller: process list + memory info every 25 ms
    smi100    nvidia-smi --query-gpu=memory.used --format=csv -lms 100

Schedule: the decoding process is pinned to one CPU and Python's garbage collector is off
while it is timed (--no-pin keeps both as they are); a warm-up (--warmup, decoding
without timing blocks) brings the GPU and CPU clocks to steady state first; no clock or
setting is changed. Then short blocks (--block seconds) alternate baseline / condition
(B c B c ... B) until the mode's share of --seconds is spent, the conditions shuffled
(seeded) in rounds, a round never starting with the condition that ended the one before,
so each condition block has baseline blocks on both sides that no other block of the same
condition uses, and decoding never pauses between blocks.

Estimators:

- p50 and mean, paired: for each block of a condition, d = ln(stat of the block) minus the
  mean of ln(stat) of its two neighbouring baseline blocks; the condition's ratio is
  exp(mean d) and its standard error sd(d) / sqrt(k) over its k blocks (the d of one
  condition are independent: they share no baseline block), as a fraction of the ratio.
- p99 and p99.9, pooled: every step of the condition's blocks against every step of their
  neighbouring baseline blocks (a block of a few hundred steps has no p99.9 of its own);
  the standard error by a cluster bootstrap that resamples the condition's blocks, each
  with its two neighbours (--bootstrap resamples, seeded).
- The noise floor: the `null` condition's standard error for each statistic, i.e. what one
  standard error of a condition with no effect is in this run; its ratio should be 1
  within about two of them. The spread between baseline blocks (max / min - 1) is printed
  too; it grows with the number of blocks and is not the floor.

A resumed process runs at once whatever fell due while it was stopped: the daemon's
1 s holdings read therefore comes once per serve block when blocks are shorter than 1 s
(at the default 0.5 s, twice its rate: the serve figures are an upper bound), the 100 ms
and faster loops and the scraper (which counts only the time it runs) keep their rates.

Raw figures: DIR/interference.json (every block's statistics, in order, with the
warm-up's per-second medians) and DIR/steps.csv (every step).
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness

CONDITIONS = ("null", "serve100", "serve20", "serve10", "nvml25", "smi100")
STATS = ("p50", "p99", "p999", "mean")
PAIRED = ("p50", "mean")  # per-block statistics steady enough to pair block by block

NVML_POLLER = """
import time, pynvml
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
while True:
    for h in handles:
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        pynvml.nvmlDeviceGetMemoryInfo(h)
    time.sleep(0.025)
"""

# --smoke: a STAND-IN for every condition's processes (no NVML, no nvidia-smi here).
STANDIN_PROCESS = "import time\nwhile True: time.sleep(0.01)"


class Condition:
    """Real processes that run only while resumed (none for the baseline and null)."""

    def __init__(self, name: str, procs: list[subprocess.Popen[Any]], daemon: Any = None):
        self.name, self.procs, self.daemon = name, procs, daemon
        self.pause()

    def _signal(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{self.name}: process {p.args!r} exited ({p.returncode})")
            os.kill(p.pid, sig)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
        if self.daemon is not None:
            self.daemon.stop()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def start_conditions(log_dir: Path | None, smoke: bool) -> dict[str, Condition]:
    out: dict[str, Condition] = {"baseline": Condition("baseline", [])}
    try:
        for name in CONDITIONS:
            if name == "null":
                out[name] = Condition(name, [])
            elif smoke:
                standin = subprocess.Popen([sys.executable, "-c", STANDIN_PROCESS])
                out[name] = Condition(name, [standin])
            elif name.startswith("serve"):
                log = log_dir / f"{name}.log" if log_dir else None
                daemon = harness.Daemon(int(name[5:]), log=log)
                scraper = harness.start_scraper(daemon.url + "/metrics", 1.0)
                out[name] = Condition(name, [daemon.proc, scraper], daemon)
            elif name == "nvml25":
                out[name] = Condition(name, [subprocess.Popen([sys.executable, "-c", NVML_POLLER])])
            elif name == "smi100":
                smi = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv", "-lms", "100"],
                    stdout=subprocess.DEVNULL,
                )
                out[name] = Condition(name, [smi])
    except BaseException:
        for c in out.values():
            c.stop()
        raise
    return out


LLAMA_1B = {
    "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 4096,
}  # fmt: skip


def build_decoder(
    batch: int, cache_len: int, graph: bool, device: str = "cuda", shape: dict[str, int] = LLAMA_1B
) -> Callable[[], None]:
    """One decode step of a random-weight LLaMA-style model: a callable that runs it. The
    positions wrap back to ``start`` before the cache fills, so every step attends over the
    same static cache and costs the same."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    config = LlamaConfig(**shape)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(config).eval()
    torch.set_default_dtype(previous)
    cache = StaticCache(config=config, max_cache_len=cache_len)
    ids = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    pos = torch.zeros((1, 1), dtype=torch.long, device=device)
    start = 16

    def forward() -> Any:
        return model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)

    def advance(position: int) -> None:
        if position + 1 < cache_len:
            pos.add_(1)
            return
        pos.fill_(start)  # the static cache counts its own length per layer: rewind it too
        for layer in cache.layers:
            layer.cumulative_length.fill_(start)

    with torch.inference_mode():
        for i in range(start):  # a prompt's worth of cache
            forward()
            advance(i)
        run: Callable[[], Any] = forward
        if graph:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for i in range(start, start + 3):
                    forward()
                    advance(i)
            torch.cuda.current_stream().wait_stream(stream)
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):
                static_out = forward()

            def replay() -> Any:
                captured.replay()
                return static_out

            run = replay
    position = [int(pos.item())]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step() -> None:
        with torch.inference_mode():
            out = run()
            ids.copy_(out.logits[:, -1].argmax(-1, keepdim=True))
            advance(position[0])
            position[0] = position[0] + 1 if position[0] + 1 < cache_len else start
        sync()

    return step


def standin_step(ms: float = 1.0) -> Callable[[], None]:
    """--smoke: a STAND-IN decode step, pure Python for about ``ms`` (no GPU, no model)."""
    n = 1000
    t = time.perf_counter()
    for _ in range(5):
        sum(range(n))
    per = (time.perf_counter() - t) / 5 / n
    n = max(1, round(ms / 1e3 / per))

    def step() -> None:
        sum(range(n))

    return step


def timed_steps(step: Callable[[], None], n: int) -> list[float]:
    """n steps' wall times in ms, one synchronize per step (inside step)."""
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t = clock()
        step()
        out.append((clock() - t) / 1e6)
    return out


def rounds(seed: int) -> Iterator[str]:
    """Conditions for B c B c ...: shuffled rounds, a round never starting with the
    condition that ended the one before, so no baseline block sits between two blocks of
    one condition."""
    rng = random.Random(seed)
    last = None
    while True:
        names = list(CONDITIONS)
        rng.shuffle(names)
        if names[0] == last:
            names[0], names[-1] = names[-1], names[0]
        last = names[-1]
        yield from names


def quantile(ordered: list[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


QUANTILES = {"p50": 0.5, "p99": 0.99, "p999": 0.999}


def block_stats(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        **{s: quantile(ordered, p) for s, p in QUANTILES.items()},
        "mean": statistics.fmean(times),
    }


def pairs(blocks: list[dict[str, Any]], name: str) -> list[int]:
    """Indices of ``name``'s blocks that have a baseline block on each side."""
    return [
        i
        for i, b in enumerate(blocks)
        if b["condition"] == name
        and 0 < i < len(blocks) - 1
        and blocks[i - 1]["condition"] == blocks[i + 1]["condition"] == "baseline"
    ]


def paired(blocks: list[dict[str, Any]], idx: list[int], stat: str) -> dict[str, Any]:
    """The paired estimator: exp(mean d), d = ln(block) - mean ln(its two baselines)."""
    d = [
        math.log(blocks[i][stat])
        - (math.log(blocks[i - 1][stat]) + math.log(blocks[i + 1][stat])) / 2
        for i in idx
    ]
    ratio = math.exp(statistics.fmean(d))
    return {
        "estimator": "paired",
        "ratio": ratio,
        "se": statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else None,
        "block_min": math.exp(min(d)),
        "block_max": math.exp(max(d)),
    }


def pooled(
    blocks: list[dict[str, Any]], idx: list[int], stats: tuple[str, ...], resamples: int, seed: int
) -> dict[str, dict[str, Any]]:
    """The pooled estimator: a statistic of all the condition's steps over the same
    statistic of all its neighbouring baseline steps; its standard error by a cluster
    bootstrap over the condition's blocks, each resampled with its two neighbours."""

    ordered = {j: sorted(blocks[j]["steps"]) for i in idx for j in (i - 1, i, i + 1)}

    def ratios(chosen: list[int]) -> dict[str, float]:
        cond: list[float] = []
        base: list[float] = []
        for i in chosen:
            cond += ordered[i]
            base += ordered[i - 1]
            base += ordered[i + 1]
        cond.sort()  # sorted runs: timsort merges them
        base.sort()
        out = {}
        for s in stats:
            if s == "mean":
                out[s] = statistics.fmean(cond) / statistics.fmean(base)
            else:
                out[s] = quantile(cond, QUANTILES[s]) / quantile(base, QUANTILES[s])
        return out

    point = ratios(idx)
    rng = random.Random(seed)
    boot: dict[str, list[float]] = {s: [] for s in stats}
    if len(idx) > 1:
        for _ in range(resamples):
            for s, r in ratios([rng.choice(idx) for _ in idx]).items():
                boot[s].append(r)
    return {
        s: {
            "estimator": "pooled",
            "ratio": point[s],
            # as a fraction of the ratio, like the paired SE
            "se": statistics.stdev(boot[s]) / point[s] if len(boot[s]) > 1 else None,
        }
        for s in stats
    }


def analyse(blocks: list[dict[str, Any]], resamples: int = 400, seed: int = 0) -> dict[str, Any]:
    """Per condition and statistic: the ratio to the neighbouring baselines with its
    standard error (paired for p50 and mean, pooled with a cluster bootstrap for p99 and
    p99.9; both kinds are kept for every statistic); the noise floor is the null's."""
    out: dict[str, Any] = {"conditions": {}}
    base_idx = [i for i, b in enumerate(blocks) if b["condition"] == "baseline"]
    base = sorted(t for i in base_idx for t in blocks[i]["steps"])
    out["baseline_ms"] = {**block_stats(base), "steps": len(base), "blocks": len(base_idx)}
    out["baseline_spread"] = {
        s: max(blocks[i][s] for i in base_idx) / min(blocks[i][s] for i in base_idx) - 1
        for s in STATS
    }
    for name in CONDITIONS:
        idx = pairs(blocks, name)
        if not idx:
            out["conditions"][name] = {"blocks": 0}
            continue
        cell: dict[str, Any] = {"blocks": len(idx)}
        pool = pooled(blocks, idx, STATS, resamples, seed)
        for s in STATS:
            cell[s] = paired(blocks, idx, s) if s in PAIRED else dict(pool[s])
            cell[s]["pooled"] = pool[s]  # both estimators, for every statistic
        out["conditions"][name] = cell
    null = out["conditions"].get("null", {})
    out["noise_floor"] = {
        s: {"se": null[s]["se"], "null_ratio": null[s]["ratio"], "estimator": null[s]["estimator"]}
        if s in null
        else None
        for s in STATS
    }
    return out


def run_mode(
    mode: str,
    step: Callable[[], None],
    conditions: dict[str, Condition],
    deadline: float,
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], list[float]]:
    """Warm up, then B c B c ... B blocks until ``deadline`` (time.monotonic)."""
    warm_end = time.monotonic() + args.warmup
    warm_medians: list[float] = []  # one a second: the clocks settling, or not
    while True:  # at least one round: its p50 sets the block's steps
        second_end = min(warm_end, time.monotonic() + 1.0)
        times = timed_steps(step, 5)
        while time.monotonic() < second_end:
            times += timed_steps(step, 5)
        warm_medians.append(statistics.median(times))
        if time.monotonic() >= warm_end:
            break
    per_step = warm_medians[-1] / 1e3
    steps = max(args.min_steps, round(args.block / per_step))
    print(
        f"{mode}: step {per_step * 1e3:.3f} ms after a {args.warmup:.1f} s warm-up (per-second "
        f"p50 {warm_medians[0]:.3f} -> {warm_medians[-1]:.3f} ms); blocks of {steps} steps "
        f"until {deadline - time.monotonic():.0f} s from now",
        flush=True,
    )
    blocks: list[dict[str, Any]] = []
    order = rounds(args.seed)
    t0 = time.monotonic()

    def block(name: str) -> None:
        cond = conditions[name]
        started = time.monotonic()
        cond.resume()
        try:
            times = timed_steps(step, steps)
        finally:
            cond.pause()
        blocks.append(
            {"mode": mode, "block": len(blocks), "condition": name, "t": started - t0,
             **block_stats(times), "steps": times}
        )  # fmt: skip

    block("baseline")
    pair_s = 2 * (time.monotonic() - t0)  # a condition block and the baseline after it
    while time.monotonic() + pair_s < deadline:
        block(next(order))
        block("baseline")
    return blocks, warm_medians


def fmt_cell(r: dict[str, Any]) -> str:
    se = r["se"] if r["se"] is not None else float("nan")
    return f"{r['ratio']:.4f} +- {se:.4f}"


def print_report(mode: str, result: dict[str, Any]) -> None:
    base = result["baseline_ms"]
    print(
        f"\n{mode}: baseline ITL p50 {base['p50']:.3f} ms, p99 {base['p99']:.3f}, "
        f"p99.9 {base['p999']:.3f}, mean {base['mean']:.3f} ({base['blocks']} blocks)"
    )
    floor = result["noise_floor"]
    print(
        "noise floor (1 SE of the null condition, an A/A comparison): "
        + ", ".join(
            f"{s} {floor[s]['se']:.3%} ({floor[s]['estimator']})"
            for s in ("p50", "p99", "p999")
            if floor[s] is not None and floor[s]["se"] is not None
        )
        + "; spread between baseline blocks (max/min-1, not the floor): "
        + ", ".join(f"{s} {result['baseline_spread'][s]:.2%}" for s in ("p50", "p99", "p999"))
    )
    print(
        f"{'':10s}{'blocks':>7s}{'p50 (paired)':>20s}{'p99 (pooled)':>20s}{'p99.9 (pooled)':>20s}"
        f"{'mean (paired)':>20s}"
    )
    for name in CONDITIONS:
        cell = result["conditions"][name]
        if not cell["blocks"]:
            print(f"{name:10s}{0:7d}  (no block ran)")
            continue
        print(
            f"{name:10s}{cell['blocks']:7d}" + "".join(f"{fmt_cell(cell[s]):>20s}" for s in STATS)
        )


def replay(path: Path, block_steps: int | None, args: argparse.Namespace) -> None:
    """What this design's estimators make of steps recorded before (a steps.csv): each
    mode's steps, in their order, cut into blocks of ``block_steps`` and labelled
    B c B c ... B as a run would. Whatever the recording ran, every condition here is a
    relabelled stretch of it, so each one's standard error is a noise floor."""
    streams: dict[str, list[float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            streams.setdefault(row["mode"], []).append(float(row["ms"]))
    print(f"REPLAY of {path}: recorded steps relabelled, no condition ran here")
    for mode, stream in streams.items():
        n = block_steps or max(args.min_steps, round(args.block * 1e3 / statistics.median(stream)))
        chunks = [stream[i : i + n] for i in range(0, len(stream) - n + 1, n)]
        chunks = chunks[: len(chunks) - 1 + len(chunks) % 2]  # end on a baseline block
        order = rounds(args.seed)
        blocks = [
            {"condition": "baseline" if k % 2 == 0 else next(order), **block_stats(c), "steps": c}
            for k, c in enumerate(chunks)
        ]
        print_report(
            f"{mode}, {len(stream)} steps in blocks of {n}",
            analyse(blocks, args.bootstrap, args.seed),
        )


def pin_and_freeze(pin: bool) -> str:
    """Pin this process to one CPU (the highest it may use: interrupts and housekeeping
    favour the lowest) and stop the garbage collector, what it would otherwise do at
    random steps; returns what was done, for the report."""
    if not pin:
        return "not pinned, GC on"
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})
    gc.collect()
    gc.freeze()
    gc.disable()
    return f"pinned to CPU {cpus[-1]} of {len(cpus)}, GC off while timed"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, help="the whole run's budget (default 240, smoke 12)")
    p.add_argument("--block", type=float, help="seconds a block (default 0.5, smoke 0.03)")
    p.add_argument("--warmup", type=float, help="seconds of warm-up a mode (default 8, smoke 0.5)")
    p.add_argument("--min-steps", type=int, default=20, help="fewest steps a block")
    p.add_argument("--modes", default="graph,eager", help="graph, eager or both (default)")
    p.add_argument("--eager-share", type=float, default=0.2, help="of the time left for modes")
    p.add_argument("--bootstrap", type=int, default=400, help="resamples for the pooled SE")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="leave CPU and GC as is")
    p.add_argument("--quick", action="store_true", help="--seconds 120")
    p.add_argument("--smoke", action="store_true", help="no GPU: STAND-IN step and processes")
    p.add_argument("--out", type=Path, help="directory for interference.json and steps.csv")
    p.add_argument("--seed", type=int, default=17)
    p.add_argument(
        "--replay", type=Path, metavar="STEPS_CSV", help="no run: the estimators on recorded steps"
    )
    p.add_argument("--block-steps", type=int, help="--replay: steps a block (default from --block)")
    args = p.parse_args()
    if args.replay:
        args.block = args.block or 0.5
        replay(args.replay, args.block_steps, args)
        return
    if not args.smoke:
        harness.require_cuda("bench_interference")
    default_seconds = 12.0 if args.smoke else 120.0 if args.quick else 240.0
    args.seconds = args.seconds or default_seconds
    args.block = args.block or (0.03 if args.smoke else 0.5)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.smoke else 8.0)
    started = time.monotonic()
    end = started + args.seconds
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        print("SMOKE: a STAND-IN step (pure Python) and STAND-IN processes for every condition;")
        print("       the schedule and the statistics run, no figure here means anything")
    conditions = start_conditions(args.out, args.smoke)
    results: dict[str, Any] = {"modes": {}, "args": {k: str(v) for k, v in vars(args).items()}}
    all_blocks: list[dict[str, Any]] = []
    modes = args.modes.split(",")
    try:
        print(f"conditions up in {time.monotonic() - started:.1f} s: {', '.join(CONDITIONS)}")
        results["process"] = pin_and_freeze(args.pin)
        print(results["process"])
        for n, mode in enumerate(modes):
            left = end - time.monotonic()
            share = (
                1.0
                if n == len(modes) - 1
                else 1 - args.eager_share
                if mode == "graph"
                else args.eager_share
            )
            deadline = time.monotonic() + left * share
            try:
                step = (
                    standin_step(1.0 if mode == "graph" else 3.0)
                    if args.smoke
                    else build_decoder(batch=8, cache_len=512, graph=mode == "graph")
                )
            except Exception as exc:  # one mode failing must not lose the other's figures
                print(f"{mode}: could not build the decoder: {exc!r}", flush=True)
                results["modes"][mode] = {"error": repr(exc)}
                continue
            blocks, warm = run_mode(mode, step, conditions, deadline, args)
            gc.collect()
            all_blocks += blocks
            result = analyse(blocks, args.bootstrap, args.seed)
            result["warmup_p50_per_second_ms"] = warm
            result["block_steps"] = len(blocks[0]["steps"])
            results["modes"][mode] = result
            print_report(mode, result)
            del step
    finally:
        gc.enable()
        for c in conditions.values():
            c.stop()
    results["seconds"] = time.monotonic() - started
    results["blocks"] = [{k: v for k, v in b.items() if k != "steps"} for b in all_blocks]
    print(f"\ntotal {results['seconds']:.0f} s (budget {args.seconds:.0f} s)")
    if args.out:
        (args.out / "interference.json").write_text(json.dumps(results, indent=1))
        with open(args.out / "steps.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["mode", "block", "condition", "step", "ms"])
            for b in all_blocks:
                for k, t in enumerate(b["steps"]):
                    w.writerow([b["mode"], b["block"], b["condition"], k, f"{t:.4f}"])


if __name__ == "__main__":
    main()
