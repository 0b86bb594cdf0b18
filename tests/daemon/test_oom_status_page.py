"""The status page shows each card's latest OOM with its holders right then, in a real
headless browser against a real `rankscope serve`: card 0 exhausted on the SIMULATED device
source (seen by the sampler), card 1 with an oom line a rank's probe wrote."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.cli.test_oom_cli import oom_line, rank_3_of_b1, write
from tests.daemon.test_status_page import browser, serve  # noqa: F401 - the browser fixture

from rankscope.demo.cards import CARD_TOTAL, DRIVER_RESERVED, SimulatedCards
from rankscope.procfs import read_start_ticks

GiB = 1 << 30


def test_the_last_oom_per_card_with_its_holders(
    tmp_path: Path,
    flight_dir: Path,
    browser: Any,  # noqa: F811
) -> None:
    foreign = subprocess.Popen(["sleep", "120"])
    try:
        me, start = rank_3_of_b1(flight_dir)
        line = oom_line("b1", me, start, 3, 1796000000.0)
        line["device"].update(uuid="GPU-simulated-demo-1", nvml_index=1)
        line["holders"] = [
            {
                "pid": foreign.pid,
                "bytes": 9 * GiB,
                "comm": "sleep",
                "start_ticks": read_start_ticks(foreign.pid),
            },
            {"pid": me, "bytes": 6 * GiB, "comm": "python3", "start_ticks": start},
        ]
        write(flight_dir, f"oom-h1-{me}-{start}.jsonl", line)
        cards = SimulatedCards(tmp_path / "cards.json")
        cards.set_holder(0, foreign.pid, CARD_TOTAL - DRIVER_RESERVED - 64 * (1 << 20))
        cards.write()
        with serve(flight_dir, cards.path) as url:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.goto(url + "/")
            page.wait_for_selector(".card[data-gpu='0'] .oom", timeout=15_000)
            sampled = page.locator(".card[data-gpu='0'] .oom").inner_text()
            assert "free memory fell to 64.0 MiB" in sampled
            assert str(foreign.pid) in sampled
            assert page.locator(".card[data-gpu='0'] .oom tr.foreign").count() == 1
            probed = page.locator(".card[data-gpu='1'] .oom").inner_text()
            assert f"rank 3 pid {me} asked 20.0 GiB, 76.0 MiB free (kv_pool_sized)" in probed
            assert page.locator(".card[data-gpu='1'] .oom tr.foreign").count() == 1
            assert page.locator(".card[data-gpu='1'] .oom tbody tr").count() == 2
    finally:
        foreign.kill()
        foreign.wait()
