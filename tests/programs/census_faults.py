"""A plain gloo program for the census's fault tests; it imports nothing from rankscope.
Every step each rank all-reduces a tensor, then pauses --pause seconds.

    torchrun --nproc-per-node 3 census_faults.py --fault F --rank R --step K

Faults, of rank R at step K:
  skip-hang   it skips its all_reduce and all-gathers instead: its peers wait in the
              all_reduce, it waits in the all_gather, and the job hangs
  skip-fail   it skips its all_reduce and raises: the job fails
  slow        it sleeps --slow seconds before its all_reduce, then carries on (a skew
              that is made up)
  none        no fault
A rank killed from outside is the test's doing (the pid is printed at the fault step).
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def run(rank, args):
    data = torch.ones(4)
    for step in range(args.steps):
        at_fault = rank == args.rank and step == args.step
        if at_fault:
            print(f"fault {args.fault} rank {rank} pid {os.getpid()} step {step}", flush=True)
        if at_fault and args.fault == "skip-hang":
            gathered = [torch.zeros(4) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, data)
        elif at_fault and args.fault == "skip-fail":
            raise RuntimeError(f"rank {rank} gives up at step {step}")
        else:
            if at_fault and args.fault == "slow":
                time.sleep(args.slow)
            dist.all_reduce(data)
            data.fill_(1.0)
        if step == args.step:
            print(f"rank {rank} at step {step}", flush=True)
        time.sleep(args.pause)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", default="none")
    parser.add_argument("--rank", type=int, default=-1)
    parser.add_argument("--step", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--slow", type=float, default=2.5)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    try:
        run(dist.get_rank(), args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
