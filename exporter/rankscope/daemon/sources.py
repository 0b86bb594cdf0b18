"""The sources the collectors and the API read, each made on first demand: a daemon with
the card collectors off never opens NVML."""

from __future__ import annotations

from typing import Protocol

from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.devices import DeviceSource, make_source
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.holdings import HoldingsReader
from rankscope.daemon.oom import ExhaustionWatch, OomBook
from rankscope.daemon.sampler import Periodic, Sampler

# The refresher's period; the API refreshes itself past twice that (rankscope.daemon.app).
FLIGHT_REFRESH_S = 1.0


class Poller(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


class Sources:
    def __init__(self, config: DaemonConfig, device: DeviceSource | None = None) -> None:
        self.config = config
        self.flight = FlightState(
            config.flight.dir,
            exited_grace=config.flight.exited_grace,
            proc=config.procfs,
            read_budget=config.flight.read_budget,
        )
        self._device = device  # tests hand in a source; the daemon makes it from the config
        self.card_sampler: Sampler | None = None
        self.holdings_reader: HoldingsReader | None = None
        self.oom_book: OomBook | None = None
        self.pollers: list[Poller] = [
            Periodic("rankscope-flight", FLIGHT_REFRESH_S, self.flight.refresh)
        ]

    def sampler(self) -> Sampler:
        if self.card_sampler is None:
            cards = self.config.cards
            device = self._device or make_source(cards.device_source, cards.device_script)
            self.card_sampler = Sampler(
                device, floors=cards.floors, interval=cards.interval, window=cards.window
            )
            self.pollers.append(self.card_sampler)
            self._watch_exhaustion()
        return self.card_sampler

    def holdings(self) -> HoldingsReader:
        if self.holdings_reader is None:
            reader = HoldingsReader(self.sampler(), self.flight.rank_processes, self.config.procfs)
            interval = self.config.cards.holdings_interval
            self.pollers.append(Periodic("rankscope-holdings", interval, reader.read))
            self.holdings_reader = reader
        return self.holdings_reader

    def ooms(self) -> OomBook:
        if self.oom_book is None:
            self.oom_book = OomBook(self.flight, None)
            self._watch_exhaustion()
        return self.oom_book

    def _watch_exhaustion(self) -> None:
        if self.card_sampler is not None and self.oom_book is not None:
            self.oom_book.watch = ExhaustionWatch(
                self.card_sampler,
                self.flight.rank_processes,
                self.config.cards.oom_free_below,
                proc=self.config.procfs,
            )

    def run(self, poller: Poller) -> None:
        """A collector's own poller, started and stopped with the sources."""
        self.pollers.append(poller)

    def up(self) -> dict[str, bool]:
        sampler = self.card_sampler
        return {} if sampler is None else {sampler.source.name: sampler.up()}

    def start(self) -> None:
        # Returns at once: NVML opens on the sampler's thread.
        for poller in self.pollers:
            poller.start()

    def stop(self) -> None:
        for poller in reversed(self.pollers):
            poller.stop()
