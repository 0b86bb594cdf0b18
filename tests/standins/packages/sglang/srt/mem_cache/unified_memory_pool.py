"""STAND-IN for sglang.srt.mem_cache.unified_memory_pool (rankscope tests): the unified
buffer and the pools over it, with only the members the adapter reads (unified memory is a
CUDA allocation)."""

from __future__ import annotations

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool


class UnifiedKVPool:
    def __init__(self, total_bytes: int, post_capture_active: bool = False) -> None:
        self.total_bytes = total_bytes
        self.post_capture_active = post_capture_active

    @property
    def post_capture_backed_bytes(self) -> int:
        raise NotImplementedError("stand-in: post-capture VMM needs a GPU")


class UnifiedMHATokenToKVPool(MHATokenToKVPool):
    def __init__(self, unified_buffer: UnifiedKVPool) -> None:
        self._unified_buffer = unified_buffer


class UnifiedMLATokenToKVPool(MLATokenToKVPool):
    def __init__(self, unified_buffer: UnifiedKVPool) -> None:
        self._unified_buffer = unified_buffer


class UnifiedSWAKVPool(SWAKVPool):
    def __init__(self, unified_buffer: UnifiedKVPool) -> None:
        self.unified_buffer = unified_buffer
