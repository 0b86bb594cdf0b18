"""bench/bench_census.py end to end at its smallest: the census's private wrapper it times
around a no-op is called as the package calls it now (the figures themselves are not judged)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_census.py"


def test_the_census_bench_runs_through_every_figure() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--calls", "20", "--blocks", "1"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "count() armed=True" in done.stdout
    assert "the wrapper alone, around a no-op" in done.stdout, done.stdout
