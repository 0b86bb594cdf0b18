"""Reading ``oom`` lines: the OOM instants the probe's observer recorded (rankscope.probe.oom),
parsed once into :class:`OomEvent`, with every holder of the card named: a rank of a boot
(matched by pid and start ticks against the records of every process in the flight
directory) or foreign.

Used by ``rankscope oom DIR`` and by the daemon (/api/v1/oom, rankscope_oom_events_total).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from rankscope.flight import Record
from rankscope.ledger import host_pid

KIND = "oom"
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
    pools: dict[str, dict[str, int]] | None
    phase: str | None
    capturing: bool | None
    holders: tuple[OomHolder, ...]
    why: tuple[str, ...]  # every read that failed, and why

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["holders"] = [asdict(h) for h in self.holders]
        doc["why"] = list(self.why)
        return doc


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


RankNamer = Callable[[int, int | None], tuple[str, int | None] | None]
HostPid = Callable[[Record], int | None]


def rank_namer(records: Iterable[Record], resolve: HostPid = host_pid) -> RankNamer:
    """(host pid, start ticks) -> (boot, rank) of the process whose records say it is that
    process, or None (foreign). A pid without start ticks never matches: it may be recycled."""
    index: dict[tuple[int, int], tuple[str, int | None]] = {}
    for rec in records:
        start, pid = _int(rec.get("start_ticks")), resolve(rec)
        if start is not None and pid is not None:
            index.setdefault((pid, start), (rec["boot"], _int(rec.get("rank"))))

    def name(pid: int, start: int | None) -> tuple[str, int | None] | None:
        return index.get((pid, start)) if start is not None else None

    return name


def parse_oom(rec: Record, name: RankNamer, resolve: HostPid = host_pid) -> OomEvent:
    """An ``oom`` line (validated header) -> the event, holders named by ``name``."""
    device, allocator = _dict(rec.get("device")), _dict(rec.get("allocator"))
    driver, nvml = _dict(rec.get("driver")), _dict(rec.get("nvml"))
    parts = {"device": device, "allocator": allocator, "driver": driver, "nvml": nvml}
    whys = [f"{what}: {p['why']}" for what, p in parts.items() if isinstance(p.get("why"), str)]
    for key in ("pools_why", "phase_why", "why"):
        if isinstance(rec.get(key), str):
            whys.append(f"{key.removesuffix('_why') or 'measure'}: {rec[key]}")
    holders: list[OomHolder] = []
    raw_holders = rec.get("holders")
    for h in raw_holders if isinstance(raw_holders, list) else ():
        if not isinstance(h, dict) or _int(h.get("pid")) is None:
            continue
        pid, start = h["pid"], _int(h.get("start_ticks"))
        named = name(pid, start)
        comm = h.get("comm") if isinstance(h.get("comm"), str) else None
        holders.append(
            OomHolder(
                pid=pid,
                bytes=_int(h.get("bytes")),
                comm=comm,
                start_ticks=start,
                role=ROLE_RANK if named else ROLE_FOREIGN,
                boot=named[0] if named else None,
                rank=named[1] if named else None,
            )
        )
    holders.sort(key=lambda h: (h.bytes is None, -(h.bytes or 0), h.pid))
    pools = rec.get("pools")
    capturing = rec.get("capturing")
    return OomEvent(
        wall=float(rec["wall"]),
        boot=rec["boot"],
        rank=_int(rec.get("rank")),
        pid=rec["pid"],
        host_pid=resolve(rec),
        start_ticks=_int(rec.get("start_ticks")),
        gpu=_int(device.get("nvml_index")),
        uuid=device.get("uuid") if isinstance(device.get("uuid"), str) else None,
        requested=_int(rec.get("requested")),
        free=_int(rec.get("torch_free")),
        total=_int(driver.get("total")) or _int(rec.get("torch_limit")),
        reserved=_int(allocator.get("reserved")),
        allocated=_int(allocator.get("allocated")),
        largest_free_block=_int(rec.get("largest_free_block")),
        pools=pools if isinstance(pools, dict) else None,
        phase=rec.get("phase") if isinstance(rec.get("phase"), str) else None,
        capturing=capturing if isinstance(capturing, bool) else None,
        holders=tuple(holders),
        why=tuple(whys),
    )


def oom_events(
    records: list[Record],
    every_record: Iterable[Record] | None = None,
    resolve: HostPid = host_pid,
    namer: RankNamer | None = None,
) -> list[OomEvent]:
    """The OOM events among ``records``, oldest first; holders named by ``namer``, else
    against ``every_record`` (default: ``records`` themselves), host pids found by
    ``resolve``."""
    name = namer or rank_namer(records if every_record is None else every_record, resolve)
    events = [parse_oom(r, name, resolve) for r in records if r["kind"] == KIND]
    events.sort(key=lambda e: e.wall)
    return events
