"""STAND-IN for sglang.srt.mem_cache.memory_pool (rankscope tests): a KV pool whose
get_kv_size_bytes() returns (K bytes, V bytes) of CPU tensors, as SGLang's does of CUDA ones;
the other pool classes carry only the members the adapter reads (their post-capture VMM
mode needs a GPU's virtual memory)."""

from __future__ import annotations

from typing import Any

import torch


class KVCache:
    post_capture_active: bool = False  # no VMM: plain tensors, committed at allocation


class MHATokenToKVPool(KVCache):
    def __init__(self, size: int, head_num: int, head_dim: int, layer_num: int) -> None:
        shape = (size, head_num, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=torch.float16) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=torch.float16) for _ in range(layer_num)]

    @property
    def post_capture_backed_bytes(self) -> int:
        raise NotImplementedError("stand-in: post-capture VMM needs a GPU")

    def get_kv_size_bytes(self) -> tuple[int, int]:
        k = sum(t.numel() * t.element_size() for t in self.k_buffer)
        v = sum(t.numel() * t.element_size() for t in self.v_buffer)
        return k, v


class MLATokenToKVPool(KVCache):
    def get_kv_size_bytes(self) -> int:
        return 0


class HybridLinearKVPool(KVCache):
    def __init__(self, full_kv_pool: KVCache) -> None:
        self.full_kv_pool = full_kv_pool

    @property
    def post_capture_active(self) -> bool:
        return self.full_kv_pool.post_capture_active

    @property
    def post_capture_backed_bytes(self) -> int:
        raise NotImplementedError("stand-in: post-capture VMM needs a GPU")

    def get_kv_size_bytes(self) -> Any:
        return self.full_kv_pool.get_kv_size_bytes()
