"""Instructions per armed mark under valgrind (callgrind), for a shared machine where timings
drift: the count does not move with the load. Compares code trees in one run.

    python3 bench/bench_mark_instructions.py [--marks N] [--out DIR] TREE [TREE ...]

TREE is a checkout's root (its exporter/ goes on PYTHONPATH). For each tree and case, the
interpreter runs the case's set-up then 0 and N marks under callgrind; the difference of the
two totals over N is the instructions a mark executes. Cases: a mark in a process without
torch (the reads are two dict lookups: nearly all is rankscope's own share), and on a
STAND-IN card (bench_mark.py's named fake torch view and NVML, so the mark's GPU path runs
with reads that cost nothing): a plain mark and process_start with its extra. Ratios are to
the first tree. Needs valgrind. Each tree runs once first, uncounted: the run that compiles
a changed module's .pyc would otherwise count the compilation.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

CHILD = """
import os, sys, tempfile
sys.path.insert(0, {bench!r})
from rankscope import probe
from rankscope.probe.nvml_view import NvmlView
from rankscope.record import RECORDER
from bench_mark import StandInNvml, StandInTorchView
RECORDER.configure(flight_dir=tempfile.mkdtemp())
if {card!r}:
    probe.TORCH, probe.NVML = StandInTorchView(), NvmlView(StandInNvml(0))
extra = {extra!r}
probe.mark("warm", **extra)
for _ in range({count}):
    probe.mark({phase!r}, **extra)
"""

CASES = {
    "no torch, plain mark": {"card": False, "phase": "weights_loaded", "extra": {}},
    "stand-in card, plain mark": {"card": True, "phase": "weights_loaded", "extra": {}},
    "stand-in card, process_start": {
        "card": True,
        "phase": "process_start",
        "extra": {"python": "3.12.0"},
    },
}


def instructions(tree: Path, case: dict[str, object], count: int) -> int:
    code = CHILD.format(bench=str(BENCH), count=count, **case)
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            code,
        ],
        env={"PYTHONPATH": str(tree / "exporter"), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", proc.stderr)
    assert found, proc.stderr[-2000:]
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", type=Path, nargs="+")
    parser.add_argument("--marks", type=int, default=1000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, dict[str, int]] = {}
    for tree in args.trees:  # a first run writes the .pyc files; its count would include that
        instructions(tree, CASES["stand-in card, plain mark"], 0)
    for name, case in CASES.items():
        results[name] = {}
        for tree in args.trees:
            base = instructions(tree, case, 0)
            total = instructions(tree, case, args.marks)
            results[name][str(tree)] = (total - base) // args.marks
        first = results[name][str(args.trees[0])]
        row = "  ".join(f"{tree}: {n} ({n / first:.2f}x)" for tree, n in results[name].items())
        print(f"{name:<30} instructions a mark  {row}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_mark_instructions.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
