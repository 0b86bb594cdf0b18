"""Cost of a counted method under torch.compile, as a ratio against the same method
uncounted, measured in the same run: a coordinator-shaped class whose ``all_reduce`` is
arithmetic on a small CPU tensor (no process group), compiled with fullgraph=True through
AOTAutograd, called in alternating blocks (counted, then uncounted, so drift of the machine
hits both alike). The counted graph runs one more op, rankscope::census_count.

    python3 bench/bench_census_compile.py [--calls N] [--blocks N] [--backend aot_eager]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


class Coordinator:
    unique_name = "tp:0"
    ranks = (0, 1)
    world_size = 2
    rank_in_group = 0

    def all_reduce(self, x: Any) -> Any:
        return x * 2


def _block(compiled: Any, x: Any, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        compiled(x)
    return (time.perf_counter() - start) / calls * 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--backend", default="aot_eager")
    args = parser.parse_args()

    import torch

    from rankscope.rank import census
    from rankscope.rank.census import counts

    plain_class = type("Plain", (Coordinator,), {})
    counted_class = type("Counted", (Coordinator,), {})
    census.instrument_methods(counted_class, ["all_reduce"])
    x = torch.ones(8)

    def make(cls: type) -> Any:
        coordinator = cls()
        return torch.compile(
            lambda t: coordinator.all_reduce(torch.sin(t)) + 1,
            fullgraph=True,
            backend=args.backend,
        )

    plain, counted = make(plain_class), make(counted_class)
    for compiled in (plain, counted):  # compile and warm both
        _block(compiled, x, 50)
    counts.reset()
    pairs = [
        (_block(counted, x, args.calls), _block(plain, x, args.calls)) for _ in range(args.blocks)
    ]
    expected = args.calls * args.blocks
    got = counts.snapshot().get(("tp:0-1", "all_reduce"), 0)
    extra = [c - p for c, p in pairs]
    ratio = [c / p for c, p in pairs]
    print(f"backend={args.backend} calls={args.calls} x {args.blocks} alternating blocks")
    print(f"  uncounted: {statistics.median(p for _, p in pairs):.0f} ns per call (median block)")
    print(f"  counted:   {statistics.median(c for c, _ in pairs):.0f} ns per call (median block)")
    print(f"  counted - uncounted: {statistics.median(extra):.0f} ns per call (median pair)")
    print(f"  counted / uncounted: {statistics.median(ratio):.3f} (median pair)")
    print(f"  counts: {got} of {expected} calls ({'right' if got == expected else 'WRONG'})")
    return 0 if got == expected else 1


if __name__ == "__main__":
    raise SystemExit(main())
