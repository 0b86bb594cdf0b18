"""The demo's scenarios and the run of one: launch the ranks, follow their flight record,
drive the card (simulated or real), watch the pages arrive, and judge them.

Each scenario is its own boot (RANKSCOPE_BOOT_ID ``demo-{scenario}-{time}``), so the daemon,
whose census and phases follow the newest boot, moves from one scenario to the next on its
own. A page belongs to the scenario during which Alertmanager first delivered it firing;
a notification repeating an alert already counted (same fingerprint and start) is not a new
page.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.demo import alerting
from rankscope.demo.cards import FOREIGN_BYTES, SimulatedCards, rank_bytes
from rankscope.demo.services import Daemon, Page, WebhookReceiver, free_port, start, stop
from rankscope.demo.view import View, card_lines, gib
from rankscope.flight import FlightReader

GiB = 1024**3


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    expected: frozenset[str]  # the alert names that must page, and nothing else


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy", "every rank issues every collective; nothing pages", frozenset()),
        Scenario(
            "skip",
            "the last rank skips one all_reduce of its tensor-parallel group",
            frozenset({alerting.CENSUS_SKEW}),
        ),
        Scenario(
            "foreign",
            "a process that is no rank takes memory on card 0",
            frozenset({alerting.FOREIGN_HOLDER}),
        ),
        Scenario(
            "trough",
            "a process takes card 0 below its floor for 400 ms",
            frozenset({alerting.CORRIDOR_BREACH}),
        ),
    )
}

TROUGH_SECONDS = 0.4
# Seconds the demo waits after serving for pages still on their way (rule `for:`, scrape
# and evaluation intervals, Alertmanager's group_wait).
SETTLE_SECONDS = 25.0
# After the expected pages are in, how long the demo keeps listening for unexpected ones.
QUIET_SECONDS = 3.0
SUMMARY_EVERY = 4.0
BOOT_TIMEOUT = 120.0


@dataclass
class Options:
    ranks: int
    duration: float
    step_interval: float
    gpu: bool
    floor: int


@dataclass
class Stack:
    """What every scenario shares: the flight directory, the daemon, the receiver (None
    without Alertmanager), the simulated cards (None on a real GPU), the terminal view."""

    workdir: Path
    flight_dir: Path
    daemon: Daemon
    receiver: WebhookReceiver | None
    cards: SimulatedCards | None
    view: View
    options: Options
    counted: set[tuple[str, str]] = field(default_factory=set)  # (fingerprint, startsAt)


@dataclass
class Result:
    scenario: Scenario
    pages: list[Page]
    notes: list[str]

    @property
    def paged(self) -> set[str]:
        return {p.alertname for p in self.pages}

    @property
    def ok(self) -> bool:
        return self.paged == set(self.scenario.expected)


class ScenarioRun:
    def __init__(self, stack: Stack, scenario: Scenario) -> None:
        self.stack = stack
        self.scenario = scenario
        self.view = stack.view
        o = stack.options
        self.tp = o.ranks // 2
        self.steps = max(math.ceil(o.duration / o.step_interval), 10)
        self.boot = f"demo-{scenario.name}-{time.strftime('%H%M%S')}-{os.getpid()}"
        self.ranks: dict[int, subprocess.Popen[bytes]] = {}
        self.rank_of_pid: dict[int, int] = {}
        self.phase: dict[int, str] = {}
        self.booted: set[int] = set()
        self.rounds: dict[int, int] = {}
        self.helpers: list[subprocess.Popen[bytes]] = []
        self.pages: list[Page] = []
        self.notes: list[str] = []
        self.page_index = stack.receiver.count() if stack.receiver else 0
        self.serving_since: float | None = None
        self.trough_done = False
        self.foreign_started = False

    # --- launching ------------------------------------------------------------------------

    def launch(self) -> None:
        o = self.stack.options
        port = free_port()
        skip = ["--skip-rank", str(o.ranks - 1), "--skip-step", str(max(self.steps // 4, 2))]
        for rank in range(o.ranks):
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(o.ranks),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANKSCOPE_DIR=str(self.stack.flight_dir),
                RANKSCOPE_BOOT_ID=self.boot,
                OMP_NUM_THREADS="1",  # four ranks on a small machine: no thread oversubscription
                # A census snapshot about once a second, so a skew shows within seconds.
                RANKSCOPE_CENSUS_EVERY=str(max(round(1.0 / o.step_interval), 1)),
            )
            argv = [
                sys.executable,
                "-m",
                "rankscope.demo.workload",
                "--tp",
                str(self.tp),
                "--steps",
                str(self.steps),
                "--step-interval",
                str(o.step_interval),
                *(skip if self.scenario.name == "skip" else []),
            ]
            log = self.stack.workdir / f"{self.scenario.name}-rank{rank}.log"
            proc = start(argv, log, env=env)
            self.ranks[rank] = proc
            self.rank_of_pid[proc.pid] = rank

    # --- the scenario's own events ----------------------------------------------------------

    def start_foreign(self) -> None:
        self.foreign_started = True
        if self.stack.options.gpu:
            proc = self._helper(
                [sys.executable, "-m", "rankscope.demo.hog", "--gpu", "0", "--bytes", "2GiB"],
                "foreign",
            )
            self.view.line(f"foreign holder: pid {proc.pid} takes 2 GiB on GPU 0 (a real allocation)")
        else:
            proc = self._helper(["sleep", "600"], "foreign")
            assert self.stack.cards is not None
            self.stack.cards.set_holder(0, proc.pid, FOREIGN_BYTES)
            self.stack.cards.write()
            self.view.line(
                f"foreign holder: pid {proc.pid} (a real `sleep`) is scripted to hold "
                f"{gib(FOREIGN_BYTES)} on simulated card 0"
            )

    def trough(self) -> None:
        self.trough_done = True
        o = self.stack.options
        if o.gpu:
            leave = max(o.floor - 2 * GiB, 256 * 1024**2)
            proc = self._helper(
                [
                    sys.executable,
                    "-m",
                    "rankscope.demo.hog",
                    "--gpu",
                    "0",
                    "--leave-free",
                    str(leave),
                    "--hold",
                    str(TROUGH_SECONDS),
                ],
                "trough",
            )
            self.view.line(
                f"trough: pid {proc.pid} takes all but {gib(leave)} of GPU 0 for "
                f"{TROUGH_SECONDS * 1000:.0f} ms (floor {gib(o.floor)})"
            )
            return
        cards = self.stack.cards
        assert cards is not None
        proc = self._helper(["sleep", "600"], "trough")
        take = cards.trough_bytes(0)
        cards.set_holder(0, proc.pid, take)
        cards.write()
        self.view.line(
            f"trough: pid {proc.pid} takes {gib(take)} on simulated card 0 for "
            f"{TROUGH_SECONDS * 1000:.0f} ms, leaving {gib(cards.free(0))} free (floor {gib(o.floor)})"
        )
        time.sleep(TROUGH_SECONDS)
        cards.drop_holder(proc.pid)
        cards.write()
        stop(proc)

    def _helper(self, argv: list[str], what: str) -> subprocess.Popen[bytes]:
        proc = start(argv, self.stack.workdir / f"{self.scenario.name}-{what}.log")
        self.helpers.append(proc)
        return proc

    # --- following the run ------------------------------------------------------------------

    def follow(self, reader: FlightReader) -> None:
        changed = False
        for rec in reader.poll():
            if rec.get("boot") != self.boot:
                continue
            rank = rec.get("rank")
            if rec.get("kind") == "mark" and isinstance(rank, int):
                phase = str(rec.get("phase"))
                self.phase[rank] = phase
                if phase == "boot_complete":
                    self.booted.add(rank)
                self.view.phase(rank, rec["pid"], phase)
                if self.stack.cards is not None and rec["pid"] in self.rank_of_pid:
                    card = self.stack.cards.card_of_rank(rank)
                    self.stack.cards.set_holder(card, rec["pid"], rank_bytes(phase))
                    changed = True
            elif rec.get("kind") == "census" and isinstance(rank, int):
                self.rounds[rank] = int(rec.get("round") or 0)
        for rank, proc in self.ranks.items():
            if proc.poll() is not None and self.stack.cards is not None:
                if any(proc.pid in held for held in self.stack.cards.holders):
                    self.stack.cards.drop_holder(proc.pid)
                    changed = True
        if changed and self.stack.cards is not None:
            self.stack.cards.write()
        if self.serving_since is None and len(self.booted) == len(self.ranks):
            self.serving_since = time.monotonic()
            self.view.line(f"all {len(self.ranks)} ranks booted; serving {self.steps} steps")

    def collect_pages(self) -> None:
        receiver = self.stack.receiver
        if receiver is None:
            return
        new = receiver.since(self.page_index)
        self.page_index += len(new)
        for page in new:
            key = (page.fingerprint, page.starts_at)
            fresh = page.status == "firing" and key not in self.stack.counted
            if fresh:
                self.stack.counted.add(key)
                self.pages.append(page)
            if fresh or page.status == "resolved":
                self.view.page(page, self.scenario.name)

    def summary(self) -> None:
        try:
            cards = self.stack.daemon.get("/api/v1/cards")
        except Exception as exc:
            self.view.line(f"summary: the daemon did not answer ({exc})")
            return
        served = ", ".join(f"r{r}:{n}" for r, n in sorted(self.rounds.items())) or "none yet"
        self.view.line(f"rounds served (latest census snapshot per rank): {served}")
        self.view.block(card_lines(cards))
        self.view.block(census_lines(self.stack.daemon, self.boot))

    # --- the whole scenario ------------------------------------------------------------------

    def run(self) -> Result:
        s, o = self.scenario, self.stack.options
        self.view.banner(f"scenario {s.name}: {s.title}")
        expect = ", ".join(sorted(s.expected)) or "no page"
        self.view.line(
            f"boot {self.boot}: {o.ranks} ranks ({o.ranks // self.tp} pipeline stages x "
            f"{self.tp} tensor-parallel), {self.steps} steps of {o.step_interval * 1000:.0f} ms; "
            f"expecting {expect}"
        )
        reader = FlightReader(self.stack.flight_dir)
        started = time.monotonic()
        last_summary = started
        try:
            self.launch()
            while any(p.poll() is None for p in self.ranks.values()):
                self.follow(reader)
                now = time.monotonic()
                if self.serving_since is None and now - started > BOOT_TIMEOUT:
                    self.notes.append(f"the ranks did not boot within {BOOT_TIMEOUT:.0f}s")
                    break
                if self.serving_since is not None:
                    if s.name == "foreign" and not self.foreign_started:
                        self.start_foreign()
                    if (
                        s.name == "trough"
                        and not self.trough_done
                        and now - self.serving_since > 0.3 * o.duration
                    ):
                        self.trough()
                self.collect_pages()
                if now - last_summary >= SUMMARY_EVERY:
                    last_summary = now
                    self.summary()
                time.sleep(0.1)
            self.follow(reader)
            self.report_exits()
            self.summary()
            self.settle()
        finally:
            for proc in [*self.ranks.values(), *self.helpers]:
                stop(proc, grace=3.0)
            if self.stack.cards is not None:
                self.stack.cards.clear()
                self.stack.cards.write()
        return Result(s, self.pages, self.notes)

    def report_exits(self) -> None:
        failed = {r: p.returncode for r, p in self.ranks.items() if p.returncode not in (0, None)}
        if not failed:
            self.view.line(f"all ranks served {self.steps} steps and exited")
            return
        for rank, code in sorted(failed.items()):
            log = self.stack.workdir / f"{self.scenario.name}-rank{rank}.log"
            if code == 3:
                self.view.line(
                    f"rank {rank} was left waiting in a collective its peer never issued, "
                    "and exited when the peer's connection closed (its last mark says where)"
                )
            else:
                self.notes.append(f"rank {rank} exited with {code}; see {log}")
                self.view.line(f"rank {rank} exited with {code}; see {log}")

    def settle(self) -> None:
        if self.stack.receiver is None:
            self.notes.append("pages not checked: no Prometheus and Alertmanager")
            return
        deadline = time.monotonic() + SETTLE_SECONDS
        satisfied_at: float | None = None
        self.view.line("waiting for pages still on their way")
        while time.monotonic() < deadline:
            self.collect_pages()
            if satisfied_at is None and {p.alertname for p in self.pages} >= self.scenario.expected:
                satisfied_at = time.monotonic()
            if satisfied_at is not None and time.monotonic() - satisfied_at >= QUIET_SECONDS:
                break
            time.sleep(0.2)


def census_lines(daemon: Daemon, boot: str) -> list[str]:
    """The census state as the daemon reports it for this boot."""
    try:
        doc: dict[str, Any] = daemon.get(f"/api/v1/census?boot={boot}")
    except Exception as exc:
        return [f"  census: not available yet ({exc})"]
    return [f"  census: {doc}"]
