"""STAND-IN for sglang.srt.managers.scheduler (rankscope tests): a Scheduler that boots its
target (and, with speculative decoding, draft) ModelRunner in SGLang's order and runs a loop
whose every iteration calls ingest_requests and, with a batch, run_batch."""

from __future__ import annotations

import torch

from sglang.srt.distributed import parallel_state
from sglang.srt.model_executor.model_runner import ModelRunner


class Scheduler:
    def __init__(self, gpu_id: int, tp_size: int, speculative: bool) -> None:
        # SGLang builds its groups here (bootstrap.init_parallel_runtime), before any runner.
        parallel_state.initialize_model_parallel(tp_size, gpu_id)
        self.tp_worker = ModelRunner(gpu_id, tp_size)
        self.draft_worker = (
            ModelRunner(gpu_id, tp_size, is_draft_worker=True) if speculative else None
        )
        self.tp_worker.alloc_memory_pool()
        if self.draft_worker is not None:
            self.draft_worker.alloc_memory_pool()
        self.tp_worker.init_cuda_graphs()
        if self.draft_worker is not None:
            self.draft_worker.init_cuda_graphs()
        self.forward_ct = 0
        self.iteration = 0

    def ingest_requests(self, stop_at_pause: bool = False) -> list[object]:
        # Rank 0 receives requests and broadcasts them over the TP group, as SGLang does: a
        # request every other iteration.
        count = torch.tensor([1 if self.iteration % 2 == 0 else 0])
        self.iteration += 1
        parallel_state.get_tp_group().broadcast(count, src=0)
        return [object()] * int(count.item())

    def run_batch(self, batch: list[object]) -> torch.Tensor:
        self.forward_ct += 1
        return self.tp_worker.forward(torch.ones(4, 64))

    def event_loop_normal(self, iterations: int) -> torch.Tensor | None:
        result = None
        for _ in range(iterations):
            batch = self.ingest_requests()
            if batch:
                result = self.run_batch(batch)
        return result
