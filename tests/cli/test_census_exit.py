"""`rankscope census`'s exit status for a rank that shares no group with another: 0 when it
left its exit line, 1 when it is dead (gone without one). Real processes, real SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

RANK = """
import os, signal, sys
from rankscope.rank import census
from rankscope.rank.writer import RECORDER
RECORDER.configure(flight_dir=sys.argv[1], boot_id="alone", rank=0)
census.configure(every=1)
census.count("tp:0", "all_reduce", 3)
census.tick()
if sys.argv[2] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(("end", "state", "status"), [("exit", "exited", 0), ("killed", "dead", 1)])
def test_a_lone_dead_rank_fails_the_census(
    flight_dir: Path, end: str, state: str, status: int
) -> None:
    rank = subprocess.run([sys.executable, "-c", RANK, str(flight_dir), end], timeout=60)
    assert rank.returncode == (0 if end == "exit" else -signal.SIGKILL)
    done = subprocess.run(
        [sys.executable, "-m", "rankscope", "census", str(flight_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    doc = json.loads(done.stdout)
    assert doc["states"][state] == [0] and doc["divergent"] is False, doc
    assert done.returncode == status, done.stderr
