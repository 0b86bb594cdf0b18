"""STAND-IN for sglang.srt.mem_cache.memory_pool (rankscope tests): a KV pool whose
get_kv_size_bytes() returns (K bytes, V bytes) of CPU tensors, as SGLang's does of CUDA ones."""

from __future__ import annotations

import torch


class KVCache:
    pass


class MHATokenToKVPool(KVCache):
    def __init__(self, size: int, head_num: int, head_dim: int, layer_num: int) -> None:
        shape = (size, head_num, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=torch.float16) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=torch.float16) for _ in range(layer_num)]
        self._post_capture_owner = None  # no VMM owner: plain tensors, committed at allocation

    def get_kv_size_bytes(self) -> tuple[int, int]:
        k = sum(t.numel() * t.element_size() for t in self.k_buffer)
        v = sum(t.numel() * t.element_size() for t in self.v_buffer)
        return k, v


class MLATokenToKVPool(KVCache):
    def get_kv_size_bytes(self) -> int:
        return 0
