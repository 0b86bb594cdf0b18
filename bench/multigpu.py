"""The multi-GPU run: census over NCCL and per-card corridors on the GPUs here.

    python3 bench/multigpu.py [--ranks N] [--out DIR]

With two or more GPUs every rank gets its own card and the world all_reduce runs on NCCL.
With one GPU, NCCL refuses two ranks on one card, so the ranks share the card: the world
collectives (and the skipped all_reduce) run on gloo with CUDA tensors, and each rank's
CUDA-graph all_reduce runs on its own single-rank NCCL group. The output says which mode
ran. What it measures:

1. each card's ledger (`rankscope phases --json`) and the daemon's per-pid attribution of
   every rank to its card (/api/v1/cards, NVML source), and each card's corridor figures;
2. a rank that skips one all_reduce and issues one extra later (sizes matched, so the ranks
   keep going): seconds from the skip to the census's in-process comparison naming group,
   op and lagging rank, against the NCCL watchdog's default 600 s;
3. a CUDA-graph-captured all_reduce replayed K times, counted 1 + K times on every rank (plus
   the one eager warm-up NCCL needs before a capture: 2 + K in all).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from rankscope.record import Census, CensusDump, Divergence, Line, of_kind
from rankscope.record.reader import read_flight

GiB = 1 << 30
ROUNDS = 400
EVERY = 10  # snapshot and compare every 10 ticks
STEP_S = 0.01
SKIP_RANK, SKIP_ROUND, EXTRA_ROUND = 1, 100, 300
REPLAYS = 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KVArena:
    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor
        self.reserved_bytes = tensor.numel() * tensor.element_size()
        self.backed_bytes = self.reserved_bytes
        self.retained_bytes = 0


def rank_main(rank: int, world: int, port: int, flight: str, boot: str, shared: bool) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANKSCOPE_DIR=flight,
        RANKSCOPE_BOOT_ID=boot,
        RANKSCOPE_CENSUS_EVERY=str(EVERY),
    )
    import torch
    import torch.distributed as dist

    from rankscope.rank import census, probe

    probe.configure(tp_rank=rank, pp_rank=0, runner="target")
    probe.mark("pre_weight_load")  # before CUDA: no context, null torch fields
    device = torch.device("cuda", 0 if shared else rank)
    torch.cuda.set_device(device)
    weights = torch.empty((rank + 1) * GiB, dtype=torch.uint8, device=device)
    torch.cuda.synchronize()
    probe.mark("weights_loaded")
    kv = KVArena(torch.empty(GiB // 2, dtype=torch.uint8, device=device))
    probe.arenas.register("kv", kv)
    probe.mark("kv_pool_sized")

    world_backend = "gloo" if shared else "nccl"
    dist.init_process_group(world_backend, rank=rank, world_size=world)
    census.instrument_torch_distributed()
    census.name_group(dist.group.WORLD, "world")
    comparator_group = dist.new_group(backend="gloo")
    census.enable_comparison(comparator_group)
    # The graph's collective: the whole world on NCCL, or this rank alone on its shared card.
    graph_groups = [dist.new_group([r], backend="nccl") for r in range(world)] if shared else None
    graph_group = graph_groups[rank] if graph_groups else dist.group.WORLD
    census.name_group(graph_group, "graph")
    probe.mark("nccl_init_end")

    x = torch.ones(1 << 20, device=device)
    dist.all_reduce(x, group=graph_group)  # NCCL warm-up outside the capture
    torch.cuda.synchronize()
    probe.mark("capture_begin")
    graph = torch.cuda.CUDAGraph()
    with census.capture(graph, "decode"), torch.cuda.graph(graph):
        dist.all_reduce(x, group=graph_group)
    for _ in range(REPLAYS):
        census.replay(graph)
        graph.replay()
    torch.cuda.synchronize()
    probe.mark("capture_end")

    t = torch.ones(1 << 16, device=device)
    skip_wall = None
    for step in range(ROUNDS):
        skip = rank == SKIP_RANK and step == SKIP_ROUND
        if skip:
            skip_wall = time.time()
        else:
            dist.all_reduce(t)
        if rank == SKIP_RANK and step == EXTRA_ROUND:
            dist.all_reduce(t)  # the extra one: peers' and this rank's calls line up again
        census.tick()
        time.sleep(STEP_S)
    probe.mark("boot_complete")
    torch.cuda.synchronize()
    census.disable_comparison()
    result = {"rank": rank, "pid": os.getpid(), "skip_wall": skip_wall}
    Path(flight, f"result-{rank}.json").write_text(json.dumps(result))
    dist.barrier(comparator_group)
    dist.destroy_process_group()
    del weights


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def main() -> int:
    import torch
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    if gpus < 1:
        print("no GPU: this run needs at least one", file=sys.stderr)
        return 2
    shared = gpus < 2
    world = args.ranks or (3 if shared else gpus)
    mode = (
        f"{world} ranks sharing 1 GPU (world on gloo, graph on 1-rank NCCL groups)"
        if shared
        else f"{world} ranks on {gpus} GPUs (world and graph on NCCL)"
    )
    print("mode:", mode, flush=True)

    work = Path(tempfile.mkdtemp(prefix="rankscope-multigpu-"))
    flight = work / "flight"
    flight.mkdir()
    boot = f"multigpu-{int(time.time())}"
    port = free_port()
    # NVML, not torch.cuda.mem_get_info: this launcher must hold no context on the cards.
    import pynvml

    pynvml.nvmlInit()
    free = [
        pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).free
        for i in range(gpus)
    ]
    floor = min(free) - (world + 1) * GiB  # the ranks' weights go below it
    with open(work / "daemon.log", "wb") as daemon_log:
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rankscope",
                "serve",
                f"--flight-dir={flight}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--device.source=nvml",
                f"--corridor.floor={floor}",
                "--sampler.interval=100ms",
            ],
            stdout=subprocess.DEVNULL,
            stderr=daemon_log,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                get_json(base + "/api/v1/cards")
                break
            except OSError:
                time.sleep(0.1)
        # The ranks exit at the end: watch the cards while they run and keep the view that
        # names the most ranks.
        best: dict[str, Any] = {"cards": []}
        done = threading.Event()

        def ranks_named(doc: dict[str, Any]) -> int:
            return sum(p["role"] == "rank" for c in doc["cards"] for p in c["processes"])

        def watch() -> None:
            while not done.wait(0.5):
                doc = get_json(base + "/api/v1/cards")
                if ranks_named(doc) >= ranks_named(best):
                    best.clear()
                    best.update(doc)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.time()
        mp.spawn(rank_main, args=(world, free_port(), str(flight), boot, shared), nprocs=world)
        wall = time.time() - started
        done.set()
        watcher.join()
        cards = best
        census_doc = get_json(base + "/api/v1/census")
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)

    phases = json.loads(
        subprocess.run(
            [sys.executable, "-m", "rankscope", "phases", str(flight), "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    results = [json.loads((flight / f"result-{r}.json").read_text()) for r in range(world)]
    skip_wall = next(r["skip_wall"] for r in results if r["skip_wall"])
    lines = read_flight(flight, all_boots=True).records
    divergences = sorted(of_kind(lines, Divergence), key=lambda d: d.header.wall)
    first = divergences[0] if divergences else None
    graph_counts = {}
    last_per_file: dict[str, Line[Census | CensusDump]] = {}
    for line in lines:
        if isinstance(line.body, (Census, CensusDump)):
            last_per_file[line.header.file] = Line(line.header, line.body)
    for last in last_per_file.values():
        for (group, op), n in (last.body.counts or {}).items():
            if group.startswith("graph") and op == "all_reduce":
                graph_counts[last.header.rank] = n

    summary = {
        "mode": mode,
        "gpus": gpus,
        "ranks": world,
        "job_wall_s": round(wall, 1),
        "floor_bytes": floor,
        "skip": {"rank": SKIP_RANK, "round": SKIP_ROUND},
        "first_divergence": first and first.body.to_json(),
        "seconds_skip_to_named": first and round(first.header.wall - skip_wall, 3),
        "divergence_records": len(divergences),
        "graph_all_reduce_counts": graph_counts,
        "graph_expected": 2 + REPLAYS,
        "cards": cards,
        "census_api": census_doc,
        "phases": phases,
    }
    corridor = [
        ln
        for ln in metrics.splitlines()
        if ln.startswith(("rankscope_gpu_free_min_bytes", "rankscope_corridor_"))
    ]
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    (out / "multigpu.json").write_text(json.dumps(summary, indent=1))
    print(
        json.dumps(
            {k: v for k, v in summary.items() if k not in ("cards", "census_api", "phases")},
            indent=1,
        )
    )
    for card in cards["cards"]:
        print(
            f"card {card['gpu']} {card['uuid']}: free_min {card['free_min']} floor "
            f"{card['floor']} margin {card['margin']} breaches {card['breaches']}"
        )
        for p in card["processes"]:
            print(
                f"   pid {p['pid']:>7} {p['comm']:<16} {p['role']:<8} rank {p['rank']} "
                f"{p['bytes'] / GiB:.2f} GiB"
            )
    print("\n".join(corridor))
    ok = (
        ranks_named(cards) == world
        and first is not None
        and first.body.lagging == (SKIP_RANK,)
        and all(n == 2 + REPLAYS for n in graph_counts.values())
        and len(graph_counts) == world
    )
    print("RESULT", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
