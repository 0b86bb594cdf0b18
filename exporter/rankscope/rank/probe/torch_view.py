"""The torch allocator view of a mark, read without initialising CUDA: torch only if the
host imported it, CUDA only once the host initialised it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

from rankscope.record import MarkTorch

NOT_IMPORTED = "torch is not imported in this process"
NOT_INITIALISED = "CUDA not initialised in this process"


@dataclass(slots=True)
class Device:
    """The card this process works on: its CUDA index and NVML's uuid string (GPU-...)."""

    index: int
    uuid: str | None


# (device, allocator view, why there is no device)
TorchReading = tuple[Device | None, MarkTorch, str | None]


def nvml_uuid(raw: Any) -> str:
    """torch prints a device uuid bare; NVML names the same card 'GPU-<uuid>'."""
    text = str(raw)
    return text if text.startswith(("GPU-", "MIG-")) else "GPU-" + text


def view_from_stats(stats: dict[str, Any]) -> MarkTorch:
    """The mark's allocator fields from torch's nested memory-stats dict (a pure function)."""
    return MarkTorch(
        stat(stats, "reserved_bytes"),
        stat(stats, "allocated_bytes"),
        stat(stats, "allocated_bytes", "peak"),
        int_or_none(stats.get("num_alloc_retries")),
        int_or_none(stats.get("num_ooms")),
    )


def stat(stats: dict[str, Any], key: str, which: str = "current") -> int | None:
    """torch's nested ``stats[key]["all"][which]``: a key torch stops reporting is null, never 0."""
    try:
        return int_or_none(stats[key]["all"][which])
    except (KeyError, TypeError):
        return None


def int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def initialising(cuda: Any) -> bool:
    """True inside torch.cuda's lazy initialisation, after the CUDA runtime is up: where the
    calls queued with ``torch.cuda._lazy_call`` run (the generic ``cuda_init`` mark), before
    ``is_initialized()`` turns true. Reading the allocator there initialises nothing more."""
    return hasattr(getattr(cuda, "_tls", None), "is_initializing")


def device_being_set(cuda: Any) -> int | None:
    """The card a ``torch.cuda.set_device(d)`` or ``with torch.cuda.device(d)`` on this
    thread's stack is choosing, or None. Both run torch's lazy init before they set the
    device: a mark there would otherwise read card 0 on every rank."""
    codes = {getattr(f, "__code__", None) for f in (cuda.set_device, cuda.device.__enter__)}
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code not in codes:
        frame = frame.f_back
    local = frame.f_locals if frame is not None else {}
    device = local.get("device", getattr(local.get("self"), "idx", None))
    return device if type(device) is int and device >= 0 else None


class TorchView:
    """Reads the allocator of the current device; caches each device and, once CUDA is
    initialised, the accessors (a forked child makes a new view)."""

    def __init__(self) -> None:
        self._devices: dict[int, Device] = {}
        # (torch module, cuda module, current-device call, nested-stats call), once CUDA is up
        self._live: tuple[Any, Any, Any, Any] | None = None
        self.marked: int | None = None  # the current device of the last mark's thread

    def read(self, index: int | None = None) -> TorchReading:
        torch = sys.modules.get("torch")
        live = self._live
        if live is None or live[0] is not torch:
            if torch is None:
                return None, MarkTorch(why=NOT_IMPORTED), NOT_IMPORTED
            cuda = getattr(torch, "cuda", None)
            if cuda is None or not (cuda.is_initialized() or initialising(cuda)):
                return None, MarkTorch(why=NOT_INITIALISED), NOT_INITIALISED
            c = torch._C
            # memory_stats() flattens ~120 keys (tens of microseconds); a mark needs five
            live = (
                torch,
                cuda,
                getattr(c, "_cuda_getDevice", None) or cuda.current_device,
                getattr(c, "_cuda_memoryStats", None) or cuda.memory_stats_as_nested_dict,
            )
            if cuda.is_initialized():  # not while torch's lazy init is still running
                self._live = live
        _, cuda, get_device, memory_stats = live
        if index is None:  # the calling thread's current device: CUDA's is per thread
            chosen = device_being_set(cuda) if live is not self._live else None  # in lazy init
            index = self.marked = int(get_device()) if chosen is None else chosen
        return self.device(cuda, index), view_from_stats(memory_stats(index)), None

    def device(self, cuda: Any, index: int) -> Device:
        device = self._devices.get(index)
        if device is None:
            raw = getattr(cuda.get_device_properties(index), "uuid", None)
            uuid = nvml_uuid(raw) if raw is not None else None
            device = self._devices[index] = Device(index, uuid)
        return device
