"""STAND-IN for sglang.srt.mem_cache.swa_memory_pool (rankscope tests): the sliding-window
pool with only the members the adapter reads (its post-capture VMM mode needs a GPU)."""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.memory_pool import KVCache


class SWAKVPool(KVCache):
    @property
    def post_capture_active(self) -> bool:
        raise NotImplementedError("stand-in: post-capture VMM needs a GPU")

    @property
    def post_capture_backed_bytes(self) -> int:
        raise NotImplementedError("stand-in: post-capture VMM needs a GPU")

    def get_kv_size_bytes(self) -> Any:
        raise NotImplementedError("stand-in")
