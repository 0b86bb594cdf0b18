"""The status page's census in a real headless browser against a real `rankscope serve`: ranks
standing still, each with the collective it is in, a dead rank, and the rank behind at the
latest counts. The records are written by the real recorder for processes of this host: this
test process (alive, so stalled) and a finished one (gone without an exit line: dead)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.daemon.test_status_page import browser, serve  # noqa: F401 (a fixture)
from tests.support.recorders import rank_recorder

from rankscope.demo.cards import SimulatedCards
from rankscope.procfs import read_pidns_inode, read_start_ticks
from rankscope.rank.writer import Recorder
from rankscope.record import BlockedIn, CensusLive

W = "world:0-2"


def recorder(flight_dir: Path, rank: int, pid: int, ticks: int) -> Recorder:
    """A rank of a real process of this host."""
    return rank_recorder(
        flight_dir,
        rank,
        boot="b-hang",
        host=socket.gethostname(),
        pid=pid,
        ticks=ticks,
        nspid=(pid,),
        pidns=read_pidns_inode(),
    )


def test_the_page_names_stalled_and_dead_ranks_and_the_op_each_is_in(
    tmp_path: Path,
    flight_dir: Path,
    browser: Any,  # noqa: F811
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_ticks = read_start_ticks(gone.pid)
    gone.wait()
    me, my_ticks = os.getpid(), read_start_ticks()
    assert gone_ticks is not None and my_ticks is not None
    # This process stands for ranks 0 and 1 (one file each), the finished one for rank 2.
    for rank, n, op, seq in ((0, 6, "all_reduce", 6), (1, 6, "all_reduce", 6)):
        rec = recorder(flight_dir / f"r{rank}", rank, me, my_ticks)
        rec.write_record(CensusLive({(W, "all_reduce"): n}, BlockedIn(W, op, seq, 100.0)))
    dead = recorder(flight_dir, 2, gone.pid, gone_ticks)
    dead.write_record(
        CensusLive(
            {(W, "all_reduce"): 5, (W, "all_gather"): 1}, BlockedIn(W, "all_gather", 1, 100.0)
        )
    )
    for rank in (0, 1):  # one directory, as the daemon reads it
        for path in (flight_dir / f"r{rank}").iterdir():
            path.rename(flight_dir / f"{path.stem}-r{rank}{path.suffix}")
    cards = SimulatedCards(tmp_path / "cards.json")
    cards.write()
    with serve(flight_dir, cards.path, floor=False) as url:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(url + "/")
        page.wait_for_selector("table.census td.state-dead")
        states = {
            r: page.locator(f"table.census tr.states td[data-rank='{r}']").inner_text()
            for r in range(3)
        }
        assert states == {
            0: f"stalled in {W} all_reduce #6",
            1: f"stalled in {W} all_reduce #6",
            2: f"dead (was in {W} all_gather #1)",
        }
        row = page.locator("table.census tr.diverged[data-at='latest'][data-op='all_reduce']")
        assert row.locator("td.num.diverged").inner_text() == "5"
        verdict = page.locator("#census-verdict").inner_text()
        assert "lagging: rank 2" in verdict and "rank 2 dead" in verdict
