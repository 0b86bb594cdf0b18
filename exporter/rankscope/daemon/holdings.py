"""Who holds each card's memory: each host pid is matched to a rank through /proc (a rank
in a container too); anything else is foreign, named by pid and comm (never the command
line: command lines carry secrets)."""

from __future__ import annotations

from dataclasses import dataclass

from rankscope.procfs import ProcInfo, RankIndex
from rankscope.reports.oom import ROLE_FOREIGN, ROLE_RANK, Holding, largest_first

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
        comm = info.comm or ""
        if rp is None:
            out.append(Holding(pid, comm, nbytes, ROLE_FOREIGN, None, None))
        else:
            out.append(Holding(pid, comm, nbytes, ROLE_RANK, rp.boot, rp.rank))
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
    rank_resident = sum(h.bytes or 0 for h in holdings if h.role == ROLE_RANK)
    foreign = sum(h.bytes or 0 for h in holdings if h.role == ROLE_FOREIGN)
    return CardHoldings(
        processes=tuple(holdings),
        free=free,
        rank_resident=rank_resident,
        foreign=foreign,
        unattributed=total - free - rank_resident - foreign,
    )
