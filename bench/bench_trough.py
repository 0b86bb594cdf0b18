"""How many short troughs the corridor's breach counter catches, by sample interval.

    python3 bench/bench_trough.py [--troughs 50] [--hold-ms 20] [--out DIR]

GPU only (exits at once, saying so, without CUDA). Three real `rankscope serve` daemons
(NVML source, holdings on, each scraped every second) watch the same card at 100, 20 and
10 ms (--sampler.interval) with the same floor, 2 GiB under the card's free memory. Another
process then allocates 4 GiB with cudaMalloc, holds it --hold-ms, frees it (empty_cache), and
waits 200-300 ms (random, so the troughs fall at every phase of the samplers), --troughs
times. Figure: each daemon's rankscope_corridor_breaches_total increase (from
/api/v1/cards) divided by the number of troughs, the fraction caught; the holds' measured
lengths are printed alongside. Budget: about 1 minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness

GiB = 1 << 30
INTERVALS_MS = (100, 20, 10)

TROUGHER = """
import random, sys, time, torch
n, hold, size = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
torch.cuda.init(); torch.zeros(1, device='cuda'); torch.cuda.synchronize()
print('ready', flush=True)
sys.stdin.readline()
rng = random.Random(17)
for _ in range(n):
    x = torch.empty(size, dtype=torch.uint8, device='cuda')
    torch.cuda.synchronize()
    t = time.perf_counter()
    time.sleep(hold)
    held = time.perf_counter() - t
    del x
    torch.cuda.empty_cache()
    print(f'{held * 1e3:.3f}', flush=True)
    time.sleep(rng.uniform(0.2, 0.3))
print('done', flush=True)
"""


def breaches(daemon: harness.Daemon) -> int:
    [card] = [c for c in daemon.cards() if c["gpu"] == 0]
    value = card["breaches"]
    assert isinstance(value, int), f"no breach count: {card}"
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--troughs", type=int, default=50)
    p.add_argument("--hold-ms", type=float, default=20.0)
    p.add_argument("--out", type=Path, help="directory for trough.json")
    args = p.parse_args()
    harness.require_cuda("bench_trough")
    import pynvml

    child = subprocess.Popen(
        [sys.executable, "-c", TROUGHER, str(args.troughs), str(args.hold_ms / 1e3), str(4 * GiB)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    daemons: dict[int, harness.Daemon] = {}
    scrapers: list[harness.Scraper] = []
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        pynvml.nvmlInit()
        free = int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free)
        pynvml.nvmlShutdown()
        floor = free - 2 * GiB
        for ms in INTERVALS_MS:
            daemons[ms] = harness.Daemon(ms, [f"--corridor.floor=0={floor}"])
            scrapers.append(harness.Scraper(daemons[ms].url + "/metrics", 1.0))
        time.sleep(1.0)
        before = {ms: breaches(d) for ms, d in daemons.items()}
        child.stdin.write("go\n")
        child.stdin.flush()
        holds = []
        for line in child.stdout:
            if line.strip() == "done":
                break
            holds.append(float(line))
        time.sleep(0.5)
        after = {ms: breaches(d) for ms, d in daemons.items()}
    finally:
        for s in scrapers:
            s.stop()
        for d in daemons.values():
            d.stop()
        child.kill()
        child.wait()
    n = len(holds)
    result: dict[str, Any] = {
        "troughs": n, "bytes": 4 * GiB, "floor_under_free": 2 * GiB,
        "hold_ms": {"median": statistics.median(holds), "min": min(holds), "max": max(holds)},
        "caught": {str(ms): after[ms] - before[ms] for ms in INTERVALS_MS},
    }  # fmt: skip
    print(
        f"{n} troughs of 4 GiB, held {result['hold_ms']['median']:.1f} ms "
        f"(min {min(holds):.1f}, max {max(holds):.1f}), floor 2 GiB under the free memory:"
    )
    for ms in INTERVALS_MS:
        caught = after[ms] - before[ms]
        print(
            f"  sampling every {ms:3d} ms: {caught:3d} breaches counted, {caught / n:6.1%} caught"
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "trough.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
