"""NVML's C functions called directly, for the reads made many times (the daemon's sample,
a mark's memory info and process list): pynvml looks each up under a lock and builds a struct
per call, half as much again as the read. Only ctypes: the probe and the daemon share it."""

from __future__ import annotations

import ctypes
import threading
from _ctypes import CFuncPtr
from collections.abc import Callable
from typing import Any


class Memory(ctypes.Structure):
    """nvmlMemory_t (version 1), the struct nvmlDeviceGetMemoryInfo fills."""

    _fields_ = (
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    )


def hold_gil(fn: Any) -> Any:
    """The same C function, called without releasing the GIL (a ctypes.PYFUNCTYPE on its
    address); anything else is returned as it is. Taking the GIL back after a ctypes call can
    wait the switch interval (5 ms) in the daemon sampler's timing, for a read of tens of
    microseconds. Never in a host's process: a stalled call would stop every thread."""
    if not isinstance(fn, CFuncPtr):  # a stand-in in tests
        return fn
    address = ctypes.cast(fn, ctypes.c_void_p).value
    if address is None:
        return fn
    restype: Any = fn.restype or ctypes.c_int
    held = ctypes.PYFUNCTYPE(restype)(address)
    if fn.argtypes is not None:
        held.argtypes = fn.argtypes
    return held


def c_function(nvml: Any, name: str, *, keep_gil: bool) -> Any | None:
    """NVML's C function ``name`` from the binding's own lookup, or None."""
    try:
        fn = nvml._nvmlGetFunctionPointer(name)
    except Exception:  # a binding without the lookup, or a library without ``name``
        return None
    return hold_gil(fn) if keep_gil and fn is not None else fn


def memory_reader(nvml: Any, *, keep_gil: bool) -> Callable[[Any], tuple[int, int]] | None:
    """(free, total) bytes of a card by one nvmlDeviceGetMemoryInfo into a per-thread struct,
    raising NVMLError; None without :func:`c_function` (the caller then uses pynvml's wrapper)."""
    fn = c_function(nvml, "nvmlDeviceGetMemoryInfo", keep_gil=keep_gil)
    if fn is None:
        return None
    success = nvml.NVML_SUCCESS
    local = threading.local()

    def read(handle: Any) -> tuple[int, int]:
        try:
            memory, ref = local.struct
        except AttributeError:
            memory = Memory()
            ref = ctypes.byref(memory)
            local.struct = memory, ref
        ret = fn(handle, ref)
        if ret != success:
            raise nvml.NVMLError(ret)
        return memory.free, memory.total

    return read
