"""The census on a real GPU: a single-rank NCCL group, a CUDA graph capturing an all_reduce,
replayed K times, is counted 1 + K times (the capture itself once, then every replay).

Runs standalone: `python3 -m pytest -m gpu tests/rank/test_census_gpu.py` (one GPU, no network,
torch + rankscope only)."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from rankscope.rank import census
from rankscope.rank.census import counts, graphs
from rankscope.record import GraphCounts

K = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def nccl() -> Iterator[Any]:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{_free_port()}",
        rank=0,
        world_size=1,
        device_id=torch.device("cuda", 0),
    )
    counts.reset()
    graphs.reset()
    undo = census.instrument_torch_distributed()
    try:
        yield dist
    finally:
        undo()
        dist.destroy_process_group()
        counts.reset()
        graphs.reset()


def _capture_and_replay(dist: Any, explicit: bool) -> tuple[int, int, int, float, Any]:
    import torch

    x = torch.zeros(16, device="cuda")
    dist.all_reduce(x)  # warm-up outside the capture: NCCL sets its communicator up here
    torch.cuda.synchronize()
    before = counts.COUNTS[("world:0", "all_reduce")]
    graph = torch.cuda.CUDAGraph()
    with census.capture(graph) if explicit else _nothing(), torch.cuda.graph(graph):
        x.add_(1)
        dist.all_reduce(x)
    captured = counts.COUNTS[("world:0", "all_reduce")]
    for _ in range(K):
        if explicit:
            graph.replay()
            census.replay(graph)
        else:
            graph.replay()  # the instrumented CUDAGraph.replay counts it
    torch.cuda.synchronize()
    after = counts.COUNTS[("world:0", "all_reduce")]
    # The graph is returned: the census holds graphs weakly, so a dropped one leaves no entry.
    return before, captured, after, float(x[0].item()), graph


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.gpu
def test_graph_replays_are_counted_through_cuda_graph_hooks(nccl: Any) -> None:
    undo = census.instrument_cuda_graphs()
    try:
        before, captured, after, value, graph = _capture_and_replay(nccl, explicit=False)
    finally:
        undo()
    assert before == 1  # the warm-up
    assert captured - before == 1  # the capture issued it once
    assert after - before == 1 + K  # and each replay again
    assert value == K  # the graph really ran K times (the capture itself runs nothing)
    (entry,) = graphs.graph_counts().values()
    assert entry == GraphCounts({("world:0", "all_reduce"): 1}, K)
    del graph  # dropping the graph drops its entry: the census never keeps a graph alive
    gc.collect()
    assert graphs.graph_counts() == {}


@pytest.mark.gpu
def test_graph_replays_are_counted_through_the_explicit_api(nccl: Any) -> None:
    before, captured, after, value, _graph = _capture_and_replay(nccl, explicit=True)
    assert (captured - before, after - before, value) == (1, 1 + K, K)


@pytest.mark.gpu
def test_the_watcher_names_the_stall_with_graph_replays_counted(nccl: Any, flight_dir: Any) -> None:
    """On NCCL, with CUDA graph replays counted: the watcher's lines carry the replays, and
    when the rank stops issuing collectives its stall line names the last one it counted."""
    import time

    from tests.support.waiting import wait_for

    from rankscope.rank.census import snapshots
    from rankscope.rank.writer import RECORDER
    from rankscope.record import CensusLive, of_kind
    from rankscope.record.reader import read_flight

    RECORDER.configure(flight_dir=flight_dir, boot_id="b-gpu-watch", rank=0, world_size=1)
    undo_graphs = census.instrument_cuda_graphs()
    try:
        assert snapshots.start_watcher(stall_s=0.5)
        _capture_and_replay(nccl, explicit=False)
        time.sleep(0.1)

        def stall() -> list[CensusLive]:
            lines = of_kind(read_flight(flight_dir).records, CensusLive)
            return [ln.body for ln in lines if ln.body.blocked_in is not None]

        (line, *_) = wait_for(stall, timeout=30, what="a stall line")
        assert line.blocked_in is not None
        assert (line.blocked_in.group, line.blocked_in.op) == ("world:0", "all_reduce")
        latest: dict[Any, int] = {}
        for live in of_kind(read_flight(flight_dir).records, CensusLive):
            for key, n in live.body.changed.items():
                latest[key] = max(n, latest.get(key, 0))
        assert latest[("world:0", "all_reduce")] == counts.COUNTS[("world:0", "all_reduce")]
    finally:
        snapshots.stop_watcher()
        undo_graphs()
        RECORDER.configure(flight_dir=None)
