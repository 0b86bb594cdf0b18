"""The in-rank probe: ``mark(phase)`` records where this process's VRAM went at a boot
boundary, durably, as one line of its flight file (docs/probe.md).

    probe.configure(tp_rank=0, pp_rank=1, runner="target")  # what the environment cannot say
    probe.mark("weights_loaded", shards=4)                   # extras go into the record
    probe.arenas.register("kv", kv_pool)                     # reserved/backed/retained bytes

Armed by RANKSCOPE_DIR (or ``configure(flight_dir=...)``); disarmed, a mark returns at its
first line. A mark never imports torch, never initialises CUDA, never raises into its caller
and never blocks on the disk: a failure costs one warning."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from rankscope.rank.probe import arenas, oom
from rankscope.rank.probe.nvml_view import NvmlView
from rankscope.rank.probe.torch_view import TorchView
from rankscope.rank.writer import RECORDER, publish_boot_id
from rankscope.record import (
    Mark,
    MarkArena,
    MarkDerived,
    MarkDevice,
    MarkFields,
    MarkNvml,
    MarkTorch,
)

__all__ = ["arenas", "configure", "derive", "mark", "mark_fields", "oom", "publish_boot_id"]

log = logging.getLogger("rankscope")

# What a mark reads (tests swap in stand-ins).
TORCH = TorchView()
NVML = NvmlView()

_failures_warned: set[str] = set()

# RECORDER.armed, kept here by the recorder: the disarmed mark reads one module global.
ARMED = False


def _follow_armed(armed: bool) -> None:
    global ARMED
    ARMED = armed


RECORDER.follow_armed(_follow_armed)


def configure(
    *,
    flight_dir: str | os.PathLike[str] | None = None,
    boot_id: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    tp_rank: int | None = None,
    pp_rank: int | None = None,
    runner: str | None = None,
) -> None:
    """Set what the environment cannot tell: the flight directory (arms the probe), the
    boot id, and the rank identity. Arguments left at None keep their current value."""
    RECORDER.configure(
        flight_dir=flight_dir,
        boot_id=boot_id,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        tp_rank=tp_rank,
        pp_rank=pp_rank,
        runner=runner,
    )
    if RECORDER.armed:
        oom.install()


def derive(
    torch_view: MarkTorch, nvml_view: MarkNvml, arena_views: dict[str, MarkArena]
) -> MarkDerived:
    """The derived fields of a mark, signed, null where a side is unmeasured: non_torch,
    NVML's bytes of this process minus the allocator's reserved bytes (context, workspaces,
    graph pools); unbacked_reservation, reserved minus backed over the arenas reporting both."""
    reserved, self_bytes = torch_view.reserved, nvml_view.self_bytes
    unbacked: int | None = None
    for view in arena_views.values():
        if view.reserved is not None and view.backed is not None:
            unbacked = (unbacked or 0) + view.reserved - view.backed
    non_torch = self_bytes - reserved if reserved is not None and self_bytes is not None else None
    return MarkDerived(non_torch, non_torch is not None, unbacked)


def mark(phase: str, /, *, runner: str | None = None, **extra: Any) -> Mark | None:
    """Record one mark, ``extra`` keyword values in it; ``runner`` overrides the configured
    runner for this mark only. Returns the mark (also when the disk refused it), None when
    disarmed or when the mark failed; never raises."""
    if not ARMED:
        return None
    return _record(phase, runner, extra)


def mark_fields(phase: str, extra: dict[str, Any] | MarkFields, /) -> Mark | None:
    """``mark(phase, **extra)`` for a caller holding its extra fields already, as a dict or
    as a generic mark's typed fields (rankscope.record.MarkFields), which it must not change
    afterwards. Never raises."""
    if not ARMED:
        return None
    return _record(phase, None, extra)


def _record(phase: str, runner: str | None, extra: dict[str, Any] | MarkFields) -> Mark | None:
    phase = phase if type(phase) is str else str(phase)
    state = oom.STATE
    if not state.settled:
        oom.install()  # torch may have been imported since the last try
    state.last_phase, state.last_phase_wall = phase, time.time()  # for the OOM observer
    try:
        recorded = _measure(phase, extra)
    except Exception as exc:  # an instrument may cost a log line, never a boot
        _warn_once("measure", f"rankscope: mark({phase!r}) failed and was skipped: {exc!r}")
        return None
    RECORDER.write_record(recorded, runner=runner)
    return recorded


def _measure(phase: str, extra: dict[str, Any] | MarkFields, index: int | None = None) -> Mark:
    device, torch_view, why_no_device = TORCH.read(index)
    process = RECORDER.process
    nvml_index, driver, nvml = NVML.read(device, why_no_device, process.pid, process.pidns)
    arena_views = arenas.snapshot()
    index, uuid = (device.index, device.uuid) if device else (None, None)
    return Mark(
        phase,
        extra,
        MarkDevice(index, uuid, nvml_index, why_no_device),
        torch_view,
        driver,
        nvml,
        arena_views,
        derive(torch_view, nvml, arena_views),
    )


def _warn_once(key: str, message: str) -> None:
    if key not in _failures_warned:
        _failures_warned.add(key)
        log.warning("%s; further failures are not logged", message)


def _after_fork_in_child() -> None:
    # Neither NVML's state nor a CUDA context survives a fork: the child reads afresh.
    global TORCH, NVML
    TORCH, NVML = TorchView(), NvmlView(NVML._module)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

if RECORDER.armed:  # armed by RANKSCOPE_DIR: watch for the OOM instant from the start
    oom.install()
