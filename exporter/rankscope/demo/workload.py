"""One rank of the demo job: a tiny model split over real torch.distributed groups.

Launched by `rankscope demo` once per rank, the way torchrun would (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT, RANKSCOPE_DIR and RANKSCOPE_BOOT_ID in the
environment). The ranks form ``pp`` pipeline stages of ``tp`` tensor-parallel ranks each;
stage s holds ranks s*tp .. s*tp+tp-1. Every stage is one row-parallel linear layer: each TP
rank multiplies its slice of the input by its slice of the weight and an all_reduce over the
stage's TP group sums the partial products; stage s sends its activations to the rank with
the same TP index in stage s+1 (send/recv over a two-rank pipeline group).

Each rank runs under ``rankscope run`` (the demo starts it so): the generic marks (process
start, process groups, CUDA init and graph captures) and the census of every
torch.distributed collective come from there, with no code here. The workload adds what a
framework adapter would: its own boot phases (pre_weight_load, weights_loaded,
kv_pool_sized with a registered KV arena, first_forward, boot_complete), the groups' names
for the census (``tp``), a census.tick() once per serving step and the in-process
comparison. Serving runs a fixed number of steps at a fixed cadence, all ranks alike.

``--skip-rank R --skip-step K`` makes rank R really skip its TP all_reduce at step K. Its
later all_reduces then pair with its peers' previous ones (same shapes, so the job keeps
serving, one collective out of step), and at the end the peers are left waiting in the one
all_reduce R never issued; the peer connection closes when R exits, and the peers record
that and exit. That is the incident the census exists for, made small.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time
from typing import Any

log = logging.getLogger("rankscope.demo.workload")

# Bytes of one KV block and how many the arena reserves; serving backs one block per step.
KV_BLOCK_BYTES = 256 * 1024
KV_BLOCKS = 64
# Exit status of a rank whose collective failed because a peer never issued its side.
COLLECTIVE_FAILED = 3


class KVArena:
    """A KV pool in the probe's arena protocol: the whole pool is reserved at boot, blocks
    are backed as serving first writes them, and freed blocks are parked (retained)."""

    def __init__(self, blocks: int, block_bytes: int, device: Any) -> None:
        import torch

        self.block_bytes = block_bytes
        self.blocks = blocks
        # torch.empty reserves the pool without touching it; pages are committed on write.
        self.pool = torch.empty(blocks * block_bytes, dtype=torch.uint8, device=device)
        self.used = 0
        self.parked = 0

    @property
    def reserved_bytes(self) -> int:
        return self.blocks * self.block_bytes

    @property
    def backed_bytes(self) -> int:
        return (self.used + self.parked) * self.block_bytes

    @property
    def retained_bytes(self) -> int:
        return self.parked * self.block_bytes

    def fill_block(self, step: int) -> None:
        if self.used + self.parked >= self.blocks:
            # Pool full: finished sequences release blocks, which stay parked for reuse.
            self.parked = min(self.parked + 1, self.blocks // 4)
            self.used = self.blocks - self.parked
            return
        start = self.used * self.block_bytes
        self.pool[start : start + self.block_bytes].fill_(step % 251)
        self.used += 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rankscope.demo.workload", description=__doc__)
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel ranks per stage")
    p.add_argument("--steps", type=int, required=True, help="serving steps, all ranks alike")
    p.add_argument("--step-interval", type=float, default=0.05, help="seconds per step")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--skip-rank", type=int, default=-1)
    p.add_argument("--skip-step", type=int, default=-1)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="rank %(process)d: %(message)s")
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world % args.tp:
        print(f"world size {world} is not a multiple of tp {args.tp}", file=sys.stderr)
        return 2
    return serve(rank, world, args)


def serve(rank: int, world: int, args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from rankscope.rank import auto, census, probe

    tp = args.tp
    pp_rank, tp_rank = divmod(rank, tp)
    stages = world // tp
    probe.configure(tp_rank=tp_rank, pp_rank=pp_rank, runner="target")

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    # NCCL wants one GPU per rank; with fewer GPUs than ranks the collectives go over gloo
    # on CPU copies while the model and the KV pool stay on the card.
    nccl = cuda and torch.cuda.device_count() >= world
    comm_device = device if nccl else torch.device("cpu")
    dist.init_process_group("nccl" if nccl else "gloo", rank=rank, world_size=world)

    # Every rank creates every group, in the same order (torch.distributed requires it).
    # The TP groups carry a short timeout so the peers of a skipping rank are not held long.
    tp_timeout = datetime.timedelta(seconds=20)
    tp_groups = [
        dist.new_group(list(range(s * tp, s * tp + tp)), timeout=tp_timeout) for s in range(stages)
    ]
    tp_group = tp_groups[pp_rank]
    # The census counts torch.distributed under `rankscope run`; instrumenting again is a
    # no-op there, and keeps the census when the workload runs on its own.
    census.instrument_torch_distributed()
    for group in tp_groups:
        census.name_group(group, "tp")  # "tp:2-3" rather than torch's "pg2:2-3"
    # The in-process comparison (its own gloo group and thread): names a divergence and the
    # lagging rank in the record while the job still runs.
    census.enable_comparison(timeout_s=30.0)
    prev_rank = rank - tp if pp_rank > 0 else None
    next_rank = rank + tp if pp_rank < stages - 1 else None
    auto_marks = auto.is_armed()  # capture marks come from `rankscope run` when armed

    # The first mark comes before this process touches the GPU: until a process has a
    # record, the daemon can only call its memory foreign.
    probe.mark("pre_weight_load", device=str(device), backend="nccl" if nccl else "gloo")
    if cuda:
        torch.cuda.set_device(device)
    shard = args.hidden // tp
    gen = torch.Generator().manual_seed(1000 + pp_rank)
    full_weight = torch.randn(args.hidden, args.hidden, generator=gen) / args.hidden**0.5
    weight = full_weight[tp_rank * shard : (tp_rank + 1) * shard].contiguous().to(device)
    del full_weight
    probe.mark("weights_loaded", weight_bytes=weight.numel() * weight.element_size())

    arena = KVArena(KV_BLOCKS, KV_BLOCK_BYTES, device)
    probe.arenas.register("kv", arena)
    probe.mark("kv_pool_sized", kv_blocks=KV_BLOCKS, kv_block_bytes=KV_BLOCK_BYTES)

    batch = 4
    x_in = torch.zeros(batch, args.hidden, device=device)

    def local(x: Any) -> Any:
        return x[:, tp_rank * shard : (tp_rank + 1) * shard] @ weight

    if cuda:
        if not auto_marks:
            probe.mark("capture_begin")
        graph = torch.cuda.CUDAGraph()
        static_out = local(x_in)  # warm-up outside the capture, as frameworks do
        with torch.cuda.graph(graph):
            static_out = local(x_in)
        torch.cuda.synchronize()
        if not auto_marks:
            probe.mark("capture_end")

        def local_step(x: Any) -> Any:
            x_in.copy_(x)
            graph.replay()
            return static_out.clone()
    else:
        local_step = local

    def all_reduce(t: Any) -> Any:
        c = t.to(comm_device)
        dist.all_reduce(c, group=tp_group)
        return c.to(device)

    def forward(step: int, skip: bool) -> Any:
        x = torch.full((batch, args.hidden), float(step % 7), device=device)
        if prev_rank is not None:
            buf = torch.empty(batch, args.hidden, device=comm_device)
            dist.recv(buf, src=prev_rank)
            x = buf.to(device)
        y = local_step(x)
        if not skip:
            y = all_reduce(y)
        if next_rank is not None:
            dist.send(y.to(comm_device).contiguous(), dst=next_rank)
        return y

    # The first forward is a full pass through the pipeline, before any serving step.
    forward(0, skip=False)
    probe.mark("first_forward")
    probe.mark("boot_complete")

    t0 = time.monotonic()
    status = 0
    for step in range(1, args.steps + 1):
        skip = rank == args.skip_rank and step == args.skip_step
        try:
            forward(step, skip)
        except RuntimeError as exc:
            # Only a peer of a skipping rank gets here: the all_reduce its peer never issued
            # finds the peer gone. Record where this rank stood, then leave.
            probe.mark("collective_failed", step=step, error=str(exc).splitlines()[0][:200])
            census.dump_local("collective_failed")
            status = COLLECTIVE_FAILED
            break
        arena.fill_block(step)
        census.tick()
        # Fixed cadence, so every rank reaches step N at about the same wall time.
        delay = t0 + step * args.step_interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    probe.mark("serving_done", steps=step)
    sys.stdout.flush()
    sys.stderr.flush()
    # No destroy_process_group: after a skipped collective a peer may never answer, and
    # the record is already on disk (one write(2) per line).
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
