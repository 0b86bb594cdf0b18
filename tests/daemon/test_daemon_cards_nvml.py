"""NvmlSource and the sampler's failure handling against FakeNvml, a stand-in for
libnvidia-ml: this machine has no GPU, and a GPU falling off the bus cannot be staged on a
real one either. FakeNvml keeps pynvml's own error types and constants (the real module),
and replaces only the calls into the library. The gpu tests in test_daemon_cards.py cover
the real library."""

from __future__ import annotations

import ctypes
import itertools
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from tests.spinner import stamps_around

from rankscope.daemon.devices import DeviceError, NvmlSource, free_reader
from rankscope.daemon.sampler import REOPEN_AFTER_FAILURES, Sampler
from rankscope.nvml_calls import hold_gil

GiB = 1 << 30


@dataclass
class FakeCard:
    uuid: str
    free: int
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] | None = field(default_factory=list)  # None: unsupported
    lost: bool = False


class FakeNvml:
    """FAKE NVML (no GPU here): the pynvml calls NvmlSource makes, counted."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED

    def __init__(self, cards: list[FakeCard]) -> None:
        self.cards = cards
        self.calls: Counter[str] = Counter()
        self.driver_loaded = True
        self.initialised = 0

    def _count(self, name: str) -> None:
        self.calls[name] += 1

    def nvmlInit(self) -> None:
        self._count("init")
        if not self.driver_loaded:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._count("shutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeCard:
        self._count("handle")
        return self.cards[index]

    def nvmlDeviceGetUUID(self, card: FakeCard) -> str:
        return card.uuid

    def nvmlDeviceGetName(self, card: FakeCard) -> bytes:
        return b"FAKE H200"

    def _check(self, card: FakeCard) -> None:
        if self.initialised <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if card.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetMemoryInfo(self, card: FakeCard) -> Any:
        self._count("meminfo")
        self._check(card)
        return SimpleNamespace(total=141 * GiB, free=card.free, used=141 * GiB - card.free)

    def nvmlDeviceGetComputeRunningProcesses(self, card: FakeCard) -> list[Any]:
        self._check(card)
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in card.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, card: FakeCard) -> list[Any]:
        self._check(card)
        if card.graphics is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in card.graphics]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml([FakeCard("GPU-fake-0", 100 * GiB), FakeCard("GPU-fake-1", 90 * GiB)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def test_handles_are_resolved_once_and_a_sample_is_one_read_per_card(fake: FakeNvml) -> None:
    s = Sampler(NvmlSource(), interval=0.1)
    for i in range(50):
        s.sample(i * 0.1)
    assert fake.calls["init"] == 1 and fake.calls["shutdown"] == 0
    assert fake.calls["handle"] == 2
    assert fake.calls["meminfo"] == 2 + 50 * 2  # totals at open, then one per card per sample
    views = s.views(5.0)
    assert [(v.identity.index, v.identity.model, v.identity.total) for v in views] == [
        (0, "FAKE H200", 141 * GiB),
        (1, "FAKE H200", 141 * GiB),
    ]
    assert [v.free for v in views] == [100 * GiB, 90 * GiB]
    s.stop()
    assert fake.calls["shutdown"] == 1


def test_a_lost_gpu_is_down_the_other_card_goes_on_and_both_recover(fake: FakeNvml) -> None:
    s = Sampler(NvmlSource(), interval=0.1)
    s.sample(0.0)
    fake.cards[1].lost = True
    fake.cards[0].free = 80 * GiB
    t = 0.0
    while t < 20:  # long enough for repeated failures, reopens and backoff
        t += 0.1
        s.sample(t)
        v0, v1 = s.views(t)
        assert v0.up and v0.free == 80 * GiB  # never taken down with the lost card
        assert not v1.up and v1.free is None
        assert not s.up()
    assert fake.calls["init"] > 1 and fake.calls["shutdown"] == fake.calls["init"] - 1  # reopened
    assert s.source_errors >= 1  # an open that could not enumerate card 1
    assert "card 1: GPU is lost" in (s.source_failing or "")
    errors = s.views(t)[1].errors
    assert errors >= REOPEN_AFTER_FAILURES
    assert errors < 20, "backoff: a lost card is not hammered every sample"
    fake.cards[1].lost = False  # the driver answers again
    t += 60
    s.sample(t)
    v0, v1 = s.views(t)
    assert v1.up and v1.free == 90 * GiB and v1.errors == errors  # the count is kept
    assert s.up() and s.source_failing is None


def test_a_card_lost_before_the_first_open_is_left_out_and_the_source_down(
    fake: FakeNvml,
) -> None:
    fake.cards[0].lost = True
    s = Sampler(NvmlSource(), interval=0.1)
    s.sample(0.0)
    assert [v.identity.uuid for v in s.views(0.0)] == ["GPU-fake-1"]
    assert not s.up() and s.source_errors == 1
    fake.cards[0].lost = False
    s.sample(5.0)
    assert [v.free for v in s.views(5.0)] == [100 * GiB, 90 * GiB] and s.up()


def test_the_driver_gone_takes_the_source_down_until_it_returns(fake: FakeNvml) -> None:
    fake.driver_loaded = False
    s = Sampler(NvmlSource(), interval=0.1)
    s.sample(0.0)
    assert not s.up() and s.source_errors == 1
    assert "Driver Not Loaded" in (s.source_failing or "")
    fake.driver_loaded = True
    s.sample(5.0)
    assert s.up() and [v.free for v in s.views(5.0)] == [100 * GiB, 90 * GiB]


def test_processes_compute_and_graphics_counted_once(fake: FakeNvml) -> None:
    fake.cards[0].compute = [(10, 3 * GiB), (11, None)]
    fake.cards[0].graphics = [(10, 3 * GiB), (12, GiB)]
    fake.cards[1].graphics = None  # a compute-only card
    fake.cards[1].compute = [(20, 5)]
    src = NvmlSource()
    src.open()
    assert src.read_processes(0) == {10: 3 * GiB, 11: None, 12: GiB}
    assert src.read_processes(1) == {20: 5}
    fake.cards[1].lost = True
    with pytest.raises(DeviceError, match="GPU is lost"):
        src.read_processes(1)
    with pytest.raises(DeviceError, match=r"slot 1.*GPU is lost"):
        src.read_free(1)
    src.close()


class FakeMemoryInfoFunction:
    """Stands in for the C function nvmlDeviceGetMemoryInfo (no NVML here): fills the
    struct it is handed, as the driver does, or returns an error code."""

    def __init__(self) -> None:
        self.free = {"h0": 7 * 2**30, "h1": 3 * 2**30}
        self.structs: set[int] = set()

    def __call__(self, handle: str, ref: Any) -> int:
        memory = ref._obj  # the struct behind ctypes.byref
        self.structs.add(id(memory))
        if handle not in self.free:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        memory.total, memory.free, memory.used = 8 * 2**30, self.free[handle], 0
        return pynvml.NVML_SUCCESS


def test_the_direct_memory_read_returns_free_bytes_and_raises_nvmls_errors() -> None:
    fn = FakeMemoryInfoFunction()
    nvml = SimpleNamespace(
        _nvmlGetFunctionPointer=lambda name: fn if name == "nvmlDeviceGetMemoryInfo" else None,
        NVML_SUCCESS=pynvml.NVML_SUCCESS,
        NVMLError=pynvml.NVMLError,
    )
    read = free_reader(nvml)
    assert (read("h0"), read("h1")) == (7 * 2**30, 3 * 2**30)
    fn.free["h0"] = 2**30
    assert read("h0") == 2**30  # read again, not cached
    with pytest.raises(pynvml.NVMLError) as lost:
        read("gone")
    assert lost.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
    # The sampler and the holdings read from their own threads: each gets its own struct.
    thread = threading.Thread(target=read, args=("h1",))
    thread.start()
    thread.join()
    assert len(fn.structs) == 2


def test_without_the_function_lookup_the_read_goes_through_pynvmls_wrapper() -> None:
    nvml = SimpleNamespace(nvmlDeviceGetMemoryInfo=lambda handle: SimpleNamespace(free=5))
    assert free_reader(nvml)("h0") == 5


def test_hold_gil_calls_the_same_c_function_without_releasing_the_gil() -> None:
    """A real C function (libc usleep, a stand-in for NVML's) made through hold_gil keeps
    every other Python thread out for its whole length; through ctypes.CDLL it does not."""
    usleep = ctypes.CDLL(None).usleep
    held = hold_gil(usleep)
    assert held is not usleep

    # Held: the spinner stops for the whole call. (Its longest pause, not "no stamp after
    # the start": on a loaded machine the GIL can pass to the spinner between taking the
    # start time and making the call.)
    stamps, start, end, returned = stamps_around(lambda: held(100_000))
    assert returned == 0
    pauses = [b - a for a, b in itertools.pairwise(stamps) if b > start and a < end]
    assert max(pauses, default=end - start) >= 0.09, "another thread ran inside the held call"
    # Released: the spinner runs while the call sleeps.
    stamps, start, end, returned = stamps_around(lambda: usleep(100_000))
    assert returned == 0
    assert [t for t in stamps if start + 0.01 < t < end - 0.01], "the released call held the GIL"
    # Stand-ins that are no C function pointer pass through unchanged.
    fake = FakeMemoryInfoFunction()
    assert hold_gil(fake) is fake
