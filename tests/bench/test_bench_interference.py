"""bench/bench_interference.py without a GPU: its schedule and its estimators on synthetic
blocks with known effects, and its --smoke run (STAND-IN step and processes) end to end."""

from __future__ import annotations

import csv
import json
import math
import random
import subprocess
import sys
from collections import Counter
from itertools import islice, pairwise
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_interference as bi  # noqa: E402

EFFECT = {"serve10": 1.02}  # every other condition has none


def synthetic_blocks(n_pairs: int, drift: float, seed: int = 1) -> list[dict[str, Any]]:
    """B c B c ... B as the bench schedules it, 200 steps a block; the level drifts by
    ``drift`` (a fraction) every block, the step noise is 0.5%, serve10 is 2% slower."""
    rng = random.Random(seed)
    order = ["baseline"]
    for name in islice(bi.rounds(seed), n_pairs):
        order += [name, "baseline"]
    blocks = []
    for i, name in enumerate(order):
        level = 3.0 * (1 + drift) ** i * EFFECT.get(name, 1.0)
        steps = [level * (1 + rng.gauss(0, 0.005)) for _ in range(200)]
        blocks.append({"condition": name, "steps": steps, **bi.block_stats(steps)})
    return blocks


def within(ratio: float, expected: float, se: float | None, k: float = 4.0) -> bool:
    assert se is not None and se > 0
    return abs(math.log(ratio / expected)) <= k * se


def test_the_schedule_alternates_and_never_flanks_a_baseline_with_one_condition() -> None:
    for seed in range(50):
        names = list(islice(bi.rounds(seed), 60))
        for r in range(0, 60, len(bi.CONDITIONS)):
            assert sorted(names[r : r + len(bi.CONDITIONS)]) == sorted(bi.CONDITIONS)
        assert all(a != b for a, b in pairwise(names)), (seed, names)


def test_the_estimators_recover_a_known_effect_under_drift() -> None:
    # 0.2% drift a block: ten times the paired SE. Pairing with both neighbours cancels it.
    result = bi.analyse(synthetic_blocks(180, drift=0.002), resamples=100)
    cond = result["conditions"]
    for name in bi.CONDITIONS:
        expected = EFFECT.get(name, 1.0)
        for stat in bi.STATS:
            cell = cond[name][stat]
            assert cell["estimator"] == ("paired" if stat in bi.PAIRED else "pooled")
            assert within(cell["ratio"], expected, cell["se"]), (name, stat, cell)
            assert cell["se"] < 0.003, (name, stat, cell)
    floor = result["noise_floor"]
    assert floor["p50"]["se"] == cond["null"]["p50"]["se"]
    assert within(floor["p50"]["null_ratio"], 1.0, floor["p50"]["se"])
    # Every condition block counted, each with a baseline on both sides.
    assert sum(cond[n]["blocks"] for n in bi.CONDITIONS) == 180


def test_the_standard_error_matches_the_spread_of_the_estimate() -> None:
    # The paired SE says how far a condition's ratio falls from its truth: over many
    # synthetic runs, the ratios of the no-effect conditions scatter by about their SE.
    z = []
    for seed in range(40):
        result = bi.analyse(synthetic_blocks(36, drift=0.001, seed=seed), resamples=0)
        for name in ("null", "serve100", "nvml25"):
            cell = result["conditions"][name]["p50"]
            z.append(math.log(cell["ratio"]) / cell["se"])
    rms = math.sqrt(sum(v * v for v in z) / len(z))
    assert 0.7 < rms < 1.5, rms


def test_the_smoke_run_writes_every_block(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_interference.py"), "--smoke", "--seconds", "8",
         "--block", "0.02", "--warmup", "0.2", "--bootstrap", "20", "--eager-share", "0.4",
         "--no-pin", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "STAND-IN" in proc.stdout
    result = json.loads((out / "interference.json").read_text())
    blocks = result["blocks"]
    for mode in ("graph", "eager"):
        seq = [b["condition"] for b in blocks if b["mode"] == mode]
        assert seq[0] == seq[-1] == "baseline"
        assert seq[::2] == ["baseline"] * len(seq[::2])
        assert "baseline" not in seq[1::2]
        cell = result["modes"][mode]["conditions"]
        assert sum(cell[n]["blocks"] for n in bi.CONDITIONS) == len(seq) // 2
    graph = result["modes"]["graph"]
    assert all(graph["conditions"][n]["blocks"] >= 2 for n in bi.CONDITIONS)
    assert graph["noise_floor"]["p50"]["se"] > 0
    with open(out / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    counts = Counter((r["mode"], int(r["block"])) for r in rows)
    assert set(counts) == {(b["mode"], b["block"]) for b in blocks}
    for (mode, _), n in counts.items():
        assert n == result["modes"][mode]["block_steps"] >= 20
    # The recorded steps replayed through the same estimators, in blocks of 10.
    replay = subprocess.run(
        [sys.executable, str(BENCH / "bench_interference.py"), "--replay", str(out / "steps.csv"),
         "--block-steps", "10", "--bootstrap", "20"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stdout + replay.stderr
    graph_steps = sum(n for (mode, _), n in counts.items() if mode == "graph")
    assert f"graph, {graph_steps} steps in blocks of 10" in replay.stdout
    assert "noise floor (1 SE of the null condition" in replay.stdout
