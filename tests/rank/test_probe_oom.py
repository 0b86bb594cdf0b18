"""The OOM observer (rankscope.rank.probe.oom) and its record, on a machine without a GPU.

torch's CPU build has no CUDA caching allocator, so the allocator is a named STAND-IN here:
``StandInTorch`` plays torch.cuda's lazy init and the allocator entry points the observer
reads, and ``StandInAllocator.malloc_fails`` calls the attached observer exactly as
c10/cuda/CUDACachingAllocator.cpp does (``obs(device, alloc_size, device_total,
device_free)``) and then raises its OutOfMemoryError. NVML is the FAKE binding of
test_probe_views. The real-process tests use the real CPU torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.rank.test_probe_views import UUID, FakeNvml

from rankscope.procfs import read_start_ticks
from rankscope.rank import probe
from rankscope.rank.probe import oom
from rankscope.rank.probe.nvml_view import NvmlView
from rankscope.rank.writer import RECORDER
from rankscope.record import Oom
from rankscope.record.reader import read_flight
from rankscope.reports.oom import oom_events

MiB = 1 << 20
GiB = 1 << 30
REPO = Path(__file__).resolve().parents[2]


class StandInOutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError."""


class StandInAllocator:
    """STAND-IN for torch._C's CUDA caching-allocator entry points (no CUDA here)."""

    def __init__(self, *, history: bool = False, blocks: int = 3) -> None:
        self.observers: list[Any] = []
        self.history = history
        self.snapshots = 0
        self.stats = {
            "reserved_bytes": {"all": {"current": 6 * GiB}},
            "allocated_bytes": {"all": {"current": 5 * GiB}},
            "segment": {"all": {"current": 3}},
            "active": {"all": {"current": blocks}},
            "inactive_split": {"all": {"current": 1}},
            "num_ooms": 1,
        }

    # -- what torch._C exposes --
    def _cuda_attach_out_of_memory_observer(self, fn: Any) -> None:
        self.observers.append(fn)

    def _cuda_memoryStats(self, device: int) -> dict[str, Any]:
        return self.stats

    def _cuda_isHistoryEnabled(self) -> bool:
        return self.history

    def _cuda_isCurrentStreamCapturing(self) -> bool:
        return False

    def _cuda_memorySnapshot(self, mempool_id: Any) -> dict[str, Any]:
        self.snapshots += 1
        return {"segments": SEGMENTS, "device_traces": []}

    # -- DeviceCachingAllocator::malloc's failure path --
    def malloc_fails(self, device: int, alloc_size: int, total: int, free: int) -> None:
        for obs in list(self.observers):
            obs(device, alloc_size, total, free)
        raise StandInOutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {alloc_size // MiB} MiB. GPU {device}"
        )


SEGMENTS = [
    {  # a default large-pool segment with a free tail of 512 MiB
        "device": 0,
        "total_size": 4 * GiB,
        "allocated_size": 3584 * MiB,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "blocks": [
            {"size": 3584 * MiB, "state": "active_allocated"},
            {"size": 512 * MiB, "state": "inactive"},
        ],
    },
    {  # a CUDA graph's private pool: its free block serves only the graph
        "device": 0,
        "total_size": 2 * GiB,
        "allocated_size": 1 * GiB,
        "segment_type": "large",
        "segment_pool_id": (1, 0),
        "blocks": [
            {"size": 1 * GiB, "state": "active_allocated"},
            {"size": 1 * GiB, "state": "inactive"},
        ],
    },
    {  # another card's segment: not this OOM's
        "device": 1,
        "total_size": 8 * GiB,
        "allocated_size": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "blocks": [{"size": 8 * GiB, "state": "inactive"}],
    },
]


class StandInCuda:
    """STAND-IN for torch.cuda: is_initialized, the lazy-init queue, device properties."""

    def __init__(self) -> None:
        self.initialized = False
        self.queued: list[Any] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def _lazy_call(self, fn: Any) -> None:
        if self.initialized:
            fn()
        else:
            self.queued.append(fn)

    def lazy_init(self) -> None:  # what torch.cuda._lazy_init does with its queue
        self.initialized = True
        for fn in self.queued:
            fn()

    def current_device(self) -> int:
        return 0

    def get_device_properties(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(uuid=UUID.removeprefix("GPU-"))


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, flight_dir: Path) -> Any:
    allocator, cuda = StandInAllocator(), StandInCuda()
    torch = SimpleNamespace(_C=allocator, cuda=cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", cuda)
    monkeypatch.setattr(oom, "STATE", oom.OomState())
    monkeypatch.setattr(probe, "NVML", NvmlView(FakeNvml([(os.getpid(), 6 * GiB), (1, 70 * GiB)])))
    monkeypatch.setattr(probe.TORCH, "_devices", {})
    saved = (RECORDER.flight_dir, RECORDER.armed)
    probe.configure(flight_dir=flight_dir)
    yield SimpleNamespace(allocator=allocator, cuda=cuda, torch=torch)
    RECORDER.configure()
    RECORDER.flight_dir, RECORDER.armed = saved
    RECORDER._close_locked()


def oom_lines(flight_dir: Path) -> list[dict[str, Any]]:
    """The oom lines as written (the on-disk JSON); each parses as the typed kind with no
    field rejected."""
    flight = read_flight(flight_dir)
    assert all(isinstance(ln.body, Oom) for ln in flight.records if ln.header.kind == "oom")
    assert not flight.invalid, flight.invalid
    return [
        json.loads(raw)
        for path in sorted(flight_dir.glob("oom-*.jsonl"))
        for raw in path.read_text().splitlines()
        if raw.strip()
    ]


def test_attach_waits_for_cuda_init_then_the_failure_path_writes_one_line(
    stand_in: Any, flight_dir: Path
) -> None:
    # configure() armed the probe before CUDA existed: queued, nothing attached, no CUDA init.
    assert oom.STATE.queued and not stand_in.allocator.observers
    assert not stand_in.cuda.initialized
    assert oom.install() and len(stand_in.cuda.queued) == 1  # idempotent: queued once
    stand_in.cuda.lazy_init()
    assert stand_in.allocator.observers == [oom.observe] and oom.STATE.attached
    probe.mark("weights_loaded")

    with pytest.raises(StandInOutOfMemoryError) as caught:
        stand_in.allocator.malloc_fails(0, 20 * GiB, 80 * GiB, 3 * GiB)
    assert "Tried to allocate 20480 MiB" in str(caught.value)  # the rank's own error

    (line,) = oom_lines(flight_dir)
    assert line["requested"] == 20 * GiB and line["torch_free"] == 3 * GiB
    assert line["torch_limit"] == 80 * GiB
    assert line["phase"] == "weights_loaded"
    assert line["allocator"] == {
        "reserved": 6 * GiB,
        "allocated": 5 * GiB,
        "num_ooms": 1,
        "segments": 3,
        "why": None,
    }
    assert line["pools"] == {
        "large": {"segments": 1, "reserved": 4 * GiB, "allocated": 3584 * MiB},
        "private:1,0": {"segments": 1, "reserved": 2 * GiB, "allocated": 1 * GiB},
    }
    assert line["largest_free_block"] == 512 * MiB  # not the graph pool's, not card 1's
    assert line["device"]["uuid"] == UUID and line["device"]["nvml_index"] == 3
    assert line["driver"]["total"] == 80_000 * MiB
    assert line["nvml"]["procs"] == {str(os.getpid()): 6 * GiB, "1": 70 * GiB}
    mine = {h["pid"]: h for h in line["holders"]}
    assert mine[os.getpid()]["start_ticks"] == read_start_ticks()
    assert mine[os.getpid()]["comm"]  # read from /proc at the instant


def test_a_failing_read_is_a_null_with_a_why_and_the_line_is_still_written(
    stand_in: Any, flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in.cuda.lazy_init()

    def broken(device: int) -> dict[str, Any]:
        raise RuntimeError("allocator stats unavailable")

    monkeypatch.setattr(stand_in.allocator, "_cuda_memoryStats", broken)
    monkeypatch.setattr(probe.NVML._module, "fail_process_list", True)
    with pytest.raises(StandInOutOfMemoryError):
        stand_in.allocator.malloc_fails(0, 2 * GiB, 80 * GiB, 100 * MiB)
    (line,) = oom_lines(flight_dir)
    assert line["allocator"]["reserved"] is None and "stats unavailable" in line["allocator"]["why"]
    assert line["pools"] is None and line["pools_why"]
    assert line["nvml"]["procs"] is None and "GPU is lost" in line["nvml"]["why"]
    assert line["holders"] is None
    assert line["driver"]["free"] is not None  # what did answer is kept
    assert line["phase"] is None and line["phase_why"] == "no mark before the OOM"


def test_even_a_measure_that_raises_leaves_the_rank_error_unchanged(
    stand_in: Any, flight_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in.cuda.lazy_init()

    def explode(*args: Any) -> dict[str, Any]:
        raise ZeroDivisionError("a bug in the probe")

    monkeypatch.setattr(oom, "measure", explode)
    with pytest.raises(StandInOutOfMemoryError):
        stand_in.allocator.malloc_fails(0, 2 * GiB, 80 * GiB, 100 * MiB)
    (line,) = oom_lines(flight_dir)
    assert "a bug in the probe" in line["why"] and line["requested"] == 2 * GiB


def test_no_snapshot_when_history_is_recorded_or_the_allocator_is_large(
    stand_in: Any, flight_dir: Path
) -> None:
    stand_in.cuda.lazy_init()
    stand_in.allocator.history = True
    oom.observe(0, GiB, 80 * GiB, 0)
    stand_in.allocator.history = False
    stand_in.allocator.stats["active"]["all"]["current"] = oom.MAX_SNAPSHOT_BLOCKS + 1
    oom.observe(0, GiB, 80 * GiB, 0)
    first, second = oom_lines(flight_dir)
    assert stand_in.allocator.snapshots == 0
    assert "history" in first["pools_why"] and "too many" in second["pools_why"]
    assert first["largest_free_block"] is None and first["allocator"]["reserved"] == 6 * GiB


def test_attach_is_immediate_once_cuda_is_initialised(
    stand_in: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(oom, "STATE", oom.OomState())
    stand_in.cuda.initialized = True
    assert oom.install() and stand_in.allocator.observers == [oom.observe]
    assert oom.install() and len(stand_in.allocator.observers) == 1


def test_the_record_names_ranks_by_pid_and_start_ticks(stand_in: Any, flight_dir: Path) -> None:
    stand_in.cuda.lazy_init()
    probe.mark("kv_pool_sized")
    stand_in.allocator.observers[0](0, 20 * GiB, 80 * GiB, 3 * GiB)
    (event,) = oom_events(read_flight(flight_dir).records)
    assert [(h.pid, h.role) for h in event.holders] == [(1, "foreign"), (os.getpid(), "rank")]
    assert event.holders[0].bytes == 70 * GiB  # largest first
    assert event.phase == "kv_pool_sized" and event.free == 3 * GiB


def test_real_cpu_torch_has_no_observer_to_attach_and_says_so(flight_dir: Path) -> None:
    """A real process armed by RANKSCOPE_DIR, the probe imported before torch: the import
    watch installs as torch.cuda is imported (no mark needed), finds no CUDA allocator, and
    the host's output and exit are its own."""
    script = textwrap.dedent(
        """
        import sys
        from rankscope.rank import probe
        from rankscope.rank.probe import oom
        print("before torch", oom.STATE.why == oom.NOT_IMPORTED, "torch" in sys.modules)
        import torch  # the import watch runs install() here, with no mark
        print("after import", oom.STATE.settled, oom.STATE.why == oom.NO_CUDA_ALLOCATOR)
        from rankscope.rank.imports import FINDER
        print("watch gone", "torch.cuda" not in FINDER.watch, torch.cuda.__spec__.name)
        probe.mark("start")
        oom.observe(0, 1 << 30, 80 << 30, 5 << 20)  # what torch would pass, called directly
        sys.exit(7)
        """
    )
    env = {**os.environ, "RANKSCOPE_DIR": str(flight_dir), "PYTHONPATH": str(REPO / "exporter")}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout.splitlines() == [
        "before torch True False",
        "after import True True",
        "watch gone True torch.cuda",
    ]
    (line,) = oom_lines(flight_dir)
    assert line["requested"] == 1 << 30 and line["phase"] == "start"
    assert line["allocator"]["reserved"] is None and line["allocator"]["why"]
    json.dumps(line)  # a plain JSON document


def test_the_oom_kind_round_trips_and_rejects_bad_values_by_name() -> None:
    body = oom.bare(0, 2 * GiB, 80 * GiB, 3 * GiB)
    body.pools, _ = oom.pool_summary(SEGMENTS, 0)
    body.holders = oom.holders({os.getpid(): 6 * GiB})
    bad: list[str] = []
    assert Oom.parse(json.loads(json.dumps(body.to_json())), bad) == body and bad == []
    raw = body.to_json()
    raw["requested"] = -1
    raw["holders"] = [{"bytes": 5}, {"pid": 7, "bytes": "lots"}]
    raw["capturing"] = "yes"
    parsed = Oom.parse(raw, bad)
    assert parsed.requested is None and parsed.capturing is None
    assert parsed.holders == [oom.OomHolder(7, None, None, None)]
    assert sorted(bad) == ["oom.capturing", "oom.holders.bytes", "oom.holders.pid", "oom.requested"]
