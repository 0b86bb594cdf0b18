"""The torch allocator view of a mark, read without ever initialising CUDA.

torch is used only if the host program already imported it (importing it here would cost
seconds), and CUDA only if the host already initialised it: a mark before the first
allocation must leave the card untouched.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from rankscope.record import MarkTorch

NOT_IMPORTED = "torch is not imported in this process"
NOT_INITIALISED = "CUDA not initialised in this process"


@dataclass(slots=True)
class Device:
    """The card this process works on: its CUDA index and NVML's uuid string (GPU-...).
    Built once per index (TorchView caches it); treat it as read-only."""

    index: int
    uuid: str | None


# (device, allocator view, why there is no device): a plain tuple, built at every mark (a
# NamedTuple's constructor is a Python call)
TorchReading = tuple[Device | None, MarkTorch, str | None]


def empty_view(why: str) -> MarkTorch:
    return MarkTorch(why=why)


def nvml_uuid(raw: Any) -> str:
    """torch prints a device uuid bare; NVML names the same card 'GPU-<uuid>'."""
    text = str(raw)
    return text if text.startswith(("GPU-", "MIG-")) else "GPU-" + text


def view_from_stats(stats: dict[str, Any]) -> MarkTorch:
    """The mark's allocator fields from torch's nested memory-stats dict (a pure function).
    A key torch stops reporting gives null, never 0."""
    # Direct lookups, and no call for a value that is already an int: a mark runs this
    # every time, and a generic path walk cost more than the rest of the view.
    try:
        current = stats["reserved_bytes"]["all"].get("current")
    except (KeyError, TypeError, AttributeError):
        current = None
    try:
        node = stats["allocated_bytes"]["all"]
        used, peak = node.get("current"), node.get("peak")
    except (KeyError, TypeError, AttributeError):
        used = peak = None
    retries, ooms = stats.get("num_alloc_retries"), stats.get("num_ooms")
    return MarkTorch(
        current if type(current) is int else _int(current),
        used if type(used) is int else _int(used),
        peak if type(peak) is int else _int(peak),
        retries if type(retries) is int else _int(retries),
        ooms if type(ooms) is int else _int(ooms),
    )


def _int(value: Any) -> int | None:
    """An int subclass (a bool, a numpy-like integer) as a plain int; anything else None."""
    return int(value) if isinstance(value, int) else None


def initialising(cuda: Any) -> bool:
    """True inside torch.cuda's lazy initialisation, after the CUDA runtime is up: where the
    calls queued with ``torch.cuda._lazy_call`` run (the generic ``cuda_init`` mark), before
    ``is_initialized()`` turns true. Reading the allocator there initialises nothing more."""
    return hasattr(getattr(cuda, "_tls", None), "is_initializing")


class TorchView:
    """Reads the allocator of the current device; caches each device (its uuid), and the
    accessors once CUDA is initialised (it stays so for the life of the process; a forked
    child starts over)."""

    def __init__(self) -> None:
        self._devices: dict[int, Device] = {}
        # (torch module, cuda module, current-device call, nested-stats call), once CUDA is up
        self._live: tuple[Any, Any, Any, Any] | None = None

    def read(self) -> TorchReading:
        torch = sys.modules.get("torch")
        live = self._live
        if live is None or live[0] is not torch:
            if torch is None:
                return None, empty_view(NOT_IMPORTED), NOT_IMPORTED
            cuda = getattr(torch, "cuda", None)
            if cuda is None or not (cuda.is_initialized() or initialising(cuda)):
                return None, empty_view(NOT_INITIALISED), NOT_INITIALISED
            c = torch._C
            # The private accessors skip torch.cuda's wrappers: memory_stats() flattens ~120
            # keys into a sorted dict (tens of microseconds) where a mark needs five numbers.
            live = (
                torch,
                cuda,
                getattr(c, "_cuda_getDevice", None) or cuda.current_device,
                getattr(c, "_cuda_memoryStats", None) or cuda.memory_stats_as_nested_dict,
            )
            if cuda.is_initialized():  # not while torch's lazy init is still running
                self._live = live
        _, cuda, get_device, memory_stats = live
        index = int(get_device())
        device = self._devices.get(index) or self._device(cuda, index)
        return device, view_from_stats(memory_stats(index)), None

    def _device(self, cuda: Any, index: int) -> Device:
        device = self._devices.get(index)
        if device is None:
            raw = getattr(cuda.get_device_properties(index), "uuid", None)
            device = self._devices[index] = Device(
                index, nvml_uuid(raw) if raw is not None else None
            )
        return device

    def _uuid(self, cuda: Any, index: int) -> str | None:
        return self._device(cuda, index).uuid

    def after_fork_in_child(self) -> None:
        self._devices.clear()
        self._live = None
