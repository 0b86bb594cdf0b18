"""The demo's scenarios and the run of one: launch the ranks, follow their flight record,
drive the card (simulated or real), watch the pages arrive, and judge them. Each scenario is
its own boot, so the daemon, following the newest boot, moves on by itself. A page belongs
to the scenario during which it first fired; a repeat (same fingerprint and start) is none.
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
from rankscope.demo.cards import FOREIGN_BYTES, TROUGH_BELOW_FLOOR, SimulatedCards, rank_bytes
from rankscope.demo.services import Page, Service, WebhookReceiver, free_port, start, stop
from rankscope.demo.view import View, card_lines, gib
from rankscope.demo.workload import COLLECTIVE_FAILED
from rankscope.record import Census, Mark
from rankscope.record.reader import FlightReader


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    expected: frozenset[str]  # the alert names that must page, and nothing else


SCENARIOS: dict[str, Scenario] = {
    name: Scenario(name, title, frozenset(expected))
    for name, title, expected in (
        ("healthy", "every rank issues every collective; nothing pages", ()),
        (
            "skip",
            "the last rank skips one all_reduce of its tensor-parallel group",
            [alerting.CENSUS_SKEW],
        ),
        ("foreign", "a process that is no rank takes memory on card 0", [alerting.FOREIGN_HOLDER]),
        ("trough", "a process takes card 0 below its floor for 400 ms", [alerting.CORRIDOR_BREACH]),
        (
            "oom",
            "a process takes all of card 0's free memory; the OOM page names it (and holds "
            "back the breach that comes with it)",
            [alerting.OUT_OF_MEMORY],
        ),
    )
}

STEP_INTERVAL = 0.05  # seconds per serving step
TROUGH_SECONDS = 0.4
# The exhaustion leaves this much of card 0 free, for less than the foreign-holder rule's
# `for:`, so the OOM page is the one page.
EXHAUST_LEAVE_FREE = 128 * 1024**2
EXHAUST_SECONDS = 1.5
SQUEEZE_AFTER = 0.3  # of the duration: when the trough and the exhaustion start
SETTLE_SECONDS = 25.0  # after serving, for pages still on their way
QUIET_SECONDS = 3.0  # once the expected pages are in, listening for unexpected ones
SUMMARY_EVERY = 4.0
# The daemon's trailing window of worst free memory (--sampler.window), short for the demo:
# once a scenario has run this long, the window lies inside it and its worst counts towards
# the scenario's, so a trough shorter than the polling is still this scenario's worst.
SAMPLER_WINDOW = 2.0
OBSERVE_EVERY = 0.5
BOOT_TIMEOUT = 120.0
STRAGGLER_GRACE = 5.0  # in a collective after the first rank finished serving


@dataclass
class Result:
    """What one scenario produced; without Alertmanager, judged by what the API ``shown``."""

    scenario: Scenario
    pages: list[Page] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    shown: set[str] = field(default_factory=set)
    checked: bool = True

    @property
    def ok(self) -> bool:
        got = {p.alertname for p in self.pages} if self.checked else self.shown
        return got == set(self.scenario.expected) and not self.notes


@dataclass
class Stack:
    """What every scenario shares; no receiver without Alertmanager, no cards on a GPU."""

    workdir: Path
    flight_dir: Path
    daemon: Service
    receiver: WebhookReceiver | None
    cards: SimulatedCards | None
    view: View
    ranks: int
    duration: float
    floor: int
    counted: set[tuple[str, str]] = field(default_factory=set)  # (fingerprint, startsAt)
    boots: dict[str, str] = field(default_factory=dict)  # boot id -> scenario name
    results: dict[str, Result] = field(default_factory=dict)  # by scenario name


class ScenarioRun:
    def __init__(self, stack: Stack, scenario: Scenario) -> None:
        self.stack = stack
        self.scenario = scenario
        self.view = stack.view
        self.tp = stack.ranks // 2
        self.steps = max(math.ceil(stack.duration / STEP_INTERVAL), 10)
        self.boot = f"demo-{scenario.name}-{time.strftime('%H%M%S')}-{os.getpid()}"
        stack.boots[self.boot] = scenario.name
        self.ranks: dict[int, subprocess.Popen[bytes]] = {}
        self.booted: set[int] = set()
        self.rounds: dict[int, int] = {}
        self.helpers: list[subprocess.Popen[bytes]] = []
        self.result = Result(scenario, checked=stack.receiver is not None)
        self.pages, self.notes, self.shown = self.result.pages, self.result.notes, self.result.shown
        stack.results[scenario.name] = self.result
        self.foreign_since: dict[int, float] = {}  # pid -> first seen
        self.breaches_before: dict[str, int] = {}  # each card's counter when first read
        self.breached: set[str] = set()  # cards whose breach counter rose in this scenario
        self.oomed: set[str] = set()  # cards with an OOM instant in this scenario
        self.worst_free: dict[str, int] = {}  # by card uuid, over this scenario's samples
        self.page_index = len(stack.receiver.pages) if stack.receiver else 0
        self.serving_since: float | None = None
        self.acted = False  # the scenario's own event (foreign holder, trough, OOM) is done
        self.started_wall = time.time()
        self.started = time.monotonic()

    def launch(self) -> None:
        world = self.stack.ranks
        port = free_port()
        # Under `rankscope run`, as an operator starts a job: marks and census come free.
        argv = [sys.executable, "-m", "rankscope", "run", "--", sys.executable, "-m"]
        argv += ["rankscope.demo.workload", "--tp", str(self.tp), "--steps", str(self.steps)]
        argv += ["--step-interval", str(STEP_INTERVAL)]
        if self.scenario.name == "skip":
            argv += ["--skip-rank", str(world - 1), "--skip-step", str(max(self.steps // 4, 2))]
        for rank in range(world):
            env = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANKSCOPE_DIR=str(self.stack.flight_dir),
                RANKSCOPE_BOOT_ID=self.boot,
                RANKSCOPE_CENSUS="1",  # armed, whatever the calling shell says
                OMP_NUM_THREADS="1",  # four ranks on a small machine: no thread oversubscription
                # A census snapshot about once a second, so a skew shows within seconds.
                RANKSCOPE_CENSUS_EVERY=str(max(round(1.0 / STEP_INTERVAL), 1)),
            )
            log = self.stack.workdir / f"{self.scenario.name}-rank{rank}.log"
            self.ranks[rank] = start(argv, log, env=env)

    def act(self, now: float) -> None:
        """Once serving: the foreign holder at once, the trough or the exhaustion a while in."""
        if self.acted or self.serving_since is None:
            return
        name = self.scenario.name
        if name == "foreign":
            self.hold(None, 0.0)
        elif now - self.serving_since <= SQUEEZE_AFTER * self.stack.duration:
            return
        elif name == "trough":
            self.hold(max(self.stack.floor - TROUGH_BELOW_FLOOR, 256 * 1024**2), TROUGH_SECONDS)
        elif name == "oom":
            # The sampler sees the card exhausted and counts an OOM no allocator reported.
            self.hold(EXHAUST_LEAVE_FREE, EXHAUST_SECONDS)
        else:
            return
        self.acted = True

    def hold(self, leave: int | None, seconds: float) -> None:
        """A process on card 0: the foreign holder (``leave`` None) for good, else one taking
        all but ``leave`` bytes for ``seconds``; the hog on a GPU, else a scripted `sleep`."""
        cards, floor = self.stack.cards, f"floor {gib(self.stack.floor)}"
        if leave is None:
            what, take, hog = "foreign holder", FOREIGN_BYTES, ["--bytes", "2GiB"]
            on_gpu = "2 GiB on GPU 0 (a real allocation)"
        else:
            what, take = self.scenario.name, cards.bytes_to_leave(0, leave) if cards else 0
            hog = ["--leave-free", str(leave), "--hold", str(seconds)]
            on_gpu = f"all but {gib(leave)} of GPU 0 for {seconds:g} s (real allocations; {floor})"
        argv = [sys.executable, "-m", "rankscope.demo.hog", "--gpu", "0", *hog]
        log = self.stack.workdir / f"{self.scenario.name}-holder.log"
        proc = start(argv if cards is None else ["sleep", "600"], log)
        self.helpers.append(proc)
        if cards is None:
            self.view.line(f"{what}: pid {proc.pid} takes {on_gpu}")
            return
        cards.set_holder(0, proc.pid, take)
        lasting = f" for {seconds:g} s, leaving {gib(cards.free(0))} free ({floor})"
        self.view.line(
            f"{what}: pid {proc.pid} (a real `sleep`) is scripted to hold {gib(take)} on "
            f"simulated card 0{'' if leave is None else lasting}"
        )
        if leave is not None:
            time.sleep(seconds)
            cards.drop_holder(proc.pid)
            stop(proc)

    def follow(self, reader: FlightReader) -> None:
        cards = self.stack.cards
        reached: dict[tuple[int, int], list[str]] = {}
        rank_pids = {proc.pid for proc in self.ranks.values()}
        for rec in reader.poll():
            h, body = rec.header, rec.body
            if h.boot != self.boot or (rank := h.rank) is None:
                continue
            if isinstance(body, Mark):
                reached.setdefault((rank, h.pid), []).append(body.phase)
                if body.phase == "boot_complete":
                    self.booted.add(rank)
                if cards is not None and h.pid in rank_pids:
                    cards.set_holder(cards.card_of_rank(rank), h.pid, rank_bytes(body.phase))
            elif isinstance(body, Census):
                self.rounds[rank] = body.round or 0
        for (rank, pid), phases in sorted(reached.items()):
            self.view.line(f"rank {rank} (pid {pid}): {' > '.join(phases)}")
        for proc in self.ranks.values():
            if cards is not None and proc.poll() is not None:
                cards.drop_holder(proc.pid)
        if self.serving_since is None and len(self.booted) == len(self.ranks):
            self.serving_since = time.monotonic()
            self.view.line(f"all {len(self.ranks)} ranks booted; serving {self.steps} steps")

    def collect_pages(self) -> None:
        if (receiver := self.stack.receiver) is None:
            return
        new = receiver.pages[self.page_index :]
        self.page_index += len(new)
        for page in new:
            key = (page.fingerprint, page.starts_at)
            fresh = page.status == "firing" and key not in self.stack.counted
            # A page naming a boot belongs to that boot's scenario, whenever it arrives;
            # a card's page to the scenario running when it arrives.
            owner = self.stack.boots.get(page.labels.get("boot", ""), self.scenario.name)
            if fresh:
                self.stack.counted.add(key)
                self.stack.results[owner].pages.append(page)
            if fresh or page.status == "resolved":
                self.view.page(page, owner)

    def observe(self) -> dict[str, Any] | None:
        """Read the daemon's cards and note what an alert would page on."""
        try:
            doc: dict[str, Any] = self.stack.daemon.get("/api/v1/cards")
        except Exception as exc:
            self.view.line(f"the daemon did not answer ({exc})")
            return None
        now = time.monotonic()
        window_inside = now - self.started >= SAMPLER_WINDOW
        for card in doc.get("cards", []):
            uuid, breaches = str(card.get("uuid")), card.get("breaches") or 0
            if breaches > self.breaches_before.setdefault(uuid, breaches):
                self.breached.add(uuid)
            if (card.get("last_oom") or {}).get("wall", 0) >= self.started_wall:
                self.oomed.add(uuid)
            seen = [card.get("free"), card.get("free_min") if window_inside else None]
            for free in (f for f in seen if isinstance(f, int)):
                self.worst_free[uuid] = min(self.worst_free.get(uuid, free), free)
            for proc in card.get("processes") or []:
                if proc.get("role") == "foreign" and isinstance(proc.get("pid"), int):
                    first = self.foreign_since.setdefault(proc["pid"], now)
                    if now - first >= alerting.FOREIGN_HOLDER_FOR_SECONDS:
                        self.shown.add(alerting.FOREIGN_HOLDER)
        # An OOM's page holds back its card's breach (the shipped inhibition); the breach may
        # be read a moment before the OOM of the same sample, so it is judged anew.
        if self.oomed:
            self.shown.add(alerting.OUT_OF_MEMORY)
        self.shown.discard(alerting.CORRIDOR_BREACH)
        if self.breached - self.oomed:
            self.shown.add(alerting.CORRIDOR_BREACH)
        return doc

    def summary(self) -> None:
        if (cards := self.observe()) is None:
            return
        served = ", ".join(f"r{r}:{n}" for r, n in sorted(self.rounds.items())) or "none yet"
        self.view.line(f"rounds served (latest census snapshot per rank): {served}")
        self.view.line(*card_lines(cards, self.worst_free, self.breaches_before))
        try:
            census: dict[str, Any] = self.stack.daemon.get(f"/api/v1/census?boot={self.boot}")
        except Exception as exc:
            self.view.line(f"  census: no report yet ({exc})")
            return
        # Judged anew at each summary, as the alert's `for:` would: a rank that waits a
        # moment for a slow peer is stalled in disagreement until the peer catches up.
        self.shown.discard(alerting.CENSUS_SKEW)
        if census.get("divergent"):
            self.shown.add(alerting.CENSUS_SKEW)
        self.view.line(*census_summary(census))

    def run(self) -> None:
        s, world = self.scenario, self.stack.ranks
        self.view.banner(f"scenario {s.name}: {s.title}")
        expect = ", ".join(sorted(s.expected)) or "no page"
        self.view.line(
            f"boot {self.boot}: {world} ranks ({world // self.tp} pipeline stages x "
            f"{self.tp} tensor-parallel), {self.steps} steps of {STEP_INTERVAL * 1000:.0f} ms; "
            f"expecting {expect}"
        )
        reader = FlightReader(self.stack.flight_dir)
        try:
            self.launch()
            stragglers = self.serve(reader)
            self.follow(reader)
            self.summary()
            self.report_exits(stragglers)
            self.settle()
        finally:
            for proc in [*self.ranks.values(), *self.helpers]:
                stop(proc, grace=3.0)
            if self.stack.cards is not None:
                self.stack.cards.clear()

    def serve(self, reader: FlightReader) -> list[int]:
        """Follow the ranks until they all ended; the ranks the demo had to stop."""
        started = last_summary = last_observed = time.monotonic()
        first_done: float | None = None
        while any(p.poll() is None for p in self.ranks.values()):
            self.follow(reader)
            now = time.monotonic()
            if self.serving_since is None and now - started > BOOT_TIMEOUT:
                self.notes.append(f"the ranks did not boot within {BOOT_TIMEOUT:.0f}s")
                break
            if first_done is None and any(p.poll() == 0 for p in self.ranks.values()):
                first_done = now
            if first_done is not None and now - first_done > STRAGGLER_GRACE:
                # A rank still inside a collective its peer never issued (NCCL does not
                # notice a peer's exit the way gloo's socket does).
                stragglers = [r for r, p in self.ranks.items() if p.poll() is None]
                for rank in stragglers:
                    stop(self.ranks[rank], grace=3.0)
                return stragglers
            self.act(now)
            self.collect_pages()
            if now - last_summary >= SUMMARY_EVERY:
                last_summary = last_observed = now
                self.summary()
            elif now - last_observed >= OBSERVE_EVERY:
                last_observed = now
                self.observe()
            time.sleep(0.1)
        return []

    def report_exits(self, stragglers: list[int]) -> None:
        """Say how each rank ended; an unclean end fails the run unless the skip caused it."""
        for rank, proc in sorted(self.ranks.items()):
            if (code := proc.returncode) == 0:
                continue
            expected = self.scenario.name == "skip"
            if rank in stragglers:
                text = (
                    f"rank {rank} was still inside a collective {STRAGGLER_GRACE:.0f}s after "
                    "its peers finished; the demo stopped it"
                )
            elif code == COLLECTIVE_FAILED:
                text = (
                    f"rank {rank} was left waiting in a collective its peer never issued and "
                    "gave up when the peer's connection closed (its last mark and census dump "
                    "say where)"
                )
            else:
                expected = False
                log = self.stack.workdir / f"{self.scenario.name}-rank{rank}.log"
                text = f"rank {rank} exited with {code}; see {log}"
            self.view.line(text)
            if not expected:
                self.notes.append(text)
        if all(proc.returncode == 0 for proc in self.ranks.values()):
            self.view.line(f"all ranks served {self.steps} steps and exited")

    def settle(self) -> None:
        if self.stack.receiver is None:
            return
        deadline = time.monotonic() + SETTLE_SECONDS
        self.view.line("waiting for pages still on their way")
        while time.monotonic() < deadline:
            self.collect_pages()
            if {p.alertname for p in self.pages} >= self.scenario.expected:
                deadline = min(deadline, time.monotonic() + QUIET_SECONDS)
            time.sleep(0.2)


def census_summary(doc: dict[str, Any]) -> list[str]:
    entries = doc.get("entries") or []
    if not entries:
        return ["  census: no snapshots yet"]
    rounds = sorted({e.get("round") for e in entries if isinstance(e.get("round"), int)})
    bad = [e for e in entries if e.get("divergent")]
    if not bad:
        return [
            f"  census: {len(entries)} (group, op) compared at round(s) "
            f"{', '.join(map(str, rounds))}: every rank agrees"
        ]
    lines = []
    for e in bad:
        counts = " ".join(f"r{r}:{n}" for r, n in (e.get("counts") or {}).items())
        lagging = ", ".join(str(r) for r in e.get("lagging") or [])
        lines.append(
            f"  census: DIVERGED {e.get('group')} {e.get('op')} at round {e.get('round')}: "
            f"{counts}; lagging rank {lagging} (first diverged at round "
            f"{doc.get('first_divergent_round')})"
        )
    return lines
