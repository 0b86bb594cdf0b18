"""One rank of the demo job, under `rankscope run` with torchrun's environment: pipeline
stages of ``tp`` tensor-parallel ranks, each one row-parallel linear layer (an all_reduce
over its TP group) feeding the next stage, plus what a framework adapter adds: boot phases,
a KV arena, census group names, a tick per step. ``--skip-rank R --skip-step K``: rank R
really skips its TP all_reduce at step K, and at the end its peers wait in the all_reduce R
never issued until R exits. The incident the census exists for, small.
Its census and capture marks come from `rankscope run`'s arming; run alone, it has neither.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KV_BLOCK_BYTES = 256 * 1024
KV_BLOCKS = 64
COLLECTIVE_FAILED = 3  # the exit status of a rank left waiting on a peer's collective


class KVArena:
    """A KV pool in the probe's arena protocol: reserved at boot, backed as written, parked."""

    reserved_bytes = KV_BLOCKS * KV_BLOCK_BYTES

    def __init__(self, device: Any) -> None:
        import torch

        self.pool = torch.empty(self.reserved_bytes, dtype=torch.uint8, device=device)
        self.used = self.parked = 0

    @property
    def backed_bytes(self) -> int:
        return (self.used + self.parked) * KV_BLOCK_BYTES

    @property
    def retained_bytes(self) -> int:
        return self.parked * KV_BLOCK_BYTES

    def fill_block(self, step: int) -> None:
        if self.used + self.parked >= KV_BLOCKS:
            # Pool full: finished sequences release blocks, which stay parked for reuse.
            self.parked = min(self.parked + 1, KV_BLOCKS // 4)
            self.used = KV_BLOCKS - self.parked
            return
        start = self.used * KV_BLOCK_BYTES
        self.pool[start : start + KV_BLOCK_BYTES].fill_(step % 251)
        self.used += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rankscope.demo.workload", description=__doc__)
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel ranks per stage")
    p.add_argument("--steps", type=int, required=True, help="serving steps, all ranks alike")
    p.add_argument("--step-interval", type=float, default=0.05, help="seconds per step")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--skip-rank", type=int, default=-1)
    p.add_argument("--skip-step", type=int, default=-1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="rank %(process)d: %(message)s")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world % args.tp:
        print(f"world size {world} is not a multiple of tp {args.tp}", file=sys.stderr)
        return 2
    return serve(rank, world, args)


@dataclass
class Placement:
    tp_rank: int
    pp_rank: int
    device: Any  # where the model and the KV pool live
    comm_device: Any  # where the collectives run
    tp_group: Any
    prev_rank: int | None  # the rank sending this one its activations
    next_rank: int | None


def serve(rank: int, world: int, args: argparse.Namespace) -> int:
    from rankscope import census, probe  # the public API, as a user's server imports it

    pp_rank, tp_rank = divmod(rank, args.tp)
    probe.configure(tp_rank=tp_rank, pp_rank=pp_rank, runner="target")
    placement = join(rank, world, args.tp)
    forward, arena = boot(placement, args)
    status, step = 0, 0
    t0 = time.monotonic()
    for step in range(1, args.steps + 1):
        try:
            forward(step, skip=rank == args.skip_rank and step == args.skip_step)
        except RuntimeError as exc:
            # A peer of a skipping rank: the all_reduce never issued found the peer gone.
            probe.mark("collective_failed", step=step, error=str(exc).splitlines()[0][:200])
            census.dump_local("collective_failed")
            status = COLLECTIVE_FAILED
            break
        arena.fill_block(step)
        census.tick()
        # Fixed cadence, so every rank reaches step N at about the same wall time.
        time.sleep(max(t0 + step * args.step_interval - time.monotonic(), 0.0))
    probe.mark("serving_done", steps=step)
    sys.stdout.flush()
    sys.stderr.flush()
    # No destroy_process_group: after a skip a peer may never answer. os._exit runs no atexit
    # hook, so the census's exit line is written here: without it the rank reads as dead.
    census.dump_local("exit")
    os._exit(status)


def join(rank: int, world: int, tp: int) -> Placement:
    """The process group, every stage's TP group and the in-process comparison."""
    import torch
    import torch.distributed as dist

    from rankscope import census

    pp_rank, tp_rank = divmod(rank, tp)
    stages = world // tp
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    # NCCL wants one GPU per rank; with fewer, gloo runs on CPU copies.
    nccl = cuda and torch.cuda.device_count() >= world
    dist.init_process_group("nccl" if nccl else "gloo", rank=rank, world_size=world)
    # Every rank creates every group, in order; a short timeout for a skipping rank's peers.
    tp_timeout = datetime.timedelta(seconds=20)
    tp_groups = [
        dist.new_group(list(range(s * tp, s * tp + tp)), timeout=tp_timeout) for s in range(stages)
    ]
    for group in tp_groups:
        census.name_group(group, "tp")  # "tp:2-3" rather than torch's "pg2:2-3"
    census.enable_comparison(timeout_s=30.0)
    return Placement(
        tp_rank=tp_rank,
        pp_rank=pp_rank,
        device=device,
        comm_device=device if nccl else torch.device("cpu"),
        tp_group=tp_groups[pp_rank],
        prev_rank=rank - tp if pp_rank > 0 else None,
        next_rank=rank + tp if pp_rank < stages - 1 else None,
    )


def boot(at: Placement, args: argparse.Namespace) -> tuple[Callable[..., Any], KVArena]:
    """The boot phases (weights, KV pool, CUDA graph, first forward); the forward and pool."""
    import torch
    import torch.distributed as dist

    from rankscope import probe

    device, cuda = at.device, at.device.type == "cuda"
    # Marked before touching the GPU: until then the daemon can only call its memory foreign.
    backend = "gloo" if at.comm_device.type == "cpu" else "nccl"
    probe.mark("pre_weight_load", device=str(device), backend=backend)
    if cuda:
        torch.cuda.set_device(device)
    shard = args.hidden // args.tp
    gen = torch.Generator().manual_seed(1000 + at.pp_rank)
    full_weight = torch.randn(args.hidden, args.hidden, generator=gen) / args.hidden**0.5
    weight = full_weight[at.tp_rank * shard : (at.tp_rank + 1) * shard].contiguous().to(device)
    probe.mark("weights_loaded", weight_bytes=weight.numel() * weight.element_size())

    arena = KVArena(device)
    probe.arenas.register("kv", arena)
    probe.mark("kv_pool_sized", kv_blocks=KV_BLOCKS, kv_block_bytes=KV_BLOCK_BYTES)

    batch = 4
    x_in = torch.zeros(batch, args.hidden, device=device)

    def local(x: Any) -> Any:
        return x[:, at.tp_rank * shard : (at.tp_rank + 1) * shard] @ weight

    local_step = local
    if cuda:  # the capture's marks come from `rankscope run`'s arming
        graph = torch.cuda.CUDAGraph()
        static_out = local(x_in)  # warm-up outside the capture, as frameworks do
        with torch.cuda.graph(graph):
            static_out = local(x_in)
        torch.cuda.synchronize()

        def local_step(x: Any) -> Any:
            x_in.copy_(x)
            graph.replay()
            return static_out.clone()

    def forward(step: int, skip: bool) -> Any:
        x = torch.full((batch, args.hidden), float(step % 7), device=device)
        if at.prev_rank is not None:
            buf = torch.empty(batch, args.hidden, device=at.comm_device)
            dist.recv(buf, src=at.prev_rank)
            x = buf.to(device)
        y = local_step(x)
        if not skip:
            c = y.to(at.comm_device)
            dist.all_reduce(c, group=at.tp_group)
            y = c.to(device)
        if at.next_rank is not None:
            dist.send(y.to(at.comm_device).contiguous(), dst=at.next_rank)
        return y

    # The first forward is a full pass through the pipeline, before any serving step.
    forward(0, skip=False)
    probe.mark("first_forward")
    probe.mark("boot_complete")
    return forward, arena


if __name__ == "__main__":
    sys.exit(main())
