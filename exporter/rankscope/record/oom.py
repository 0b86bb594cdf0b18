"""Kind ``oom`` (docs/probe.md): the OOM instant torch's caching allocator reported, what the
allocator and the card held then, and who held the card (rankscope.rank.probe.oom)."""

# ruff: noqa: RUF009 (the codec's field builders return dataclasses.field()s)

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankscope.record import codec
from rankscope.record.codec import Bad, Codec
from rankscope.record.mark import MarkDevice, MarkDriver, MarkNvml


@dataclass(slots=True)
class OomAllocator(Codec, where="oom.allocator"):
    """The caching allocator's own counters at the OOM."""

    reserved: int | None = codec.nbytes()
    allocated: int | None = codec.nbytes()
    num_ooms: int | None = codec.count()
    segments: int | None = codec.count()
    why: str | None = codec.text()


@dataclass(slots=True)
class OomPool(Codec, where="oom.pools"):
    """One allocator pool's segments at the OOM: ``large``, ``small``, or ``private:A,B``
    (a CUDA graph's or MemPool's private pool)."""

    segments: int | None = codec.count()
    reserved: int | None = codec.nbytes()
    allocated: int | None = codec.nbytes()


@dataclass(slots=True)
class OomHolder(Codec, where="oom.holders"):
    """One process on the card at the OOM: NVML's pid and bytes, with the comm and start
    ticks /proc gave right then (null where this process's /proc cannot see the pid)."""

    pid: int = codec.whole()
    bytes: int | None = codec.nbytes()
    comm: str | None = codec.text()
    start_ticks: int | None = codec.integer()


def _pools(value: Any, bad: Bad, name: str) -> dict[str, OomPool] | None:
    """Absent: null; an entry that is no object reads as an empty pool."""
    if not isinstance(value, dict):
        return codec.reject(value, bad, name)
    return {
        str(k): codec.parse_section(OomPool, v if isinstance(v, dict) else {}, bad)
        for k, v in value.items()
    }


def _holders(value: Any, bad: Bad, name: str) -> list[OomHolder] | None:
    """Absent: null; an entry that is no object is left out, one of no pid named bad."""
    if not isinstance(value, list):
        return codec.reject(value, bad, name)
    holders = [OomHolder.parse(raw, bad) for raw in value if isinstance(raw, dict)]
    bad.extend(f"{name}.pid" for h in holders if h is None)
    return [h for h in holders if h is not None]


@dataclass(slots=True)
class Oom(Codec, kind="oom", stream="oom", where="oom"):
    """The OOM instant torch's caching allocator reported (docs/probe.md). ``requested``,
    ``torch_free`` and ``torch_limit`` are what torch handed the observer; every other field
    is a read of the probe's, null with a why where it failed."""

    requested: int | None = codec.nbytes()  # the segment size the allocator failed to get
    torch_free: int | None = codec.nbytes()  # cudaMemGetInfo's free at the instant
    torch_limit: int | None = codec.nbytes()  # the card's total, or the allowed maximum
    device: MarkDevice = codec.section(MarkDevice)
    allocator: OomAllocator = codec.section(OomAllocator)
    pools: dict[str, OomPool] | None = codec.custom(_pools, codec.json_of_each)
    largest_free_block: int | None = codec.nbytes()
    pools_why: str | None = codec.text()
    driver: MarkDriver = codec.section(MarkDriver)
    nvml: MarkNvml = codec.section(MarkNvml)
    holders: list[OomHolder] | None = codec.custom(
        _holders, lambda hs: None if hs is None else [h.to_json() for h in hs]
    )
    phase: str | None = codec.text()  # the last mark's
    phase_wall: float | None = codec.time()
    phase_why: str | None = codec.text()
    capturing: bool | None = codec.boolean()  # the current stream was capturing a CUDA graph
    why: str | None = codec.text()  # the measurement itself failed
