"""What rankscope costs a decoding model: inter-token latency (ITL) with and without it.

    python3 bench/bench_interference.py [--quick] [--out DIR]

GPU only (exits at once, saying so, without CUDA). A transformers LLaMA-style model built
from a config with random weights (about 1.1 B parameters, bf16), batch 8, a static KV
cache, decodes one token per step; each step's wall time is taken with a synchronize per
step. Two modes: eager, and one decode step captured in a CUDA graph and replayed.

Conditions, each a set of real processes started once and held stopped (SIGSTOP) except
during their own blocks, so every block runs next to the same idle processes:

    baseline  nothing running
    serve100  `rankscope serve` at 100 ms, holdings on (1 s), a scraper on /metrics every 1 s
    serve20   the same at 20 ms
    serve10   the same at 10 ms
    nvml25    a bare NVML poller: process list + memory info every 25 ms
    smi100    nvidia-smi --query-gpu=memory.used --format=csv -lms 100

Schedule: after a warm-up that brings the clocks to steady state, blocks alternate
baseline / condition (B c B c B ...), the conditions shuffled (seeded) in each round, so
every condition block has a baseline block on each side, and decoding never pauses between
blocks. Figures: per block ITL p50 / p99 / p99.9 / mean; per condition the paired ratio of
each of its blocks to the mean of its two neighbouring baseline blocks (median, min, max)
(mean with its standard error, min, max) and the pooled ratio (all its steps against all
baseline steps). The noise floor is the same paired ratio for each baseline block against
the baseline blocks two away (its neighbours of the same kind): one standard error of a
mean of as many such ratios as a condition has blocks; and the spread between baseline
blocks (max / min - 1). Raw per-block
figures go to DIR/interference.json and every step to DIR/steps.csv.

Budget: about 5 minutes on an H200 in full, about 2 with --quick.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness

CONDITIONS = ("serve100", "serve20", "serve10", "nvml25", "smi100")

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

SCRAPER = """
import sys, time, urllib.request
url = sys.argv[1]
while True:
    time.sleep(1.0)
    try:
        urllib.request.urlopen(url, timeout=10).read()
    except OSError:
        pass
"""


class Condition:
    """Real processes that run only while resumed."""

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


def start_conditions(log_dir: Path | None) -> dict[str, Condition]:
    env = harness.child_env()
    out: dict[str, Condition] = {}
    try:
        for name in CONDITIONS:
            if name.startswith("serve"):
                log = log_dir / f"{name}.log" if log_dir else None
                daemon = harness.Daemon(int(name[5:]), log=log)
                scraper = subprocess.Popen(
                    [sys.executable, "-c", SCRAPER, daemon.url + "/metrics"], env=env
                )
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


def timed_steps(step: Callable[[], None], n: int) -> list[float]:
    """n steps' wall times in ms, one synchronize per step (inside step)."""
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t = clock()
        step()
        out.append((clock() - t) / 1e6)
    return out


def schedule(rounds: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    order = ["baseline"]
    for _ in range(rounds):
        names = list(CONDITIONS)
        rng.shuffle(names)
        for name in names:
            order += [name, "baseline"]
    return order


STATS = ("p50", "p99", "p999", "mean")


def analyse(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Paired and pooled ratios per condition; the baseline's own noise floor."""
    base_idx = [i for i, b in enumerate(blocks) if b["condition"] == "baseline"]
    out: dict[str, Any] = {}

    def neighbours(i: int, kind_gap: int) -> list[dict[str, Any]]:
        return [blocks[j] for j in (i - kind_gap, i + kind_gap) if 0 <= j < len(blocks)]

    null: dict[str, list[float]] = {s: [] for s in STATS}
    for i in base_idx:
        around = [b for b in neighbours(i, 2) if b["condition"] == "baseline"]
        if len(around) == 2:
            for s in STATS:
                null[s].append(blocks[i][s] / statistics.fmean(b[s] for b in around))
    base_values = {s: [blocks[i][s] for i in base_idx] for s in STATS}
    base_steps = [t for i in base_idx for t in blocks[i]["steps"]]
    half = [
        [t for k, i in enumerate(base_idx) if k % 2 == h for t in blocks[i]["steps"]]
        for h in (0, 1)
    ]
    q_half = [harness.quantiles(h) for h in half]
    blocks_per_condition = max(1, sum(b["condition"] == CONDITIONS[0] for b in blocks))
    out["noise_floor"] = {
        s: {
            # One standard error of a condition's mean paired ratio, had it no effect: the
            # spread of baseline-against-baseline ratios over as many blocks.
            "se_of_condition_mean": statistics.stdev(null[s]) / blocks_per_condition**0.5
            if len(null[s]) > 1
            else None,
            "paired_median": statistics.median(null[s]) if null[s] else None,
            "paired_min": min(null[s], default=None),
            "paired_max": max(null[s], default=None),
            "spread_max_over_min": max(base_values[s]) / min(base_values[s]) - 1,
            "split_half_ratio": q_half[1][s] / q_half[0][s],
        }
        for s in STATS
    }
    q_base = harness.quantiles(base_steps)
    out["baseline_ms"] = q_base
    for name in CONDITIONS:
        idx = [i for i, b in enumerate(blocks) if b["condition"] == name]
        paired: dict[str, list[float]] = {s: [] for s in STATS}
        for i in idx:
            around = [b for b in neighbours(i, 1) if b["condition"] == "baseline"]
            for s in STATS:
                paired[s].append(blocks[i][s] / statistics.fmean(b[s] for b in around))
        q = harness.quantiles([t for i in idx for t in blocks[i]["steps"]])
        out[name] = {
            s: {
                "paired_mean": statistics.fmean(paired[s]),
                "paired_se": statistics.stdev(paired[s]) / len(paired[s]) ** 0.5
                if len(paired[s]) > 1
                else None,
                "paired_median": statistics.median(paired[s]),
                "paired_min": min(paired[s]),
                "paired_max": max(paired[s]),
                "pooled": q[s] / q_base[s],
            }
            for s in STATS
        }
        out[name]["blocks"] = len(idx)
    return out


def run_mode(
    mode: str, step: Callable[[], None], conditions: dict[str, Condition], args: argparse.Namespace
) -> list[dict[str, Any]]:
    warm_end = time.monotonic() + args.warmup
    warm: list[float] = []
    while time.monotonic() < warm_end:
        warm += timed_steps(step, 20)
    per_step = statistics.median(warm[-200:]) / 1e3
    steps = max(50, round(args.block / per_step))
    order = schedule(args.rounds_graph if mode == "graph" else args.rounds_eager, args.seed)
    print(
        f"{mode}: step {per_step * 1e3:.3f} ms after {args.warmup:.0f} s warm-up; "
        f"{len(order)} blocks of {steps} steps",
        flush=True,
    )
    blocks: list[dict[str, Any]] = []
    for n, name in enumerate(order):
        cond = conditions.get(name)
        if cond is not None:
            cond.resume()
        try:
            times = timed_steps(step, steps)
        finally:
            if cond is not None:
                cond.pause()
        blocks.append(
            {"mode": mode, "block": n, "condition": name, **harness.quantiles(times),
             "steps": times}
        )  # fmt: skip
    return blocks


def print_report(mode: str, result: dict[str, Any]) -> None:
    base = result["baseline_ms"]
    print(
        f"\n{mode}: baseline ITL p50 {base['p50']:.3f} ms, p99 {base['p99']:.3f}, "
        f"p99.9 {base['p999']:.3f}, mean {base['mean']:.3f}"
    )
    floor = result["noise_floor"]
    print(
        "noise floor (1 SE of a condition's mean paired ratio, from baseline-vs-baseline): "
        + ", ".join(
            f"{s} {floor[s]['se_of_condition_mean']:.3%}"
            for s in ("p50", "p99", "p999")
            if floor[s]["se_of_condition_mean"] is not None
        )
        + "; spread between baseline blocks (max/min-1): "
        + ", ".join(f"{s} {floor[s]['spread_max_over_min']:.2%}" for s in ("p50", "p99", "p999"))
    )
    print(f"{'':10s}" + "".join(f"{s:>40s}" for s in ("p50", "p99", "p99.9")))
    print(f"{'':10s}" + "     paired mean +- SE [min..max]  pooled" * 3)
    for name in CONDITIONS:
        cells = []
        for s in ("p50", "p99", "p999"):
            r = result[name][s]
            se = r["paired_se"] if r["paired_se"] is not None else float("nan")
            cells.append(
                f"{r['paired_mean']:.4f}+-{se:.4f} [{r['paired_min']:.3f}..{r['paired_max']:.3f}]"
                f" {r['pooled']:.4f}"
            )
        print(f"{name:10s}" + "".join(f"{c:>40s}" for c in cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="about 2 minutes instead of 5")
    p.add_argument("--modes", default="graph,eager", help="graph, eager or both (default)")
    p.add_argument("--out", type=Path, help="directory for interference.json and steps.csv")
    p.add_argument("--seed", type=int, default=17)
    args = p.parse_args()
    harness.require_cuda("bench_interference")
    args.block, args.warmup = (0.6, 6.0) if args.quick else (1.2, 15.0)
    args.rounds_graph, args.rounds_eager = (3, 3) if args.quick else (8, 4)
    started = time.monotonic()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    conditions = start_conditions(args.out)
    results: dict[str, Any] = {"modes": {}}
    all_blocks: list[dict[str, Any]] = []
    try:
        print(f"conditions up in {time.monotonic() - started:.1f} s: {', '.join(conditions)}")
        for mode in args.modes.split(","):
            try:
                step = build_decoder(batch=8, cache_len=512, graph=mode == "graph")
            except Exception as exc:  # one mode failing must not lose the other's figures
                print(f"{mode}: could not build the decoder: {exc!r}", flush=True)
                results["modes"][mode] = {"error": repr(exc)}
                continue
            blocks = run_mode(mode, step, conditions, args)
            all_blocks += blocks
            results["modes"][mode] = analyse(blocks)
            print_report(mode, results["modes"][mode])
            del step
    finally:
        for c in conditions.values():
            c.stop()
    results["seconds"] = time.monotonic() - started
    results["blocks"] = [{k: v for k, v in b.items() if k != "steps"} for b in all_blocks]
    print(f"\ntotal {results['seconds']:.0f} s")
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
