"""STAND-IN for sglang.srt.model_executor.model_runner (rankscope tests): ModelRunner with
SGLang's boot methods in SGLang's order; each does a token amount of CPU work."""

from __future__ import annotations

import torch

from sglang.srt.distributed import parallel_state
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool


class ModelRunner:
    def __init__(self, gpu_id: int, tp_size: int, is_draft_worker: bool = False) -> None:
        self.gpu_id = gpu_id
        self.tp_size = tp_size
        self.is_draft_worker = is_draft_worker
        self.token_to_kv_pool: MHATokenToKVPool | None = None
        self.init_torch_distributed()
        self.load_model()

    def init_torch_distributed(self) -> None:
        # As SGLang's: the groups exist already (the Scheduler built them); it reads them.
        self.pp_group = parallel_state.get_pp_group()

    def load_model(self) -> None:
        self.weight = torch.ones(64, 64)

    def alloc_memory_pool(self, memory_pool_config: object | None = None) -> None:
        size = 128 if self.is_draft_worker else 512
        self.token_to_kv_pool = MHATokenToKVPool(size, head_num=2, head_dim=8, layer_num=2)

    def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True) -> None:
        # A capture runs collectives once per batch size, as SGLang's warm-up does.
        for _ in range(2):
            self.forward(torch.ones(4, 64))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = hidden @ self.weight
        return parallel_state.get_tp_group().all_reduce(out)
