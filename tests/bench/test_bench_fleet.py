"""bench/bench_fleet.py's simulated hosts without Prometheus: every catalog metric gets label
sets, and the fleet is healthy but for its foreign holders (no census deficit, every rank
running)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_fleet

STATE = re.compile(r'^rankscope_census_rank_state\{[^}]*state="(\w+)"\} (\S+)$', re.M)


def test_a_simulated_host_publishes_the_catalog_as_a_healthy_daemon_would() -> None:
    text = bench_fleet.exposition(0)  # a metric whose labels it cannot fill raises
    states = STATE.findall(text)
    assert {s for s, _ in states} == {"running", "stalled", "exited", "dead"}
    assert {v for s, v in states if s == "running"} == {"1"}
    assert {v for s, v in states if s != "running"} == {"0"}
    for behind in ("rank_deficit", "latest_deficit", "blocked_collective"):
        assert f"\nrankscope_census_{behind}{{" not in text, behind
