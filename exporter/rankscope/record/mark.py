"""Kinds ``mark`` and ``sample`` (docs/probe.md): what the process held at a boot phase, or
at a serving sample, in views shared with ``oom``; and the generic marks' typed extras."""

# ruff: noqa: RUF009 (the codec's field builders return dataclasses.field()s)

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankscope.record import codec
from rankscope.record.codec import Codec, Json


@dataclass(slots=True)
class MarkDevice(Codec, where="mark.device"):
    """The card the process works on: CUDA index, NVML uuid and NVML index."""

    index: int | None = codec.integer()
    uuid: str | None = codec.text()
    nvml_index: int | None = codec.integer()
    why: str | None = codec.text()


@dataclass(slots=True)
class MarkTorch(Codec, where="mark.torch"):
    """The allocator's view: reserved and allocated bytes, peak, retries, OOMs."""

    reserved: int | None = codec.nbytes()
    allocated: int | None = codec.nbytes()
    peak_allocated: int | None = codec.nbytes()
    num_alloc_retries: int | None = codec.count()
    num_ooms: int | None = codec.count()
    why: str | None = codec.text()


@dataclass(slots=True)
class MarkDriver(Codec, where="mark.driver"):
    """The card's free and total bytes (NVML memory info)."""

    free: int | None = codec.nbytes()
    total: int | None = codec.nbytes()
    why: str | None = codec.text()

    @property
    def used(self) -> int | None:
        return self.total - self.free if self.free is not None and self.total is not None else None


@dataclass(slots=True)
class MarkNvml(Codec, where="mark.nvml"):
    """This process's NVML bytes and the card's host pid -> bytes map (None: not listed
    per process on this card); on the wire the pids are the object's string keys."""

    self_bytes: int | None = codec.nbytes()
    procs: dict[int, int | None] | None = codec.custom(codec.as_count_by_int, codec.str_keys)
    why: str | None = codec.text()


@dataclass(slots=True)
class MarkArena(Codec, where="mark.arenas"):
    """One registered arena's bytes: reserved address space, backed, retained."""

    reserved: int | None = codec.nbytes()
    backed: int | None = codec.nbytes()
    retained: int | None = codec.nbytes()
    why: str | None = codec.text()


@dataclass(slots=True)
class MarkDerived(Codec, where="mark.derived"):
    """Signed residues, null where a side is unmeasured."""

    non_torch: int | None = codec.signed_bytes()
    non_torch_measured: bool = codec.flag()
    unbacked_reservation: int | None = codec.signed_bytes()

    @classmethod
    def parse(cls, obj: Any, bad: codec.Bad) -> MarkDerived:
        derived = cls(**(codec.parse_fields(cls, obj, bad) or {}))
        derived.non_torch_measured &= derived.non_torch is not None  # needs a value
        return derived


class MarkFields(Codec, where="mark.extra"):
    """A generic mark's extra as typed fields (rankscope.rank.auto's hooks); a reader parses
    them from a mark's ``extra`` dict with ``parse(extra, bad)``."""

    __slots__ = ()


@dataclass(slots=True)
class ProcessStartFields(MarkFields):
    """process_start's extra: the interpreter's version, or ``forked`` in a forked child."""

    python: str | None = codec.text()
    forked: bool = codec.flag()

    def to_json(self) -> Json:
        return {"forked": True} if self.forked else {"python": self.python}


@dataclass(slots=True)
class GroupFields(MarkFields):
    """nccl_init_end's extra: the group creation's seconds, instance name, ranks and backend,
    null where unreadable; ``member`` is written only when set (False: this rank is no
    member, torch returned a placeholder)."""

    seconds: float | None = codec.time()
    group: str | None = codec.text()
    ranks: list[int] | None = codec.ints()
    backend: str | None = codec.text()
    member: bool | None = codec.custom(lambda v, bad, name: v if isinstance(v, bool) else None)

    def to_json(self) -> Json:
        obj = codec.encode_fields(self, GroupFields)
        if self.member is None:
            del obj["member"]
        return obj


@dataclass(slots=True)
class PoolFields(MarkFields):
    """capture_end's extra: the captured graph's memory pool id, the bytes the allocator holds
    in that pool (shared by every graph captured into it), and why they are null or were
    read from the whole allocator's snapshot."""

    pool: tuple[int, ...] | None = codec.custom(
        codec.as_int_tuple,
        lambda pool: None if pool is None else [int(n) for n in pool],  # a bool is no id
    )
    pool_bytes: int | None = codec.nbytes()
    pool_why: str | None = codec.text()


@dataclass(slots=True)
class Mark(Codec, kind="mark", stream="marks", where="mark"):
    """A boot-phase mark (docs/probe.md). A per-mark runner goes in the header
    (``Recorder.write_record(mark, runner=...)``). A mark of no phase is malformed."""

    phase: str = codec.text(required=True)
    # a user's fields, or a generic mark's typed ones (written alike; parsed as a dict)
    extra: dict[str, Any] | MarkFields = codec.custom(
        lambda v, bad, name: v if isinstance(v, dict) else {},
        lambda v: v.to_json() if isinstance(v, MarkFields) else v,
        factory=dict,
    )
    device: MarkDevice = codec.section(MarkDevice)
    torch: MarkTorch = codec.section(MarkTorch)
    driver: MarkDriver = codec.section(MarkDriver)
    nvml: MarkNvml = codec.section(MarkNvml)
    arenas: dict[str, MarkArena] = codec.sections(MarkArena)
    derived: MarkDerived = codec.section(MarkDerived)


@dataclass(slots=True)
class Sample(Codec, kind="sample", stream="samples", where="mark"):
    """A serving sample (docs/probe.md, "Serving samples"): a mark's views with no phase,
    written at a bounded rate while serving; bad fields are named mark.* as a mark's."""

    device: MarkDevice = codec.section(MarkDevice)
    torch: MarkTorch = codec.section(MarkTorch)
    driver: MarkDriver = codec.section(MarkDriver)
    nvml: MarkNvml = codec.section(MarkNvml)
    arenas: dict[str, MarkArena] = codec.sections(MarkArena)
    derived: MarkDerived = codec.section(MarkDerived)

    @classmethod
    def of(cls, mark: Mark) -> Sample:
        """The views of a measured mark, as a sample."""
        return cls(mark.device, mark.torch, mark.driver, mark.nvml, mark.arenas, mark.derived)
