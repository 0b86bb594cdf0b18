"""NVML's C functions called directly, for the reads rankscope makes many times: the daemon's
free-memory sample and a mark's memory info and process list.

pynvml's wrappers look each function up under a lock and build a printable struct per call;
for a read of a few microseconds that costs about half as much again as the read. Here a
function is looked up once and fills a struct kept by its caller. The daemon's sampler also
keeps the GIL through the call (:func:`hold_gil`); the probe, in the host's process, never
does. Imports nothing beyond ctypes and threading: the probe and the daemon both use it.
"""

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
    address); anything that is not a ctypes function pointer is returned as it is.

    A call through ctypes.CDLL releases the GIL and must take it back on return; while
    another thread runs Python, that wait lasts up to the interpreter's switch interval
    (5 ms), and in the daemon it lands in the sampler's own timing (the `gil` part of
    bench/bench_sampler.py shows it with a stand-in call). An NVML read is tens of
    microseconds, so holding the GIL through it costs the daemon's other threads nothing
    they would notice (docs/corridor.md, "The sampler's own cost"). Not for a host's process:
    an NVML call the driver stalls would stop every thread of the host."""
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
    """NVML's C function ``name`` from the binding's own lookup, GIL held through each call
    where ``keep_gil`` (:func:`hold_gil`); None where the binding exposes no lookup (a
    stand-in) or the library lacks the function."""
    lookup = getattr(nvml, "_nvmlGetFunctionPointer", None)
    if lookup is None:
        return None
    try:
        fn = lookup(name)
    except Exception:
        return None
    if fn is None:
        return None
    return hold_gil(fn) if keep_gil else fn


def memory_reader(nvml: Any, *, keep_gil: bool) -> Callable[[Any], tuple[int, int]] | None:
    """(free, total) bytes of a card by one nvmlDeviceGetMemoryInfo into a struct kept per
    thread (threads that read at once never share one); NVML's error raised as the binding's
    NVMLError. None where :func:`c_function` finds no function (the caller then uses
    pynvml's wrapper)."""
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
