"""STAND-IN for vllm.v1.worker.gpu_worker (rankscope tests): a Worker with vLLM's boot
methods in the order the engine calls them, and execute_model once per engine step."""

from __future__ import annotations

from typing import Any

import torch

from vllm.distributed import parallel_state
from vllm.v1.kv_cache_interface import KVCacheConfig


class _ModelRunner:
    def __init__(self) -> None:
        self.kv_caches: list[torch.Tensor] = []
        self.weight = torch.ones(64, 64)

    def forward(self) -> torch.Tensor:
        return parallel_state.get_tp_group().all_reduce(torch.ones(4, 64) @ self.weight)


class Worker:
    def __init__(self, local_rank: int, rank: int, tp_size: int) -> None:
        self.local_rank = local_rank
        self.rank = rank
        self.tp_size = tp_size
        self.model_runner: _ModelRunner | None = None

    def init_device(self) -> None:
        parallel_state.ensure_model_parallel_initialized(self.tp_size, self.local_rank)
        self.model_runner = _ModelRunner()

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        assert self.model_runner is not None
        self.model_runner.weight = torch.ones(64, 64)

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        assert self.model_runner is not None
        (size,) = {t.size for t in kv_cache_config.kv_cache_tensors}  # one backing allocation
        self.model_runner.kv_cache = torch.zeros(size, dtype=torch.uint8)

    def compile_or_warm_up_model(self) -> Any:
        assert self.model_runner is not None
        for _ in range(2):  # capture sizes: one dummy forward each
            self.model_runner.forward()

    def execute_model(self, scheduler_output: Any) -> Any:
        assert self.model_runner is not None
        # A call that bypasses the coordinator (as vLLM's stateless coordinator does): the
        # device communicator's own counter counts it.
        parallel_state.get_tp_group().device_communicator.broadcast(torch.zeros(1), 0)
        return self.model_runner.forward()
