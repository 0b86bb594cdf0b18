"""The holdings source: every card's process list, read on its own thread (a slow query
never delays a corridor sample) and published on the sampler's card state. Each host pid is
matched to a rank through /proc (a rank in a container too); anything else is foreign, named
by pid and comm (never the command line: command lines carry secrets)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rankscope.daemon.devices import DeviceError
from rankscope.procfs import ProcCache, ProcInfo, RankIndex
from rankscope.reports.oom import ROLE_FOREIGN, ROLE_RANK, Holding, largest_first

if TYPE_CHECKING:  # the sampler keeps each card's holdings: it imports this module
    from rankscope.daemon.flightstate import RankProcess
    from rankscope.daemon.sampler import CardState, Sampler

log = logging.getLogger("rankscope.daemon")

ROLE_OVERFLOW = "overflow"


@dataclass(frozen=True)
class CardHoldings:
    """One read of a card's process list, and its free bytes."""

    processes: tuple[Holding, ...]
    free: int
    rank_resident: int
    foreign: int
    unattributed: int  # total - free - every process's bytes; signed


def attribute(
    held: dict[int, int | None], infos: dict[int, ProcInfo], index: RankIndex
) -> list[Holding]:
    """A card's pid -> bytes map -> holdings, largest first (unknown bytes last)."""
    out: list[Holding] = []
    for pid, nbytes in held.items():
        info = infos.get(pid) or ProcInfo(pid, None, None, None, None)
        rp = index.match(info)
        role, boot, rank = (ROLE_RANK, rp.boot, rp.rank) if rp else (ROLE_FOREIGN, None, None)
        out.append(Holding(pid, info.comm or "", nbytes, role, boot, rank))
    return largest_first(out)


def cap(holdings: list[Holding], max_series: int) -> list[Holding]:
    """At most ``max_series`` series per card: beyond it, the largest ``max_series - 1``
    and one overflow series summing the rest (its unknown bytes left out of the sum)."""
    if max_series < 1:
        raise ValueError("the holdings cap must be at least 1")
    if len(holdings) <= max_series:
        return holdings
    kept, rest = holdings[: max_series - 1], holdings[max_series - 1 :]
    overflow = sum(h.bytes for h in rest if h.bytes is not None)
    return [*kept, Holding(None, "", overflow, ROLE_OVERFLOW, None, None)]


def summarize(holdings: list[Holding], total: int, free: int) -> CardHoldings:
    """The per-card identity: total = free + rank-resident + foreign + unattributed, the
    last signed (driver context, memory outside any process, sampling skew)."""
    rank = sum(h.bytes or 0 for h in holdings if h.role == ROLE_RANK)
    foreign = sum(h.bytes or 0 for h in holdings if h.role == ROLE_FOREIGN)
    return CardHoldings(tuple(holdings), free, rank, foreign, total - free - rank - foreign)


class HoldingsReader:
    def __init__(
        self, sampler: Sampler, rank_processes: Callable[[], list[RankProcess]], proc: str = "/proc"
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
