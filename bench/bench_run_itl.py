"""Decode inter-token latency (ITL) of a job under `rankscope run` against the same job plain.

    python3 bench/bench_run_itl.py [--pairs 4] [--steps 4000] [--warmup 1000] [--out DIR]

GPU only (exits at once, saying so, without CUDA). The job is bench_interference's decoder:
a random-weight LLaMA-style model (about 1.1 B parameters, bf16), batch 8, a static KV cache,
one decode step captured in a CUDA graph and replayed, in a process of its own that imports
nothing from rankscope, unpinned and with the garbage collector on, as a server runs. It runs
alternately plain and as `rankscope run --dir DIR -- python3 ...` (probe armed, census
counting, the census watcher and the serving sampler running), plain first and last
(P R P R ... P), so each armed run has a plain run on both sides.

Per run: the p50, p99 and mean of its timed steps (after --warmup untimed ones). An armed
run's ratio is its statistic over the mean of its two neighbours'; the figure is the median
ratio over the armed runs, with their min and max. The spread of the plain runs among
themselves (max / min of their p50) is printed too: the noise between processes, which an
armed run's ratio cannot be read below.

Raw figures: DIR/run_itl.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve().parent
STATS = ("p50", "p99", "mean")


def child(steps: int, warmup: int) -> None:
    """One run of the job: its step statistics as one JSON line on stdout."""
    from bench_interference import build_decoder, timed_steps

    step = build_decoder(batch=8, cache_len=1024, graph=True)
    timed_steps(step, warmup)
    times = sorted(timed_steps(step, steps))
    print(
        json.dumps(
            {
                "p50": times[len(times) // 2],
                "p99": times[min(len(times) - 1, int(len(times) * 0.99))],
                "mean": statistics.fmean(times),
            }
        ),
        flush=True,
    )


def run_once(armed: bool, steps: int, warmup: int, flight: Path) -> dict[str, float]:
    job = [sys.executable, str(HERE / "bench_run_itl.py"), "--child"]
    job += ["--steps", str(steps), "--warmup", str(warmup)]
    command = (
        [sys.executable, "-m", "rankscope", "run", "--dir", str(flight), "--", *job]
        if armed
        else job
    )
    done = subprocess.run(
        command, capture_output=True, text=True, env=harness.child_env(), check=False
    )
    if done.returncode != 0:
        raise SystemExit(
            f"{'armed' if armed else 'plain'} run exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def ratios(runs: list[dict[str, Any]], stat: str) -> list[float]:
    """Each armed run's statistic over the mean of its two plain neighbours'."""
    return [
        runs[i]["stats"][stat]
        / statistics.fmean((runs[i - 1]["stats"][stat], runs[i + 1]["stats"][stat]))
        for i in range(1, len(runs) - 1, 2)
    ]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pairs", type=int, default=4, help="armed runs, each between two plain ones")
    p.add_argument("--steps", type=int, default=4000, help="timed decode steps a run")
    p.add_argument("--warmup", type=int, default=1000, help="untimed decode steps first")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.steps, args.warmup)
        return
    harness.require_cuda("bench_run_itl")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(2 * args.pairs + 1):
            armed = i % 2 == 1
            stats = run_once(armed, args.steps, args.warmup, Path(tmp) / "flight")
            runs.append({"armed": armed, "stats": stats})
            print(
                f"run {i + 1}: {'rankscope run' if armed else 'plain'}: "
                + ", ".join(f"{s} {stats[s]:.4f} ms" for s in STATS),
                flush=True,
            )
        records = sorted(path.name for path in (Path(tmp) / "flight").iterdir())
    plain_p50 = [r["stats"]["p50"] for r in runs if not r["armed"]]
    print(
        f"plain runs' p50 spread (noise between processes): {max(plain_p50) / min(plain_p50):.4f}x"
    )
    summary: dict[str, Any] = {}
    for stat in STATS:
        r = ratios(runs, stat)
        summary[stat] = {"median": statistics.median(r), "min": min(r), "max": max(r), "ratios": r}
        print(
            f"ITL {stat} under rankscope run / plain: median {statistics.median(r):.4f}x "
            f"(min {min(r):.4f}, max {max(r):.4f}, {len(r)} armed runs)"
        )
    print(f"the armed runs' flight record: {len(records)} files")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "run_itl.json").write_text(
            json.dumps({"runs": runs, "summary": summary, "records": records}, indent=1)
        )


if __name__ == "__main__":
    main()
