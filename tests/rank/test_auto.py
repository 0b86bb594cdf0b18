"""The pure parts of zero-touch arming: the graph pool's bytes from an allocator snapshot,
the switches read from the environment, and the environment `rankscope run` hands on.
The processes themselves are tested in tests/rank/test_run.py."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rankscope.rank import auto, run
from rankscope.rank.census import snapshots
from rankscope.rank.probe import samples
from rankscope.record import PoolFields

# The shape of torch.cuda.memory._snapshot()["segments"] (trimmed): two graph pools and the
# default pool (0, 0).
SEGMENTS = [
    {"total_size": 2 << 20, "segment_pool_id": (0, 0)},
    {"total_size": 20 << 20, "segment_pool_id": (1, 3)},
    {"total_size": 2 << 20, "segment_pool_id": (1, 3)},
    {"total_size": 8 << 20, "segment_pool_id": (1, 5)},
    {"total_size": 1 << 20},  # an older torch without pool ids: in no graph pool
]


def test_pool_bytes_sums_the_segments_of_one_pool() -> None:
    assert auto.pool_bytes(SEGMENTS, (1, 3)) == 22 << 20
    assert auto.pool_bytes(SEGMENTS, [1, 5]) == 8 << 20
    assert auto.pool_bytes(SEGMENTS, (9, 9)) == 0
    assert auto.pool_bytes([], (1, 3)) == 0


@pytest.fixture(autouse=True)
def pool_form_untried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test learns the pool snapshot's form afresh: rankscope.rank.auto keeps it per process."""
    monkeypatch.setattr(auto, "_pool_form", auto._UNTRIED)


class StandInAllocator:
    """STAND-IN for torch._C's snapshot call (no GPU here): ``takes`` is the argument shape
    this 'torch' accepts for one pool (3: (a, b, include_traces), 2: (a, b), 0: none, like a
    torch before pool snapshots); every call is counted by shape."""

    def __init__(self, takes: int, filters: bool = True) -> None:
        self.takes, self.filters = takes, filters
        self.listed: list[dict[str, Any]] | None = None  # set: what one pool's snapshot lists
        self.calls: list[int | None] = []

    def _cuda_memorySnapshot(self, arg: Any) -> dict[str, Any]:
        self.calls.append(None if arg is None else len(arg))
        if arg is None:
            return {"segments": SEGMENTS}
        if len(arg) != self.takes:
            raise TypeError(f"incompatible function arguments: {arg!r}")
        if self.listed is not None:
            return {"segments": self.listed}
        pool = tuple(arg[:2])
        keep = [s for s in SEGMENTS if s.get("segment_pool_id") == pool] if self.filters else []
        return {"segments": keep}


def stand_in_torch(allocator: StandInAllocator) -> Any:
    memory = SimpleNamespace(_snapshot=lambda: allocator._cuda_memorySnapshot(None))
    return SimpleNamespace(_C=allocator, cuda=SimpleNamespace(memory=memory))


class Graph:
    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def pool(self) -> Any:
        return self._pool


@pytest.mark.parametrize("takes", [3, 2])
def test_capture_end_reads_one_pools_snapshot_in_the_form_this_torch_takes(takes: int) -> None:
    allocator = StandInAllocator(takes)
    torch = stand_in_torch(allocator)
    first = auto.pool_fields(torch, Graph((1, 3)))
    assert first == PoolFields((1, 3), 22 << 20, None)
    del allocator.calls[:]
    assert auto.pool_fields(torch, Graph((1, 5))).pool_bytes == 8 << 20
    assert allocator.calls == [takes]  # the form found once, then used alone; no whole snapshot


def test_a_pool_snapshot_listing_other_pools_segments_sums_only_the_graphs_pool() -> None:
    allocator = StandInAllocator(takes=3)
    allocator.listed = SEGMENTS  # a torch that takes a pool and lists every segment anyway
    torch = stand_in_torch(allocator)
    assert auto.pool_fields(torch, Graph((1, 3))) == PoolFields((1, 3), 22 << 20, None)
    # the form found, each later capture's snapshot is checked before its sizes are summed
    assert auto.pool_fields(torch, Graph((1, 3))) == PoolFields((1, 3), 22 << 20, None)
    assert auto.pool_fields(torch, Graph((1, 5))) == PoolFields((1, 5), 8 << 20, None)


def test_a_pool_snapshot_of_segments_without_pool_ids_is_summed_by_the_general_path() -> None:
    allocator = StandInAllocator(takes=3)
    torch = stand_in_torch(allocator)
    assert auto.pool_fields(torch, Graph((1, 3))).pool_bytes == 22 << 20
    allocator.listed = [SEGMENTS[-1], SEGMENTS[3]]  # a segment of no pool id first
    assert auto.pool_fields(torch, Graph((1, 5))) == PoolFields((1, 5), 8 << 20, None)


def test_a_pool_snapshot_that_fails_after_its_form_was_found_falls_back_to_the_whole() -> None:
    allocator = StandInAllocator(takes=3)
    torch = stand_in_torch(allocator)
    assert auto.pool_fields(torch, Graph((1, 3))).pool_why is None
    allocator.takes = 2  # the form found at the first capture now raises
    del allocator.calls[:]
    fields = auto.pool_fields(torch, Graph((1, 3)))
    assert fields.pool_bytes == 22 << 20
    assert "snapshot of pool (1, 3) failed (TypeError(" in str(fields.pool_why)
    # the found form once (it says why), then the whole snapshot
    assert allocator.calls == [3, None]
    assert auto._pool_form == (False,)  # kept: the next capture tries it alone again


def test_a_snapshot_failing_in_any_way_after_the_form_was_found_keeps_the_mark() -> None:
    allocator = StandInAllocator(takes=3)
    torch = stand_in_torch(allocator)
    assert auto.pool_fields(torch, Graph((1, 3))).pool_why is None

    def failing(arg: Any) -> dict[str, Any]:
        raise ValueError("a binding's own error")

    allocator._cuda_memorySnapshot = failing  # type: ignore[method-assign]
    fields = auto.pool_fields(torch, Graph((1, 3)))
    assert fields.pool == (1, 3) and fields.pool_bytes is None
    assert str(fields.pool_why).startswith("no snapshot: ValueError(")


def test_a_form_learnt_meanwhile_is_used_by_the_general_path() -> None:
    """A capture that found the form untried, while another thread's capture learnt it,
    reads one pool's snapshot: not the whole, and no claim that this torch takes none."""
    allocator = StandInAllocator(takes=3)
    torch = stand_in_torch(allocator)
    auto._pool_form = (False,)
    assert auto.pool_segments(torch, (1, 3)) == ([s for s in SEGMENTS[1:3]], None)
    assert allocator.calls == [3]


def test_a_pool_id_of_numbers_in_another_type_is_converted() -> None:
    torch = stand_in_torch(StandInAllocator(takes=3))
    assert auto.pool_fields(torch, Graph((1, 3))).pool_bytes == 22 << 20
    for odd in [["1", "3"], ("1", "3"), [1, 3]]:
        assert auto.pool_fields(torch, Graph(odd)) == PoolFields((1, 3), 22 << 20, None), odd
    fields = auto.pool_fields(torch, Graph(("a", "b")))
    assert fields.pool is None and "pool unreadable: ValueError(" in str(fields.pool_why)


def test_a_pool_id_of_other_than_two_numbers_leaves_the_form_to_learn() -> None:
    allocator = StandInAllocator(takes=3)
    torch = stand_in_torch(allocator)
    assert auto.pool_segments(torch, (1, 3, 0))[1] == (
        f"pool id (1, 3, 0) is not two numbers: {auto.WHOLE}"
    )
    assert auto._pool_form is auto._UNTRIED  # not taken as "this torch takes no pool"
    assert auto.pool_fields(torch, Graph((1, 3))).pool_why is None  # learnt at the next


def test_a_torch_without_pool_snapshots_sums_the_whole_snapshot_and_says_so() -> None:
    allocator = StandInAllocator(takes=0)
    torch = stand_in_torch(allocator)
    fields = auto.pool_fields(torch, Graph((1, 3)))
    assert fields.pool_bytes == 22 << 20
    assert "takes no snapshot of one pool" in str(fields.pool_why)
    del allocator.calls[:]
    auto.pool_fields(torch, Graph((1, 3)))
    assert allocator.calls == [None]  # not retried at every capture


def test_an_empty_pool_names_the_pools_that_hold_segments() -> None:
    torch = stand_in_torch(StandInAllocator(takes=3))
    fields = auto.pool_fields(torch, Graph((9, 9)))
    assert fields.pool_bytes == 0
    assert "no allocator segment in pool (9, 9)" in str(fields.pool_why)
    assert "(1, 3)" in str(fields.pool_why) and "(1, 5)" in str(fields.pool_why)


def test_a_pool_snapshot_that_lists_nothing_is_checked_against_the_whole() -> None:
    torch = stand_in_torch(StandInAllocator(takes=3, filters=False))
    fields = auto.pool_fields(torch, Graph((1, 3)))
    assert fields.pool_bytes == 22 << 20
    assert "listed none of its segments" in str(fields.pool_why)


@pytest.mark.parametrize(
    ("value", "armed"),
    [("1", True), ("yes", True), ("", False), ("0", False), ("off", False), ("FALSE", False)],
)
def test_rankscope_auto_switch(value: str, armed: bool) -> None:
    assert auto.enabled({"RANKSCOPE_AUTO": value}) is armed


def test_sample_interval_from_the_environment() -> None:
    assert samples.every_from_env({}) == samples.DEFAULT_EVERY_S
    assert samples.every_from_env({"RANKSCOPE_SAMPLE_EVERY": "0.5"}) == 0.5
    assert samples.every_from_env({"RANKSCOPE_SAMPLE_EVERY": "0"}) == 0
    for short in ("1e-9", "0.01"):  # raised to the shortest interval, never thousands a second
        assert samples.every_from_env({"RANKSCOPE_SAMPLE_EVERY": short}) == samples.MIN_EVERY_S
    for bad in ("-1", "nan", "inf", "soon"):
        value = samples.every_from_env({"RANKSCOPE_SAMPLE_EVERY": bad})
        assert value == samples.DEFAULT_EVERY_S and math.isfinite(value)


def test_run_environment_one_boot_and_the_switches(tmp_path) -> None:
    env = run.child_environment({"PATH": "/bin"}, str(tmp_path), None, census=True, compare=False)
    assert env["RANKSCOPE_AUTO"] == "1"
    assert env["RANKSCOPE_DIR"] == str(tmp_path.resolve())
    assert env["RANKSCOPE_BOOT_ID"]  # derived from this process: one per run
    assert "RANKSCOPE_CENSUS" not in env and "RANKSCOPE_COMPARE" not in env
    given = run.child_environment(
        {"RANKSCOPE_BOOT_ID": "inherited"}, "d", "mine", census=False, compare=True
    )
    assert given["RANKSCOPE_BOOT_ID"] == "mine"
    assert (given["RANKSCOPE_CENSUS"], given["RANKSCOPE_COMPARE"]) == ("0", "1")
    inherited = run.child_environment(
        {"RANKSCOPE_BOOT_ID": "inherited"}, "d", None, census=True, compare=False
    )
    assert inherited["RANKSCOPE_BOOT_ID"] == "inherited"


def test_an_explicit_tick_stops_the_automatic_cadence() -> None:
    state = snapshots.STATE
    saved = (state.round, state.every, state.auto_every, state.explicit)
    try:
        snapshots.reset()
        snapshots.configure(auto_every=7)
        assert state.every == 7
        for _ in range(3):
            snapshots.auto_tick()
        assert state.round == 3
        snapshots.tick()  # a framework's tick: it drives the rounds from now on
        assert state.round == 4 and state.every == snapshots.every_from_env()
        snapshots.auto_tick()
        assert state.round == 4
    finally:
        state.round, state.every, state.auto_every, state.explicit = saved


def test_optional_parts_cost_a_line_never_the_arming(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="rankscope.auto"):
        auto._optional("rankscope.no_such_part", "install")  # absent: a debug line
        auto._optional("json", "no_such_function")  # broken: one warning
    levels = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert levels == [
        ("DEBUG", "rankscope"),
        ("WARNING", "rankscope"),
    ], caplog.records
    assert "json.no_such_function() failed" in caplog.records[1].getMessage()


TIMES = re.compile(rb',"mono":[^,]+,"wall":[^,]+')


def test_the_hooks_write_the_line_the_keyword_mark_writes(flight_dir: Path) -> None:
    """nccl_init_end, capture_end and process_start hand their fields to the mark as typed
    fields (probe.mark_fields, rankscope.record.MarkFields): each line is the one
    probe.mark(phase, **fields) writes, byte for byte but for its times, fields in the same
    order. Over a real one-rank gloo group."""
    import torch.distributed as dist

    from rankscope.rank import probe
    from rankscope.rank.writer import RECORDER

    torch = stand_in_torch(StandInAllocator(takes=3))
    saved = RECORDER.armed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        probe.configure(flight_dir=flight_dir)
        auto._group_end(dist, ((), {}), dist.GroupMember.WORLD, 0.25)
        probe.mark("nccl_init_end", seconds=0.25, group="world:0", ranks=[0], backend="gloo")
        auto._group_end(dist, (((3, 1),), {}), object(), 1e-06)  # no member: a placeholder
        probe.mark(
            "nccl_init_end", seconds=1e-06, group=None, ranks=[1, 3], backend=None, member=False
        )
        auto._mark_capture_end(torch, Graph((1, 3)))
        probe.mark("capture_end", pool=[1, 3], pool_bytes=22 << 20, pool_why=None)
        auto._mark_process_start()
        probe.mark("process_start", python=sys.version.split()[0])
        auto._forked()
        probe.mark("process_start", forked=True)
    finally:
        dist.destroy_process_group()
        RECORDER.configure()
        RECORDER.armed = saved
        RECORDER._close_locked()
    (path,) = flight_dir.iterdir()
    lines = [TIMES.sub(b"", line) for line in path.read_bytes().splitlines()]
    assert len(lines) == 10
    for hook, keywords in zip(lines[::2], lines[1::2], strict=True):
        assert hook == keywords


def test_the_auto_module_alone_loads_no_schema() -> None:
    """RANKSCOPE_AUTO=0 still imports rankscope.rank.auto (the .pth line) and stops there: the
    generic marks' typed fields load with the probe, not with this module (the schema brings
    json and dataclasses, a start-up cost in every process of the job)."""
    code = "import sys, rankscope.rank.auto; print(*sorted(m for m in sys.modules if 'rankscope' in m))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(Path(auto.__file__).parents[2])},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["rankscope", "rankscope.rank", "rankscope.rank.auto"], (
        done.stdout
    )


class StandInGraph:
    """STAND-IN for torch.cuda.CUDAGraph (no GPU here): the three methods rankscope wraps."""

    def capture_begin(self) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        pass

    def pool(self) -> tuple[int, int]:
        return (1, 3)


def test_one_graph_instrumentation_marks_captures_and_counts_replays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Armed, CUDAGraph is wrapped once: the capture marks around the capture, and the census
    counts a captured collective again at each replay."""
    import torch

    from rankscope.rank.census import counts, graphs

    phases: list[str] = []
    monkeypatch.setattr(torch.cuda, "CUDAGraph", StandInGraph)
    monkeypatch.setattr(auto, "_mark", lambda phase, fields=None: phases.append(phase))
    counts.reset()
    graphs.reset()
    try:
        auto._hook_graphs(torch)
        auto._hook_graphs(torch)  # idempotent: wrapped once
        graph = StandInGraph()
        graph.capture_begin()
        counts.count("world:0", "all_reduce")
        graph.capture_end()
        graph.replay()
        graph.replay()
        assert phases == ["capture_begin", "capture_end"]
        assert counts.snapshot() == {("world:0", "all_reduce"): 3}
    finally:
        counts.reset()
        graphs.reset()


def test_without_the_census_graphs_keep_their_capture_marks_and_an_unwrapped_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from rankscope.rank.census import counts

    class Graph(StandInGraph):  # a class of its own: the instrumentation stays on it
        pass

    replay = Graph.replay

    phases: list[str] = []
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(counts, "ARMED", False)
    monkeypatch.setattr(auto, "_mark", lambda phase, fields=None: phases.append(phase))
    auto._hook_graphs(torch)
    Graph().capture_begin()
    Graph().capture_end()
    assert phases == ["capture_begin", "capture_end"]
    assert Graph.replay is replay


def test_the_comparison_destroys_its_group_once_at_exit(tmp_path: Path) -> None:
    """Armed with RANKSCOPE_COMPARE, a program that destroys no group: at exit the comparator
    destroys its own gloo group through the armed destroy hook, which must not take it for the
    live comparison's and destroy it first (the comparator's own call then fails)."""
    program = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from rankscope.rank import auto\n"
        "assert auto.arm()\n"
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0,"
        " world_size=1)\n"
        "from rankscope.rank.census import gloo\n"
        "assert gloo._active is not None and gloo._active.own_group\n"
        "dist.all_reduce(torch.ones(2))\n"
    )
    env = dict(
        os.environ,
        RANKSCOPE_AUTO="1",
        RANKSCOPE_DIR=str(tmp_path / "flight"),
        RANKSCOPE_COMPARE="1",
    )
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "comparison group was not destroyed" not in done.stderr, done.stderr[-2000:]
