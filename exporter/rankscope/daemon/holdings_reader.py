"""The holdings source: every card's process list, read on its own thread (a slow query
never delays a corridor sample), attributed, published on the sampler's card state."""

from __future__ import annotations

import logging
from collections.abc import Callable

from rankscope.daemon.devices import DeviceError
from rankscope.daemon.flightstate import RankProcess
from rankscope.daemon.holdings import attribute, summarize
from rankscope.daemon.sampler import CardState, Sampler
from rankscope.procfs import ProcCache, RankIndex

log = logging.getLogger("rankscope.daemon")


class HoldingsReader:
    def __init__(
        self,
        sampler: Sampler,
        rank_processes: Callable[[], list[RankProcess]],
        proc: str = "/proc",
    ) -> None:
        self.sampler = sampler
        self.rank_processes = rank_processes
        self.cache = ProcCache(proc)
        self._warned: set[str] = set()

    def read(self) -> None:
        try:
            index = RankIndex(self.rank_processes())
        except Exception as exc:  # the flight side failing must not stop the holdings
            self._warn("rank processes", exc)
            index = RankIndex(())
        per_card: list[tuple[CardState, dict[int, int | None], int]] = []
        with self.sampler.open_cards() as cards:
            source = self.sampler.source
            for card in cards:
                slot = card.identity.slot
                try:
                    held = source.read_processes(slot)
                    free = source.read_free(slot)
                except DeviceError as exc:
                    self.sampler.count_error(card)
                    self.sampler.set_holdings(card, None)
                    self._warn(f"card {card.identity.index}", exc)
                    continue
                per_card.append((card, held, free))
        # /proc is read with the source released: a reopen need not wait for it.
        infos = self.cache.lookup({pid for _, held, _ in per_card for pid in held})
        for card, held, free in per_card:
            holdings = attribute(held, infos, index)
            self.sampler.set_holdings(card, summarize(holdings, card.identity.total, free))

    def _warn(self, what: str, exc: Exception) -> None:
        key = f"{what}: {exc}"
        if key not in self._warned:
            self._warned.add(key)
            log.warning("holdings: reading %s failed: %s; retrying each read", what, exc)
