"""The status page in a real headless browser (Debian's chromium driven by Playwright)
against a real `rankscope serve` process.

The flight directory is written by real rank processes through the probe and the census;
the cards are the daemon's SIMULATED device source (the demo's own SimulatedCards) naming the
real pids of those ranks and of a real `sleep` as the foreign holder. The screenshot goes to
pytest's temporary directory, never into the repository.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from rankscope.demo.cards import FLOOR, SimulatedCards
from rankscope.demo.services import daemon
from support.services import free_port

GiB = 1024**3
BOOT = "boot-status-page"
WORLD = 4
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# A rank: marks and census ticks on command from stdin, alive until stdin closes (so the
# holdings match its pid to its records).
RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from rankscope.rank import census, probe
    rank = int(os.environ["RANK"])
    probe.configure(tp_rank=rank % 2, pp_rank=rank // 2, runner="target")
    tp = census.group_instance("tp", [rank // 2 * 2, rank // 2 * 2 + 1])
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "mark":
            probe.mark(arg)
        elif cmd == "serve":  # arg: how many all_reduces this round (a skip is one fewer)
            census.count(tp, "all_reduce", int(arg))
            census.tick()
        print("done", flush=True)
    """
)


class Rank:
    def __init__(self, rank: int, flight_dir: Path) -> None:
        env = dict(
            os.environ,
            RANKSCOPE_DIR=str(flight_dir),
            RANKSCOPE_BOOT_ID=BOOT,
            RANKSCOPE_CENSUS_EVERY="1",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(WORLD),
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def do(self, command: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done", f"rank did not do {command!r}"

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def ranks(flight_dir: Path) -> Iterator[list[Rank]]:
    started: list[Rank] = []
    try:
        for r in range(WORLD):
            started.append(Rank(r, flight_dir))
        yield started
    finally:
        for rank in started:
            rank.stop()


@contextlib.contextmanager
def serve(flight_dir: Path, script: Path, floor: bool = True) -> Iterator[str]:
    """The daemon as the demo starts it (rankscope.demo.services.daemon)."""
    flags = ["--device.source=script", f"--device.script={script}"]
    flags += [f"--corridor.floor={FLOOR}"] if floor else []
    with daemon(
        flight_dir.parent, flight_dir, free_port(), [*flags, "--holdings.interval=200ms"]
    ) as d:
        yield d.url


def visible_legend(page: Any) -> list[list[str]]:
    """[class, background colour] of each legend swatch shown."""
    return page.eval_on_selector_all(
        ".legend .swatch",
        "els => els.filter(e => e.checkVisibility())"
        ".map(e => [e.className, getComputedStyle(e).backgroundColor])",
    )


def legend_entries_not_drawn(page: Any) -> list[str]:
    """The legend swatches shown whose colour no bar draws at least a pixel wide."""
    drawn = page.eval_on_selector_all(
        ".card .bar, .card .bar *",
        "els => els.map(e => [getComputedStyle(e).backgroundColor,"
        " e.getBoundingClientRect().width])",
    )
    seen = {colour for colour, width in drawn if width >= 1}
    return [name for name, colour in visible_legend(page) if colour not in seen]


@pytest.fixture
def simulated_cards(tmp_path: Path) -> Path:
    """The device script of simulated cards, written: what `serve` reads as its cards."""
    cards = SimulatedCards(tmp_path / "cards.json")
    cards.write()
    return cards.path


@pytest.fixture
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing; scripts/test.sh installs Debian's chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def test_status_page_shows_cards_ranks_census_and_follows_the_flight_dir(
    tmp_path: Path, flight_dir: Path, browser: Any
) -> None:
    foreign = subprocess.Popen(["sleep", "120"])
    try:
        with ranks(flight_dir) as rs:
            for r in rs:
                r.do("mark pre_weight_load")
                r.do("mark weights_loaded")
                r.do("serve 3")
            cards = SimulatedCards(tmp_path / "cards.json")
            for i, r in enumerate(rs):
                cards.set_holder(cards.card_of_rank(i), r.proc.pid, 20 * GiB)
            cards.set_holder(0, foreign.pid, 3 * GiB)
            cards.write()
            with serve(flight_dir, cards.path) as url:
                page = browser.new_page(viewport={"width": 1300, "height": 1000})
                problems: list[str] = []
                page.on(
                    "console",
                    lambda m: (
                        problems.append(f"console {m.type}: {m.text}")
                        if m.type == "error"
                        else None
                    ),
                )
                page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
                page.goto(url + "/")
                # Before its first answer the page says it is loading, not that nothing is there.
                with urllib.request.urlopen(url + "/", timeout=10) as resp:
                    first = resp.read().decode()
                assert "loading…" in first and "no cards reported yet" not in first

                # Each card, with its bar, its floor mark and its holdings.
                page.wait_for_selector(".card[data-gpu='1']")
                assert page.locator(".card").count() == 2
                for gpu in (0, 1):
                    card = page.locator(f".card[data-gpu='{gpu}']")
                    assert card.locator(".bar .floor-mark").count() == 1
                    assert "simulated card" in card.inner_text()
                    for i, r in enumerate(rs):
                        shown = card.locator(f"td.mono:text-is('{r.proc.pid}')").count()
                        assert shown == (1 if cards.card_of_rank(i) == gpu else 0)
                foreign_row = page.locator(".card[data-gpu='0'] tr.foreign")
                page.wait_for_function(
                    "() => document.querySelectorAll('.card[data-gpu=\"0\"] tr.foreign').length == 1"
                )
                assert str(foreign.pid) in foreign_row.inner_text()
                assert page.locator(".card[data-gpu='0'] .bar .seg.foreign").count() == 1
                assert legend_entries_not_drawn(page) == []
                assert len(visible_legend(page)) == 5

                # Each rank's waterfall row, and the census of every rank, in agreement.
                for r in range(WORLD):
                    row = page.locator(f".wf-row[data-rank='{r}']")
                    row.wait_for()
                    assert row.locator(".wf-seg[data-to='weights_loaded']").count() == 1
                    assert row.locator(".wf-seg[data-to='boot_complete']").count() == 0
                page.wait_for_selector("table.census")
                header = page.locator("table.census thead").inner_text()
                assert all(f"rank {r}" in header for r in range(WORLD))
                caption = page.locator("table.census caption").inner_text()
                assert "calls each rank counted" in caption  # the cells are counts
                assert page.locator("table.census tr.diverged").count() == 0

                # The flight directory changes: rank 3 reaches boot_complete and skips one
                # all_reduce in its next round; the page follows without a reload.
                rs[3].do("mark boot_complete")
                for i, r in enumerate(rs):
                    r.do("serve 2" if i == 3 else "serve 3")
                page.wait_for_selector(
                    ".wf-row[data-rank='3'] .wf-seg[data-to='boot_complete']", timeout=15_000
                )
                page.wait_for_selector("table.census tr.diverged[data-group='tp:2-3']")
                lagging = page.locator("table.census tr.diverged td.num.diverged")
                assert lagging.count() == 1
                assert page.locator("table.census tr.diverged[data-group='tp:0-1']").count() == 0
                assert "rank 3" in page.locator("#census-verdict").inner_text()

                # The foreign holder leaves: its row and its bar segment go.
                cards.drop_holder(foreign.pid)
                cards.write()
                page.wait_for_function(
                    "() => document.querySelectorAll('.card[data-gpu=\"0\"] tr.foreign').length == 0",
                    timeout=15_000,
                )
                shot = tmp_path / "status-page.png"
                page.screenshot(path=str(shot), full_page=True)
                artifacts = os.environ.get("RANKSCOPE_ARTIFACTS")
                if artifacts:  # CI may collect it; never written into the repository
                    Path(artifacts).mkdir(parents=True, exist_ok=True)
                    shutil.copy(shot, Path(artifacts) / shot.name)
                assert problems == []
    finally:
        foreign.kill()
        foreign.wait()


def test_the_legend_names_only_colours_a_bar_draws(
    simulated_cards: Path, flight_dir: Path, browser: Any
) -> None:
    """No floor configured and no process on the cards: no floor, rank or foreign entry."""
    with serve(flight_dir, simulated_cards, floor=False) as url:
        page = browser.new_page()
        page.goto(url + "/")
        page.wait_for_selector(".card[data-gpu='0'] .bar .seg.free")
        assert page.locator(".bar .floor-mark").count() == 0
        assert legend_entries_not_drawn(page) == []
        assert [name for name, _ in visible_legend(page)] == [
            "swatch unattributed",
            "swatch free",
        ]


@pytest.fixture(scope="module")
def torchrun_boot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A flight directory one real torchrun launch wrote under `rankscope run`: two gloo ranks
    of the demo's workload (start-up, group creations, its framework phases) and the
    launcher, armed too, with no rank."""
    flight = tmp_path_factory.mktemp("torchrun") / "flight"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += [f"--master-port={free_port()}"]
    workload = [
        "-m",
        "rankscope.demo.workload",
        "--tp",
        "1",
        "--steps",
        "3",
        "--step-interval",
        "0.01",
    ]
    run = [sys.executable, "-m", "rankscope", "run", "--dir", str(flight), "--boot-id", BOOT, "--"]
    done = subprocess.run(
        [*run, *torchrun, *workload],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return flight


def page_of(browser: Any, url: str) -> Any:
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto(url + "/")
    page.wait_for_function("() => Number(document.body.dataset.refreshed || 0) >= 1")
    return page


def waterfall_of(browser: Any, url: str) -> Any:
    """The page, once rank 1's waterfall row has drawn its bars."""
    page = page_of(browser, url)
    page.wait_for_selector(".wf-row[data-rank='1'] .wf-seg")
    return page


def test_the_waterfall_names_each_bar_by_its_span_and_keeps_every_bar_readable(
    torchrun_boot: Path, simulated_cards: Path, browser: Any
) -> None:
    with serve(torchrun_boot, simulated_cards) as url:
        page = waterfall_of(browser, url)
        for rank in (0, 1):
            row = page.locator(f".wf-row[data-rank='{rank}']")
            spans = row.locator(".wf-seg").evaluate_all("els => els.map(e => e.dataset.span)")
            # Interpreter and torch start-up is no group init; the gloo groups are no nccl.
            assert spans[:2] == ["start-up", "gloo init"], spans
            assert not [s for s in spans if "nccl_init_begin" in s or "nccl init" in s], spans
            assert "pre_weight_load → weights_loaded" in spans, spans
            first = row.locator(".wf-seg").first
            assert first.get_attribute("data-from") == "process_start"
        bars = page.eval_on_selector_all(
            ".wf-seg",
            "els => els.map(e => [e.dataset.span, e.getBoundingClientRect().width, e.innerText])",
        )
        # Each bar, a millisecond's included, is wide enough to read its duration.
        narrow = [(name, width) for name, width, _ in bars if width < 40]
        assert not narrow, narrow
        assert all(re.match(r"(<1 ms|\d+ ms|\d+\.\d+ s) ", text) for _, _, text in bars), bars
        # The legend names what the bars measure, each in a colour some bar draws.
        legend = page.eval_on_selector_all(
            ".wf-legend span",
            "els => els.map(e => [e.innerText.trim(),"
            " getComputedStyle(e.querySelector('i')).backgroundColor])",
        )
        drawn = page.eval_on_selector_all(
            ".wf-seg", "els => els.map(e => [e.dataset.span, getComputedStyle(e).backgroundColor])"
        )
        assert sorted(map(tuple, legend)) == sorted(set(map(tuple, drawn)))
        assert len({colour for _, colour in legend}) == len(legend), legend


def test_the_launcher_is_a_process_with_no_rank_not_rank_unknown(
    torchrun_boot: Path, simulated_cards: Path, browser: Any
) -> None:
    with serve(torchrun_boot, simulated_cards) as url:
        page = waterfall_of(browser, url)
        labels = page.locator(".wf-label").all_inner_texts()
        assert labels[:2] == ["rank 0", "rank 1"], labels
        (launcher,) = labels[2:]
        assert re.fullmatch(r"pid \d+ \(no rank\)", launcher), labels
        assert "?" not in " ".join(labels)


def test_without_a_gpu_the_cards_say_so_plainly_and_draw_no_legend(
    torchrun_boot: Path, browser: Any
) -> None:
    """The daemon's default device source, NVML, on this machine: a real NVML failure."""
    with daemon(torchrun_boot.parent, torchrun_boot, free_port()) as d:
        if d.get("/api/v1/cards")["cards"]:
            pytest.skip("a GPU is visible here: NVML is up")
        page = page_of(browser, d.url)
        note = page.locator("#no-cards").inner_text()
        assert note.startswith("No GPU to show: NVML is down"), note
        assert "need no GPU" in note
        assert not page.locator("#cards-section .legend").is_visible()
        assert [name for name, _ in visible_legend(page)] == []


def test_every_endpoint_is_in_the_header_and_nothing_follows_the_footer(
    flight_dir: Path, simulated_cards: Path, browser: Any
) -> None:
    with serve(flight_dir, simulated_cards) as url:
        page = page_of(browser, url)
        assert page.locator("header nav a[href='api/v1/oom']").count() == 1
        assert page.locator("footer ~ *:not(script)").count() == 0
        assert page.locator("nav.endpoints").count() == 0
