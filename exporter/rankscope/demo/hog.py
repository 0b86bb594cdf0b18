"""A real process taking device memory on a real card: the demo's foreign holder, trough
and exhaustion on a GPU. ``--leave-free`` sizes the allocation from the card's free memory
at that instant (less this process's own CUDA context).

    python -m rankscope.demo.hog --gpu 0 --bytes 2GiB              # hold until killed
    python -m rankscope.demo.hog --gpu 0 --leave-free 4GiB --hold 0.4
"""

from __future__ import annotations

import argparse
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    from rankscope.daemon.flags import parse_bytes

    p = argparse.ArgumentParser(prog="rankscope.demo.hog", description=__doc__)
    p.add_argument("--gpu", type=int, default=0)
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--bytes", type=parse_bytes, help="bytes to take")
    size.add_argument("--leave-free", type=parse_bytes, help="take all but this much free")
    p.add_argument("--hold", type=float, help="seconds to hold (default: until killed)")
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("rankscope.demo.hog: no CUDA device; this helper needs a real GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", args.gpu)
    torch.cuda.set_device(device)
    torch.cuda.init()
    take = args.bytes
    if take is None:
        free, _total = torch.cuda.mem_get_info(device)
        take = max(free - args.leave_free, 0)
    block = torch.empty(take, dtype=torch.uint8, device=device)
    block.fill_(1)  # commit the pages, so the driver counts them
    torch.cuda.synchronize()
    print(f"holding {take} bytes on cuda:{args.gpu}", flush=True)
    if args.hold is None:
        signal.pause()  # SIGTERM from the demo ends it
    else:
        time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
