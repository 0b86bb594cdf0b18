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
from types import SimpleNamespace
from typing import Any

BENCH = Path(__file__).resolve().parent

CHILD = """
import functools, os, sys, tempfile
sys.path.insert(0, {bench!r})
from rankscope.rank import probe
from rankscope.rank.probe.nvml_view import NvmlView
from rankscope.rank.writer import RECORDER
from bench_mark import StandInNvml, StandInTorchView
RECORDER.configure(flight_dir=tempfile.mkdtemp())
if {card!r}:
    probe.TORCH, probe.NVML = StandInTorchView(), NvmlView(StandInNvml(0))
from rankscope.rank import auto
from rankscope.rank.census import torch_patch
# process_start as the hook calls it (a tree before its typed fields: _mark with the field)
start = getattr(auto, "_mark_process_start", None) or functools.partial(
    auto._mark, "process_start", python="3.12.0"
)
from bench_mark_instructions import StandInDist, StandInGraph, StandInTorch
dist, torch, graph = StandInDist(), StandInTorch(), StandInGraph()
call = lambda: {call}
call()
for _ in range({count}):
    call()
"""


class StandInDist:
    """STAND-IN torch.distributed (a fake: no process group here): a world group of one
    rank on gloo, answering the queries nccl_init_end makes (rankscope.rank.auto._group_fields)."""

    class ProcessGroup:
        pass

    def __init__(self) -> None:
        self.GroupMember = SimpleNamespace(WORLD=self.ProcessGroup())

    def get_process_group_ranks(self, group: Any) -> list[int]:
        return [0]

    def get_backend(self, group: Any = None) -> str:
        return "gloo"


# One segment of a graph's private pool as torch's allocator snapshot lists it (the keys
# torch 2.x gives; the pool's blocks as one allocation).
STAND_IN_SEGMENT = {
    "device": 0,
    "address": 139_637_976_727_552,
    "total_size": 2 << 20,
    "allocated_size": 4096,
    "active_size": 4096,
    "requested_size": 4096,
    "stream": 0,
    "segment_type": "small",
    "segment_pool_id": (1, 1),
    "is_expandable": False,
    "frames": [],
    "blocks": [{"address": 139_637_976_727_552, "size": 4096, "state": "active_allocated"}],
}


class StandInTorch:
    """STAND-IN torch (a fake: no CUDA here): the one-pool allocator snapshot capture_end
    reads (rankscope.rank.auto.pool_fields), answering with a fixed one-segment pool."""

    def __init__(self) -> None:
        snapshot = {"segments": [STAND_IN_SEGMENT]}
        self._C = SimpleNamespace(_cuda_memorySnapshot=lambda *args: snapshot)


class StandInGraph:
    """STAND-IN torch.cuda.CUDAGraph (a fake): its private pool's id."""

    def pool(self) -> tuple[int, int]:
        return (1, 1)


PLAIN = 'probe.mark("weights_loaded")'
CASES = {
    "no torch, plain mark": {"card": False, "call": PLAIN},
    "stand-in card, plain mark": {"card": True, "call": PLAIN},
    "stand-in card, process_start": {
        "card": True,
        "call": "start()",
    },
    # as the new_group hook calls it, for the world group
    "stand-in card, nccl_init_end": {
        "card": True,
        "call": "auto._after_group(dist, dist.GroupMember.WORLD, None, 0.1)",
    },
    "stand-in group queries (alone)": {
        "card": True,
        "call": "(torch_patch._instance_of(dist, None), "
        "list(dist.get_process_group_ranks(dist.GroupMember.WORLD)), str(dist.get_backend(None)))",
    },
    # as rankscope.rank.auto's capture_end wrapper calls it
    "stand-in card, capture_end": {
        "card": True,
        "call": "auto._mark_capture_end(torch, graph)",
    },
    # the reads that give the pool's bytes: its id, its snapshot, the sum (bench_startup.py)
    "stand-in pool read (alone)": {
        "card": True,
        "call": 'sum(s["total_size"] for s in '
        'torch._C._cuda_memorySnapshot(graph.pool() + (False,))["segments"])',
    },
}

# each generic mark: the case counting the reads it adds beyond a plain mark's (None: none)
OWN_SHARE = {
    "stand-in card, process_start": None,
    "stand-in card, nccl_init_end": "stand-in group queries (alone)",
    "stand-in card, capture_end": "stand-in pool read (alone)",
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
    # A generic mark's own share beyond a plain mark's: its count less the plain mark's and
    # the reads it adds (counted alone on the same stand-ins).
    own: dict[str, dict[str, int]] = {}
    for name, reads in OWN_SHARE.items():
        own[name] = {}
        for tree in args.trees:
            t = str(tree)
            extra = results[name][t] - results["stand-in card, plain mark"][t]
            own[name][t] = extra - (results[reads][t] if reads else 0)
        row = "  ".join(f"{tree}: {n:+d}" for tree, n in own[name].items())
        print(f"{name:<30} own share beyond a plain mark  {row}")
    results["own share beyond a plain mark"] = own
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_mark_instructions.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
