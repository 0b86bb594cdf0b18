"""The OOM report, for ``rankscope oom`` and the daemon: each probe's ``oom`` line as an
:class:`OomEvent` whose holders are named ranks of a boot or foreign, and :class:`SamplerOom`,
an OOM the daemon's sampler saw, as its API serves it and the CLI reads it back."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from rankscope.record import Line, Oom, of_kind
from rankscope.record.reader import BootSummary, HostPid, Record, host_pid

ROLE_RANK = "rank"
ROLE_FOREIGN = "foreign"
T = TypeVar("T")

RankNamer = Callable[[int, int | None], tuple[str, int | None] | None]


API_KEYS = ("pid", "comm", "bytes", "role", "boot", "rank")  # /api/v1/cards, the sampler's OOMs
# A probe's holders keep the order and the start ticks it recorded.
RECORDED_KEYS = ("pid", "bytes", "comm", "start_ticks", "role", "boot", "rank")


@dataclass(frozen=True)
class Holding:
    """One process holding a card's memory, named a rank of a boot or foreign."""

    pid: int | None  # None for the daemon's overflow series
    comm: str | None
    bytes: int | None
    role: str  # ROLE_RANK, ROLE_FOREIGN, or the daemon's overflow
    boot: str | None
    rank: int | None
    start_ticks: int | None = None  # the probe's; the daemon matches ranks through /proc

    def as_json(self, keys: Sequence[str] = API_KEYS) -> dict[str, Any]:
        return {key: getattr(self, key) for key in keys}


def largest_first(holdings: Iterable[Holding]) -> list[Holding]:
    """Largest first, unknown bytes last, then by pid."""
    return sorted(holdings, key=lambda h: (h.bytes is None, -(h.bytes or 0), h.pid))


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
    holders: tuple[Holding, ...]  # largest first
    why: tuple[str, ...]  # every read that failed, and why

    def as_json(self) -> dict[str, Any]:
        holders = [h.as_json(RECORDED_KEYS) for h in self.holders]
        return asdict(self) | {"holders": holders, "why": list(self.why)}


def rank_namer(records: Iterable[Record], resolve: HostPid = host_pid) -> RankNamer:
    """(host pid, start ticks) -> (boot, rank), or None: foreign, or a pid with no start ticks."""
    index: dict[tuple[int, int | None], tuple[str, int | None]] = {}
    for rec in records:
        start, pid = rec.header.start_ticks, resolve(rec)
        if start is not None and pid is not None:
            index.setdefault((pid, start), (rec.header.boot, rec.header.rank))
    return lambda pid, start: index.get((pid, start))  # no entry has unknown start ticks


def parse_oom(line: Line[Oom], name: RankNamer, resolve: HostPid = host_pid) -> OomEvent:
    """An ``oom`` line -> the event, holders named by ``name``."""
    h, body = line.header, line.body
    parts = {part: getattr(body, part).why for part in ("device", "allocator", "driver", "nvml")}
    parts.update(pools=body.pools_why, phase=body.phase_why, measure=body.why)
    holders = []
    for held in body.holders or ():
        named = name(held.pid, held.start_ticks)
        role = ROLE_RANK if named else ROLE_FOREIGN
        boot, rank = named or (None, None)
        holders.append(Holding(held.pid, held.comm, held.bytes, role, boot, rank, held.start_ticks))
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
        pools=None if body.pools is None else {n: p.to_json() for n, p in body.pools.items()},
        phase=body.phase,
        capturing=body.capturing,
        holders=tuple(largest_first(holders)),
        why=tuple(f"{what}: {why}" for what, why in parts.items() if why is not None),
    )


def oom_events(
    records: Sequence[Record], resolve: HostPid = host_pid, namer: RankNamer | None = None
) -> list[OomEvent]:
    """The OOM events among ``records``, oldest first, holders named by ``namer``."""
    name = namer or rank_namer(records, resolve)
    events = (parse_oom(line, name, resolve) for line in of_kind(records, Oom))
    return sorted(events, key=lambda e: e.wall)


@dataclass(frozen=True)
class SamplerOom:
    """An OOM instant the daemon's sampler saw (free at or below --oom.free-below)."""

    wall: float  # the worst instant of the exhaustion
    gpu: int | None
    uuid: str | None
    free: int | None  # free bytes at the worst instant
    onset_wall: float | None
    onset_free: int | None
    holders: tuple[Holding, ...] | None  # read once, at the onset; None when unread
    why: tuple[str, ...] = ()  # why the holders are unknown

    def as_json(self) -> dict[str, Any]:
        """An /api/v1/oom entry; a rank's OOM fields the sampler cannot know are null."""
        doc: dict[str, Any] = {"source": "sampler", **asdict(self), "why": list(self.why)}
        doc["holders"] = None if self.holders is None else [h.as_json() for h in self.holders]
        return doc | dict.fromkeys(("boot", "rank", "pid", "requested"))

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> SamplerOom:
        """One API entry -> the instant; ValueError naming the first field that is wrong."""
        raw = obj.get("holders")
        return cls(
            wall=_of(obj.get("wall"), float, "wall"),
            **_optional(obj, "", gpu=int, uuid=str, free=int, onset_wall=float, onset_free=int),
            holders=None if raw is None else tuple(_holder(h) for h in _of(raw, list, "holders")),
            why=tuple(_of(w, str, "why") for w in _of(obj.get("why") or [], list, "why")),
        )


def _holder(obj: Any) -> Holding:
    h = _of(obj, dict, "holders")
    role = _of(h.get("role"), str, "holders.role")
    if role not in (ROLE_RANK, ROLE_FOREIGN):
        raise ValueError(f"holders.role: {role!r}")
    pid = _of(h.get("pid"), int, "holders.pid")
    return Holding(
        pid=pid, role=role, **_optional(h, "holders.", comm=str, bytes=int, boot=str, rank=int)
    )


def _optional(obj: Mapping[str, Any], where: str, **kinds: type) -> dict[str, Any]:
    """Each field of ``kinds`` in ``obj``: null, or of its kind."""
    return {name: _opt(obj.get(name), kind, where + name) for name, kind in kinds.items()}


def _of(value: Any, kind: type[T], name: str) -> T:
    """``value`` when it is a ``kind`` (a bool is no number; an int is a float)."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # type: ignore[return-value]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{name}: {value!r}")
    return value


def _opt(value: Any, kind: type[T], name: str) -> T | None:
    return None if value is None else _of(value, kind, name)


def sampler_ooms_of_boot(
    ooms: Iterable[SamplerOom], boots: Sequence[BootSummary], boot: str | None
) -> list[SamplerOom]:
    """The sampler's OOMs from ``boot``'s first record to the next boot's (open for the
    newest: a rank killed by the OOM writes nothing after it); all when no boot matches."""
    starts = [b.first_wall for b in boots] + [float("inf")]
    i = next((i for i, b in enumerate(boots) if b.boot == boot), None)
    if i is not None:
        ooms = (o for o in ooms if starts[i] <= o.wall < starts[i + 1])
    return sorted(ooms, key=lambda o: o.wall)


def sampler_ooms_of_page(doc: Any) -> tuple[list[SamplerOom], list[str], str | None]:
    """One answer of /api/v1/oom -> its sampler entries, why each unreadable one was skipped,
    the next page's path (None on the last); ValueError for an answer not the API's."""
    body = _of(doc, dict, "answer")
    why = body.get("why")
    if isinstance(why, str):  # the daemon watches for no OOM: say so, not "none recorded"
        raise ValueError(f"the daemon records no OOM: {why}")
    ooms: list[SamplerOom] = []
    skipped: list[str] = []
    for entry in _of(body.get("ooms"), list, "ooms"):
        try:
            if _of(entry, dict, "ooms[]").get("source") == "sampler":  # a probe's is in DIR
                ooms.append(SamplerOom.parse(entry))
        except ValueError as exc:
            skipped.append(str(exc))
    page = _opt(body.get("page"), dict, "page") or {}
    return ooms, skipped, _opt(page.get("next"), str, "page.next")
