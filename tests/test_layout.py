"""The tree's promise: the daemon and the readers never load code that runs inside a rank
(rankscope/rank/), checked in a fresh interpreter; and the public faces stay importable."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What a reader or the host daemon imports: nothing of these may pull in rankscope.rank.
READERS = [
    "rankscope.daemon.cli",
    "rankscope.daemon.app",
    "rankscope.record.reader",
    "rankscope.reports.census",
    "rankscope.reports.ledger",
    "rankscope.reports.oom",
    "rankscope.cli.boots",
    "rankscope.cli.census",
    "rankscope.cli.common",
    "rankscope.cli.oom",
    "rankscope.cli.phases",
    "rankscope.mixin.render",
]


def _loaded_after(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in json.loads(done.stdout) if m.startswith("rankscope")]


@pytest.mark.parametrize("module", READERS)
def test_readers_and_the_daemon_load_nothing_of_the_rank(module: str) -> None:
    loaded = _loaded_after(module)
    assert module in loaded
    assert [m for m in loaded if m == "rankscope.rank" or m.startswith("rankscope.rank.")] == []


def test_the_public_faces_are_the_rank_code() -> None:
    from rankscope import adapters, census, probe
    from rankscope.rank import adapters as rank_adapters
    from rankscope.rank import census as rank_census
    from rankscope.rank import probe as rank_probe

    assert probe.mark is rank_probe.mark
    assert probe.arenas is rank_probe.arenas
    assert census.count is rank_census.count
    assert census.tick is rank_census.tick
    assert adapters.install_import_hooks is rank_adapters.install_import_hooks
    assert sorted(census.__all__) == sorted(rank_census.__all__)
