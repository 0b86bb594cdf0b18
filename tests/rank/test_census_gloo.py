"""The census across real processes: torch.distributed on gloo, three ranks on 127.0.0.1.

This file is also the rank program: `python3 tests/rank/test_census_gloo.py SCENARIO` with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RANKSCOPE_DIR set by the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORLD = 3
TICKS_HEALTHY = 300
EVERY = 10


# --- the rank program ---------------------------------------------------------------------------


def run_ops(dist: Any, torch: Any, rank: int) -> dict[str, Any]:
    """Every patched op once or more, with nesting (all_gather_into_tensor -> all_gather_single,
    batch_isend_irecv -> isend/irecv), a subgroup this rank may not be in, and the undo."""
    from torch.distributed import distributed_c10d as c10d

    from rankscope.rank import census
    from rankscope.record import encode_counts

    plain = {n: getattr(dist, n) for n in ("all_reduce", "isend", "batch_isend_irecv")}
    pair = dist.new_group([0, 1], backend="gloo", group_desc="tp")
    undo = census.instrument_torch_distributed()
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    out = torch.empty(4 * WORLD)
    dist.all_gather_into_tensor(out, t)
    dist.broadcast(t, src=0)
    dist.barrier()
    nxt, prv = (rank + 1) % WORLD, (rank - 1) % WORLD
    ops = [dist.P2POp(dist.isend, t.clone(), nxt), dist.P2POp(dist.irecv, torch.empty(4), prv)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
    dist.all_reduce(t, group=pair)  # rank 2 is no member: torch issues nothing, nor do we count
    counted = encode_counts(census.snapshot())
    undo()
    restored = all(getattr(dist, n) is f and getattr(c10d, n) is f for n, f in plain.items())
    dist.all_reduce(t)  # not counted any more
    after = encode_counts(census.snapshot())
    return {"counts": counted, "restored": restored, "unchanged": after == counted}


def rank_main(scenario: str) -> None:
    import torch
    import torch.distributed as dist

    from rankscope.rank import census
    from rankscope.rank.census import counts as census_counts

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    result: dict[str, Any] = {"rank": rank}
    if scenario == "ops":
        result.update(run_ops(dist, torch, rank))
        census_counts.reset()
    comparator = census.enable_comparison(timeout_s=20.0)
    world = census.group_instance("world", range(WORLD))
    t = torch.ones(1)
    pg = dist.distributed_c10d._get_default_group()
    ticks = TICKS_HEALTHY if scenario == "ops" else 100
    for tick in range(1, ticks + 1):
        # The collective really happens every tick; what the census sees is the scenario.
        skip = scenario == "skip" and ((rank == 2 and tick == 37) or (rank != 2 and tick == 73))
        if skip:
            pg.allreduce([t]).wait()  # on the wire, matched in size, but never counted
        else:
            dist.all_reduce(t)
            census.count(world, "all_reduce")
        census.tick()
    census.disable_comparison()
    assert comparator is not None
    result.update(
        compared=comparator.compared,
        failed=repr(comparator.failed),
        divergences=[[r, e] for r, e in comparator.divergences],
    )
    print(json.dumps(result), flush=True)
    if scenario == "skip":
        time.sleep(60)  # wait, like a wedged job, for the launcher's signals
    dist.destroy_process_group()


# --- the tests ----------------------------------------------------------------------------------


def start_ranks(scenario: str, flight_dir: Path) -> list[subprocess.Popen[str]]:
    from tests.support.services import free_port

    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANKSCOPE_DIR=str(flight_dir),
            RANKSCOPE_BOOT_ID=f"gloo-{scenario}",
            RANKSCOPE_CENSUS_EVERY=str(EVERY),
            GLOO_SOCKET_IFNAME="lo",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, scenario], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    return procs


def results(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line, f"rank exited with {p.wait(timeout=30)} before reporting"
        out.append(json.loads(line))
    return out


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def census_json(flight_dir: Path) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "rankscope", "census", str(flight_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.returncode, json.loads(out.stdout)


def test_patched_ops_count_once_and_a_healthy_run_never_diverges(flight_dir: Path) -> None:
    procs = start_ranks("ops", flight_dir)
    try:
        res = results(procs)
        assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    finally:
        stop(procs)
    for r in res:
        rank = r["rank"]
        expected = {
            ("world:0-2", "all_reduce"): 3,
            ("world:0-2", "all_gather_into_tensor"): 1,  # not again as all_gather_single
            ("world:0-2", "broadcast"): 1,
            ("world:0-2", "barrier"): 1,
            ("world:0-2", f"send>{(rank + 1) % WORLD}"): 1,  # the batch, op by op
            ("world:0-2", f"recv<{(rank - 1) % WORLD}"): 1,
        }
        if rank == 0:
            expected[("world:0-2", "send>1")] += 1
        if rank == 1:
            expected[("world:0-2", "recv<0")] += 1
        if rank < 2:
            expected[("tp:0-1", "all_reduce")] = 1
        assert {(g, op): n for g, op, n in r["counts"]} == expected
        assert r["restored"] and r["unchanged"]
        assert r["compared"] == TICKS_HEALTHY // EVERY and r["failed"] == "None"
        assert r["divergences"] == []
    code, doc = census_json(flight_dir)
    assert code == 0 and doc["divergent"] is False and doc["history"] == []
    assert [r["snapshots"] for r in doc["ranks"]] == [TICKS_HEALTHY // EVERY] * WORLD
    assert doc["entries"][0]["round"] == TICKS_HEALTHY
    assert doc["entries"][0]["counts"] == {str(r): TICKS_HEALTHY for r in range(WORLD)}
    assert doc["in_process"] == []


def test_a_skipped_all_reduce_is_named_and_kills_leave_records(flight_dir: Path) -> None:
    procs = start_ranks("skip", flight_dir)
    try:
        res = results(procs)
        # In-process: named at round 40, the first comparison after the skip at tick 37.
        for r in res:
            first_round, entry = r["divergences"][0]
            assert first_round == 40
            assert entry["group"] == "world:0-2" and entry["op"] == "all_reduce"
            assert entry["counts"] == {"0": 40, "1": 40, "2": 39}
            assert entry["lagging"] == [2]
            assert {rd for rd, _ in r["divergences"]} == {40, 50, 60, 70}
        procs[0].send_signal(signal.SIGKILL)
        for p in procs[1:]:
            p.send_signal(signal.SIGTERM)
        assert [p.wait(timeout=30) for p in procs] == [-9, -15, -15]
    finally:
        stop(procs)
    code, doc = census_json(flight_dir)
    # The counts agree again at the latest round, but rank 0 is dead: gone with no exit line.
    assert code == 1
    assert doc["states"]["dead"] == [0] and doc["states"]["exited"] == [1, 2]
    assert [e for e in doc["entries"] if e["divergent"]] == []
    assert doc["first_divergent_round"] == 40  # the divergence is still reported
    (span,) = doc["history"]
    assert (span["group"], span["op"], span["lagging"]) == ("world:0-2", "all_reduce", [2])
    assert span["rounds"] == [40, 70] and span["counts"] == {"0": 40, "1": 40, "2": 39}
    # The lowest member recorded each divergent round, and the round it healed.
    (line,) = doc["in_process"]
    assert line["round"] == 80 and line["lagging"] == [] and doc["in_process_lines"] == 5
    # SIGKILL: rank 0 left its last snapshot and no dump; SIGTERM: ranks 1 and 2 dumped.
    assert [r["last_round"] for r in doc["ranks"]] == [100, 100, 100]
    assert [(d["rank"], d["reason"]) for d in doc["dumps"]["ranks"]] == [
        (1, "SIGTERM"),
        (2, "SIGTERM"),
    ]


if __name__ == "__main__":
    rank_main(sys.argv[1])
