"""The card source: every card's free memory at a fixed interval, its minimum over a
trailing window (a monotonic deque: a trough between two scrapes is still seen at the next)
and the time below each card's floor. A failing card is retried with backoff while the
others go on; docs/corridor.md describes the accounting."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rankscope.daemon.devices import CardIdentity, DeviceError, DeviceSource
from rankscope.daemon.flags import parse_bytes
from rankscope.daemon.holdings import CardHoldings

log = logging.getLogger("rankscope.daemon")

MAX_BACKOFF_S = 30.0
REOPEN_AFTER_FAILURES = 3  # consecutive failures of one card before the source is reopened
SOURCE_DOWN = "device source %s is down: %s; the daemon keeps serving, retrying with backoff"
SOURCE_PARTIAL = "device source %s: %s; serving the other cards"


@dataclass(frozen=True)
class FloorValue:
    """A floor in bytes, or as a fraction of the card's total ('5%')."""

    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, total: int) -> int:
        return self.bytes if self.bytes is not None else round(total * (self.fraction or 0.0))


@dataclass(frozen=True)
class Floors:
    """``--corridor.floor``: floors by card uuid or index ('0'), and '' for every other card."""

    by_card: dict[str, FloorValue] = field(default_factory=dict)

    def for_card(self, card: CardIdentity) -> int | None:
        keys = (card.uuid, str(card.index), "")
        value = next((self.by_card[key] for key in keys if key in self.by_card), None)
        return None if value is None else value.resolve(card.total)

    def merged(self, other: Floors) -> Floors:
        return Floors({**self.by_card, **other.by_card})


def parse_floor_value(text: str) -> FloorValue:
    text = text.strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise ValueError(f"{text!r} is not a percentage") from None
        if not 0 <= percent <= 100:
            raise ValueError(f"{text!r}: a percentage of the card's total is 0..100")
        return FloorValue(fraction=percent / 100)
    return FloorValue(bytes=parse_bytes(text))


def parse_floors(text: str) -> Floors:
    """'2GiB' (every card), '0=2GiB,GPU-abc=3GiB' (by index or uuid), '5%,1=4GiB'."""
    by_card: dict[str, FloorValue] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.rpartition("=")
        key = key.strip()
        try:
            if sep and not key:
                raise ValueError("empty card key before '='")
            floor = parse_floor_value(value)
        except ValueError as exc:
            detail = str(exc).removeprefix(f"{value!r}: ")  # the item already names it
            raise ValueError(f"corridor floor {item!r}: {detail}") from None
        by_card[str(int(key)) if key.isdecimal() else key] = floor
    return Floors(by_card)


@dataclass
class CardState:
    identity: CardIdentity
    floor: int | None
    present: bool = True  # still enumerated by the source
    latest: int | None = None
    window: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    below: bool = False
    last_t: float | None = None
    breach_seconds: float = 0.0
    breaches: int = 0
    errors: int = 0
    failing: str | None = None
    failures: int = 0  # consecutive
    retry_at: float = 0.0
    backoff: float = 0.0
    holdings: CardHoldings | None = None


@dataclass(frozen=True)
class CardView:
    """What the collectors and the JSON API read: one card, copied under the lock."""

    identity: CardIdentity
    source: str
    up: bool
    floor: int | None
    free: int | None
    free_min: int | None
    breach_seconds: float | None  # None: no floor, nothing to measure against
    breaches: int | None
    errors: int
    holdings: CardHoldings | None

    @property
    def margin(self) -> int | None:
        return None if self.free_min is None or self.floor is None else self.free_min - self.floor


class Sampler:
    """:meth:`sample` takes one sample, :meth:`start` one every ``interval``."""

    def __init__(
        self,
        source: DeviceSource,
        *,
        floors: Floors | None = None,
        interval: float = 0.1,
        window: float = 15.0,
    ) -> None:
        self.source = source
        self.floors = floors or Floors()
        self.interval = interval
        self.window = window
        self.samples = 0
        self.duration_sum = 0.0
        self.source_errors = 0
        self.source_failing: str | None = None
        self.tried = threading.Event()  # set once the source has been tried (up or down)
        self._open = False
        # When to (re)open the source: always set while closed; while open, when failing.
        self._reopen_at: float | None = 0.0
        self._source_backoff = 0.0
        self._cards: list[CardState] = []  # present cards, in slot order
        self._known: dict[str, CardState] = {}  # every card ever seen, by uuid
        self._lock = threading.Lock()  # card state: sampler and holdings write, scrapes read
        self._source_lock = threading.Lock()  # (re)opening vs the holdings' reads
        self._runner = Periodic("rankscope-sampler", interval, self.sample)
        # Each card read, after the lock (rankscope.daemon.oom's exhaustion watch).
        self.on_read: Callable[[CardState, int], None] | None = None

    def sample(self, now: float | None = None) -> None:
        started = time.perf_counter()
        now = time.monotonic() if now is None else now
        if self._reopen_at is not None and now >= self._reopen_at:
            self._reopen(now)
        elif self._open:
            try:
                if self.source.changed():
                    self._reopen(now)
            except DeviceError as exc:
                self._source_failed(exc, now)
        if self._open:
            self._read_cards(now)
        self.duration_sum += time.perf_counter() - started
        self.samples += 1
        self.tried.set()

    def _read_cards(self, now: float) -> None:
        read = self.source.read_free
        reads: list[tuple[CardState, int]] = []
        for card in self._cards:
            if card.retry_at > now:
                continue
            try:
                reads.append((card, read(card.identity.slot)))
            except DeviceError as exc:
                self._card_failed(card, exc, now)
        cutoff = now - self.window
        with self._lock:
            for card, free in reads:
                if card.failing is not None:
                    log.info("card %s (%s) answers again", card.identity.index, card.identity.uuid)
                    card.failing, card.failures, card.backoff = None, 0, 0.0
                card.latest = free
                window = card.window
                while window and window[-1][1] >= free:
                    window.pop()
                window.append((now, free))
                while window[0][0] <= cutoff:
                    window.popleft()
                below = card.floor is not None and free < card.floor
                if below and card.last_t is not None:
                    card.breach_seconds += now - card.last_t
                if below and not card.below:
                    card.breaches += 1
                card.below, card.last_t = below, now
        if self.on_read is not None:
            for card, free in reads:
                self.on_read(card, free)

    def _card_failed(self, card: CardState, exc: DeviceError, now: float) -> None:
        with self._lock:
            card.errors += 1
            card.failures += 1
            card.last_t = None  # the time while it failed is unmeasured, never counted
            card.backoff = backoff(card.backoff, self.interval)
            card.retry_at = now + card.backoff
            if card.failing is None:
                log.warning(
                    "card %s (%s) failed: %s; serving the other cards, retrying with backoff",
                    card.identity.index,
                    card.identity.uuid,
                    exc,
                )
            card.failing = str(exc)
            if card.failures >= REOPEN_AFTER_FAILURES:
                card.failures = 0
                # Handles may be dead (driver reloaded, GPU reset): re-resolve them all.
                self._reopen_at = card.retry_at

    def _count_source_failure(self, message: str, warning: str, now: float) -> None:
        """Under the lock: counts a failure of the source, and when to try it again."""
        self.source_errors += 1
        self._source_backoff = backoff(self._source_backoff, self.interval)
        self._reopen_at = now + self._source_backoff
        if self.source_failing != message:
            log.warning(warning, self.source.name, message)
        self.source_failing = message

    def _source_failed(self, exc: DeviceError, now: float) -> None:
        """The open source stopped answering: closed until the retry."""
        with self._lock:
            self._count_source_failure(str(exc), SOURCE_DOWN, now)
            self._open = False
            for card in self._cards:
                card.last_t, card.holdings = None, None
        with self._source_lock:
            self.source.close()

    def _reopen(self, now: float) -> None:
        with self._source_lock:
            if self._open:
                self.source.close()
                self._open = False
            try:
                self._adopt(self.source.open())
            except DeviceError as exc:
                with self._lock:
                    self._count_source_failure(str(exc), SOURCE_DOWN, now)
                self.source.close()
                return
        with self._lock:
            self._open = True
            incomplete = self.source.incomplete
            if incomplete is not None:  # serving the cards that answered, retrying the rest
                self._count_source_failure(incomplete, SOURCE_PARTIAL, now)
                return
            if self.source_failing is not None:
                log.info("device source %s is up again", self.source.name)
            self.source_failing, self._source_backoff, self._reopen_at = None, 0.0, None

    def _adopt(self, identities: list[CardIdentity]) -> None:
        """State is kept per uuid (counters never go backwards across a reopen); a card no
        longer listed stays, marked absent."""
        if self.source.name == "simulated":
            log.warning(
                "device source: %d SIMULATED card(s) from a script, not real GPUs "
                "(rankscope_gpu_info source=simulated)",
                len(identities),
            )
        with self._lock:
            cards: list[CardState] = []
            for ident in identities:
                floor = self.floors.for_card(ident)
                card = self._known.get(ident.uuid)
                if card is None:
                    card = self._known[ident.uuid] = CardState(ident, floor)
                card.identity, card.floor, card.present = ident, floor, True
                card.retry_at, card.last_t = 0.0, None
                cards.append(card)
            listed = {c.identity.uuid for c in cards}
            for uuid, card in self._known.items():
                if uuid not in listed:
                    card.present, card.latest, card.holdings = False, None, None
                    card.window.clear()
            self._cards = cards
        known = {"", *listed, *(str(c.identity.index) for c in cards)}
        for key in self.floors.by_card:
            if key not in known:
                log.warning("--corridor.floor names card %r, which the source does not list", key)

    def start(self) -> None:
        self._runner.start()

    def stop(self) -> None:
        self._runner.stop()
        with self._source_lock:
            self.source.close()
            self._open, self._reopen_at = False, 0.0

    @contextlib.contextmanager
    def open_cards(self) -> Iterator[list[CardState]]:
        """The present cards (none while the source is down), the source held open."""
        with self._source_lock:
            yield list(self._cards) if self._open else []

    def set_holdings(self, card: CardState, holdings: CardHoldings | None) -> None:
        with self._lock:
            card.holdings = holdings

    def count_error(self, card: CardState) -> None:
        with self._lock:
            card.errors += 1

    @property
    def overrun_count(self) -> int:
        return self._runner.overruns

    def up(self) -> bool:
        with self._lock:
            cards_ok = all(c.failing is None for c in self._cards)
            return self._open and self.source_failing is None and cards_ok

    def views(self, now: float | None = None) -> list[CardView]:
        now = time.monotonic() if now is None else now
        cutoff = now - self.window
        out: list[CardView] = []
        with self._lock:
            for card in sorted(self._known.values(), key=lambda c: c.identity.index):
                window = card.window
                while window and window[0][0] <= cutoff:
                    window.popleft()
                measured = card.floor is not None
                up = self._open and card.present and card.failing is None
                out.append(
                    CardView(
                        identity=card.identity,
                        source=self.source.name,
                        up=up,
                        floor=card.floor,
                        free=card.latest if up else None,  # a stale value is no sample
                        free_min=window[0][1] if window else None,
                        breach_seconds=card.breach_seconds if measured else None,
                        breaches=card.breaches if measured else None,
                        errors=card.errors,
                        holdings=card.holdings,
                    )
                )
        return out


def backoff(previous: float, first: float) -> float:
    """The next retry delay: ``first``, then doubling up to MAX_BACKOFF_S."""
    return min(max(previous * 2, first), MAX_BACKOFF_S)


@dataclass(eq=False)
class Periodic:
    """Runs ``fn`` every ``interval`` seconds on a daemon thread; a run that starts late is
    an overrun, and the schedule restarts from now instead of bursting to catch up."""

    name: str
    interval: float
    fn: Callable[[], object]
    stop_wait: float = 10.0
    after_each: bool = False  # wait ``interval`` after each run ends instead (no overruns)
    overruns: int = field(default=0, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.stop_wait)
            self._thread = None

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.fn()
            except Exception:  # a bug in one run must not end the thread
                log.exception("%s: a run failed", self.name)
            next_at += self.interval
            now = time.monotonic()
            if self.after_each:
                next_at = now + self.interval
            elif now > next_at:
                self.overruns += 1
                next_at = now
            self._stop.wait(next_at - now)
