"""The views a mark reads, as pure functions on fixture data, and the NVML view against the
real pynvml (no driver here) and a named fake binding standing in for the GPU this machine
lacks."""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.spinner import stamps_around

from rankscope.nvml_calls import memory_reader
from rankscope.procfs import HOST_PIDNS_INODE
from rankscope.rank import probe
from rankscope.rank.probe import arenas, oom, samples
from rankscope.rank.probe.nvml_view import NvmlView, _fast_process_lister, own_bytes
from rankscope.rank.probe.torch_view import (
    Device,
    TorchReading,
    TorchView,
    nvml_uuid,
    view_from_stats,
)
from rankscope.rank.writer import Recorder
from rankscope.record import (
    Mark,
    MarkArena,
    MarkDerived,
    MarkDevice,
    MarkDriver,
    MarkNvml,
    MarkTorch,
    of_kind,
)
from rankscope.record.reader import read_flight

MiB = 1 << 20
UUID = "GPU-6f1c0d5e-1111-2222-3333-444455556666"


# --- torch view -----------------------------------------------------------------------------

NESTED_STATS: dict[str, Any] = {
    "reserved_bytes": {"all": {"current": 512 * MiB, "peak": 600 * MiB}, "large_pool": {}},
    "allocated_bytes": {"all": {"current": 300 * MiB, "peak": 450 * MiB}},
    "num_alloc_retries": 2,
    "num_ooms": 0,
    "active": {"all": {"current": 9}},
}


def test_view_from_stats_reads_the_five_numbers_of_the_nested_dict() -> None:
    assert view_from_stats(NESTED_STATS) == MarkTorch(
        reserved=512 * MiB,
        allocated=300 * MiB,
        peak_allocated=450 * MiB,
        num_alloc_retries=2,
        num_ooms=0,
        why=None,
    )
    # A torch that stops reporting a key gives null for it, never 0.
    partial = view_from_stats({"allocated_bytes": {"all": {"current": 1}}})
    assert partial.reserved is None and partial.num_ooms is None and partial.allocated == 1


def test_nvml_uuid_adds_the_prefix_nvml_uses() -> None:
    assert nvml_uuid("6f1c0d5e-1111-2222-3333-444455556666") == UUID
    assert nvml_uuid(UUID) == UUID
    assert nvml_uuid("MIG-abc") == "MIG-abc"


def test_the_torch_view_without_cuda_says_why() -> None:
    import torch  # the CPU build

    device, view, why_no_device = TorchView().read()
    assert device is None
    assert why_no_device == view.why == "CUDA not initialised in this process"
    assert not torch.cuda.is_initialized()


@pytest.mark.parametrize("select", ["set_device", "with device"])
def test_a_read_in_the_cuda_init_of_a_device_selection_reads_the_card_being_selected(
    monkeypatch: pytest.MonkeyPatch, select: str
) -> None:
    """torch.cuda.set_device(3) and `with torch.cuda.device(3)` initialise CUDA before they
    set the device: the cuda_init mark read there is card 3's, not card 0's. Real torch's
    set_device and device (the CPU build); STAND-IN for their C halves (_cuda_setDevice,
    _cuda_exchangeDevice), which run the lazy init's queued calls (the mark), then set."""
    import torch

    view, readings = TorchView(), []

    def lazy_init_then_set(index: int) -> int:  # STAND-IN: torch's C half
        torch.cuda._tls.is_initializing = True  # what torch.cuda._lazy_init sets around them
        try:
            readings.append((*view.read(), view.marked))
        finally:
            del torch.cuda._tls.is_initializing
        return 0

    for name, value in {
        "_cuda_setDevice": lazy_init_then_set,
        "_cuda_getDevice": lambda: 0,  # the current device until the selection sets it
        "_cuda_memoryStats": lambda index: {"reserved_bytes": {"all": {"current": index}}},
    }.items():
        monkeypatch.setattr(torch._C, name, value, raising=False)
    monkeypatch.setattr(torch.cuda, "_exchange_device", lazy_init_then_set)  # bound at import
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=i))

    if select == "set_device":
        torch.cuda.set_device(torch.device("cuda", 3))
    else:
        monkeypatch.setattr(torch.cuda, "_maybe_exchange_device", lambda index: index)
        with torch.cuda.device(torch.device("cuda", 3)):
            pass
    lazy_init_then_set(5)  # an init that no set_device triggered: the current device
    (chosen, view_chosen, _, marked), (current, _, _, marked_after) = readings
    assert chosen == Device(3, "GPU-3") and view_chosen.reserved == 3 and marked == 3
    assert current == Device(0, "GPU-0") and marked_after == 0


# --- NVML view ------------------------------------------------------------------------------


def test_own_bytes_in_and_out_of_the_host_pid_namespace() -> None:
    procs = {10: 300, 11: None, 12: 50}
    assert own_bytes(procs, 10, HOST_PIDNS_INODE) == (300, None)
    assert own_bytes(procs, 99, HOST_PIDNS_INODE) == (0, None)  # no context on this card
    value, why = own_bytes(procs, 11, HOST_PIDNS_INODE)
    assert value is None and why is not None and "per-process" in why
    value, why = own_bytes(procs, 10, 4026532000)  # pid 10 in a container is not host pid 10
    assert value is None and why is not None and "PID namespace 4026532000" in why
    value, why = own_bytes(procs, 10, None)
    assert value is None and why is not None


def test_the_real_pynvml_without_a_driver_gives_nulls_and_is_not_retried() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here; this test is for machines without a driver")
    view = NvmlView()
    index, driver, nvml = view.read(Device(0, UUID), None, 1, HOST_PIDNS_INODE)
    assert index is None
    assert driver.free is None and nvml.self_bytes is None and nvml.procs is None
    assert str(nvml.why).startswith("NVML unavailable: ")
    failure = view._failure
    view.read(Device(0, UUID), None, 1, HOST_PIDNS_INODE)
    assert view._failure is failure  # remembered, not re-initialised per mark


class FakeNvml:
    """FAKE NVML binding: stands in for the GPU this machine lacks. Counts calls so the tests
    can see what the view caches."""

    class NVMLError(Exception):
        pass

    def __init__(self, procs: list[tuple[int, int | None]], free: int = 70_000 * MiB) -> None:
        self.procs = procs
        self.free = free
        self.total = 80_000 * MiB
        self.calls: dict[str, int] = {}
        self.fail_process_list = False

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self) -> None:
        self._count("init")

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self._count("handle")
        if uuid != UUID:
            raise self.NVMLError("Not Found")
        return "handle-0"

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        return 3

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(free=self.free, total=self.total, used=self.total - self.free)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[SimpleNamespace]:
        if self.fail_process_list:
            raise self.NVMLError("GPU is lost")
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.procs]


def test_nvml_view_initialises_once_and_caches_handles() -> None:
    fake = FakeNvml([(10, 900 * MiB), (77, 4400 * MiB)])
    view = NvmlView(fake)
    for _ in range(5):
        index, driver, nvml = view.read(Device(0, UUID), None, 10, HOST_PIDNS_INODE)
    assert fake.calls == {"init": 1, "handle": 1}
    assert index == 3
    assert driver == MarkDriver(free=70_000 * MiB, total=80_000 * MiB, why=None)
    assert nvml == MarkNvml(self_bytes=900 * MiB, procs={10: 900 * MiB, 77: 4400 * MiB}, why=None)


def test_a_pid_nvml_lists_twice_keeps_its_first_entry() -> None:
    _, _, nvml = NvmlView(FakeNvml([(10, 900), (10, 5)])).read(
        Device(0, UUID), None, 10, HOST_PIDNS_INODE
    )
    assert nvml == MarkNvml(self_bytes=900, procs={10: 900}, why=None)


def test_nvml_view_failures_are_fields_not_exceptions() -> None:
    fake = FakeNvml([(10, 1)])
    view = NvmlView(fake)
    _, driver, nvml = view.read(Device(1, "GPU-unknown"), None, 10, HOST_PIDNS_INODE)
    assert driver.free is None and "GPU-unknown" in str(nvml.why)
    fake.fail_process_list = True
    _, driver, nvml = view.read(Device(0, UUID), None, 10, HOST_PIDNS_INODE)
    assert driver.free == fake.free  # the memory info still came through
    assert nvml.self_bytes is None and "GPU is lost" in str(nvml.why)
    _, driver, nvml = view.read(None, "CUDA not initialised in this process", 10, HOST_PIDNS_INODE)
    assert driver.why == nvml.why == "CUDA not initialised in this process"


def test_the_one_call_process_list_grows_its_buffer_and_keeps_unknown_sizes_null() -> None:
    pynvml = pytest.importorskip("pynvml")
    not_available = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    procs: list[tuple[int, int | None]] = [(1000 + i, i * MiB) for i in range(100)]
    procs[5] = (1005, None)
    calls = []

    def fake_nvml_function(handle: str, count_ref: Any, buf: Any) -> int:
        """FAKE nvmlDeviceGetComputeRunningProcesses_v3: NVML's size protocol, in Python."""
        count = count_ref._obj
        calls.append(count.value)
        if count.value < len(procs):
            count.value = len(procs)
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, (pid, used) in enumerate(procs):
            buf[i].pid = pid
            buf[i].usedGpuMemory = not_available if used is None else used
        count.value = len(procs)
        return int(pynvml.NVML_SUCCESS)

    binding = SimpleNamespace(
        _nvmlGetFunctionPointer=lambda name: fake_nvml_function,
        c_nvmlProcessInfo_v3_t=pynvml.c_nvmlProcessInfo_v3_t,
        NVML_VALUE_NOT_AVAILABLE_ulonglong=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong,
        NVML_SUCCESS=pynvml.NVML_SUCCESS,
        NVML_ERROR_INSUFFICIENT_SIZE=pynvml.NVML_ERROR_INSUFFICIENT_SIZE,
        NVMLError=pynvml.NVMLError,
    )
    list_processes = _fast_process_lister(binding)
    assert list_processes is not None
    assert list_processes("handle") == procs
    assert calls == [64, 208]  # too small once, then grown with headroom
    assert list_processes("handle") == procs
    assert calls[2:] == [208]  # the grown buffer is kept: one call per read


def test_the_direct_memory_read_fills_one_struct_and_raises_nvmls_errors() -> None:
    pynvml = pytest.importorskip("pynvml")
    free = {"handle-0": 7 * MiB}
    structs = set()

    def fake_nvml_function(handle: str, ref: Any) -> int:
        """FAKE nvmlDeviceGetMemoryInfo: fills the struct it is handed, as the driver does."""
        memory = ref._obj
        structs.add(id(memory))
        if handle not in free:
            return int(pynvml.NVML_ERROR_GPU_IS_LOST)
        memory.total, memory.free, memory.used = 80 * MiB, free[handle], 0
        return int(pynvml.NVML_SUCCESS)

    binding = SimpleNamespace(
        _nvmlGetFunctionPointer=lambda name: (
            fake_nvml_function if name == "nvmlDeviceGetMemoryInfo" else None
        ),
        NVML_SUCCESS=pynvml.NVML_SUCCESS,
        NVMLError=pynvml.NVMLError,
    )
    read_memory = memory_reader(binding, keep_gil=False)
    assert read_memory is not None
    assert read_memory("handle-0") == (7 * MiB, 80 * MiB)
    free["handle-0"] = 3 * MiB
    assert read_memory("handle-0") == (3 * MiB, 80 * MiB)  # read again, not cached
    assert len(structs) == 1  # one struct, reused
    with pytest.raises(pynvml.NVMLError) as lost:
        read_memory("gone")
    assert lost.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
    # A binding without the function lookup (a stand-in) gets pynvml's public wrapper.
    assert memory_reader(FakeNvml([]), keep_gil=False) is None


# --- derived fields -------------------------------------------------------------------------


def test_derive_is_signed_and_null_where_unmeasured() -> None:
    torch_view = MarkTorch(reserved=1000)
    assert probe.derive(torch_view, MarkNvml(self_bytes=1500), {}) == MarkDerived(
        non_torch=500, non_torch_measured=True, unbacked_reservation=None
    )
    # The allocator counts more than the driver holds: negative, not floored.
    assert probe.derive(torch_view, MarkNvml(self_bytes=400), {}).non_torch == -600
    unmeasured = probe.derive(torch_view, MarkNvml(self_bytes=None), {})
    assert unmeasured.non_torch is None and unmeasured.non_torch_measured is False
    arena_views = {
        "kv": MarkArena(reserved=8000, backed=3000),
        "draft_kv": MarkArena(reserved=100, backed=100),
        "broken": MarkArena(reserved=None, backed=5),
    }
    assert probe.derive(torch_view, MarkNvml(), arena_views).unbacked_reservation == 5000


# --- arenas ---------------------------------------------------------------------------------


class Arena:
    def __init__(self, reserved: int, backed: int) -> None:
        self.reserved_bytes = reserved
        self._backed = backed

    def backed_bytes(self) -> int:
        return self._backed

    @property
    def retained_bytes(self) -> int:
        return 7


@pytest.fixture
def clean_registry() -> Any:
    before = dict(arenas._registry)
    arenas._registry.clear()
    yield
    arenas._registry.clear()
    arenas._registry.update(before)


@pytest.mark.usefixtures("clean_registry")
def test_the_arena_protocol_accepts_attributes_methods_and_properties() -> None:
    class Odd:
        reserved_bytes = None  # the arena cannot tell

        def backed_bytes(self) -> int:
            raise RuntimeError("unmapped")

    keep = [Arena(100, 40), Odd()]
    assert arenas.register("kv", keep[0]) and arenas.register("odd", keep[1])
    snap = arenas.snapshot()
    assert snap["kv"] == MarkArena(reserved=100, backed=40, retained=7, why=None)
    odd = snap["odd"]
    assert (odd.reserved, odd.backed, odd.retained) == (None, None, None)
    why = str(odd.why)
    assert "unknown" in why and "unmapped" in why and "no retained_bytes" in why


@pytest.mark.usefixtures("clean_registry")
def test_an_arena_collected_while_registered_is_not_kept_alive(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "RECORDER", Recorder(flight_dir=flight_dir, boot="b"))
    monkeypatch.setattr(probe, "ARMED", True)  # the mark follows the process's RECORDER
    arena = Arena(64 * MiB, 16 * MiB)
    alive = weakref.ref(arena)
    arenas.register("kv", arena)
    first = probe.mark("kv_pool_sized")
    assert first is not None and first.arenas["kv"].backed == 16 * MiB
    assert first.derived.unbacked_reservation == 48 * MiB
    del arena
    gc.collect()
    assert alive() is None  # the registry held it weakly
    assert arenas.registered() == [] and arenas._registry == {}
    second = probe.mark("boot_complete")
    assert second is not None and second.arenas == {}
    marks = of_kind(read_flight(flight_dir).records, Mark)
    assert [r.body.arenas for r in marks] == [first.arenas, {}]


@pytest.mark.usefixtures("clean_registry")
def test_an_arena_that_cannot_be_held_weakly_is_refused_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Slotted:
        __slots__ = ("reserved_bytes",)

    assert arenas.register("kv", Slotted()) is False
    assert "cannot be weakly referenced" in caplog.text
    assert arenas.snapshot() == {}


@pytest.mark.usefixtures("clean_registry")
def test_a_later_registration_of_a_name_replaces_the_earlier() -> None:
    a, b = Arena(1, 1), Arena(2, 2)
    arenas.register("kv", a)
    arenas.register("kv", b)
    del a
    gc.collect()  # the old arena's finaliser must not remove the new registration
    assert arenas.snapshot()["kv"].reserved == 2


# --- a whole mark on the fake card ----------------------------------------------------------


class FakeCudaTorchView(TorchView):
    """FAKE torch view: CUDA initialised on a card this machine does not have."""

    def __init__(self, stats: dict[str, Any]) -> None:
        super().__init__()
        self.stats = stats

    def read(self, index: int | None = None) -> TorchReading:
        return Device(0, UUID), view_from_stats(self.stats), None


def test_a_mark_on_the_fake_card_holds_every_view(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(flight_dir=flight_dir, boot="b")
    monkeypatch.setattr(probe, "RECORDER", recorder)
    monkeypatch.setattr(probe, "ARMED", True)  # the mark follows the process's RECORDER
    monkeypatch.setattr(probe, "TORCH", FakeCudaTorchView(NESTED_STATS))
    me = recorder.process.pid
    monkeypatch.setattr(probe, "NVML", NvmlView(FakeNvml([(me, 1012 * MiB), (4242, 4400 * MiB)])))
    rec = probe.mark("weights_loaded")
    assert rec is not None
    assert rec.device == MarkDevice(index=0, uuid=UUID, nvml_index=3, why=None)
    assert rec.torch.reserved == 512 * MiB
    assert rec.nvml.self_bytes == 1012 * MiB
    assert rec.nvml.procs == {me: 1012 * MiB, 4242: 4400 * MiB}
    assert rec.driver.total == 80_000 * MiB
    assert rec.derived.non_torch == 500 * MiB
    (written,) = read_flight(flight_dir).records
    assert written.body == rec  # what the reader parses is what the writer built


class SleepingNvml(FakeNvml):
    """FAKE NVML binding whose memory-info function is a real C function, libc's usleep (the
    handle is its microseconds): a stand-in for an NVML call the driver stalls."""

    NVML_SUCCESS = 0

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        return 200_000

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        return ctypes.CDLL(None).usleep if name == "nvmlDeviceGetMemoryInfo" else None


def test_a_marks_nvml_calls_let_the_hosts_other_threads_run(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mark's NVML call releases the GIL: a call the driver stalls stops the thread that
    marks, never the host's others (the daemon's sampler keeps it: tests/daemon/test_daemon_cards_nvml)."""
    monkeypatch.setattr(probe, "RECORDER", Recorder(flight_dir=flight_dir, boot="b"))
    monkeypatch.setattr(probe, "ARMED", True)
    monkeypatch.setattr(probe, "TORCH", FakeCudaTorchView(NESTED_STATS))
    monkeypatch.setattr(probe, "NVML", NvmlView(SleepingNvml([])))
    stamps, start, end, rec = stamps_around(lambda: probe.mark("weights_loaded"))
    assert rec is not None and rec.driver.why is None  # the stalled read came back
    assert end - start >= 0.2
    assert [t for t in stamps if start + 0.05 < t < end - 0.05], "the mark held the GIL"


class PerThreadCuda:
    """STAND-IN for torch with CUDA initialised on cards this machine lacks. As CUDA's, the
    current device is per thread: a thread that never set one is on device 0."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.cuda = SimpleNamespace(
            is_initialized=lambda: True,
            get_device_properties=lambda index: SimpleNamespace(uuid=f"card-{index}"),
        )
        self._C = SimpleNamespace(
            _cuda_getDevice=lambda: getattr(self.local, "device", 0),
            _cuda_memoryStats=lambda index: {"reserved_bytes": {"all": {"current": index + 1}}},
        )


def test_a_serving_sample_reads_the_card_of_the_last_mark_not_its_own_threads(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler's thread never set a CUDA device: on a rank of card 1 it reads card 1,
    the card the rank's last mark read, not card 0."""
    torch = PerThreadCuda()
    monkeypatch.setitem(sys.modules, "torch", torch)
    recorder = Recorder(flight_dir=flight_dir, boot="b")
    monkeypatch.setattr(probe, "RECORDER", recorder)
    monkeypatch.setattr(samples, "RECORDER", recorder)
    monkeypatch.setattr(probe, "ARMED", True)
    monkeypatch.setattr(oom, "STATE", oom.OomState(settled=True))  # no observer to attach
    monkeypatch.setattr(probe, "TORCH", TorchView())
    monkeypatch.setattr(probe, "NVML", NvmlView(FakeNvml([])))
    torch.local.device = 1  # the rank's torch.cuda.set_device(1)
    rec = probe.mark("weights_loaded")
    assert rec is not None and rec.device.index == 1
    taken: list[Any] = []
    sampler = threading.Thread(target=lambda: taken.append(samples.take()))
    sampler.start()
    sampler.join()
    (sample,) = taken
    assert sample.device.index == 1 and sample.device.uuid == "GPU-card-1"
    assert sample.torch.reserved == 2  # card 1's allocator, not card 0's
