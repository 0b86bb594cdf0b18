"""Per-pid holdings: who holds each card's memory, and which of them are ranks.

NVML (or the scripted source) lists host pids and their bytes per card. Each host pid P is
matched to a rank's record through /proc, so a rank inside a container or another PID
namespace is recognised as itself (docs/architecture.md, "The record"): the last entry of
the NSpid chain of /proc/P/status equals the record's ``pid``, the start ticks of
/proc/P/stat equal its ``start_ticks``, and, when both are known, the inode of
/proc/P/ns/pid equals its ``pidns``. Everything else is foreign, named by its pid and its
comm (/proc/P/comm, never the command line: command lines carry secrets).

The proc root is injectable, so the parse and match functions are tested on fixture trees
and the daemon can read a host /proc mounted elsewhere (--path.procfs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rankscope.daemon.devices import DeviceError
from rankscope.daemon.flightstate import RankProcess
from rankscope.daemon.sampler import CardHoldings, CardState, Holding, Periodic, Sampler
from rankscope.record import (
    parse_stat_start_ticks,
    read_nspid,
    read_pidns_inode,
    read_start_ticks,
)

log = logging.getLogger("rankscope.daemon")

ROLE_RANK = "rank"
ROLE_FOREIGN = "foreign"
ROLE_OVERFLOW = "overflow"


@dataclass(frozen=True)
class ProcInfo:
    """What /proc says about one host pid. Fields are None where /proc could not tell (the
    process exited, or it is outside the daemon's PID view)."""

    pid: int
    comm: str | None
    start_ticks: int | None
    nspid: tuple[int, ...] | None
    pidns: int | None


def parse_comm(raw: str) -> str:
    """/proc/PID/comm -> the process name (at most 15 bytes, a trailing newline)."""
    return raw.rstrip("\n")


def read_comm(pid: int, proc: str = "/proc") -> str | None:
    try:
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return parse_comm(f.read())
    except OSError:
        return None


def read_proc_info(pid: int, proc: str = "/proc") -> ProcInfo:
    return ProcInfo(
        pid=pid,
        comm=read_comm(pid, proc),
        start_ticks=read_start_ticks(pid, proc),
        nspid=read_nspid(pid, proc),
        pidns=read_pidns_inode(pid, proc),
    )


def parse_stat_comm(stat_line: str) -> str | None:
    """The comm field of /proc/PID/stat (what /proc/PID/comm holds, in parentheses; it may
    itself hold spaces and parentheses, so it ends at the last ')')."""
    start, end = stat_line.find("("), stat_line.rfind(")")
    return stat_line[start + 1 : end] if 0 <= start < end else None


def read_stat(pid: int, proc: str = "/proc") -> tuple[int | None, str | None]:
    """(start ticks, comm) from one read of /proc/PID/stat; (None, None) when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None, None
    return parse_stat_start_ticks(raw), parse_stat_comm(raw)


class ProcCache:
    """ProcInfo per host pid. A pid seen before costs one read of /proc/P/stat per holdings
    read (start ticks and comm); the NSpid chain and the namespace are read again only when
    the start ticks change, i.e. the pid was recycled."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._infos: dict[int, ProcInfo] = {}

    def lookup(self, pids: Iterable[int]) -> dict[int, ProcInfo]:
        fresh: dict[int, ProcInfo] = {}
        for pid in pids:
            cached = self._infos.get(pid)
            start, comm = read_stat(pid, self.proc) if cached is not None else (None, None)
            if cached is not None and start is not None and cached.start_ticks == start:
                # A process may rename itself (prctl PR_SET_NAME).
                info = cached if comm == cached.comm else _with_comm(cached, comm)
            else:
                info = read_proc_info(pid, self.proc)
            fresh[pid] = info
        self._infos = fresh  # exited pids drop out here
        return fresh


def _with_comm(info: ProcInfo, comm: str | None) -> ProcInfo:
    return ProcInfo(info.pid, comm, info.start_ticks, info.nspid, info.pidns)


class RankIndex:
    """The rank processes, indexed by (pid as the rank saw it, start ticks)."""

    def __init__(self, ranks: Iterable[RankProcess]) -> None:
        self._by_key: dict[tuple[int, int], list[RankProcess]] = {}
        for rp in ranks:
            if rp.start_ticks is None:
                continue  # without start ticks a pid alone could be a recycled one
            self._by_key.setdefault((rp.pid, rp.start_ticks), []).append(rp)

    def match(self, info: ProcInfo) -> RankProcess | None:
        """The rank process a host pid is, or None. The host name is not compared: a
        container has its own, and pid + start ticks + namespace already pin the process."""
        if not info.nspid or info.start_ticks is None:
            return None
        candidates = self._by_key.get((info.nspid[-1], info.start_ticks), [])
        matches = [
            rp
            for rp in candidates
            if rp.pidns is None or info.pidns is None or rp.pidns == info.pidns
        ]
        # Several records of one process (it moved to a newer boot): the first wins, and
        # the flight state lists the newest boot first.
        return matches[0] if matches else None


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
    out.sort(key=lambda h: (h.bytes is None, -(h.bytes or 0), h.pid))
    return out


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


class HoldingsReader:
    """Reads every card's process list at its own cadence (1 s by default, on its own
    thread, so a slow process query never delays a corridor sample) and publishes the
    attributed holdings on the sampler's card state."""

    def __init__(
        self,
        sampler: Sampler,
        rank_processes: Callable[[], list[RankProcess]],
        *,
        interval: float = 1.0,
        proc: str = "/proc",
    ) -> None:
        self.sampler = sampler
        self.rank_processes = rank_processes
        self.interval = interval
        self.cache = ProcCache(proc)
        self._warned: set[str] = set()
        self._runner = Periodic("rankscope-holdings", interval, self.read)

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

    def start(self) -> None:
        self._runner.start()

    def stop(self) -> None:
        self._runner.stop()
