"""STAND-IN fake boot (rankscope tests): one rank of a tiny "serving job" run through the
stand-in SGLang or vLLM packages (packages/, which the caller puts on PYTHONPATH), over real torch.distributed (gloo).

    python boot.py sglang|vllm RANK WORLD PORT STEPS

Arms the adapters as `rankscope run` does (install_import_hooks, and the generic
torch.distributed counting) unless STANDIN_ADAPTERS=0, then boots in the framework's order
and serves STEPS scheduler iterations. Prints the job's own output (a checksum of its last
forward) and, for the test, which stand-in methods ended up wrapped.
"""

from __future__ import annotations

import json
import os
import sys


def wrapped_methods(modules: list[str]) -> list[str]:
    out = []
    for name in modules:
        module = sys.modules.get(name)
        for cls_name, cls in vars(module).items() if module else ():
            if isinstance(cls, type) and cls.__module__ == name:
                for attr, value in vars(cls).items():
                    if hasattr(value, "__wrapped__"):
                        out.append(f"{name}:{cls_name}.{attr}")
    return sorted(out)


def main() -> int:
    framework, rank, world, port, steps = sys.argv[1], *map(int, sys.argv[2:6])
    if os.environ.get("STANDIN_ADAPTERS", "1") == "1":
        from rankscope.rank import adapters, census

        adapters.install_import_hooks()
        census.instrument_torch_distributed()
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    if framework == "sglang":
        from sglang.srt.managers.scheduler import Scheduler

        scheduler = Scheduler(gpu_id=rank, tp_size=world, speculative=True)
        result = scheduler.event_loop_normal(steps)
    else:
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheTensor
        from vllm.v1.worker.gpu_worker import Worker

        worker = Worker(local_rank=rank, rank=rank, tp_size=world)
        worker.init_device()
        worker.load_model()
        # Two cache groups' tensors in one 2 MiB backing allocation, side by side.
        tensors = [
            KVCacheTensor(2 << 20, ["l0"], 1 << 20, 1 << 16),
            KVCacheTensor(2 << 20, ["l1"], 1 << 20, 1 << 16, offset=1 << 20),
        ]
        worker.initialize_from_config(KVCacheConfig(num_blocks=16, kv_cache_tensors=tensors))
        worker.compile_or_warm_up_model()
        for _ in range(steps):
            result = worker.execute_model(object())
    modules = [m for m in sys.modules if m.split(".")[0] == framework]
    print(f"standin job rank {rank}: checksum {float(result.sum()):.1f}")
    print("WRAPPED " + json.dumps(wrapped_methods(modules)))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
