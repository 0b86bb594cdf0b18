"""The OOM instant: one ``oom`` line written from inside torch's CUDA caching allocator when
it gives up on an allocation (its out-of-memory observer, called on the failing thread just
before torch raises OutOfMemoryError), naming what held the card right then. The observer
allocates nothing on the card, makes a bounded number of reads and never raises (torch would
turn an exception into a C++ one replacing the rank's OutOfMemoryError): a failed read is a
null field with a why. Attaching initialises CUDA, so it waits for the host's own CUDA
initialisation, or, armed before torch, for the import of torch.cuda."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any

from rankscope.procfs import read_stat
from rankscope.rank.imports import after_import
from rankscope.rank.probe.torch_view import Device, int_or_none, stat
from rankscope.rank.writer import RECORDER
from rankscope.record import MarkDevice, MarkDriver, MarkNvml, Oom, OomAllocator, OomHolder, OomPool

# Above this many allocator blocks the segment summary is skipped: the snapshot walks every
# block, and the failure path must stay short.
MAX_SNAPSHOT_BLOCKS = 20_000

NOT_IMPORTED = "torch is not imported in this process (yet)"
NO_CUDA_ALLOCATOR = "this torch build has no CUDA caching allocator (no OOM observer to attach)"


@dataclass
class OomState:
    """Whether the observer is attached, why not, and the phase of the last mark."""

    attached: bool = False  # the observer is in the allocator's list
    queued: bool = False  # waiting on torch.cuda's lazy init
    settled: bool = False  # nothing more to try in this process (attached, or impossible)
    why: str | None = NOT_IMPORTED
    last_phase: str | None = None
    last_phase_wall: float | None = None


STATE = OomState()


def install() -> bool:
    """Attach the OOM observer, now if CUDA is initialised, else at CUDA's lazy init. True
    when attached or queued, else False (``STATE.why`` says why). Idempotent, never raises,
    never imports torch nor initialises CUDA."""
    if STATE.attached or STATE.queued:
        return True
    if STATE.settled:
        return False
    try:
        torch, cuda = sys.modules.get("torch"), sys.modules.get("torch.cuda")
        if torch is None or cuda is None:
            STATE.why = NOT_IMPORTED
            after_import("torch.cuda", _installed)
            return False
        c = torch._C  # imported by torch before torch.cuda
        if not hasattr(c, "_cuda_attach_out_of_memory_observer"):
            STATE.why, STATE.settled = NO_CUDA_ALLOCATOR, True
            return False
        if cuda.is_initialized():
            _attach(c)
            return True
        STATE.queued, STATE.why = True, "queued: attaches when CUDA initialises"
        cuda._lazy_call(_attach_at_init)
        return True
    except Exception as exc:  # the probe never raises into its host
        STATE.why, STATE.settled = f"attaching the OOM observer failed: {exc!r}", True
        return False


def _installed(module: Any) -> None:
    install()


def _attach_at_init() -> None:
    # Runs inside torch.cuda._lazy_init: an exception here would fail the host's CUDA init.
    try:
        _attach(sys.modules["torch"]._C)
    except Exception as exc:
        STATE.why = f"attaching the OOM observer at CUDA init failed: {exc!r}"
    finally:
        STATE.queued = False
        STATE.settled = True


def _attach(c: Any) -> None:
    c._cuda_attach_out_of_memory_observer(observe)
    STATE.attached, STATE.settled, STATE.why = True, True, None


# --- the observer -----------------------------------------------------------------------


def observe(device: int, alloc_size: int, device_total: int, device_free: int) -> None:
    """torch's OOM observer. Writes one ``oom`` line; never raises."""
    with contextlib.suppress(Exception):
        try:
            body = measure(int(device), int(alloc_size), int(device_total), int(device_free))
        except Exception as exc:
            body = bare(device, alloc_size, device_total, device_free)
            body.why = f"measuring the OOM instant failed: {exc!r}"
        RECORDER.write_record(body)


def bare(device: Any, alloc_size: Any, device_total: Any, device_free: Any) -> Oom:
    """What torch handed the observer, with every read of ours null."""
    return Oom(
        requested=int_or_none(alloc_size),
        torch_free=int_or_none(device_free),
        torch_limit=int_or_none(device_total),
        device=MarkDevice(index=int_or_none(device)),
        allocator=OomAllocator(why="not read"),
        pools_why="not read",
        driver=MarkDriver(why="not read"),
        nvml=MarkNvml(why="not read"),
        phase=STATE.last_phase,
        phase_wall=STATE.last_phase_wall,
    )


def holders(procs: dict[int, int | None] | None) -> list[OomHolder] | None:
    """Every process on the card, as NVML listed it, with its comm and start ticks from
    /proc (null where this process cannot see the pid), so a recycled pid is told apart."""
    if procs is None:
        return None
    stats = {pid: read_stat(pid) for pid in procs}  # pid -> (start ticks, comm)
    return [OomHolder(pid, n, stats[pid][1], stats[pid][0]) for pid, n in procs.items()]


def measure(device: int, alloc_size: int, device_total: int, device_free: int) -> Oom:
    from rankscope.rank import probe  # the probe's cached views (imported: it imported us)

    body = bare(device, alloc_size, device_total, device_free)
    torch = sys.modules.get("torch")
    c = getattr(torch, "_C", None)
    stats: dict[str, Any] | None = None
    try:
        stats = c._cuda_memoryStats(device)  # type: ignore[union-attr]
        body.allocator = OomAllocator(
            reserved=stat(stats, "reserved_bytes"),
            allocated=stat(stats, "allocated_bytes"),
            num_ooms=int_or_none(stats.get("num_ooms")),
            segments=stat(stats, "segment"),
        )
    except Exception as exc:
        body.allocator = OomAllocator(why=f"memory stats failed: {exc!r}")
    body.pools, body.largest_free_block, body.pools_why = _pools(c, device, stats)
    with contextlib.suppress(Exception):  # capturing stays null
        body.capturing = bool(c._cuda_isCurrentStreamCapturing())  # type: ignore[union-attr]
    uuid: str | None = None
    try:
        uuid = probe.TORCH.device(torch.cuda, device).uuid  # type: ignore[union-attr]
    except Exception as exc:
        body.device.why = f"device uuid unread: {exc!r}"
    process = RECORDER.process
    nvml_index, body.driver, body.nvml = probe.NVML.read(
        Device(device, uuid), body.device.why, process.pid, process.pidns
    )
    body.device.uuid, body.device.nvml_index = uuid, nvml_index
    body.holders = holders(body.nvml.procs)
    if STATE.last_phase is None:
        body.phase_why = "no mark before the OOM"
    return body


def _pools(
    c: Any, device: int, stats: dict[str, Any] | None
) -> tuple[dict[str, OomPool] | None, int | None, str | None]:
    if stats is None:
        return None, None, "allocator stats unread, so the snapshot size is unknown"
    blocks = (stat(stats, "active") or 0) + (stat(stats, "inactive_split") or 0)
    segments = stat(stats, "segment") or 0
    if blocks + segments > MAX_SNAPSHOT_BLOCKS:
        return None, None, f"{blocks} blocks: over {MAX_SNAPSHOT_BLOCKS}, too many to walk here"
    try:
        if c._cuda_isHistoryEnabled():
            return None, None, "allocation history is recorded: a snapshot would carry frames"
        snapshot = c._cuda_memorySnapshot(None)
    except Exception as exc:
        return None, None, f"allocator snapshot failed: {exc!r}"
    pools, largest = pool_summary(snapshot.get("segments") or [], device)
    return pools, largest, None


def pool_summary(
    segments: list[dict[str, Any]], device: int
) -> tuple[dict[str, OomPool], int | None]:
    """(bytes per pool, largest free block) of one device from torch's snapshot segments.
    Pools: ``large`` and ``small`` (the default pools), ``private:A,B`` (a graph's or a
    MemPool's); the largest free block is the default pools' (a private pool's serve only
    its own graph)."""
    sums: dict[str, list[int]] = {}  # name -> [segments, reserved, allocated]
    free: list[int] = []
    for seg in segments:
        if seg.get("device") != device:
            continue
        pool_id = tuple(seg.get("segment_pool_id") or (0, 0))
        private = pool_id != (0, 0)
        name = f"private:{','.join(map(str, pool_id))}" if private else str(seg.get("segment_type"))
        sums.setdefault(name, [0, 0, 0])
        sums[name][0] += 1
        sums[name][1] += int(seg.get("total_size") or 0)
        sums[name][2] += int(seg.get("allocated_size") or 0)
        if not private:
            blocks = seg.get("blocks") or ()
            free += (int(b.get("size") or 0) for b in blocks if b.get("state") == "inactive")
    return {name: OomPool(*counts) for name, counts in sums.items()}, max(free, default=None)
