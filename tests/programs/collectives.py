"""A plain torch.distributed program, in the style of PyTorch's "Writing Distributed
Applications" tutorial: every step each rank all-reduces a gradient, all-gathers a metric
and takes rank 0's parameters by broadcast. It imports nothing from rankscope.

    torchrun --nproc-per-node 4 collectives.py [--steps N] [--skip-rank R --skip-step K]
    python collectives.py --spawn 2          # multiprocessing spawn, no launcher

``--skip-rank R --skip-step K`` is the bug: rank R forgets its all_reduce at step K.
"""

import argparse
import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, size, args):
    grad = torch.zeros(8)
    param = torch.zeros(8)
    for step in range(args.steps):
        grad.fill_(rank + step)
        if not (rank == args.skip_rank and step == args.skip_step):
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        metric = torch.tensor([float(step * size + rank)])
        gathered = [torch.zeros(1) for _ in range(size)]
        dist.all_gather(gathered, metric)
        if rank == 0:
            param.add_(grad / size)
        dist.broadcast(param, src=0)
    print(
        f"rank {rank}: param {param.sum().item():.1f} last metrics "
        f"{[round(t.item()) for t in gathered]}",
        flush=True,
    )


def init_process(rank, size, args, fn=run):
    dist.init_process_group(
        "gloo", rank=rank, world_size=size, timeout=datetime.timedelta(seconds=args.timeout)
    )
    try:
        fn(rank, size, args)
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip-rank", type=int, default=-1)
    parser.add_argument("--skip-step", type=int, default=-1)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--spawn", type=int, default=0, help="start this many ranks here")
    args = parser.parse_args()
    if args.spawn:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", os.environ.get("TEST_MASTER_PORT", "29511"))
        mp.spawn(init_process, args=(args.spawn, args), nprocs=args.spawn, join=True)
    else:
        init_process(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)


if __name__ == "__main__":
    main()
