"""Reading ``oom`` lines: the OOM instants the probe's observer recorded (rankscope.probe.oom),
parsed once into :class:`OomEvent`, with every holder of the card named: a rank of a boot
(matched by pid and start ticks against the records of every process in the flight
directory) or foreign.

Used by ``rankscope oom DIR`` and by the daemon (/api/v1/oom, rankscope_oom_events_total).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rankscope.flight import Record
from rankscope.ledger import host_pid
from rankscope.schema import Line, Oom, of_kind

ROLE_RANK = "rank"
ROLE_FOREIGN = "foreign"


@dataclass(frozen=True)
class OomHolder:
    """One process on the card at the OOM instant, largest first in an event."""

    pid: int
    bytes: int | None
    comm: str | None
    start_ticks: int | None
    role: str  # rank or foreign
    boot: str | None
    rank: int | None


@dataclass(frozen=True)
class OomEvent:
    """One OOM instant. Bytes as integers; null where unmeasured."""

    wall: float
    boot: str
    rank: int | None
    pid: int  # as the failing process saw itself
    host_pid: int | None  # as NVML lists it, where known
    start_ticks: int | None
    gpu: int | None  # NVML index
    uuid: str | None
    requested: int | None  # the segment size the allocator failed to get
    free: int | None  # free bytes at the instant (torch's cudaMemGetInfo)
    total: int | None  # NVML's total, else torch's limit
    reserved: int | None  # the allocator's reserved bytes
    allocated: int | None
    largest_free_block: int | None
    pools: dict[str, dict[str, int | None]] | None
    phase: str | None
    capturing: bool | None
    holders: tuple[OomHolder, ...]
    why: tuple[str, ...]  # every read that failed, and why

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["holders"] = [asdict(h) for h in self.holders]
        doc["why"] = list(self.why)
        return doc


RankNamer = Callable[[int, int | None], tuple[str, int | None] | None]
HostPid = Callable[[Record], int | None]


def rank_namer(records: Iterable[Record], resolve: HostPid = host_pid) -> RankNamer:
    """(host pid, start ticks) -> (boot, rank) of the process whose records say it is that
    process, or None (foreign). A pid without start ticks never matches: it may be recycled."""
    index: dict[tuple[int, int], tuple[str, int | None]] = {}
    for rec in records:
        start, pid = rec.header.start_ticks, resolve(rec)
        if start is not None and pid is not None:
            index.setdefault((pid, start), (rec.header.boot, rec.header.rank))

    def name(pid: int, start: int | None) -> tuple[str, int | None] | None:
        return index.get((pid, start)) if start is not None else None

    return name


def parse_oom(line: Line[Oom], name: RankNamer, resolve: HostPid = host_pid) -> OomEvent:
    """An ``oom`` line -> the event, holders named by ``name``."""
    h, body = line.header, line.body
    parts = {
        "device": body.device.why,
        "allocator": body.allocator.why,
        "driver": body.driver.why,
        "nvml": body.nvml.why,
        "pools": body.pools_why,
        "phase": body.phase_why,
        "measure": body.why,
    }
    whys = tuple(f"{what}: {why}" for what, why in parts.items() if why is not None)
    holders = []
    for held in body.holders or ():
        named = name(held.pid, held.start_ticks)
        holders.append(
            OomHolder(
                pid=held.pid,
                bytes=held.bytes,
                comm=held.comm,
                start_ticks=held.start_ticks,
                role=ROLE_RANK if named else ROLE_FOREIGN,
                boot=named[0] if named else None,
                rank=named[1] if named else None,
            )
        )
    holders.sort(key=lambda x: (x.bytes is None, -(x.bytes or 0), x.pid))
    pools = None
    if body.pools is not None:
        pools = {n: p.to_json() for n, p in body.pools.items()}
    return OomEvent(
        wall=h.wall,
        boot=h.boot,
        rank=h.rank,
        pid=h.pid,
        host_pid=resolve(line),
        start_ticks=h.start_ticks,
        gpu=body.device.nvml_index,
        uuid=body.device.uuid,
        requested=body.requested,
        free=body.torch_free,
        total=body.driver.total if body.driver.total is not None else body.torch_limit,
        reserved=body.allocator.reserved,
        allocated=body.allocator.allocated,
        largest_free_block=body.largest_free_block,
        pools=pools,
        phase=body.phase,
        capturing=body.capturing,
        holders=tuple(holders),
        why=whys,
    )


def oom_events(
    records: Sequence[Record],
    every_record: Iterable[Record] | None = None,
    resolve: HostPid = host_pid,
    namer: RankNamer | None = None,
) -> list[OomEvent]:
    """The OOM events among ``records``, oldest first; holders named by ``namer``, else
    against ``every_record`` (default: ``records`` themselves), host pids found by
    ``resolve``."""
    name = namer or rank_namer(records if every_record is None else every_record, resolve)
    events = [parse_oom(line, name, resolve) for line in of_kind(records, Oom)]
    events.sort(key=lambda e: e.wall)
    return events
