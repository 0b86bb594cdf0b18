"""The NVML view of a mark: the card's free and total memory, this process's bytes and the
card's pid -> bytes map. NVML is initialised once, at the first mark that knows its card (a
failure is remembered and said in every record); handles are cached by uuid."""

from __future__ import annotations

import ctypes
import importlib
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from rankscope.nvml_calls import c_function, memory_reader
from rankscope.procfs import HOST_PIDNS_INODE
from rankscope.rank.probe.torch_view import Device
from rankscope.record import MarkDriver, MarkNvml

ProcessList = list[tuple[int, int | None]]
# A card's process list and its (free, total) bytes, by handle.
Reads = tuple[Callable[[Any], ProcessList], Callable[[Any], tuple[int, int]]]


def own_bytes(
    procs: dict[int, int | None], pid: int, pidns: int | None
) -> tuple[int | None, str | None]:
    """This process's bytes in NVML's pid -> bytes map: (bytes, None) or (None, why). NVML
    lists host pids: outside the host PID namespace the bytes are not attributable here."""
    if pidns == HOST_PIDNS_INODE:
        used = procs.get(pid, 0)  # not listed: no context on this card
        if used is None:
            return None, "NVML does not report per-process memory on this card"
        return used, None
    if pidns is None:
        return None, "PID namespace unknown (no /proc/self/ns/pid); NVML lists host pids"
    return None, (
        f"this process runs in PID namespace {pidns}, not the host's; NVML lists host pids, "
        "so the daemon attributes this process's bytes"
    )


def _fast_process_lister(nvml: Any) -> Callable[[Any], ProcessList] | None:
    """One C call per read into a reused buffer, where pynvml's wrapper makes two and builds
    an object per process. The call releases the GIL: a call the driver stalls stops the
    thread that marks, never the host's others."""
    struct: Any = getattr(nvml, "c_nvmlProcessInfo_v3_t", None)
    name = "nvmlDeviceGetComputeRunningProcesses_v3"
    fn = c_function(nvml, name, keep_gil=False) if struct else None
    if fn is None:
        return None
    not_available = nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    success, too_small = nvml.NVML_SUCCESS, nvml.NVML_ERROR_INSUFFICIENT_SIZE
    count = ctypes.c_uint()
    count_ref = ctypes.byref(count)
    buf = (struct * 64)()
    lock = threading.Lock()  # the buffer and count are shared by every thread that marks

    def list_processes(handle: Any) -> ProcessList:
        nonlocal buf
        with lock:
            while True:
                count.value = len(buf)
                ret = fn(handle, count_ref, buf)
                if ret == success:
                    return [
                        (entry.pid, None if used == not_available else used)
                        for entry in buf[: count.value]
                        for used in (entry.usedGpuMemory,)
                    ]
                if ret != too_small:
                    raise nvml.NVMLError(ret)
                buf = (struct * (count.value * 2 + 8))()

    return list_processes


def _public_processes(nvml: Any, handle: Any) -> ProcessList:
    return [
        (int(p.pid), p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    ]


def _public_memory(nvml: Any, handle: Any) -> tuple[int, int]:
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.free), int(info.total)


class NvmlView:
    """Lazily initialised NVML with handles cached by uuid. ``module``: the NVML binding
    (pynvml by default; tests pass a fake)."""

    def __init__(self, module: Any = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._failure: str | None = None
        self._handles: dict[str, tuple[Any, int]] = {}  # uuid -> (handle, nvml index)
        self._reads: Reads | None = None  # once NVML is up; both release the GIL

    def _handle(self, uuid: str) -> tuple[Any, int]:
        with self._lock:
            if self._reads is None and self._failure is None:
                try:
                    nvml = self._module or importlib.import_module("pynvml")
                    nvml.nvmlInit()
                except Exception as exc:
                    self._failure = f"NVML unavailable: {exc}"
                else:
                    self._module = nvml
                    self._reads = (
                        _fast_process_lister(nvml) or partial(_public_processes, nvml),
                        memory_reader(nvml, keep_gil=False) or partial(_public_memory, nvml),
                    )
            if self._failure:
                raise RuntimeError(self._failure)
            handle = self._module.nvmlDeviceGetHandleByUUID(uuid)
            cached = self._handles[uuid] = (handle, int(self._module.nvmlDeviceGetIndex(handle)))
        return cached

    def read(
        self, device: Device | None, why_no_device: str | None, pid: int, pidns: int | None
    ) -> tuple[int | None, MarkDriver, MarkNvml]:
        """(nvml index, driver view, nvml view) of this process's card."""
        if device is None:
            why = why_no_device or "no CUDA device in this process"
            return None, MarkDriver(why=why), MarkNvml(why=why)
        if device.uuid is None:
            why = f"CUDA device {device.index} reports no uuid to match with NVML"
            return None, MarkDriver(why=why), MarkNvml(why=why)
        try:
            handle, nvml_index = self._handles.get(device.uuid) or self._handle(device.uuid)
        except Exception as exc:
            why = self._failure or f"NVML has no card {device.uuid}: {exc}"
            return None, MarkDriver(why=why), MarkNvml(why=why)
        assert self._reads is not None  # set with the handle
        list_processes, read_memory = self._reads
        try:
            driver = MarkDriver(*read_memory(handle), None)
        except Exception as exc:
            driver = MarkDriver(why=f"NVML memory info failed: {exc}")
        try:
            procs = dict(reversed(list_processes(handle)))  # a pid listed twice: the first
        except Exception as exc:
            return nvml_index, driver, MarkNvml(why=f"NVML process list failed: {exc}")
        self_bytes, self_why = own_bytes(procs, pid, pidns)
        return nvml_index, driver, MarkNvml(self_bytes, procs, self_why)
